// Decode GEMV, stage 1: warp-row (a warp per output row of W, 16-byte loads).
// Changed from stage 0: warp n reads row n of W as 16-byte chunks (8 bf16), lane l taking chunks l,
//   l+32, ...: each warp instruction reads 512 contiguous bytes. Each chunk is dotted with MT rows
//   of inp (two float4 loads each, from L1/L2: inp is small), the MT partial sums reduced across
//   the warp with shuffles. M > MT runs in passes of MT rows (W re-read per pass, from L2).
// Why it should be faster: coalesced 16-byte loads of W, the only large operand: predicted near the
//   copy rate once N/4 blocks of 4 warps keep enough rows in flight (all GPT-2 shapes have N >= 768).
// Launch: gemv_m{1,2,4,8} (fp32 inp) and gemv_bf16_m{1,2,4,8} (bf16 inp) (MT rows per pass): grid ceil(N/4), block 128 (4 warps, one row each).
// Constraints: 1 <= M <= 64; K % 8 == 0 (16-byte rows); N*K < 2^31. Tolerance: 1e-2 preset.
// Limits: M <= 64; N * K < 2^31; K % 8 == 0
#include "matmul_gemv.cuh"

template <int MT, typename In>
__device__ __forceinline__ void gemv_warp_row(float* out, const In* inp, const __nv_bfloat16* w,
                                              const float* bias, const float* residual, int tail, int M, int N, int K) {
    gemv_warp_row_passes<MT>(out, w, bias, residual, tail, M, N, K,
                             [&](float (&acc)[MT], const uint4* row, int, int m0, int lane) {
                                 for (int c = lane; c < K / 8; c += 32) gemv_chunk_dot(acc, row[c], inp, c, m0, M, K);
                             });
}

GEMV_ENTRIES(gemv_warp_row)
