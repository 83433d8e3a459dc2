// linear-bf16, stage 15: lean-epilogue (stage 12 with a store of few instructions).
// Changed from stage 12: (1) one entry per tail (linear_bf16_lean, _gelu, _residual) passes the
//   tail as a constant, so each compiles only its own tail instead of branching on a runtime code
//   per element; (2) a tile wholly inside the output (EPI_LEAN: all but the last tile row and
//   column of a ragged shape, every tile at the GPT-2 shapes) stores with no bounds checks and no
//   per-element address arithmetic: two row offsets per thread, each column an immediate offset;
//   edge tiles keep stage 12's checked store; (3) GELU on the SFU's tanh.approx.f32 instead of
//   tanhf (max relative error ~2^-11).
// Why it should be faster: Nsight Compute's warp-stall sampling of stage 12 at 4096 x 768 x 768
//   puts 57% of the samples in the store and 28% in the MMA loop: the store's SASS is ~100 KB of
//   unrolled per-element checks, branch reconvergence (BSYNC) and 64-bit address math, over the
//   instruction cache's size (stage 12's `no_instruction` stalls). With one tile per SM at N = 768
//   the store is not hidden behind anything. Predicted: the K = 768 shapes 15-30% faster than
//   stage 12 (the store from ~half a tile's time to a fifth), MLP down ~10%, the GELU tail the
//   most (the tanhf sequence was the longest part of its store); 4096^3 and 8192^3 within noise.
// Launch: linear_bf16_lean[_gelu|_residual]: as stage 11 (grid min(tiles, SMs), block 384, WS_BN
//   picked per shape, dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B + 1 KiB + barriers);
//   `residual` is read only by the _residual entry.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias.
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_lean, 0)
LEAN_ENTRY(linear_bf16_lean_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_lean_residual, EPI_RESIDUAL)
