// linear-bf16, stage 23: ping-pong-multicast (stage 22 in clusters of 2 sharing the W tile, as
// stage 20 does for stage 18).
// Changed from stage 22: clusters of 2 blocks along M walk pairs of vertically adjacent tiles;
//   each producer loads its own A tile and half of the shared W tile, multicast into both blocks'
//   rings. The two blocks' walks are the same, so each ring stage is read by the same consumer in
//   both, and its empty barrier waits for those two (one arrival from each block).
// Why it should be faster: per K step a block reads (128 + WS_BN / 2) x 128 B from L2 instead of
//   (128 + WS_BN) x 128 B: 28 instead of 40 KiB at 192 wide. Stage 22's lead over cuBLASLt shrinks
//   from 1.14x in the table (300 ms a stage) to 1.06x in criterion (1.2 s a stage), while
//   cuBLASLt's own time moves 2%: under a sustained load the clock follows the power limit, and
//   cuBLASLt's kernels (clusters of 2 at every GPT-2 shape) move fewer bytes for the same flops.
//   Predicted: within +-3% of stage 22 in the table at K = 768 (stages 14 and 20 lost 3-10% to
//   their unicast stages there: two blocks' rings advance together), 2-6% faster than stage 22 in
//   criterion at QKV, MLP up and the GELU tail, 2-4% at 8192^3.
// Launch: linear_bf16_ping_pong_multicast[_gelu|_residual]: clusters of 2 along x, grid 2 x
//   min(tile pairs, clusters that fit at once), block 384, 128 x WS_BN tiles (192 declared, the
//   _residual entry run at 128), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B + 2 *
//   WS_BN * 4 B + 16 KiB of staging + 1 KiB + barriers; `residual` is read only by the _residual
//   entry.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define WS_PINGPONG 1
#define EPI_BIAS_SMEM 1
#define EPI_STAGED 1
#define WS_MULTICAST 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_ping_pong_multicast, 0)
LEAN_ENTRY(linear_bf16_ping_pong_multicast_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_ping_pong_multicast_residual, EPI_RESIDUAL)
