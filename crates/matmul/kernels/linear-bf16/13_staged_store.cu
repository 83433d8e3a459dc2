// linear-bf16, stage 13: staged-store (stage 12 storing whole 128-byte lines through shared memory).
// Changed from stage 12 (epilogue part EpiStaged, built on EpiBiasSmem; switches EPI_BIAS_SMEM, EPI_STAGED): (1) each consumer copies its tile's
//   bias into shared memory with 16-byte cp.async while its MMAs run, and its store reads it there;
//   (2) in a tile wholly inside the output, each consumer warp writes 32 columns of its 16 rows of
//   accumulators into its own 2 KiB staging buffer (XOR-swizzled by row), reads them back as
//   row-contiguous float4s (8 lanes a 128-byte row), adds the bias (one broadcast float4) and the
//   tail, and stores float4s: each store instruction writes 4 whole 128-byte lines. The residual
//   is read the same way, before the staging, so its latency runs under it. A bf16 output without
//   the residual is packed before it is staged (16-byte pieces of 8 columns). Edge tiles store as
//   stage 12.
// Why it should be faster: (1) the bias loads leave the store's critical path; (2) stall sampling
//   of stage 12 put 30% of the store's samples in `lg_throttle`: each STG.64 of the wgmma layout
//   touches 32 bytes in each of 8 rows, so a 64 x 256 fp32 store is 1024 warp instructions and 8192
//   line requests; staged it is 512 STG.128 touching 2048 lines. Predicted: N = 768 3-6% faster,
//   the residual tails 5-10%, the multi-tile shapes 1-4%, 4096^3 and 8192^3 within 2%.
// Measured (H100, 2026-11-23, against stage 12): N = 768 1.03x, MLP down 1.04x, the residual tails
//   1.04x, QKV 1.09x, MLP up 1.11x, the GELU tail 1.09x, 8192^3 and 4096^3 1.02x. Kept.
// Launch: linear_bf16_staged_store[_gelu|_residual]: as stage 12, dynamic shared memory
//   `persistent_shared_bytes` (the ring, 2 x WS_BN bias values, 8 warps' 2 KiB buffers).
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#include "matmul_wgmma_persistent.cuh"

using Recipe = PersistentRecipe<GroupedOrder, StreamOrdered, Cooperative, EpiStaged>;

LEAN_ENTRY(linear_bf16_staged_store, Recipe, 0)
LEAN_ENTRY(linear_bf16_staged_store_gelu, Recipe, EPI_GELU)
LEAN_ENTRY(linear_bf16_staged_store_residual, Recipe, EPI_RESIDUAL)
