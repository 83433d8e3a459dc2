// linear-bf16, stage 40: weights-early-one (stage 30 loading the W tile of only the first K step,
// not of the ring's first WG_STAGES steps, before it waits for the previous grid).
// Changed from stage 30: the W tiles issued before `griddepcontrol.wait` are a tunable, WS_EARLY,
//   declared 1 and swept 1-4 (stage 30: the ring's depth, 4). The other W tiles are issued with
//   their A tiles, in step order.
// Why it should be faster: `ladder timeline` at the attention projection (default timing: no
//   kernel before this one to wait for) has the producer past the wait 1.0 us after the block
//   starts, and the first ring stage landing 2.5 us after that. At K = 64, where the ring holds one
//   step and only its W tile goes early, the same interval is 1.3 us. With four W tiles issued
//   first, a block's first A tile queues behind 96 KiB of W (12 MB over the grid, from 0.4 MB of
//   distinct W) on the SM's TMA and L2 paths, and the first MMA waits for it. Predicted (default
//   table): the first stage lands 0.5-1 us earlier at the N = 768 shapes, the event time 3-6% lower
//   at the attention projection and 1-3% at MLP down; back to back, where the early tiles come in
//   under the previous kernel's tail, up to 2% slower; the many-tile shapes within 1%.
// Contract: as stage 27 (`weight` is not the previous kernel's output).
// Launch: linear_bf16_weights_early_one[_gelu|_residual]: as stage 30 (grid min(tiles, SMs),
//   block 384, WS_BN picked per shape), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B +
//   2 * WS_BN * 4 B + 16 KiB of staging + 1 KiB + barriers; the programmatic-serialization
//   attribute.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; 1 <= WS_EARLY <= WG_STAGES;
//   the GELU and residual tails need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define EPI_BIAS_SMEM 1
#define EPI_STAGED 1
#define WS_PDL 1
#define WS_WEIGHTS_EARLY 1
#define WS_PDL_LAST_TILE 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_weights_early_one, 0)
LEAN_ENTRY(linear_bf16_weights_early_one_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_weights_early_one_residual, EPI_RESIDUAL)
