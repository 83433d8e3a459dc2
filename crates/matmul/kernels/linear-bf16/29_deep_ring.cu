// linear-bf16, stage 29: deep-ring (stage 27 with the ring as deep as fits at the fitted width).
// Changed from stage 27: nothing in the kernel. Rust sets WG_STAGES per shape to the most ring
//   stages that fit in shared memory beside the bias copies and the staging buffers, at most the
//   declared 6: 6 at 128 wide (32 KiB a stage), 5 at 192 (40 KiB), 4 at 256 (48 KiB, as before).
// Why it should be faster: at the one-tile N = 768 shapes a block's whole life is one tile of 12
//   (K = 768) or 48 (K = 3072) K steps; with 4 stages in flight the producer runs at most 4 steps
//   ahead, so a slow load (a DRAM miss at the ring's start, a TMA queued behind the other blocks')
//   stalls the MMAs sooner. The sixth session's sweep of stage 21 at N = 768 measured 5 stages at
//   15.95 against 16.54 us with 4 (1.04x). Predicted: the N = 768 shapes and QKV (192 wide) 2-4%
//   faster than stage 27 in both regimes, 8192^3 (192 wide) within 2%, the 256-wide shapes (MLP
//   up, the LM heads, 4096^3) unchanged: the same kernel at the same depth.
// Contract: as stage 27 (`weight` must not be written by the kernel just before this one).
// Launch: linear_bf16_deep_ring[_gelu|_residual]: as stage 27 (grid min(tiles, SMs), block 384,
//   WS_BN picked per shape), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B + 2 * WS_BN *
//   4 B + 16 KiB of staging + 1 KiB + barriers with WG_STAGES picked as above (at most 224 KiB);
//   the programmatic-serialization attribute.
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
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_deep_ring, 0)
LEAN_ENTRY(linear_bf16_deep_ring_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_deep_ring_residual, EPI_RESIDUAL)
