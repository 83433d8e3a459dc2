// linear-fp8, stage 3: persistent (one block an SM walks its tiles; the ring runs on across them).
// Changed from stage 2: the grid is one block an SM (at most one a tile); block b computes tiles b,
//   b + grid, ... in stage 2's launch order (Fp8TileStride). The producer keeps loading into the
//   ring across tile boundaries, so while the consumers store one tile the first WG_STAGES K steps of
//   the next are already landing; ring positions count on from tile to tile.
// Why it should be faster: stage 2 pays, per 128 x 128 tile, a block launch and a pipeline fill (the
//   first TMA round trip, ~1-2 us from L2 or DRAM) with the tensor cores idle, against ~9 us of MMA
//   at K = 4096 (and ~1.7 us at K = 768). Here only the epilogue's stores are left between two tiles'
//   MMA. Predicted ~1.1x stage 2 at 4096^3, more at GPT-2's K = 768.
// Measured (H100, stage 2 in the same call, as stage 4 beside the refuted pair-multicast rung of
//   branch linear-fp8-refuted-rungs): 970 TFLOP/s at 4096^3 (1.03x), 888 at 8192^3 (1.01x);
//   GPT-2's K = 768 shapes 1.05-1.14x, MLP down 1.05x; the LM head 0.89x (its odd-length rows store
//   one float at a time). Against cuBLASLt's block-scaled FP8 (same call, same codes and scales):
//   0.89x at 4096^3, 0.82x at 8192^3, 0.77-0.94x at GPT-2's shapes. ncu at 4096^3: tensor pipe 60%.
// Launch: linear_fp8_persistent: grid (min(tiles, SMs)), block 384 (producer + 2 consumer
//   warpgroups), dynamic shared memory WG_STAGES * 32 KiB + 1 KiB + 2 barriers a stage.
// Constraints: sm_90a; K % 16 == 0; M, N, K >= 1; M * K, N * K, M * N < 2^31 (so the tile count
//   fits an int); no limit on M from the grid.
// Tolerance: 1e-2 preset against the f64 product of the dequantized operands.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 16 == 0; out = 32; epi = 0
#include "matmul_fp8_gemm.cuh"

// Recipe: fp8_ring, Fp8TileStride, fp8_consumer with fp8_produce_tiles, fp8_consume_overlapped at
// running ring positions, store_m64_bias<128>.

extern "C" __global__ void __launch_bounds__(384, 1)
    linear_fp8_persistent(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, float* out,
                          const float* a_scales, const float* b_scales, const float* bias, int M, int N, int K) {
    const Fp8Ring<WG_STAGES> ring = fp8_ring<WG_STAGES>();
    const Fp8TileStride tiles(M, N);
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    const int ktiles = (K + F8_BK - 1) / F8_BK;

    if (!fp8_consumer(ring, wg, [&] { fp8_produce_tiles(ring, tiles, &map_a, &map_b, ktiles); })) return;

    const int c = wg - 1, warp = (tid >> 5) & 3;
    int first = 0;
    for (int t = tiles.first(); !tiles.done(t); t = tiles.next(t), first += ktiles) {
        const int row0 = tiles.m0(t) + 64 * c + 16 * warp + (lane >> 2), n0 = tiles.n0(t);
        const StepScales scales(a_scales, b_scales, row0, n0, M, ktiles);
        float acc[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
        fp8_consume_overlapped(acc, ring, c * 64 * F8_BK, scales, ktiles, first, [] {});
        store_m64_bias<128>(acc, out, bias, row0, n0, M, N);
    }
}
