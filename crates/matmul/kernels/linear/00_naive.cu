// Linear forward, stage 0: naive (the report's baseline, 31.35 ms on its largest call).
// Op: out[M, N] = inp[M, K] . W[N, K]^T + bias[N], row-major fp32 (llm.c's layout).
// Changed from previous: - (baseline).
// What it does: one thread per output element, a sequential loop over K reading one row of inp
//   and one row of W from global memory.
// Why it is slow: every output re-reads 2K floats (2·M·N·K loads in all, arithmetic intensity
//   ~0.25 FLOP/byte before caches); lanes of a warp walk 16 different rows of W at a stride of K
//   floats, so each load instruction touches 16 cache lines. L1/L2 absorb part of it, but the
//   kernel is bound by load issue and latency, far below the FMA rate.
// Launch: block (16, 16) = 16 columns x 16 rows, grid (ceil(N/16), ceil(M/16)), no shared memory.
// Constraints: M, N, K >= 1; M*K, N*K, M*N < 2^31; ceil(M/16) <= 65535. bias may be NULL.
// Tolerance: fp32 accumulation, rel L2 <= 1e-5.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; M <= 65535 * 16
#include "matmul_aux.cuh"

extern "C" __global__ void linear_naive(float* out, const float* inp, const float* w, const float* bias, int M, int N,
                                        int K) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    int m = blockIdx.y * blockDim.y + threadIdx.y;
    if (m >= M || n >= N) return;
    const float* a = inp + (size_t)m * K;
    const float* b = w + (size_t)n * K;
    float acc = (bias != nullptr) ? bias[n] : 0.0f;
    for (int k = 0; k < K; k++) acc += a[k] * b[k];
    out[(size_t)m * N + n] = acc;
}
