// linear-bf16, stage 38: descriptor-prefetch (stage 30 with both tensor maps prefetched into the
// TMA unit as each block starts).
// Changed from stage 30: thread 0 issues `prefetch.tensormap` for the A and W tensor maps before it
//   initializes the ring's barriers (`WS_TMAP_PREFETCH`).
// Why it should be faster: a TMA load reads its 128-byte tensor map from the kernel's parameters.
//   At the first load through a map the TMA unit does not hold it yet, and the load waits for that
//   fetch before it asks for any operand. At the N = 768 shapes every SM runs one tile, so the first
//   ring fill is on the critical path once per launch. The prefetch starts the fetch during the
//   barrier set-up instead. Predicted: `ladder timeline` puts consumer 0's first stage landed the
//   length of one descriptor fetch earlier (0.2-0.5 us) at the attention projection and MLP down;
//   the event time moves by as much there (1-3%), and by under 1% at the many-tile shapes, where the
//   fill happens once in a run of several tiles.
// Contract: as stage 27 (`weight` is not the previous kernel's output).
// Launch: linear_bf16_descriptor_prefetch[_gelu|_residual]: as stage 30 (grid min(tiles, SMs),
//   block 384, WS_BN picked per shape), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B +
//   2 * WS_BN * 4 B + 16 KiB of staging + 1 KiB + barriers; the programmatic-serialization
//   attribute.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define EPI_BIAS_SMEM 1
#define EPI_STAGED 1
#define WS_PDL 1
#define WS_WEIGHTS_EARLY 1
#define WS_PDL_LAST_TILE 1
#define WS_TMAP_PREFETCH 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_descriptor_prefetch, 0)
LEAN_ENTRY(linear_bf16_descriptor_prefetch_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_descriptor_prefetch_residual, EPI_RESIDUAL)
