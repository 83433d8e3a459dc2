// linear-bf16, stage 21: staged-store (stage 18 with interior tiles stored in whole lines through a
// per-warp shared staging buffer).
// Changed from stage 18: in a tile wholly inside the output (N % 4 == 0), each consumer warp writes
//   32 columns of its 16 rows of accumulators into its own 2 KiB staging buffer (XOR-swizzled by
//   row), reads them back as row-contiguous float4s (8 lanes a 128-byte row), adds the bias (one
//   broadcast float4 from stage 18's copy) and the tail, and stores float4s: each store
//   instruction writes 4 whole 128-byte lines. The residual is read the same way. Other tiles
//   store as stage 18.
// Why it should be faster: Nsight Compute's stall sampling of stage 15 at MLP up put 30% of the
//   store's samples in `lg_throttle`: each STG.64 of the wgmma layout touches 32 bytes in each of 8
//   rows, so a 64 x 256 fp32 store is 1024 warp instructions and 8192 line requests through the
//   LSU queue. Staged, it is 512 STG.128s touching 2048 lines (plus 1024 STS.64 and 512 LDS.128,
//   which do not leave the SM), and the residual tail's loads shrink the same way. Predicted: the
//   one-tile N = 768 shapes (whose store is exposed) 3-6% faster than stage 18, the residual tails
//   5-10%, the multi-tile shapes 1-4%, 4096^3 and 8192^3 within 2%.
// Launch: linear_bf16_staged_store[_gelu|_residual]: as stage 18 (grid min(tiles, SMs), block 384,
//   WS_BN picked per shape), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B + 2 * WS_BN *
//   4 B + 16 KiB of staging + 1 KiB + barriers; `residual` is read only by the _residual entry.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define EPI_BIAS_SMEM 1
#define EPI_STAGED 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_staged_store, 0)
LEAN_ENTRY(linear_bf16_staged_store_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_staged_store_residual, EPI_RESIDUAL)
