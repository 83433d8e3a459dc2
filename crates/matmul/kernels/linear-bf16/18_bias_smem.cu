// linear-bf16, stage 18: bias-smem (stage 15 with the tile's bias copied to shared memory while
// the MMAs run).
// Changed from stage 15: at each tile's start a consumer copies the tile's WS_BN bias values into
//   its own 1 KiB of shared memory (cp.async, zero-filled past N), and its store reads them there
//   (one ld.shared.v2 per 8 columns, 4 distinct addresses a warp: broadcast, no conflicts) instead
//   of from global memory.
// Why it should be faster: Nsight Compute's warp-stall sampling of stage 15 at MLP up (4096 x 3072
//   x 768) puts 40% of the consumers' samples in the store, and 56% of those are `long_scoreboard`
//   on the bias loads: each chunk of 8 column groups waits one L2 round trip for its bias (4 chunks
//   a 256-wide tile, behind the previous chunk's stores), with both consumers stopped and the
//   tensor cores idle. Copied during the MMAs, the bias is ready when the store starts. Predicted:
//   the multi-tile K = 768 shapes (QKV, MLP up, the GELU tail, the padded LM head) 10-20% faster
//   than stage 15, the N = 768 shapes 3-8% (one tile per SM: one store, still exposed), no bias
//   (LM head, 4096^3, 8192^3) unchanged.
// Launch: linear_bf16_bias_smem[_gelu|_residual]: as stage 15 (grid min(tiles, SMs), block 384,
//   WS_BN picked per shape), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B + 2 * WS_BN *
//   4 B + 1 KiB + barriers; `residual` is read only by the _residual entry.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define EPI_BIAS_SMEM 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_bias_smem, 0)
LEAN_ENTRY(linear_bf16_bias_smem_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_bias_smem_residual, EPI_RESIDUAL)
