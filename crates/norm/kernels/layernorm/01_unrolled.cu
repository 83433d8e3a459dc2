// LayerNorm forward, stage 1: unrolled.
// Changed from stage 0: `#pragma unroll LN_UNROLL` (default 8, the report's choice; the define is
//   the sweep knob, up to 32) on the three loops over C.
// Why it might be faster: fewer loop branches and more independent loads in flight per thread. The
//   loads stay uncoalesced (one row per thread), so the report saw little change; expect ~1.0-1.2x.
// Launch: grid ceil(rows/256), block 256. Constraints: rows*C < 2^31. Tolerance: fp32, 1e-5.
// Limits: rows * C < 2^31

#ifndef LN_UNROLL
#error "LN_UNROLL (the unroll factor) is a tunable: the stage list sets it"
#endif

extern "C" __global__ void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                             const float* weight, const float* bias, int rows, int C,
                                             float eps) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* x = inp + (size_t)row * C;
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
    float* o = out + (size_t)row * C;
#pragma unroll LN_UNROLL
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[row] = m;
    rstd[row] = s;
}
