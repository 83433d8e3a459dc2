// Decode GEMV on e4m3 weights, stage 4: split-rows (stage 3 with a long row split over the block's warps).
// Changed from stage 3: a row of K > 2048 is taken by all 4 warps of a block (the _k4 entries), warp r
//   holding the row's pieces r * 32 + lane, + 128, ... and its share of inp; their sums meet in shared
//   memory (one barrier a row, two slots taken in turn) and warp 0 stores. The host picks the split:
//   4 when K > 2048, else 1, where the stage is stage 3's kernel.
// Why it should be faster: stage 3 holds a lane's share of inp in registers, 16 floats a piece,
//   refuses K > 2048 (at P = 8 pieces a lane ptxas spills), which leaves MLP down (K = 3072,
//   N = 768) to stage 2: 768 warps, each with 6 pieces a lane in flight and then 96 dependent
//   conversions and multiply-adds per lane before its reduction, 7.3 us (66% of the copy). With the
//   row split 4 ways a lane holds 2 pieces (P = 2), four times as many warps share the row's work,
//   and the persistent grid streams the rest: predicted ~5.5 us (~85% of the copy's 4.8 us).
// Measured (H100): MLP down 6.88 us (1.05x stage 2, 71% of the copy), short of the prediction; the
//   kernel is 5.7 us on the device at 13% of DRAM: launch, ramp and one round trip, as the short rows.
// Recipe: the streamed-rows kernel (matmul_gemv_fp8_streamed.cuh), 4 warps a long row (SplitRows<4>).
// Launch: gemv_fp8{_bf16}_p{1,2,4} (a warp a row) and gemv_fp8{_bf16}_p{1,2,4}_k4 (4 warps a row) (P
//   pieces a lane: K / 16 / (32 * split) rounded up to a power of two): grid min(ceil(N / rows a
//   block), SMs * resident blocks an SM), block 128 (4 rows a block at K <= 2048, 1 at K > 2048).
// Constraints: stage 3's, with K <= 8192 (a row in one pass of 4 warps, P <= 4 pieces a lane).
// Tolerance: 1e-2 preset against the f64 product on the dequantized weights (fp32 products and sums).
// Limits: M <= 64; N * K < 2^31; K % 16 == 0; K <= 8192
#include "matmul_gemv_fp8_streamed.cuh"

GEMV_FP8_STREAMED_ENTRIES(1, )
GEMV_FP8_STREAMED_ENTRIES(4, _k4)
