// linear-bf16, stage 28: ping-pong-weights-early (stage 26 with stage 27's early W loads).
// Changed from stage 26: the producer issues the W tiles of the block's first WG_STAGES K steps
//   before its `griddepcontrol.wait`, the consumers wait on their own (stage 27's change).
// Why it should be faster: as stage 27: the first W fetch from DRAM runs under the previous
//   kernel's tail. Predicted (back to back): about 1% at QKV, MLP up and the GELU tail, nothing in
//   the table or at 8192^3.
// Contract: `weight` must not be written by the kernel just before this one in the stream.
// Launch: linear_bf16_ping_pong_weights_early[_gelu|_residual]: as stage 26 (grid min(tiles,
//   SMs), block 384, 128 x WS_BN tiles, 192 declared, the residual entry at 128), dynamic shared
//   memory WG_STAGES * (128 + WS_BN) * 128 B + 2 * WS_BN * 4 B + 16 KiB of staging + 1 KiB +
//   barriers; the programmatic-serialization attribute.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Switches: EPI_PREFETCH, EPI_LEAN, WS_PINGPONG, EPI_BIAS_SMEM, EPI_STAGED, WS_PDL and
//   WS_WEIGHTS_EARLY (stage 26's and this stage's), set by the stage list rather than here, so that
//   leave-one-out (`ladder run matmul --op linear-bf16 --leave-one-out`) can take each away: a row
//   `all-X` lacks X and the switches that build on it (EPI_LEAN on EPI_PREFETCH, EPI_BIAS_SMEM on
//   EPI_LEAN, EPI_STAGED on EPI_BIAS_SMEM, WS_WEIGHTS_EARLY on WS_PDL).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_ping_pong_weights_early, 0)
LEAN_ENTRY(linear_bf16_ping_pong_weights_early_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_ping_pong_weights_early_residual, EPI_RESIDUAL)
