// linear-fp8, stage 2: overlapped promotion (a K step's wgmma run while the previous step is promoted).
// Changed from stage 1: a consumer issues step kt + 1's four wgmma into a second partial tile before
//   it waits for step kt's (wgmma.wait_group 1 instead of 0), then releases stage kt and promotes its
//   tile while step kt + 1 runs; the two partial tiles alternate. Each step's scales are loaded when
//   it is issued and multiplied when it is promoted.
// Why it should be faster: in stage 1 each warpgroup drains the tensor pipe every K step (wait_group
//   0) and then spends 64 FFMA and the scale loads with none of its own MMA in flight; only the other
//   consumer's wgmma can fill that gap, and the two drift into step. Here a warpgroup's own next step
//   is queued behind the current one, so the promotion (~64 of ~320 cycles a step at the FP8 rate)
//   leaves the critical path. Predicted ~1.15x stage 1. Costs 64 registers a thread (192 live of
//   the consumers' 232).
// Measured (H100, stage 1 in the same call): 941 TFLOP/s at 4096^3 (1.07x), 879 at 8192^3 (1.02x),
//   1.01-1.04x at GPT-2's shapes; ncu at 4096^3: tensor pipe 57% of active cycles (stage 1: 54%).
//   Short of the prediction: the other consumer already filled much of the gap. The first build
//   serialized every wgmma (ptxas C7514): the release's `if (thread 0) arrive` was a branch inside
//   the open wgmma group; the predicated arrive fixed it.
// Launch: linear_fp8_overlap: stage 1's (grid (ceil(N / 128), ceil(M / 128)), block 384, dynamic
//   shared memory WG_STAGES * 32 KiB + 1 KiB + 2 barriers a stage).
// Constraints: stage 0's.
// Tolerance: 1e-2 preset against the f64 product of the dequantized operands.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; M <= 65535 * 128; K % 16 == 0; out = 32; epi = 0
#include "matmul_fp8_gemm.cuh"

// Recipe: fp8_ws_tile (fp8_ring, fp8_consumer with fp8_produce, store_m64_bias<128>) with fp8_consume_overlapped.

extern "C" __global__ void __launch_bounds__(384, 1)
    linear_fp8_overlap(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, float* out,
                       const float* a_scales, const float* b_scales, const float* bias, int M, int N, int K) {
    const auto consume = [](float (&acc)[64], const Fp8Ring<WG_STAGES>& ring, unsigned a_row_bytes,
                            const StepScales& scales, int ktiles) {
        fp8_consume_overlapped(acc, ring, a_row_bytes, scales, ktiles, 0, [] {});
    };
    fp8_ws_tile(map_a, map_b, out, a_scales, b_scales, bias, M, N, K, consume);
}
