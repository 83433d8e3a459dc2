// GELU, stage 1: vectorized (16-byte loads and stores, four elements per thread).
// Changed from stage 0: each thread reads and writes one float4, so a warp moves 512 bytes per
//   instruction instead of 128; the last N % 4 elements are done one per thread.
// Why it should be faster: the op is memory-bound (8 bytes per element, ~20 flops); fewer, wider
//   memory instructions keep more bytes in flight per thread. Expected near the copy rate at large N.
// Launch: gelu_forward: grid ceil((N/4 + N%4)/PW_THREADS), block PW_THREADS.
//   PW_THREADS is a tunable (256 declared; 4..1024 swept). Constraints: N < 2^31, buffers 16-byte
//   aligned (whole allocations). Tolerance: fp32 (1e-5).
// Limits: N < 2^31
#include "gpt2_pointwise_stage.cuh"

extern "C" __global__ void __launch_bounds__(PW_THREADS) gelu_forward(float* out, const float* inp, int n) {
    pw_split4(
        n,
        [&](int i) {
            float4 x = reinterpret_cast<const float4*>(inp)[i];
            x.x = gelu_tanh(x.x);
            x.y = gelu_tanh(x.y);
            x.z = gelu_tanh(x.z);
            x.w = gelu_tanh(x.w);
            reinterpret_cast<float4*>(out)[i] = x;
        },
        [&](int j) { out[j] = gelu_tanh(inp[j]); });
}
