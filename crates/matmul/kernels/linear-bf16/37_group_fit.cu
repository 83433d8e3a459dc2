// linear-bf16, stage 37: group-fit (stage 31 with the tile order's group of row panels picked per
// shape, so that where the weights overflow L2 each W tile comes from DRAM as few times as the L2
// allows).
// Changed from stage 31: nothing in the kernel. WS_GROUP_M, the row panels the walk takes at a
//   time (walking their tiles column by column), is a define the host sets per shape
//   (`group_fit`), not the tunable 8 of stages 9-36. Where W (N x K bf16) fits in the L2 it stays
//   8. Where it does not, it is the most row panels whose A rows (WS_GROUP_M x 128 x K bf16) fit in
//   half the L2, all of them when they fit.
// Why it should be faster: the walk fetches W from DRAM once per pass over the columns, and there
//   are ceil(tiles_m / WS_GROUP_M) passes. At the padded LM head (W 77 MB, A 6.3 MB, 32 row panels)
//   a group of 8 reads W 4 times: 309 MB beside the 824 MB fp32 output. All 32 panels read it once
//   (77 MB), and the 6.3 MB of A stay in L2 over the walk. That is 20% of the launch's DRAM
//   traffic, while its ping-pong consumers keep the store under the MMAs. The stage-31 sweep of
//   this session over WS_GROUP_M at that shape (sweep-31-lmhead-50304-group-m.txt) gave 587.0 us
//   at 8 against 554.5 at 16 and 556.3 at 32.
//   Predicted (default table): the padded LM head 5% faster than stage 31; the odd LM head 1%
//   (the sweep: 1.707 against 1.683 ms); 4096^3 (a group of 25) and 8192^3 (12) within 2%; the
//   GPT-2 block shapes, where W fits in L2 and the group stays 8, the same kernel as stage 31.
// First model, measured and replaced: W's bound was half the L2 too, which gave 4096^3 (W 32 MB,
//   64% of the L2) a group of 25, 2-6% slower than stage 31's 8 in all three timing regimes. The
//   model now keeps 8 wherever W fits in the L2.
// Contract: as stage 28 (`weight` is not the previous kernel's output).
// Launch: linear_bf16_group_fit[_gelu|_residual]: as stage 31 (grid min(tiles, SMs), block 384,
//   128 x WS_BN tiles, 192 declared, the residual entry at 128), dynamic shared memory
//   WG_STAGES * (128 + WS_BN) * 128 B + 2 * WS_BN * 4 B + 16 KiB of staging + 1 KiB + barriers;
//   the programmatic-serialization attribute.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; WS_GROUP_M >= 1; the GELU and
//   residual tails need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
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

LEAN_ENTRY(linear_bf16_group_fit, 0)
LEAN_ENTRY(linear_bf16_group_fit_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_group_fit_residual, EPI_RESIDUAL)
