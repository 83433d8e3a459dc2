// linear-fp8, stage 4: staged epilogue (a tile's store runs under the next tile's first K step).
// Changed from stage 3: a consumer no longer stores its finished tile from registers with the
//   tensor cores idle. It issues the next tile's first four wgmma, then (Fp8StagedStore) writes the
//   finished accumulator plus the bias into its own 32 KiB of shared memory in the TMA's 128-byte
//   swizzle, and one thread stores it with four TMA stores; the next tile's promotion starts into
//   the zeroed accumulator only after that. The last tile is stored after the loop and waited for.
// Why it should be faster: stage 3 spends, per tile and warpgroup, 64 STG.64 with their bounds
//   checks and address math (and the bias loads) between two tiles' MMA; at GPT-2's K = 768 a tile
//   has only six K steps (~1.7 us at the FP8 rate), so that store is a large share. Here the
//   warpgroup's own next step runs under it, and the stores themselves leave as four bulk copies
//   of whole 128-byte lines. Predicted ~1.1x stage 3 at the K = 768 shapes, ~1.03x at 4096^3.
// Measured (H100, stage 3 in the same call): QKV 1.21x (33.5 us), MLP up 1.17x (40.1), attn proj
//   1.00x, MLP down 1.02x; 4096^3 and 8192^3 0.98x. Against cuBLASLt's block-scaled FP8, same call:
//   0.93x at QKV, 0.90x at MLP up. ncu at MLP up: tensor pipe 33% of active cycles (stage 3: 25%),
//   long-scoreboard stalls 2.1 (4.7). Kept for the multi-wave K = 768 shapes; at large K the staging
//   (64 STS, two named barriers) delays the next step's issue by more than the store it replaces.
//   With the tails (a later call): MLP up with GELU into bf16 35.7 us (30.1 without), attn proj and
//   MLP down adding an fp32 residual 22.9 and 39.1 us.
// Tails: the bias, then GELU (_gelu, the SFU's tanh form) or plus a residual of out's type
//   (_residual; it may be out itself, since a tile reads its residual before it is stored), as
//   linear-bf16's. The first stage with a tail or a bf16 output (stage 5 keeps them).
// Launch: linear_fp8_staged_epilogue[_gelu|_residual][_bf16] (fp32 or bf16 out): stage 3's grid and
//   block; dynamic shared memory WG_STAGES * 32 KiB +
//   2 barriers a stage, rounded up to 1 KiB, + two consumers' staging (2 x 32 KiB fp32, 2 x 16 KiB
//   bf16) + 1 KiB (alignment); a third CUtensorMap (out, boxes of 128 bytes x 64 rows) after stage
//   3's arguments, then the residual.
// Constraints: stage 3's, and 16-byte rows of out for the TMA: N % 4 == 0 (fp32), N % 8 == 0 (bf16).
// Tolerance: 1e-2 preset against the f64 product of the dequantized operands.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 16 == 0; N % 4 == 0; N % 8 == 0 at out = 16; out = 32 or 16
#include "matmul_fp8_gemm.cuh"

// Recipe: fp8_staged_tiles with TwoOverlapped (fp8_ring, Fp8TileStride, fp8_consumer with
// fp8_produce_tiles, fp8_consume_overlapped with Fp8StagedStore of the previous tile under its first
// step).
FP8_STAGED_ENTRIES(linear_fp8_staged_epilogue, TwoOverlapped, Fp8TileStride<128>)
