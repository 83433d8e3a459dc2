// linear-bf16, stage 16: group-fit (stage 15 with the tile order fitted to the L2).
// Changed from stage 15 (host switch WS_GROUP_FIT): nothing in the kernel. WS_GROUP_M, the row
//   panels the walk takes at a time (their tiles column by column), is a define the host sets per
//   shape (`group_fit`) instead of the tunable 8. Where W (N x K bf16) fits in the L2 it stays 8.
//   Where it does not, it is the most row panels whose A rows (WS_GROUP_M x 128 x K bf16) fit in
//   half the L2, all of them when they fit.
// Why it should be faster: the walk fetches W from DRAM once per pass over the columns, and there
//   are ceil(tiles_m / WS_GROUP_M) passes. At the padded LM head (W 77 MB, A 6.3 MB, 32 row panels)
//   a group of 8 reads W 4 times, 309 MB beside the 824 MB fp32 output; all 32 panels read it
//   once. Predicted: the padded LM head 5% faster than stage 15, the odd one 1%, 4096^3 and 8192^3
//   within 2%, the GPT-2 block shapes the same kernel as stage 15.
// Measured (H100, 2026-11-25, against stage 15): the padded LM head 0.99-1.01x (1.05x in the sweep
//   that motivated it), the odd LM head 1.02x (1.95x cuBLASLt, whose odd-N
//   kernel is slow), the others within noise. Kept as the last rung: `--leave-one-out` takes each
//   of its nine switches away.
// Contract: `weight` is not the previous kernel's output.
// Launch: linear_bf16_group_fit[_gelu|_residual]: as stage 15.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#include "matmul_wgmma_persistent.cuh"

// Stage 15's parts, each picked by its switch, so that a leave-one-out row (one switch off, and with
// it the switches built on it) compiles that axis's previous part.
using Recipe = PersistentRecipe<
    GroupedOrder,
    Pick<LADDER_SWITCH(WS_PDL), DependentLaunch<LADDER_SWITCH(WS_WEIGHTS_EARLY), LADDER_SWITCH(WS_PDL_LAST_TILE)>, StreamOrdered>,
    Pick<LADDER_SWITCH(WS_PINGPONG), PingPong, Cooperative>,
    Pick<LADDER_SWITCH(EPI_STAGED), EpiStaged,
         Pick<LADDER_SWITCH(EPI_BIAS_SMEM), EpiBiasSmem,
              Pick<LADDER_SWITCH(EPI_LEAN), EpiLean, Pick<LADDER_SWITCH(EPI_PREFETCH), EpiPrefetch, EpiChecked>>>>>;

LEAN_ENTRY(linear_bf16_group_fit, Recipe, 0)
LEAN_ENTRY(linear_bf16_group_fit_gelu, Recipe, EPI_GELU)
LEAN_ENTRY(linear_bf16_group_fit_residual, Recipe, EPI_RESIDUAL)
