// linear-bf16, stage 24: multicast-staged (stage 21 in clusters of 2 sharing the W tile, as stage
// 20 does for stage 18).
// Changed from stage 21: clusters of 2 blocks along M walk pairs of vertically adjacent tiles;
//   each producer loads its own A tile and half of the shared W tile, multicast into both blocks'
//   rings (stage 14's mechanism).
// Why it should be faster: at 4096^3 cuBLASLt runs nvjet_sm90_tss_256x128_64x4_1x2_..._coopA:
//   256 x 128 tiles of two consumers in clusters of 2 sharing one operand, the same bytes per flop
//   as this stage's 128 x 256 tiles sharing W. Nsight Compute (one launch, clocks free) puts
//   stage 21 at 189.5 us against cuBLASLt's 184.7 with the tensor pipe equally busy (88.6% and
//   89.8%), but stage 21 moves 1.44 GB through L2 against 1.14 and reads 187 MB from DRAM against
//   151. Back to back (the table) the H100 sits at its 700 W cap and the gap widens to 0.90x: the
//   clock follows the power, and moving bytes costs power. Stage 20 shares W without stage 21's
//   staged store. Predicted: 4096^3 and 8192^3 3-6% faster than stage 21 in the table; the K =
//   768 shapes 3-10% slower (stages 14, 20 and 23 there: two blocks' rings advance together).
// Launch: linear_bf16_multicast_staged[_gelu|_residual]: clusters of 2 along x, grid 2 x min(tile
//   pairs, clusters that fit at once), block 384, WS_BN picked per shape, dynamic shared memory
//   WG_STAGES * (128 + WS_BN) * 128 B + 2 * WS_BN * 4 B + 16 KiB of staging + 1 KiB + barriers;
//   `residual` is read only by the _residual entry.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define EPI_BIAS_SMEM 1
#define EPI_STAGED 1
#define WS_MULTICAST 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_multicast_staged, 0)
LEAN_ENTRY(linear_bf16_multicast_staged_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_multicast_staged_residual, EPI_RESIDUAL)
