// linear-fp8, stage 5: three consumers (a third consumer warpgroup on 192 x 128 tiles).
// Changed from stage 4: the tile is 192 rows (an A box of 192 x 128 codes; three consumer
//   warpgroups of 64 rows and the producer, 512 threads) and a consumer waits for each K step's
//   wgmma before it promotes (fp8_consume_waited_staged: one partial tile; 24 registers for the
//   producer and 160 a consumer, though ptxas allocates at the 128 of 512 threads). The previous tile's staged store still runs under the next tile's first step.
// Why it should be faster: stage 4 keeps the tensor pipe 60% busy at 4096^3 (33% at MLP up): two
//   consumers share it, and each still drains its own group every other step with 64 FFMA of
//   promotion between. A third warpgroup's wgmma fill the pipe while one promotes, instead of a
//   second partial tile per warpgroup (which does not fit 160 registers). A 192-row tile also
//   reads 17% fewer L2 bytes a flop, and it wave-fits GPT-2's shapes at M = 4096 (22 row tiles):
//   the N = 768 projections become 132 tiles, one wave of 132 SMs (stage 4: 192 tiles, 1.45
//   waves), QKV 396 (3.0 waves) and MLP up 528 (4.0). Predicted ~1.3x stage 4 at N = 768,
//   ~1.1x at QKV, MLP up and 8192^3, ~1.05x at 4096^3 (5.3 waves).
// Tails: stage 4's (bias, then GELU or a residual of out's type; fp32 or bf16 out).
// Launch: linear_fp8_three_consumers[_gelu|_residual][_bf16]: grid (min(tiles, SMs)), block 512
//   (producer + 3 consumer warpgroups), dynamic shared memory WG_STAGES * 40 KiB + 2 barriers a
//   stage, rounded up to 1 KiB, + three consumers' staging (3 x 32 KiB fp32, 3 x 16 KiB bf16) +
//   1 KiB (alignment); stage 4's arguments, A's tensor map in boxes of 192 rows.
// Constraints: stage 4's.
// Tolerance: 1e-2 preset against the f64 product of the dequantized operands.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 16 == 0; N % 4 == 0; N % 8 == 0 at out = 16
#include "matmul_fp8_gemm.cuh"

// Recipe: fp8_ring of 192-row A tiles, Fp8TileStride<192>, fp8_consumer of three warpgroups with
// fp8_produce_tiles, fp8_consume_waited_staged with Fp8StagedStore of the previous tile under its
// first step.

constexpr int CONSUMERS = 3, TILE_ROWS = 64 * CONSUMERS;
using Ring = Fp8Ring<WG_STAGES, TILE_ROWS>;

template <class Out, int TAIL>
__device__ __forceinline__ void three_consumers(const TmaMap& map_a, const TmaMap& map_b, const float* a_scales,
                                                const float* b_scales, const float* bias, int M, int N, int K,
                                                const TmaMap& map_out, const Out* residual) {
    const Ring ring = fp8_ring<WG_STAGES, TILE_ROWS>();
    const unsigned staging = (ring.base + Ring::BYTES + 1023) & ~1023u;
    const Fp8TileStride<TILE_ROWS> tiles(M, N);
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    const int ktiles = (K + F8_BK - 1) / F8_BK;

    // 128 x 24 + 384 x 160 registers <= 64K.
    const auto produce = [&] { fp8_produce_tiles(ring, tiles, &map_a, &map_b, ktiles); };
    if (!fp8_consumer<CONSUMERS, 24, 160>(ring, wg, produce)) return;

    const int c = wg - 1, warp = (tid >> 5) & 3;
    using Store = Fp8StagedStore<Out, TAIL>;
    const Store store{staging + c * Store::BYTES, 1 + c, (tid & 127) == 0};
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    // The tile whose result acc holds (none before the first: its store is predicated off).
    int prev_m0 = 0, prev_n0 = 0;
    bool have_prev = false;
    int first = 0;
    for (int t = tiles.first(); !tiles.done(t); t = tiles.next(t), first += ktiles) {
        const int m0 = tiles.m0(t) + 64 * c, n0 = tiles.n0(t);
        const StepScales scales(a_scales, b_scales, m0 + 16 * warp + (lane >> 2), n0, M, ktiles);
        const auto store_prev = [&] { store(acc, &map_out, bias, residual, prev_m0, prev_n0, M, N, have_prev); };
        fp8_consume_waited_staged(acc, ring, c * 64 * F8_BK, scales, ktiles, first, store_prev);
        prev_m0 = m0, prev_n0 = n0, have_prev = true;
    }
    store(acc, &map_out, bias, residual, prev_m0, prev_n0, M, N, have_prev);
    tma_store_wait();
}

// Stage 4's argument list (`out` unused: the stores go through map_out).
#define THREE_CONSUMERS_ENTRY(name, Out, TAIL)                                                                     \
    extern "C" __global__ void __launch_bounds__(128 * (1 + CONSUMERS), 1)                                         \
        name(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, void* out,                \
             const float* a_scales, const float* b_scales, const float* bias, int M, int N, int K,                 \
             const __grid_constant__ TmaMap map_out, const Out* residual) {                                        \
        three_consumers<Out, TAIL>(map_a, map_b, a_scales, b_scales, bias, M, N, K, map_out, residual);            \
    }

THREE_CONSUMERS_ENTRY(linear_fp8_three_consumers, float, MM_TAIL_NONE)
THREE_CONSUMERS_ENTRY(linear_fp8_three_consumers_gelu, float, MM_TAIL_GELU)
THREE_CONSUMERS_ENTRY(linear_fp8_three_consumers_residual, float, MM_TAIL_RESIDUAL)
THREE_CONSUMERS_ENTRY(linear_fp8_three_consumers_bf16, __nv_bfloat16, MM_TAIL_NONE)
THREE_CONSUMERS_ENTRY(linear_fp8_three_consumers_gelu_bf16, __nv_bfloat16, MM_TAIL_GELU)
THREE_CONSUMERS_ENTRY(linear_fp8_three_consumers_residual_bf16, __nv_bfloat16, MM_TAIL_RESIDUAL)
