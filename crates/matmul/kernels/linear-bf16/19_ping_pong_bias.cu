// linear-bf16, stage 19: ping-pong-bias (stage 17's consumers taking turns, with stage 18's bias
// copy).
// Changed from stage 17: each consumer copies its tile's WS_BN bias values into shared memory
//   (cp.async) at the tile's start, as stage 18 does for stage 15.
// Why it should be faster: stage 17 hides one consumer's store under the other's MMAs only if the
//   store is shorter than a tile's MMAs; its store (a 128 x WS_BN tile per consumer) waits on the
//   bias loads for most of its time (Nsight Compute's stall sampling of stages 15 and 17 at MLP
//   up). Without that wait the store should fit under the other consumer's 12 K steps.
//   Predicted: MLP up, QKV and the GELU tail 5-15% faster than stage 18; the N = 768 shapes slower
//   (two turns on some SMs, as stage 17).
// Launch: linear_bf16_ping_pong_bias[_gelu|_residual]: as stage 17 (grid min(tiles, SMs), block
//   384, 128 x WS_BN tiles, 192 declared, the _residual entry run at 128), dynamic shared memory
//   WG_STAGES * (128 + WS_BN) * 128 B + 2 * WS_BN * 4 B + 1 KiB + barriers; `residual` is read
//   only by the _residual entry.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define WS_PINGPONG 1
#define EPI_BIAS_SMEM 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_ping_pong_bias, 0)
LEAN_ENTRY(linear_bf16_ping_pong_bias_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_ping_pong_bias_residual, EPI_RESIDUAL)
