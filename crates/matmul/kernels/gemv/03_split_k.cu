// Decode GEMV, stage 3: split-K (a block of GEMV_SPLIT warps per row of W, K split across them).
// Changed from stage 1: block n takes row n of W; its warps read interleaved 512-byte pieces of the
//   row (warp w, lane l: chunks 32w + l, 32w + l + 32*GEMV_SPLIT, ...), so a block's warps together
//   read 2 KiB contiguous per step; the warps' partial sums meet in shared memory (no atomics, the
//   sum order fixed: deterministic).
// Why it should be faster: at M = 1 a row of the MLP down projection (K = 3072) is 12 sequential
//   512-byte steps for stage 1's single warp, and N = 768 rows give only 768 warps; with the row split
//   four ways each warp has 3 steps and 4x the warps keep 4x the bytes in flight, so the long-K
//   shapes, latency-bound at stage 1, should approach the launch floor (predicted ~2x at K = 3072,
//   ~1.3x at K = 768, unchanged at the LM head, which already has 50257 warps).
// Launch: gemv_m{1,2,4,8} (fp32 inp) and gemv_bf16_m{1,2,4,8} (bf16 inp) (MT rows per pass): grid N, block 32 * GEMV_SPLIT.
// Constraints: 1 <= M <= 64; K % 8 == 0 (16-byte rows); N*K < 2^31; N <= 2^31 - 1 blocks.
// Tolerance: 1e-2 preset.
// Limits: M <= 64; N * K < 2^31; K % 8 == 0
#include "matmul_gemv.cuh"

#ifndef GEMV_SPLIT
#define GEMV_SPLIT 4
#endif

template <int MT, typename In>
__device__ __forceinline__ void gemv_split_k(float* out, const In* inp, const __nv_bfloat16* w,
                                             const float* bias, const float* residual, int tail, int M, int N, int K) {
    __shared__ float part[GEMV_SPLIT][MT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = blockIdx.x;
    const uint4* row = reinterpret_cast<const uint4*>(w + (size_t)n * K);
    const int chunks = K / 8;
    gemv_passes<MT>(M, [&](float (&acc)[MT], int m0) {
        for (int c = warp * 32 + lane; c < chunks; c += 32 * GEMV_SPLIT) gemv_chunk_dot(acc, row[c], inp, c, m0, M, K);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            const float s = warp_sum(acc[i]);
            if (lane == 0) part[warp][i] = s;
        }
        __syncthreads();
        if (threadIdx.x < MT && m0 + (int)threadIdx.x < M) {
            float s = 0.0f;
#pragma unroll
            for (int p = 0; p < GEMV_SPLIT; ++p) s += part[p][threadIdx.x];
            {
                const size_t idx = (size_t)(m0 + threadIdx.x) * N + n;
                out[idx] = gemv_out(s, bias, residual, tail, n, idx);
            }
        }
        __syncthreads();  // part is rewritten by the next pass
    });
}

GEMV_ENTRIES(gemv_split_k)
