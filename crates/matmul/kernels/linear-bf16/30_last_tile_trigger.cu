// linear-bf16, stage 30: last-tile-trigger (stage 27 letting the next grid launch only at its last
// tile).
// Changed from stage 27: a block executes `griddepcontrol.launch_dependents` when its producer
//   starts the block's last tile, not as the block starts (`WS_PDL_LAST_TILE`).
// Why it should be faster: stages 25-29 lose 2-7% at 8192^3 back to back (not in the table, where
//   nothing follows a launch), while a block there walks 15-16 tiles. One candidate cause: the next
//   grid is pending for the whole run, its blocks landing on each SM that one of ours leaves. With
//   the trigger at the last tile the next grid is pending only during the last tile round; where
//   a block has one tile (the N = 768 shapes) the trigger comes as early as stage 27's. Predicted
//   (back to back): 8192^3 back to stage 21's time if that is the cause, no change elsewhere; if
//   8192^3 still loses, the pending grid is not the cause.
// Contract: as stage 27 (`weight` is not the previous kernel's output).
// Launch: linear_bf16_last_tile_trigger[_gelu|_residual]: as stage 27 (grid min(tiles, SMs),
//   block 384, WS_BN picked per shape), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B +
//   2 * WS_BN * 4 B + 16 KiB of staging + 1 KiB + barriers; the programmatic-serialization
//   attribute.
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
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_last_tile_trigger, 0)
LEAN_ENTRY(linear_bf16_last_tile_trigger_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_last_tile_trigger_residual, EPI_RESIDUAL)
