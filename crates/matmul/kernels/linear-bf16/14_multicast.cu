// linear-bf16, stage 14: multicast (stage 12 in clusters of 2 sharing the W tile).
// Changed from stage 12: blocks launch in clusters of 2 along M (WS_MULTICAST). A cluster walks
//   pairs of vertically adjacent 128 x WS_BN tiles, which read the same W tile: each block's
//   producer loads its own A tile and half of the W tile (a box of WS_BN / 2 rows), multicast by the
//   TMA into both blocks' rings; each block's full barrier expects both halves. A consumer releases
//   a ring stage to both blocks' empty barriers (4 arrivals a stage), since either producer writes
//   into both; those arrivals release at CTA scope (see mbar_arrive_cluster). Cluster barriers order the start (barriers initialized before any remote arrival)
//   and the end (no block leaves while its partner may still arrive). The store is stage 12's,
//   from registers (stage 13's TMA store measured slower at most shapes).
// Why it should be faster: at K = 768 a 128 x 192 tile spends ~5 us in the tensor cores and pulls
//   480 KB through L2 (12 K steps of 40 KB), and the four GPT-2 block shapes run at 250-370 TFLOP/s
//   against 990: the consumers wait on loads (`long_scoreboard` on the full barriers, the counters
//   of stage 9) while cuBLASLt's kernel for these shapes (nvjet ..._64x5_1x2_...) runs clusters of
//   2. Sharing W cuts each block's L2 reads per K step from (128 + WS_BN) x 128 B to (128 + WS_BN
//   / 2) x 128 B: 40 to 28 KB at WS_BN = 192 (-30%), 48 to 32 KB at 256. Predicted: the K = 768
//   shapes 10-20% faster than stage 12; 4096^3 and 8192^3 a few %; the odd tile-row count (M /
//   128 odd) pays one idle tile row per pair column.
// Launch: linear_bf16_multicast: grid 2 x min(ceil(ceil(M/128) / 2) * ceil(N/WS_BN), the clusters
//   that fit at once), cluster (2, 1, 1), block 384 (3 warpgroups), WS_BN picked per shape as stage
//   11, dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B + 1 KiB + barriers; two
//   CUtensorMaps by value (A boxes of 128 rows, W boxes of WS_BN / 2 rows).
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias.
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define WS_MULTICAST 1
#include "matmul_wgmma_persistent.cuh"

extern "C" __global__ void __launch_bounds__(384, 1)
    linear_bf16_multicast(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, float* out,
                          const float* bias, const float* residual, int M, int N, int K, int epilogue) {
    persistent_gemm<true>(map_a, map_b, out, bias, residual, M, N, K, epilogue);
}
