// Decode GEMV on e4m3 weights, stage 2: loads-first (stage 0 with a warp's whole row requested at once).
// Changed from stage 0: each lane issues the loads of all its pieces of the row (P pieces, 16 bytes
//   each, with their scales) before it converts or multiplies any; P is picked on the host from K
//   (the smallest of 1, 2, 4, 8 that covers the row, 32 lanes x P x 16 codes; K > 4096 takes passes of
//   8). Everything else is stage 0's.
// Why it should be faster: stage 0's loop converts each piece right after loading it, and ptxas keeps
//   that order (its SASS: one LDG.128 of W, then the conversions that wait on it, then the next
//   iteration's load), so a warp makes ceil(K / 512) dependent trips to DRAM: 2 at K = 768, 6 at
//   K = 3072. At M = 1 the block linears are bound by that latency, not by bytes; one trip a warp
//   should take each ~0.7 us off QKV, the projection and MLP up (6.1-6.4 -> ~5.5 us, ~85% of the
//   copy), MLP down from 8.1 to ~5.5 us, and the LM head from 29.6 toward the copy's 17 us.
// Measured (H100): MLP down 7.23 us (1.11x stage 0), proj equal, QKV / MLP up / LM head 0.92-1.0x:
//   one trip a warp is not what bounds the short rows (their kernels are ~5 us of launch and ramp).
// Launch: gemv_fp8_m{1,2,4,8}_p{1,2,4,8} (fp32 inp) and gemv_fp8_bf16_m{..}_p{..} (bf16 inp) (MT rows
//   per pass, P pieces a lane a pass): grid ceil(N / 4), block 128 (4 warps, one row each).
// Constraints: stage 0's: 1 <= M <= 64; K % 16 == 0; N * K < 2^31.
// Tolerance: 1e-2 preset against the f64 product on the dequantized weights (fp32 products and sums).
// Limits: M <= 64; N * K < 2^31; K % 16 == 0
#include "matmul_gemv_fp8.cuh"

template <int MT, int P, typename In>
__device__ __forceinline__ void gemv_fp8_loads_first(float* out, const In* inp, const unsigned char* w,
                                                     const float* scales, const float* bias, const float* residual,
                                                     int tail, int M, int N, int K) {
    gemv_warp_row_passes<MT>(out, w, bias, residual, tail, M, N, K,
                             [&](float (&acc)[MT], const uint4* row, int n, int m0, int lane) {
                                 const float* row_scales = fp8_row_scales(scales, n, K);
                                 const int pieces = K / 16;
                                 for (int c0 = lane; c0 < pieces; c0 += 32 * P) {
                                     uint4 q[P];
                                     float scale[P];
                                     fp8_row_pieces(q, scale, row, row_scales, c0, pieces);
                                     fp8_row_dot(acc, q, scale, inp + (size_t)m0 * K, c0, pieces, M - m0, K);
                                 }
                             });
}

GEMV_FP8_PIECES_ENTRIES(gemv_fp8_loads_first)
