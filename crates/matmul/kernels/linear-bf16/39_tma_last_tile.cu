// linear-bf16, stage 39: tma-last-tile (stage 30 storing each block's last tile with the TMA, out of
// the ring its MMAs no longer need).
// Changed from stage 30: at the block's last tile, once both consumers' MMAs are done, each
//   consumer writes its 64 x WS_BN results (bias and GELU applied) into the ring's shared memory
//   in the output map's boxes (64 rows x 128 bytes, 128-byte swizzle), and one thread issues a box
//   store per 128 bytes of columns (`EPI_TMA_LAST`). Other tiles, the residual tail and outputs
//   whose rows are not a multiple of 16 bytes keep stage 30's staged store.
// Why it should be faster: `ladder timeline` (stages 29-31, this session) shows where a one-tile
//   SM's time goes at the attention projection: about 1 us to the first loads, 2.1 us until the
//   first ring stage lands, 6.1 us of MMAs, then 2.6 us to issue the 96 KiB staged store, which is
//   37-44 GB/s an SM both with 128 SMs storing at once and with 48 (M = 1024): the rate is the
//   store path's own (per warp: write the staging buffer, read it back, add the bias, store, six
//   times over), not the memory system's. Writing the tile to shared memory takes about a quarter
//   of that (96 KiB at 128 B a clock), and the TMA then moves it at the copy engine's rate.
//   Predicted: the store phase (last MMAs done to last store issued) from 2.6 us to under 1 us,
//   and the event time 1-1.5 us shorter at the attention projection and MLP down (6-9% and 3-4%),
//   if the L2 takes the 12.6 MB at the rate the TMA offers it; less at the many-tile shapes, where
//   only the last of several tiles changes.
// Contract: as stage 27 (`weight` is not the previous kernel's output).
// Launch: linear_bf16_tma_last_tile[_gelu|_residual]: as stage 30 (grid min(tiles, SMs), block 384,
//   WS_BN picked per shape), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B + 2 * WS_BN *
//   4 B + 16 KiB of staging + 1 KiB + barriers; arguments as stage 30's, then `out`'s tensor map and
//   whether it is valid (N % 4 == 0, or N % 8 == 0 for a bf16 output); the
//   programmatic-serialization attribute.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define EPI_BIAS_SMEM 1
#define EPI_STAGED 1
#define WS_PDL 1
#define WS_WEIGHTS_EARLY 1
#define WS_PDL_LAST_TILE 1
#define EPI_TMA_LAST 1
#include "matmul_wgmma_persistent.cuh"

TMA_LAST_ENTRY(linear_bf16_tma_last_tile, 0)
TMA_LAST_ENTRY(linear_bf16_tma_last_tile_gelu, EPI_GELU)
TMA_LAST_ENTRY(linear_bf16_tma_last_tile_residual, EPI_RESIDUAL)
