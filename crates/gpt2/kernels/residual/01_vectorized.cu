// Residual add, stage 1: vectorized (16-byte loads and stores, four elements per thread).
// Changed from stage 0: float4 loads of a and b and a float4 store; the last N % 4 elements one per
//   thread. Why it should be faster: 12 bytes per element and one add: purely memory-bound, so
//   wider memory instructions are all there is to gain. Expected near the copy rate at large N.
// Launch: residual_forward: grid ceil((N/4 + N%4)/PW_THREADS), block PW_THREADS.
//   PW_THREADS is a tunable (256 declared; 4..1024 swept). Constraints: N < 2^31, whole
//   allocations (16-byte aligned); out may alias a or b. Tolerance: fp32 (1e-5).
// Limits: N < 2^31
#include "gpt2_pointwise_stage.cuh"

extern "C" __global__ void __launch_bounds__(PW_THREADS)
    residual_forward(float* out, const float* a, const float* b, int n) {
    pw_split4(
        n,
        [&](int i) {
            const float4 x = reinterpret_cast<const float4*>(a)[i];
            const float4 y = reinterpret_cast<const float4*>(b)[i];
            reinterpret_cast<float4*>(out)[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
        },
        [&](int j) { out[j] = a[j] + b[j]; });
}
