// linear-fp8, stage 8: wide-tile (128 x 256 tiles, a K step in two column halves).
// Changed from stage 7: where the shape's waves allow it, a tile is 128 rows x 256 columns. Each
//   consumer warpgroup runs a K step as two halves of 128 columns (each one W scale block): four
//   wgmma.m64n128k32 into one partial tile, waited for and promoted, then the other half's
//   (fp8_consume_halves; DeepGEMM's schedule, one warpgroup's promotion under the other's wgmma).
//   Its accumulator is 128 registers and the partial 64: the producer warpgroup keeps 24 registers
//   so each consumer thread has 240 (setmaxnreg; two partial tiles, stage 4's overlap, would need
//   256). The previous tile's halves are stored one under each half of the next tile's first step,
//   so one half's store is live at a time. The host takes the wide tile where its rounds x (rows +
//   columns) on the SMs, the L2 bytes an SM reads a K step over the shape, is less than stage 7's
//   tile's, at the fp32 and bf16 outs; else stage 7's kernel, from stage 7's module. At the e4m3 out
//   it is stage 7's: the wide tile's quantized store measured 0.89-0.94x stage 7's at the MLP up
//   (calls W3, Y3), so this file has no e4m3 entries.
// Why it should be faster: a K step of a 128 x 128 tile moves 32 KiB from L2 for 4.2 MFLOP, 64 bytes
//   a clock an SM at the FP8 rate, the most an SM takes from L2; 128 x 256 moves 48 KiB for twice
//   the flops (47 bytes a clock), with half the tiles' fills, stores and ring restarts. 4096^3 is 512
//   tiles (3.9 rounds on 132 SMs, against 1024 in 7.8). Predicted 1.10-1.20x stage 7 at 4096^3,
//   8192^3 and the LM head, ~1.05x at the MLP up (N = 3072, the wide tile's 3 rounds against 4 of
//   192 rows); the N = 768 and QKV shapes keep stage 7's 192-row tile.
// Launch: linear_fp8_wide_tile[_gelu|_residual][_bf16]: stage 7's arguments; at
//   128 x 256, 384 threads and three ring stages of 48 KiB (A's 128 rows, W's 256: W's tensor map in
//   boxes of 256 rows), each consumer storing its tile's halves one after the other through stage
//   4's staging (a consumer's 64 x 128 of out); at stage 7's tile, stage 7's entry and launch.
// Constraints: stage 7's.
// Tolerance: 1e-2 preset against the f64 product of the dequantized operands.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 16 == 0; N % 4 == 0; N % 8 == 0 at out = 16; N % 16 == 0 at out = 8; epi < 2 at out = 8
#include "matmul_fp8_gemm.cuh"

#ifndef F8_TILE_ROWS
#error "F8_TILE_ROWS (128 or 192) is set by the host per shape"
#endif
#ifndef F8_TILE_COLS
#error "F8_TILE_COLS (128 or 256) is set by the host per shape"
#endif
#ifndef F8_GROUP_M
#error "F8_GROUP_M (row panels a group) is set by the host per shape"
#endif

// Recipe: fp8_staged_tiles with TwoHalvesWaited (setmaxnreg 24/240, fp8_consume_halves) at 128 x 256,
// stage 7's consumers otherwise, in Fp8TileGrouped over the tile; fp32 and bf16 outs.
using WideTileConsumers = Fp8ConsumersOfTile<F8_TILE_ROWS, F8_TILE_COLS>::type;
using WideTileOrder = Fp8TileGrouped<F8_TILE_ROWS, F8_GROUP_M, F8_TILE_COLS>;
FP8_STAGED_ENTRIES(linear_fp8_wide_tile, WideTileConsumers, WideTileOrder)
