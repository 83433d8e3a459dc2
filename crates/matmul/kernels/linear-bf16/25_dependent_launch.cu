// linear-bf16, stage 25: dependent-launch (stage 21 launched as a programmatic dependent of the
// kernel before it in the stream).
// Changed from stage 21: every block executes `griddepcontrol.launch_dependents` as it starts and
//   `griddepcontrol.wait` after its prologue (mbarrier init and the block barrier), before its
//   first global access; Rust launches it with the programmatic-stream-serialization attribute.
// Why it should be faster: without the attribute a kernel starts only once the one before it has
//   finished and its writes are flushed, so the launch, the block rasterization and the prologue
//   are paid after the last block of the previous kernel. With it, a block of this kernel takes
//   each SM that the previous kernel's blocks leave, runs its prologue, and waits only for the
//   memory. Back to back, Nsight Compute's single-launch time of stage 21 at N = 768 equals
//   cuBLASLt's (14.46 against 14.62 us) while criterion's launch-to-launch time is 1 us longer
//   (14.9 against 13.9): cuBLASLt's launches overlap. Predicted: no change where each launch sits
//   between its own events (the table), 0.5-1 us a launch back to back (criterion): 3-6% at the
//   N = 768 shapes, 1-3% at the K = 768 multi-tile shapes, under 1% at 4096^3 and 8192^3.
// Launch: linear_bf16_dependent_launch[_gelu|_residual]: as stage 21 (grid min(tiles, SMs), block
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
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_dependent_launch, 0)
LEAN_ENTRY(linear_bf16_dependent_launch_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_dependent_launch_residual, EPI_RESIDUAL)
