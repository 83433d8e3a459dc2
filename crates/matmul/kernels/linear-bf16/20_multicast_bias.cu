// linear-bf16, stage 20: multicast-bias (stage 18 in clusters of 2 sharing the W tile, as stage 14
// does for stage 12).
// Changed from stage 18: clusters of 2 blocks along M walk pairs of vertically adjacent tiles;
//   each producer loads its own A tile and half of the shared W tile, multicast by the TMA into
//   both blocks' rings; a ring stage is refilled once the consumers of both blocks have released
//   it (stage 14's mechanism, CTA-scope release).
// Why it should be faster: stage 14 found the multicast worth 0.93-0.98x of stage 12 at K = 768,
//   when the bias loads and a 100 KB store held the consumers; with both gone (stages 15 and 18)
//   the MMA loop is a larger share of the time, and cuBLASLt's kernels at every GPT-2 shape run
//   clusters of 2 (nvjet ..._1x2_...). Per K step a block reads (128 + WS_BN / 2) x 128 B from
//   L2 instead of (128 + WS_BN) x 128 B. Predicted: within +-3% of stage 18 at K = 768 (stage 14's
//   lesson: L2 traffic is not the limit there), 1-4% faster at 4096^3 and 8192^3.
// Launch: linear_bf16_multicast_bias[_gelu|_residual]: clusters of 2 along x, grid 2 x min(tile
//   pairs, clusters that fit at once), block 384, WS_BN picked per shape, dynamic shared memory
//   WG_STAGES * (128 + WS_BN) * 128 B + 2 * WS_BN * 4 B + 1 KiB + barriers; `residual` is read only
//   by the _residual entry.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define EPI_BIAS_SMEM 1
#define WS_MULTICAST 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_multicast_bias, 0)
LEAN_ENTRY(linear_bf16_multicast_bias_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_multicast_bias_residual, EPI_RESIDUAL)
