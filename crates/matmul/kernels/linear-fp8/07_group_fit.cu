// linear-fp8, stage 7: group-fit (stage 6 walking its tiles a group of row panels at a time).
// Changed from stage 6: the persistent walk takes F8_GROUP_M row panels at a time, column by column
//   (Fp8TileGrouped, linear-bf16's grouped order), instead of every column of one row panel before
//   the next. The host fits the group per shape: where W (N x K codes) fits in half the L2, one
//   row panel (stage 6's walk); where it does not, the most row panels whose A rows fit in half the
//   L2, all of them where they fit, so W comes from DRAM once.
// Why it should be faster: stages 3-6 walk row panel by row panel, so every panel reads all of W
//   again. GPT-2's LM head at N = 50304 (the model's padded vocabulary) has 38.6 MB of W codes against
//   a 50 MB L2 that its 412 MB of bf16 logits stream through: stage 6 (128-row tiles there) reads W
//   from DRAM once a row panel, 32 times, 1.2 GB, ~0.4 ms at 3 TB/s, as long as its 0.53 ms. With
//   every panel in one group W is read once and the head is bound by its 316 GFLOP and its store.
//   8192^3 (W 64 MB) reads W 3 times instead of 43. Predicted: the LM head ~1.4x stage 6, 8192^3
//   ~1.05x, GPT-2's block linears and 4096^3 (W within the L2) as stage 6.
// Measured (H100, stage 6 and cuBLASLt in the same call): the LM head 372.0 us against 511.9
//   (1.38x; cuBLASLt 358.0, 0.96x), 8192^3 (16 panels) 0.99x. With the declared group of 8 where W
//   fits, GPT-2's block linears and 4096^3 were 0.96-0.99x stage 6; the group there is now 1,
//   stage 6's walk.
// Launch: linear_fp8_group_fit[_gelu|_residual][_bf16]: stage 6's.
// Constraints: stage 4's.
// Tolerance: 1e-2 preset against the f64 product of the dequantized operands.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 16 == 0; N % 4 == 0; N % 8 == 0 at out = 16
#include "matmul_fp8_gemm.cuh"

#ifndef F8_TILE_ROWS
#error "F8_TILE_ROWS (128 or 192) is set by the host per shape"
#endif
#ifndef F8_GROUP_M
#error "F8_GROUP_M (row panels a group) is set by the host per shape"
#endif

// Recipe: fp8_staged_tiles with stage 6's consumers of the shape's rows and Fp8TileGrouped.
using GroupFitConsumers = Fp8ConsumersOfRows<F8_TILE_ROWS>::type;
using GroupFitOrder = Fp8TileGrouped<F8_TILE_ROWS, F8_GROUP_M>;
FP8_STAGED_ENTRIES(linear_fp8_group_fit, GroupFitConsumers, GroupFitOrder)
