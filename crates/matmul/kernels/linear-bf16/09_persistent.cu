// linear-bf16, stage 9: persistent (stage 8 on a grid of one block per SM, tiles in L2-friendly order).
// Changed from stage 8: the grid is min(tiles, SMs) blocks that each walk the output tiles
//   tile = blockIdx.x, blockIdx.x + gridDim.x, ... ; the producer runs ahead into the next tile's
//   K steps while the consumers store the previous tile (the smem ring and its phases continue
//   across tiles), and the tiles are visited in groups of WS_GROUP_M rows of tiles (column after
//   column within a group), so the blocks in flight share a few row panels of inp and column
//   panels of W in L2 instead of sweeping all of W for every row panel.
// Why it should be faster: at 8192^3 stage 8's row-major launch order streams W (128 MiB, more
//   than the 50 MiB L2) once per 128-row panel of inp; grouping 8 panels cuts that 8x, and the
//   persistent loop hides each tile's prologue and epilogue behind the next tile's loads.
//   Predicted: 8192^3 from ~500 to ~650 TFLOP/s; little change at 4096^3.
// Launch: linear_bf16_persistent: grid min(ceil(M/128) * ceil(N/WS_BN), SMs), block 384 (3
//   warpgroups), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B + 1 KiB (alignment) +
//   barriers; two CUtensorMaps by value (A boxes of 128 rows, B boxes of WS_BN rows). WS_BN is a
//   tunable: 256 declared, 128 and 192 swept.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31.
// Tolerance: bf16 preset (operands bf16, fp32 accumulation).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#include "matmul_wgmma_persistent.cuh"

using Recipe = PersistentRecipe<GroupedOrder, StreamOrdered, Cooperative, EpiChecked>;

extern "C" __global__ void __launch_bounds__(384, 1)
    linear_bf16_persistent(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, float* out,
                           const float* bias, int M, int N, int K) {
    persistent_gemm<Recipe, false>(map_a, map_b, out, bias, nullptr, M, N, K, 0);
}
