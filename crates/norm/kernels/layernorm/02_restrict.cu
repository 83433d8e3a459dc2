// LayerNorm forward, stage 2: restrict.
// Changed from stage 1: every pointer is `__restrict__` (and inputs `const`), promising no aliasing.
// Why it might be faster: the compiler may keep loads in registers across the store to `out` and use
//   the read-only path. The report measured no change; the kernel is bound by its uncoalesced loads,
//   so expect ~1.0x.
// Launch: grid ceil(rows/256), block 256. Constraints: rows*C < 2^31. Tolerance: fp32, 1e-5.
// Limits: rows * C < 2^31

#ifndef LN_UNROLL
#error "LN_UNROLL (the unroll factor) is a tunable: the stage list sets it"
#endif

extern "C" __global__ void layernorm_forward(float* __restrict__ out, float* __restrict__ mean,
                                             float* __restrict__ rstd, const float* __restrict__ inp,
                                             const float* __restrict__ weight,
                                             const float* __restrict__ bias, int rows, int C, float eps) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* __restrict__ x = inp + (size_t)row * C;
    float m = 0.0f;
#pragma unroll LN_UNROLL
    for (int i = 0; i < C; i++) m += x[i];
    m /= C;
    float v = 0.0f;
#pragma unroll LN_UNROLL
    for (int i = 0; i < C; i++) {
        float d = x[i] - m;
        v += d * d;
    }
    v /= C;
    float s = rsqrtf(v + eps);
    float* __restrict__ o = out + (size_t)row * C;
#pragma unroll LN_UNROLL
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[row] = m;
    rstd[row] = s;
}
