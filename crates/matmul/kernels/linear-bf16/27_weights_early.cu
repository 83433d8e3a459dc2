// linear-bf16, stage 27: weights-early (stage 25 with the first W tiles loaded before the wait for
// the previous grid).
// Changed from stage 25: the producer issues the W tiles of the block's first WG_STAGES K steps
//   (with each ring stage's full byte count) before its `griddepcontrol.wait`, and the A tiles of
//   those steps after it; the consumers wait for the previous grid on their own, after setmaxnreg.
// Why it should be faster: stage 25 overlaps the launch and the prologue with the previous
//   kernel's tail, but its first loads still start only after that kernel has finished: a DRAM
//   round trip plus WG_STAGES x 24-32 KiB of W per block before the first MMA. The weights are no
//   kernel's output, so those loads can run under the tail too. Predicted (back to back): 0.3-0.6
//   us a launch, 2-4% at the N = 768 shapes, about 1% at the other K = 768 shapes, nothing
//   measurable in the table (each launch between its own events) or at 4096^3 and 8192^3.
// Contract: `weight` must not be written by the kernel just before this one in the stream (it is
//   read before that kernel has finished); `inp`, `bias`, `residual` and `out` may be.
// Launch: linear_bf16_weights_early[_gelu|_residual]: as stage 25 (grid min(tiles, SMs), block
//   384, WS_BN picked per shape), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B + 2 *
//   WS_BN * 4 B + 16 KiB of staging + 1 KiB + barriers; the programmatic-serialization attribute.
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

LEAN_ENTRY(linear_bf16_weights_early, 0)
LEAN_ENTRY(linear_bf16_weights_early_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_weights_early_residual, EPI_RESIDUAL)
