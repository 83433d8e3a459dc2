// linear-bf16, stage 14: dependent-launch (stage 13 launched under the previous kernel's tail).
// Changed from stage 13 (launch part DependentLaunch<true, true>; switches WS_PDL, WS_WEIGHTS_EARLY,
//   WS_PDL_LAST_TILE): the kernel is a programmatic dependent launch. Its blocks wait for the previous grid (`griddepcontrol.wait`)
//   only after the prologue (barrier set-up, tensor-map reads); the producer first issues the W
//   tiles of its first ring stages, since weights are no kernel's output (the caller's contract,
//   `Prepared::reads_weight_early`); and a block lets the next grid launch only when its producer
//   starts the block's last tile, so the next grid is pending for the last tile round only.
// Why it should be faster: back to back (the model's regime, `--back-to-back`) a one-tile-per-SM
//   GEMM at N = 768 pays ~1 us of launch and prologue and ~2.5 us of first fill of a ~13-16 us
//   launch (the notes' timeline); both can run under the tail of the kernel before. In the default
//   table, where each launch stands alone behind a gate, nothing should change. Predicted (back to
//   back): N = 768 5-10% faster, the multi-tile shapes 1-3%.
// Measured (H100, 2026-11-23/25, back to back, against stage 13): the dependent launch 1.10x at
//   N = 768, 1.04-1.08x at QKV and MLP down, 1.02x at 4096^3, 0.95-0.98x at 8192^3 (a loss whose
//   cause is unexplained: the late trigger did not remove it); the weights early a further 1.02x at
//   N = 768 (1.04x in the default table too); the late trigger within noise. The best stage at
//   N = 768 (0.94-1.00x cuBLASLt in the default table, 1.07x back to back at the attention
//   projection, 2026-11-25) and at 4096^3. Kept.
// Contract: `weight` is not the previous kernel's output.
// Launch: linear_bf16_dependent_launch[_gelu|_residual]: as stage 13, with the
//   programmatic-serialization attribute.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#include "matmul_wgmma_persistent.cuh"

using Recipe = PersistentRecipe<GroupedOrder, DependentLaunch</*weights early*/ true, /*last-tile trigger*/ true>, Cooperative, EpiStaged>;

LEAN_ENTRY(linear_bf16_dependent_launch, Recipe, 0)
LEAN_ENTRY(linear_bf16_dependent_launch_gelu, Recipe, EPI_GELU)
LEAN_ENTRY(linear_bf16_dependent_launch_residual, Recipe, EPI_RESIDUAL)
