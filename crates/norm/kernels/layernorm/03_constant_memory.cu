// LayerNorm forward, stage 3: constant memory.
// Changed from stage 2: weight and bias live in `__constant__` memory (bound once, like model
//   parameters), not in global memory.
// Why it should be faster: every thread of a warp reads the same weight[i] at the same step, which is
//   exactly the constant cache's broadcast case; the report saw 1.14x from the global-load requests
//   it removed.
// Launch: grid ceil(rows/256), block 256. Constraints: C <= LN_CONST_MAX_C (declared 7936 floats
//   each for weight and bias: 62 KB of the 64 KB constant bank). Tolerance: fp32, 1e-5.
// Limits: rows * C < 2^31; C <= LN_CONST_MAX_C

#ifndef LN_UNROLL
#error "LN_UNROLL (the unroll factor) is a tunable: the stage list sets it"
#endif
#ifndef LN_CONST_MAX_C
#error "LN_CONST_MAX_C (floats of weight, and of bias, in constant memory) is set by the stage list"
#endif

__constant__ float ln_weight[LN_CONST_MAX_C];
__constant__ float ln_bias[LN_CONST_MAX_C];

extern "C" __global__ void layernorm_forward(float* __restrict__ out, float* __restrict__ mean,
                                             float* __restrict__ rstd, const float* __restrict__ inp,
                                             int rows, int C, float eps) {
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
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * ln_weight[i] + ln_bias[i];
    mean[row] = m;
    rstd[row] = s;
}
