// linear-bf16, stage 26: ping-pong-dependent (stage 22 launched as a programmatic dependent of the
// kernel before it in the stream).
// Changed from stage 22: stage 25's `griddepcontrol` pair (launch_dependents as a block starts,
//   wait after its prologue) and the programmatic-serialization launch attribute.
// Why it should be faster: as stage 25: the launch and the prologue run under the previous
//   kernel's tail instead of after it. Predicted: no change in the table (each launch between its
//   own events); back to back (criterion) 1-3% at QKV, MLP up and the GELU tail, where stage 22 is
//   the fastest stage, under 1% at 8192^3 and the padded LM head.
// Launch: linear_bf16_ping_pong_dependent[_gelu|_residual]: as stage 22 (grid min(tiles, SMs),
//   block 384, 128 x WS_BN tiles, 192 declared, the residual entry at 128), dynamic shared memory
//   WG_STAGES * (128 + WS_BN) * 128 B + 2 * WS_BN * 4 B + 16 KiB of staging + 1 KiB + barriers;
//   the programmatic-serialization attribute.
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
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_ping_pong_dependent, 0)
LEAN_ENTRY(linear_bf16_ping_pong_dependent_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_ping_pong_dependent_residual, EPI_RESIDUAL)
