// linear-fp8, stage 6: wave-fit (stage 4's 128-row tile or stage 5's 192-row tile, chosen per shape).
// Changed from stage 5: the host picks the tile's rows F8_TILE_ROWS from {192, 128} for each shape
//   by linear-bf16 stage 11's wave model along M: the rows that minimize rounds x rows, where
//   rounds = ceil(ceil(M / rows) * ceil(N / 128) / SMs), 192 winning ties (fewer L2 bytes a flop).
//   At 192 the kernel is stage 5's (three consumers, each step waited for, three ring stages); at
//   128 it is stage 4's (two consumers overlapping the promotion, four ring stages). 192 where no
//   shape is known.
// Why it should be faster: stage 5 wins where its 192-row tiles fit the SMs' waves (GPT-2's block
//   linears at M = 4096: one wave at N = 768) and loses 16% at 4096^3, where 704 tiles make 5.3
//   waves against stage 4's 1024 in 7.8. The model picks 192 at GPT-2's four block linears and at
//   8192^3, 128 at 4096^3. Predicted: stage 5's time where it picks 192, stage 4's (1.19x stage 5)
//   at 4096^3.
// Measured (H100, stages 4 and 5 and cuBLASLt in the same call): 4096^3 143.0 us (1.21x stage 5,
//   1.02x stage 4; 961 TFLOP/s), 8192^3 1.01x stage 5; GPT-2's block linears as stage 5 (0.99-1.01x).
//   Against cuBLASLt's block-scaled FP8: 1.11-1.16x at the four block linears with a bf16 output,
//   0.94-1.04x in fp32, 0.89x at 4096^3, 0.82x at 8192^3.
// Launch: linear_fp8_wave_fit[_gelu|_residual][_bf16]: stage 4's launch (block 384, four ring
//   stages) at 128 rows, stage 5's (block 512, three) at 192; A's tensor map in boxes of the rows.
// Constraints: stage 4's.
// Tolerance: 1e-2 preset against the f64 product of the dequantized operands.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 16 == 0; N % 4 == 0; N % 8 == 0 at out = 16; out = 32 or 16
#include "matmul_fp8_gemm.cuh"

#ifndef F8_TILE_ROWS
#error "F8_TILE_ROWS (128 or 192) is set by the host per shape"
#endif

// Recipe: fp8_staged_tiles with TwoOverlapped at 128 rows (stage 4), ThreeWaited at 192 (stage 5).
using WaveFitConsumers = Fp8ConsumersOfRows<F8_TILE_ROWS>::type;
FP8_STAGED_ENTRIES(linear_fp8_wave_fit, WaveFitConsumers, Fp8TileStride<F8_TILE_ROWS>)
