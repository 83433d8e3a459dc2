// linear-bf16, stage 12: lean-epilogue (stage 11 with a store of few instructions).
// Changed from stage 11 (epilogue part EpiLean, built on EpiPrefetch; switches EPI_PREFETCH, EPI_LEAN): (1) the bias and residual pairs of a
//   chunk of 8 column groups are loaded before the chunk's first store, so their latencies overlap
//   instead of following each store; (2) one entry per tail (linear_bf16_lean, _gelu, _residual)
//   passes the tail as a constant, so each compiles only its own tail; (3) a tile wholly inside the
//   output (every tile at the GPT-2 shapes) stores with no bounds checks and no per-element address
//   arithmetic: two row offsets per thread, each column an immediate; edge tiles keep the checked
//   store; (4) GELU on the SFU's tanh.approx.f32 (max relative error ~2^-11) instead of tanhf.
//   The lean store is also the one that can write a bf16 output (OUT_BF16, `out = 16`).
// Why it should be faster: Nsight Compute's stall sampling of stage 11 put the store at 57% of the
//   warp samples at 4096 x 768 x 768: ~100 KB of unrolled per-element checks, branch reconvergence
//   and 64-bit address math (over the instruction cache), one load latency per column group, and
//   tanhf's ~20 instructions an element in the GELU tail. Predicted: the K = 768 shapes 15-30%
//   faster, MLP down ~10%, the GELU tail the most; 4096^3 and 8192^3 within noise.
// Measured (H100, 2026-11-23, against the batched loads alone, then against stage 11): the batched
//   loads 1.00-1.13x; the lean store QKV 1.09x, MLP up 1.25x, the GELU tail 1.84x, the padded LM
//   head 1.15x, 8192^3 1.08x, but N = 768 only 1.03x: with one tile an SM the store is not what the
//   SM waits on (see the notes' timeline). Kept.
// Launch: linear_bf16_lean[_gelu|_residual]: grid min(tiles, SMs), block 384, 128 x WS_BN tiles
//   (WS_BN picked per shape), dynamic shared memory `persistent_shared_bytes`; `residual` is read
//   only by the _residual entry.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias.
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#include "matmul_wgmma_persistent.cuh"

using Recipe = PersistentRecipe<GroupedOrder, StreamOrdered, Cooperative, EpiLean>;

LEAN_ENTRY(linear_bf16_lean, Recipe, 0)
LEAN_ENTRY(linear_bf16_lean_gelu, Recipe, EPI_GELU)
LEAN_ENTRY(linear_bf16_lean_residual, Recipe, EPI_RESIDUAL)
