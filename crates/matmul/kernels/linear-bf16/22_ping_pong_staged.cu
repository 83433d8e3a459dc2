// linear-bf16, stage 22: ping-pong-staged (stage 19 with stage 21's staged store).
// Changed from stage 19: interior tiles stored through each warp's staging buffer in whole
//   128-byte lines, as stage 21 does for stage 18.
// Why it should be faster: stage 19 hides one consumer's store under the other's MMAs only while
//   the store is shorter than a tile's MMAs, and the LSU queue the STGs fill is shared by both
//   consumers; half the store instructions and a quarter of the line requests make the store
//   shorter and leave the queue to the TMA-fed MMAs. The residual pairs (8 x 2 float2 a chunk) are
//   gone from the registers, so the residual entry may fit at 192 wide. Predicted: QKV, MLP up and
//   the GELU tail 1-3% faster than stage 19, the N = 768 shapes 3-6%, the residual tails 5-15%.
// Launch: linear_bf16_ping_pong_staged[_gelu|_residual]: as stage 19 (grid min(tiles, SMs), block
//   384, 128 x WS_BN tiles, 192 declared), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B
//   + 2 * WS_BN * 4 B + 16 KiB of staging + 1 KiB + barriers; `residual` is read only by the
//   _residual entry.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define WS_PINGPONG 1
#define EPI_BIAS_SMEM 1
#define EPI_STAGED 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_ping_pong_staged, 0)
LEAN_ENTRY(linear_bf16_ping_pong_staged_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_ping_pong_staged_residual, EPI_RESIDUAL)
