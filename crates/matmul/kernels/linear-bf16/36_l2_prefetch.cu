// linear-bf16, stage 36: l2-prefetch (stage 30 with the operands of the walk's first K steps fetched
// into L2 at the start).
// Changed from stage 30: once the ring's first WG_STAGES loads are issued, the producer issues TMA
//   prefetches into L2 (cp.async.bulk.prefetch.tensor) for the A and W boxes of the K steps after
//   them, up to step WS_L2_WINDOW of its walk (`WS_L2_PREFETCH`; WS_L2_WINDOW a tunable, swept);
//   W's before the wait for the previous grid, A's after it. Each box is fetched by one block of
//   the grid: the one whose tile column (A) or row (W) equals the K step modulo the tile columns
//   (rows), so the grid asks for each distinct byte once and no SM's TMA takes on more than a few
//   boxes. No shared memory, no consumer registers, nothing in the K loop.
// Why it should be faster: where a launch's operands are not in L2 (the default table rotates its
//   inputs over 3x L2), the ring paces each SM's DRAM requests to its MMAs: WG_STAGES steps in
//   flight, 608 KB of distinct A and W a K step over all 128 SMs at N = 768. The eleventh session
//   measured that at M = 4096 and N = 768 the first dozen K steps cost 0.55 us each, against
//   0.37 us on 32 SMs and 0.45 us for a K step further on: they wait on DRAM. Asking for the
//   window at once lets DRAM run at its rate from the start and the ring's later loads hit L2.
//   Predicted (default table): attention projection (K = 768: the whole K range at
//   WS_L2_WINDOW >= 12) 3-7% faster than stage 30, MLP down 2-4%; back to back and the many-tile
//   shapes within 2%. If it does not move, the first steps wait not on the operands' DRAM fetch
//   but on the earlier launches' dirty lines and the store.
// First version, measured and replaced: every block prefetched its own A and W boxes WS_L2_AHEAD
//   steps ahead of every ring load, A's window before the ring's first A loads. It was 13-120%
//   slower than stage 30 at every shape in both regimes. The likely cause: a prefetch costs the
//   SM's TMA about what a load does, so the ring's loads queued behind twice the boxes.
// Contract: as stage 27 (`weight` is not the previous kernel's output).
// Launch: linear_bf16_l2_prefetch[_gelu|_residual]: as stage 30 (grid min(tiles, SMs), block 384,
//   WS_BN picked per shape), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B +
//   2 * WS_BN * 4 B + 16 KiB of staging + 1 KiB + barriers; the programmatic-serialization
//   attribute.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; WS_L2_WINDOW > WG_STAGES; the
//   GELU and residual tails need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define EPI_BIAS_SMEM 1
#define EPI_STAGED 1
#define WS_PDL 1
#define WS_WEIGHTS_EARLY 1
#define WS_PDL_LAST_TILE 1
#define WS_L2_PREFETCH 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_l2_prefetch, 0)
LEAN_ENTRY(linear_bf16_l2_prefetch_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_l2_prefetch_residual, EPI_RESIDUAL)
