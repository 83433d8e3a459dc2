// linear-bf16, stage 32: cooperative-256 (stage 30 on 256-row tiles, each consumer 128 rows in two
// accumulator sets).
// Changed from stage 30: the tile is 256 x WS_BN (WS_BM 256, a define of the stage list) and each
//   of the two consumer warpgroups takes 128 of its rows as two 64 x WS_BN accumulator sets (two
//   wgmma.m64nWS_BNk16 per K step of 16, on two A sub-tiles and the one shared W tile), as stage
//   17's ping-pong consumer does, but the two work on the same tile at once. The host picks WS_BN
//   from {128, 192} by the wave model with 256-row tiles: 128 at 4096^3 and 8192^3, 192 where the
//   rounds tie (QKV, MLP up, the padded LM head); the residual entry runs 128 wide (at 192 its
//   loads spill beside two sets, as in the ping-pong stages).
// Why it should be faster: it is the tile of cuBLASLt's kernels at these shapes
//   (`nvjet_sm90_tss_256x128_64x4_...`). At 4096^3 it makes the same 512 tiles as stage 30's
//   128 x 256 (3.9 rounds of 132) and loads the same 384 rows of 128 bytes a K step, so the bytes
//   and the rounds give it nothing; what changes is the instruction mix: 128 accumulators a thread
//   in two m64n128 sets instead of one m64n256, and per K step of 16 a consumer reads 12 KiB of
//   shared memory instead of 10 (W is read once per set), 96 instead of 80 bytes a cycle at the
//   tensor cores' rate, under the 128 the SM delivers. Predicted: 4096^3 and 8192^3 within 2% of
//   stage 30 either way (the experiment the seventh and eighth sessions left: whether cuBLASLt's
//   shape is what closes their last 2-3% at 4096^3); the N = 768 shapes 0.75x of stage 30 (96
//   tiles of 256 x 128 on 132 SMs), the K = 768 multi-tile shapes within a few %.
// Contract: as stage 27 (`weight` is not the previous kernel's output).
// Launch: linear_bf16_cooperative_256[_gelu|_residual]: grid min(tiles, SMs), block 384, dynamic
//   shared memory WG_STAGES * (256 + WS_BN) * 128 B (the ring as deep as fits, at most WG_STAGES:
//   4 at 128 wide, 3 at 192) + 2 * WS_BN * 4 B + 16 KiB of staging + 1 KiB + barriers; the
//   programmatic-serialization attribute.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies); WS_BN <= 192.
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define EPI_BIAS_SMEM 1
#define EPI_STAGED 1
#define WS_PDL 1
#define WS_WEIGHTS_EARLY 1
#define WS_PDL_LAST_TILE 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_cooperative_256, 0)
LEAN_ENTRY(linear_bf16_cooperative_256_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_cooperative_256_residual, EPI_RESIDUAL)
