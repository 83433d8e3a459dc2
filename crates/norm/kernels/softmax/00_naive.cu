// Softmax forward over rows, stage 0: naive (the report's baseline).
// Changed from previous: - (baseline).
// What it does: one thread per row; three sequential loops over the row (max, sum of exp,
//   normalise). With `causal`, row r of a T-long block of rows (position p = r % T) uses columns
//   0..p and writes 0 to columns p+1..T-1.
// Why it is slow: a warp's threads walk 32 different rows (stride T*4 bytes), uncoalesced; the row
//   is read three times; and parallelism is only rows/256 blocks.
// Launch: grid ceil(rows/256), block 256, no shared memory.
// Constraints: rows, T >= 1; causal needs rows % T == 0; rows*T < 2^31. Tolerance: fp32, 1e-5.
// Limits: rows * T < 2^31; rows % T == 0 when causal
#include "ladder.cuh"

// out[r, j] = exp(s*(x[r,j] - max)) / sum_k exp(s*(x[r,k] - max)), s = inv_temperature.

extern "C" __global__ void softmax_forward(float* out, const float* inp, int rows, int T,
                                           float inv_temperature, int causal) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* x = inp + (size_t)row * T;
    float* o = out + (size_t)row * T;
    int len = causal ? (row % T) + 1 : T;
    float maxval = -INFINITY;
    for (int j = 0; j < len; j++) maxval = fmaxf(maxval, x[j]);
    float sum = 0.0f;
    for (int j = 0; j < len; j++) sum += expf(inv_temperature * (x[j] - maxval));
    float norm = 1.0f / sum;
    for (int j = 0; j < len; j++) o[j] = expf(inv_temperature * (x[j] - maxval)) * norm;
    for (int j = len; j < T; j++) o[j] = 0.0f;
}
