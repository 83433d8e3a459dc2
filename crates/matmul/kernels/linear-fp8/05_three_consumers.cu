// linear-fp8, stage 5: three consumers (a third consumer warpgroup on 192 x 128 tiles).
// Changed from stage 4: the tile is 192 rows (an A box of 192 x 128 codes; three consumer
//   warpgroups of 64 rows and the producer, 512 threads) and a consumer waits for each K step's
//   wgmma before it promotes (fp8_consume_waited_staged: one partial tile; 24 registers for the
//   producer and 160 a consumer, though ptxas allocates at the 128 of 512 threads). The previous
//   tile's staged store still runs under the next tile's first step.
// Why it should be faster: stage 4 keeps the tensor pipe 60% busy at 4096^3 (33% at MLP up): two
//   consumers share it, and each still drains its own group every other step with 64 FFMA of
//   promotion between. A third warpgroup's wgmma fill the pipe while one promotes, instead of a
//   second partial tile per warpgroup (which does not fit 160 registers). A 192-row tile also
//   reads 17% fewer L2 bytes a flop, and it wave-fits GPT-2's shapes at M = 4096 (22 row tiles):
//   the N = 768 projections become 132 tiles, one wave of 132 SMs (stage 4: 192 tiles, 1.45
//   waves), QKV 396 (3.0 waves) and MLP up 528 (4.0). Predicted ~1.3x stage 4 at N = 768,
//   ~1.1x at QKV, MLP up and 8192^3, ~1.05x at 4096^3 (5.3 waves).
// Measured (H100, stage 4 and cuBLASLt's block-scaled FP8 in the same call): attn proj 1.11x, MLP
//   down 1.17x, QKV 1.10x, MLP up 1.04x, 8192^3 1.07x (951 TFLOP/s), 4096^3 0.84x; with a bf16
//   output 1.03-1.19x at the four block linears, 1.10-1.16x cuBLASLt. ncu: the tensor pipe 58% of
//   active cycles at 4096^3 (stage 4: 60%): the gain is the wave fit, not the third warpgroup.
//   Kept for GPT-2's shapes; at 4096^3 stage 4's 128-row tiles fit the waves better.
// Tails: stage 4's (bias, then GELU or a residual of out's type; fp32 or bf16 out).
// Launch: linear_fp8_three_consumers[_gelu|_residual][_bf16]: grid (min(tiles, SMs)), block 512
//   (producer + 3 consumer warpgroups), dynamic shared memory WG_STAGES * 40 KiB + 2 barriers a
//   stage, rounded up to 1 KiB, + three consumers' staging (3 x 32 KiB fp32, 3 x 16 KiB bf16) +
//   1 KiB (alignment); stage 4's arguments, A's tensor map in boxes of 192 rows.
// Constraints: stage 4's.
// Tolerance: 1e-2 preset against the f64 product of the dequantized operands.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 16 == 0; N % 4 == 0; N % 8 == 0 at out = 16; out = 32 or 16
#include "matmul_fp8_gemm.cuh"

// Recipe: fp8_staged_tiles with ThreeWaited (fp8_ring of 192-row A tiles, Fp8TileStride<192>,
// fp8_consumer of three warpgroups with fp8_produce_tiles, fp8_consume_waited_staged with
// Fp8StagedStore of the previous tile under its first step).
FP8_STAGED_ENTRIES(linear_fp8_three_consumers, ThreeWaited, Fp8TileStride<192>)
