// Decode GEMV, stage 0: naive (one thread per output, scalar loads).
// What it does: out[m, n] = sum_k inp[m, k] * W[n, k] + bias[n], W bf16, fp32 accumulation; thread
//   (m, n) walks row n of W and row m of inp with 2- and 4-byte loads.
// Why it is the baseline: consecutive threads read rows of W K elements apart, so no load is
//   coalesced; the floor is W read once (2 bytes per weight).
// Launch: gemv_m{1,2,4,8} (fp32 inp) and gemv_bf16_m{1,2,4,8} (bf16 inp) (all the same here): grid ceil(M*N/256), block 256.
// Constraints: 1 <= M <= 64; N*K < 2^31. Tolerance: fp32 accumulation of bf16 weights (1e-2 preset).
// Limits: M <= 64; N * K < 2^31
#include "matmul_gemv.cuh"

template <int MT, typename In>
__device__ __forceinline__ void gemv_naive(float* out, const In* inp, const __nv_bfloat16* w, const float* bias,
                                           const float* residual, int tail, int M, int N, int K) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= M * N) return;
    const int m = idx / N, n = idx % N;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += gemv_in(inp[(size_t)m * K + k]) * __bfloat162float(w[(size_t)n * K + k]);
    out[idx] = gemv_out(acc, bias, residual, tail, n, idx);
}

GEMV_ENTRIES(gemv_naive)
