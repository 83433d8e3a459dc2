// Residual add, stage 0: naive (one thread per element): out[i] = a[i] + b[i], fp32.
// Launch: residual_forward: grid ceil(N/PW_THREADS), block PW_THREADS.
//   PW_THREADS is a tunable (256 declared; 4..1024 swept). Constraints: N < 2^31; out may alias a or b.
// Tolerance: fp32 (1e-5).
// Limits: N < 2^31
#include "gpt2_pointwise_stage.cuh"

extern "C" __global__ void __launch_bounds__(PW_THREADS)
    residual_forward(float* out, const float* a, const float* b, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
