// Linear + epilogue, stage 2: the epilogue inside the GEMM's store.
// Changed from previous: no kernel after the GEMM. The stage-4 WMMA kernel applies bias and then
//   GELU (linear_wmma_m3_gelu) or bias and the residual (linear_wmma_m3_residual) to each element
//   as it leaves the per-warp shared-memory stage (mm_store_tile<EPI> in matmul_wmma.cuh).
// Why it should be faster: out is written once and never re-read; the residual is read once.
//   Saves the whole element-wise kernel of stage 1 (its launch and ~8-12 bytes per output).
// Launch: as linear stage 4. Constraints: as linear stage 4. Tolerance: fp16, rel L2 <= 1e-2.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K <= 65535 * 32
#include "matmul_wmma_m3.cuh"

MM_DEFINE_WMMA_M3(linear_wmma_m3_gelu, MM_EPI_GELU)
MM_DEFINE_WMMA_M3(linear_wmma_m3_residual, MM_EPI_RESIDUAL)
