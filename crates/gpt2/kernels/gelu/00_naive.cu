// GELU, stage 0: naive (one thread per element).
// out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's tanh form, in fp32.
// Launch: gelu_forward: grid ceil(N/256), block 256. Constraints: N < 2^31. Tolerance: fp32 (1e-5).
// Limits: N < 2^31
#include "gpt2_pointwise.cuh"

extern "C" __global__ void gelu_forward(float* out, const float* inp, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gelu_tanh(inp[i]);
}
