// linear-bf16, stage 13: tma-store (stage 12 storing through shared memory with the TMA).
// Changed from stage 12: a consumer no longer stores its fp32 results from registers. Per chunk of
//   64 columns it writes them (bias, GELU, residual applied) into one of EPI_SLOTS shared slots of
//   64 x 64 fp32 in the TMA's 128-byte swizzle, fences the async proxy, and one thread issues two
//   TMA box stores (`cp.async.bulk.tensor` global <- shared, a bulk async-group per chunk); the
//   consumer then goes straight on, to its next chunk or its next tile's wgmmas. A slot is reused
//   EPI_SLOTS chunks later, after `cp.async.bulk.wait_group.read` says the TMA has read it. The
//   ring is as deep as WG_STAGES allows beside the slots (3 at the 256-wide tile).
// Why it should be faster: the output is fp32 and large against the work at GPT-2's K = 768: at
//   QKV 37.7 MB of stores against 14.5 GFLOP, 11 us at 3.35 TB/s next to ~22 us of MMAs. In stages
//   9-12 the consumers issue those stores themselves, 2 rows x 32 bytes a thread per column group,
//   and start the next tile's MMAs only when the last store has issued: the tensor pipe idles for
//   the whole epilogue (the counters: 66% busy against cuBLASLt's 78%). Shared-memory writes take a
//   few hundred cycles per tile; the TMA then drains the slot while the next tile computes.
//   Predicted: the GPT-2 shapes 10-25% faster than stage 12 (the store's share of a tile), the
//   padded LM head (824 MB of stores, ~40% of its time) most; 4096^3 and 8192^3 within noise.
// Launch: linear_bf16_tma_store: grid min(tiles, SMs), block 384 (3 warpgroups), WS_BN picked per
//   shape as stage 11, dynamic shared memory ring * (128 + WS_BN) * 128 B + 2 * EPI_SLOTS * 16 KiB +
//   1 KiB + barriers; three CUtensorMaps by value (A, B, and the output in boxes of 64 rows x 32).
// Constraints: sm_90a; K % 8 == 0; N % 4 == 0 (the output map's row stride is a multiple of 16
//   bytes); M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails need a bias.
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0; N % 4 == 0
#define EPI_TMA_STORE 1
#include "matmul_wgmma_persistent.cuh"

extern "C" __global__ void __launch_bounds__(384, 1)
    linear_bf16_tma_store(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b,
                          const __grid_constant__ TmaMap map_out, const float* bias, const float* residual, int M,
                          int N, int K, int epilogue) {
    persistent_gemm<true>(map_a, map_b, nullptr, bias, residual, M, N, K, epilogue, &map_out);
}
