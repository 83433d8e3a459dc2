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
// Out = 8 (e4m3, the first stage with it): linear_fp8_group_fit[_gelu]_e4m3 store the tile plus
//   the bias (then GELU) as e4m3 codes with one fp32 scale per row per 128 columns, matmul::fp8's
//   activation format (Fp8QuantizedStore), so the next linear reads them with no quantizer pass. For
//   the fp8 plan's MLP up at B = 4, T = 1024 (N = 3072) that replaces a bf16 store (25 MB) and
//   quantize-fp8's row pass over it (25 MB read, 12.6 MB of codes written, 19.3 us) with a store
//   of 12.6 MB of codes and the scales: predicted ~19 us (~0.23 ms over the 12 layers) off the
//   plan's prefill, the linear itself as with a bf16 out.
// Launch: linear_fp8_group_fit[_gelu|_residual][_bf16] and [_gelu]_e4m3: stage 6's, the e4m3 ones
//   with 8 KiB of staging a consumer, out's map in boxes of 128 codes x 64 rows and the scales
//   (M x ceil(N / 128) fp32) as the last argument.
// Constraints: stage 4's; at out = 8 no residual tail and N % 16 == 0 (16-byte rows of codes).
// Tolerance: 1e-2 preset against the f64 product of the dequantized operands; at out = 8 each
//   dequantized element against e4m3's rounding bound at the kernel's scale (fp8::rounding_bound),
//   the scales against the reference rows' amax / 448.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 16 == 0; N % 4 == 0; N % 8 == 0 at out = 16; N % 16 == 0 at out = 8; epi < 2 at out = 8
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
FP8_QUANTIZED_ENTRIES(linear_fp8_group_fit, GroupFitConsumers, GroupFitOrder)
