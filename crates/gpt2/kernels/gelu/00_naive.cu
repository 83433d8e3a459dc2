// GELU, stage 0: naive (one thread per element).
// out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's tanh form, in fp32.
// Launch: gelu_forward: grid ceil(N/PW_THREADS), block PW_THREADS.
//   PW_THREADS is a tunable (256 declared; 4..1024 swept). Constraints: N < 2^31. Tolerance: fp32 (1e-5).
// Limits: N < 2^31
#include "gpt2_pointwise_stage.cuh"

extern "C" __global__ void __launch_bounds__(PW_THREADS) gelu_forward(float* out, const float* inp, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gelu_tanh(inp[i]);
}
