// LayerNorm forward, stage 0: naive (the report's baseline).
// Changed from previous: - (baseline).
// What it does: one thread per row; three sequential loops over C read the row from global memory
//   three times (mean, then variance, then normalise and write).
// Why it is slow: a warp's 32 threads walk 32 different rows, so each load instruction touches 32
//   cache lines (stride C*4 bytes): uncoalesced, ~3 reads of x per element, and only rows/256
//   blocks of parallelism (16 blocks at rows = 4096: most SMs idle).
// Launch: grid ceil(rows/256), block 256, no shared memory.
// Constraints: rows, C >= 1; rows*C < 2^31. Tolerance: fp32, rel L2 <= 1e-5.
// Outputs: out[rows*C], mean[rows], rstd[rows] (rstd = 1/sqrt(var + eps), biased variance).
// Limits: rows * C < 2^31

extern "C" __global__ void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                             const float* weight, const float* bias, int rows, int C,
                                             float eps) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* x = inp + (size_t)row * C;
    float m = 0.0f;
    for (int i = 0; i < C; i++) m += x[i];
    m /= C;
    float v = 0.0f;
    for (int i = 0; i < C; i++) {
        float d = x[i] - m;
        v += d * d;
    }
    v /= C;
    float s = rsqrtf(v + eps);
    float* o = out + (size_t)row * C;
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[row] = m;
    rstd[row] = s;
}
