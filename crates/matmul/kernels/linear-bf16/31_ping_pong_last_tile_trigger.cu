// linear-bf16, stage 31: ping-pong-last-tile-trigger (stage 28 with stage 30's trigger).
// Changed from stage 28: a block lets the next grid launch when its producer starts the block's
//   last tile (`WS_PDL_LAST_TILE`), not as the block starts.
// Why it should be faster: as stage 30, for the ping-pong stages, which lose 6% at 8192^3 back to
//   back (stage 26 against 22). Predicted (back to back): 8192^3 back to stage 22's time if the
//   pending grid is the cause; QKV, MLP up and the LM heads (2-64 tiles a block) within 1% of
//   stage 28.
// Contract: as stage 28 (`weight` is not the previous kernel's output).
// Launch: linear_bf16_ping_pong_last_tile_trigger[_gelu|_residual]: as stage 28 (grid min(tiles,
//   SMs), block 384, 128 x WS_BN tiles, 192 declared, the residual entry at 128), dynamic shared
//   memory WG_STAGES * (128 + WS_BN) * 128 B + 2 * WS_BN * 4 B + 16 KiB of staging + 1 KiB +
//   barriers; the programmatic-serialization attribute.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define WS_PINGPONG 1
#define EPI_BIAS_SMEM 1
#define EPI_STAGED 1
#define WS_PDL 1
#define WS_WEIGHTS_EARLY 1
#define WS_PDL_LAST_TILE 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_ping_pong_last_tile_trigger, 0)
LEAN_ENTRY(linear_bf16_ping_pong_last_tile_trigger_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_ping_pong_last_tile_trigger_residual, EPI_RESIDUAL)
