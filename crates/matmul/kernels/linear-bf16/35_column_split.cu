// linear-bf16, stage 35: column-split (stage 30's consumers splitting the tile's columns, one
// WS_LAG K steps behind the other).
// Changed from stage 30: each consumer holds both 64-row halves of its WS_BN / 2 columns (two
//   wgmma.m64n(WS_BN/2)k16 sets) instead of 64 rows of all WS_BN columns (`WS_COLSPLIT`), and
//   consumer 1 starts once consumer 0 has run WS_LAG K steps (a tunable, swept 0-4); the ring is
//   as deep as fits (as stage 29), so that the lead leaves the producer stages to fill ahead.
// Why it should be faster: at M = 4096 and N = 768 every SM runs one 128 x 192 tile, and stage 30's
//   two consumers end its K loop together and store its 96 KiB at once, on all 128 busy SMs at
//   the same moment: the same per-SM work takes 15.9 us at M = 4096 and 11.3 us at M = 1024 (32
//   SMs), so the store's burst (12.6 MB of fp32) and the cold loads contend in L2 and DRAM.
//   With the columns split and one consumer WS_LAG steps ahead, half the tile (48 KiB) is
//   stored while the other half's last MMAs run, so half the burst leaves the SM early; the loads,
//   the bytes read from shared memory per MMA (A 128 rows + B WS_BN / 2 against A 64 + B WS_BN:
//   224 against 256 rows at 192 wide) and the registers (2 x 48 accumulators) do not grow.
//   Predicted: the attention projection and MLP down 3-6% faster than stage 30 at the best lag
//   (2-3), the residual tails as much or more (their residual loads move with the store), the
//   many-tile shapes within 2% (each consumer's store overlaps the other's next tile, as
//   ping-pong does, but the lead's first steps run one consumer's MMAs only); lag 0 equal to
//   stage 30 or up to 3% slower (the narrower wgmma).
// Contract: as stage 27 (`weight` is not the previous kernel's output).
// Launch: linear_bf16_column_split[_gelu|_residual]: as stage 30 (grid min(tiles, SMs), block
//   384, WS_BN picked per shape), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B +
//   2 * WS_BN * 4 B + 16 KiB of staging + 1 KiB + barriers (the ring as deep as fits: 6 stages
//   at 128 wide, 5 at 192, 4 at 256); the programmatic-serialization attribute.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; WS_LAG <= WG_STAGES; the
//   GELU and residual tails need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define EPI_BIAS_SMEM 1
#define EPI_STAGED 1
#define WS_PDL 1
#define WS_WEIGHTS_EARLY 1
#define WS_PDL_LAST_TILE 1
#define WS_COLSPLIT 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_column_split, 0)
LEAN_ENTRY(linear_bf16_column_split_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_column_split_residual, EPI_RESIDUAL)
