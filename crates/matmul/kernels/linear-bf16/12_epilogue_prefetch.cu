// linear-bf16, stage 12: epilogue-prefetch (stage 11 with the store's loads batched).
// Changed from stage 11: the consumers' store walks a tile's columns in chunks of 8 column groups
//   (EPI_PREFETCH: EPI_CHUNK = 8 in matmul_wgmma_persistent.cuh) and loads every bias pair and
//   residual pair of a chunk, as 8-byte loads, before the chunk's first store.
// Why it should be faster: in stages 9-11 each group's bias and residual loads come after the
//   previous group's stores, which the compiler must assume may alias them, so a thread waits a
//   full global-load latency per group: 24-32 groups x 2 rows per tile. The residual tail measured
//   +50-90% over the bare GEMM at N = 768 (34.7 against 19.6 us), cuBLASLt's +9%. With 8 groups'
//   loads in flight at once the wait is paid 3-4 times a tile instead of 24-32. Predicted: the
//   residual shapes from +50-90% to within ~25% of the bare GEMM; the others unchanged (bias
//   loads hit L1/L2) or a few % faster. Registers: 48 more live values (8 bias pairs and 16
//   residual pairs) next to up to 128 accumulators, inside the consumers' 232.
// Launch: linear_bf16_wave_fit: as stage 11 (grid min(tiles, SMs), block 384, WS_BN picked per
//   shape, dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B + 1 KiB + barriers).
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias.
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#include "matmul_wgmma_persistent.cuh"

extern "C" __global__ void __launch_bounds__(384, 1)
    linear_bf16_wave_fit(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, float* out,
                         const float* bias, const float* residual, int M, int N, int K, int epilogue) {
    persistent_gemm<true>(map_a, map_b, out, bias, residual, M, N, K, epilogue);
}
