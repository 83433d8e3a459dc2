// Decode GEMV on e4m3 weights, stage 1: skinny-mma (gemv stages 4-5 on 1-byte weights).
// Changed from stage 0: the product is computed transposed on the tensor cores, out^T[N, M] =
//   W[N, K] . inp^T[K, M] with mma.sync.m16n8k16 (bf16, fp32 accumulation), W read once for all
//   M <= 64 rows, a block of `split` warps per 16 rows of W (the split chosen on the host, as gemv's
//   stage 4, and at most the steps of K). Each lane loads 16 contiguous codes (16 bytes) of rows g
//   and g + 8 and converts them exactly to bf16 pairs (cvt.rn.f16x2.e4m3x2, then to bf16): the
//   16 k of a piece feed four k16 mma steps as the columns {2t, 2t+1, 2t+8, 2t+9} of each (a dot
//   product does not care in which order K is summed), and the same 16 elements of inp, rounded to
//   bf16, are the matching B fragments. A warp's 64-wide step of K lies in one 128-channel group and
//   the block's 16 rows in one 128-row block (16 | 128), so one scale covers the step's whole mma
//   tile: it multiplies inp before the bf16 rounding (the rounding stays relative to the product's
//   terms), and the accumulator needs no promotion. The folded LayerNorm is gemv stage 5's (the
//   gemv_fp8_mma_ln_m* entries: the gain folded into W before the quantization, the shift into the
//   bias, the row statistics in the block); the parts are matmul_gemv_mma.cuh's.
// Why it should be faster: at M > 1 stage 0 re-reads W per pass of 8 rows and spends M FMAs per
//   weight on the FMA pipe (plus 1.5 conversion instructions per weight per pass); here the codes are
//   read and converted once and the multiply-adds go to the tensor cores, so the time should stay near
//   the M = 1 time up to M = 64 (predicted: MLP up at M = 32 from ~4x its M = 1 time to ~1.5x). At
//   M = 1 on par with stage 0 (7/8 of each mma is padding, free in a kernel bound by its bytes).
// Measured (H100): M = 8 8.19 us, M = 32 11.36 (4.3x stage 0); at M = 1 5.89-28.32 us, behind
//   stage 0 at the short linears; folded LayerNorm: QKV 8.86 us, LM head 41.0.
// Launch: gemv_fp8_mma_m{8,16,32,64}, gemv_fp8_mma_bf16_m{...}, gemv_fp8_mma_ln_m{...} (fp32 inp,
//   bf16 inp, fp32 residual stream with the LayerNorm folded; MT = M rounded up to a power of two,
//   >= 8): grid ceil(N / 16), block 32 * split (4 <= split <= 16: the reduction's 128 threads, and
//   registers for the whole block); dynamic shared memory split * 16 * 8 floats (the partial
//   tiles, reduced one 8-column tile at a time).
// Constraints: 1 <= M <= 64; K % 16 == 0 (16-byte pieces of codes, whole pieces of inp); N * K <
//   2^31; scales [ceil(N / 128), ceil(K / 128)]; a folded LayerNorm reads fp32 inp and has a bias.
// Tolerance: 1e-2 preset against the f64 product on the dequantized weights (inp times the scale
//   rounded to bf16, fp32 accumulation).
// Limits: M <= 64; N * K < 2^31; K % 16 == 0
#include "matmul_gemv_mma.cuh"
#include "matmul_fp8.cuh"

#ifndef GEMV_UNROLL
#define GEMV_UNROLL 4
#endif

template <int MT, bool LN = false, typename In, typename Store>
__device__ __forceinline__ void gemv_fp8_skinny_mma(const Store& store, const In* inp, const unsigned char* w,
                                                    const float* scales, int M, int N, int K) {
    constexpr int TILES = MT / 8;
    extern __shared__ float part[];  // [split][16][8]
    const int split = blockDim.x >> 5;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16;
    const bool row_a = n0 + g < N, row_b = n0 + g + 8 < N;
    const unsigned char* wa_row = w + (size_t)(row_a ? n0 + g : 0) * K;
    const unsigned char* wb_row = w + (size_t)(row_b ? n0 + g + 8 : 0) * K;
    // The block's 16 rows lie in one 128-row block: its row of scales.
    const float* block_scales = fp8_row_scales(scales, n0, K);
    const int steps = (K + 63) / 64;
    RowStats<MT, LN> stats;
    if constexpr (LN) {
        __shared__ float mean[MT], rstd[MT];
        row_stats(mean, rstd, inp, M, K, MT);
        __syncthreads();
        stats = {mean, rstd};
    }
    float acc[TILES][4];
#pragma unroll
    for (int i = 0; i < TILES; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

    for (int s0 = warp; s0 < steps; s0 += split * GEMV_UNROLL) {
        uint4 wa[GEMV_UNROLL], wb[GEMV_UNROLL];
        float scale[GEMV_UNROLL];
        // All of this pass's loads of W (and its scales) first: they are what the kernel waits on.
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int s = s0 + u * split, k = 64 * s + 16 * t;
            const bool valid = s < steps && k < K;
            const uint4 zero = make_uint4(0, 0, 0, 0);
            wa[u] = valid && row_a ? *reinterpret_cast<const uint4*>(wa_row + k) : zero;
            wb[u] = valid && row_b ? *reinterpret_cast<const uint4*>(wb_row + k) : zero;
            scale[u] = s < steps ? block_scales[64 * s / FP8_GROUP] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int s = s0 + u * split, k = 64 * s + 16 * t;
            const bool valid = s < steps && k < K;
            unsigned a[8], b8[8];  // rows g and g + 8: pair j = codes 2j, 2j + 1 of the piece
            e4m3x16_to_bf16x2(wa[u], a);
            e4m3x16_to_bf16x2(wb[u], b8);
#pragma unroll
            for (int i = 0; i < TILES; ++i) {
                const int m = 8 * i + g;
                unsigned lo[2][2], hi[2][2];  // elements 0-7 and 8-15 of the piece
                inp_fragments(lo, inp, m, M, k, valid, K, stats.mean(m), scale[u]);
                inp_fragments(hi, inp, m, M, k + 8, valid, K, stats.mean(m), scale[u]);
                mma_16816<__nv_bfloat16>(acc[i], a[0], b8[0], a[1], b8[1], lo[0][0], lo[0][1]);
                mma_16816<__nv_bfloat16>(acc[i], a[2], b8[2], a[3], b8[3], lo[1][0], lo[1][1]);
                mma_16816<__nv_bfloat16>(acc[i], a[4], b8[4], a[5], b8[5], hi[0][0], hi[0][1]);
                mma_16816<__nv_bfloat16>(acc[i], a[6], b8[6], a[7], b8[7], hi[1][0], hi[1][1]);
            }
        }
    }
    gemv_mma_reduce(acc, part, stats, store, n0, M, N);
}

#define GEMV_FP8_MMA_ENTRY(MT)                                                                               \
    extern "C" __global__ void gemv_fp8_mma_m##MT(float* out, const float* inp, const unsigned char* w,      \
                                                  const float* scales, const float* bias,                    \
                                                  const float* residual, int tail, int M, int N, int K) {    \
        gemv_fp8_skinny_mma<MT>(StoreRows{out, bias, residual, tail, N}, inp, w, scales, M, N, K);           \
    }                                                                                                        \
    extern "C" __global__ void gemv_fp8_mma_bf16_m##MT(float* out, const __nv_bfloat16* inp,                 \
                                                       const unsigned char* w, const float* scales,          \
                                                       const float* bias, const float* residual, int tail,   \
                                                       int M, int N, int K) {                                \
        gemv_fp8_skinny_mma<MT>(StoreRows{out, bias, residual, tail, N}, inp, w, scales, M, N, K);           \
    }                                                                                                        \
    /* inp: the raw fp32 residual stream; w, scales: the blocks of the LayerNorm-folded W' */                \
    extern "C" __global__ void gemv_fp8_mma_ln_m##MT(float* out, const float* inp, const unsigned char* w,   \
                                                     const float* scales, const float* bias,                 \
                                                     const float* residual, int tail, int M, int N, int K) { \
        gemv_fp8_skinny_mma<MT, true>(StoreRows{out, bias, residual, tail, N}, inp, w, scales, M, N, K);     \
    }
GEMV_FP8_MMA_ENTRY(8)
GEMV_FP8_MMA_ENTRY(16)
GEMV_FP8_MMA_ENTRY(32)
GEMV_FP8_MMA_ENTRY(64)
