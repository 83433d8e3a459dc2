// Decode GEMV on e4m3 weights, stage 0: warp-row (gemv stage 1 on 1-byte weights).
// What it does: out[M, N] = inp[M, K] . dequant(W)[N, K]^T (+ bias), then gemv's tails (GELU, or plus
//   a residual that may be out itself). W is e4m3 codes with an fp32 scale per 128 x 128 block
//   (matmul::fp8, prepared once). Warp n reads row n of the codes as 16-byte pieces (16 codes), lane
//   l taking pieces l, l + 32, ...: each warp instruction reads 512 contiguous bytes. A piece lies in
//   one 128-channel group, so it is converted exactly to floats (cvt.rn.f16x2.e4m3x2, then to f32),
//   dotted with MT rows of inp in fp32 and added in times its block's scale. M > MT runs in passes of
//   MT rows (the codes re-read per pass, from L2).
// Why it should be faster than gemv's bf16 stage 1: half the bytes of W, the only large operand
//   (1 byte a weight and 4 bytes of scale per 16 K); predicted near the copy rate of those bytes at
//   the LM head (~13 us against ~26 us for bf16), and at the block linears bound by launch and ramp
//   like the copy itself (~4-5 us).
// Measured (H100, M = 1): QKV 5.79 us, MLP up 6.14, proj 5.25, MLP down 8.03, LM head 29.47 (43% of
//   DRAM, no faster than bf16 W in gemv stage 1: a block's one trip carries half the bytes).
// Launch: gemv_fp8_m{1,2,4,8} (fp32 inp) and gemv_fp8_bf16_m{1,2,4,8} (bf16 inp) (MT rows per pass):
//   grid ceil(N / 4), block 128 (4 warps, one row each).
// Constraints: 1 <= M <= 64; K % 16 == 0 (16-byte pieces of codes, 64-byte pieces of fp32 inp);
//   N * K < 2^31; scales [ceil(N / 128), ceil(K / 128)].
// Tolerance: 1e-2 preset against the f64 product on the dequantized weights (fp32 products and sums;
//   the weights' e4m3 rounding is the format's error, reported apart).
// Limits: M <= 64; N * K < 2^31; K % 16 == 0
#include "matmul_gemv_fp8.cuh"

template <int MT, typename In>
__device__ __forceinline__ void gemv_fp8_warp_row(float* out, const In* inp, const unsigned char* w,
                                                  const float* scales, const float* bias, const float* residual,
                                                  int tail, int M, int N, int K) {
    gemv_warp_row_passes<MT>(out, w, bias, residual, tail, M, N, K,
                             [&](float (&acc)[MT], const uint4* row, int n, int m0, int lane) {
                                 const float* row_scales = fp8_row_scales(scales, n, K);  // 8 pieces a scale
                                 for (int c = lane; c < K / 16; c += 32) {
                                     float wv[16];
                                     e4m3x16_to_float(row[c], wv);
                                     const float scale = row_scales[c / (FP8_GROUP / 16)];
#pragma unroll
                                     for (int i = 0; i < MT; ++i)
                                         if (m0 + i < M) acc[i] += scale * fp8_dot16(wv, inp + (size_t)(m0 + i) * K + 16 * c);
                                 }
                             });
}

GEMV_FP8_FMA_ENTRY(m1, gemv_fp8_warp_row<1>)
GEMV_FP8_FMA_ENTRY(m2, gemv_fp8_warp_row<2>)
GEMV_FP8_FMA_ENTRY(m4, gemv_fp8_warp_row<4>)
GEMV_FP8_FMA_ENTRY(m8, gemv_fp8_warp_row<8>)
