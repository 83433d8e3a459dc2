// matmul_wgmma_persistent.cuh: the persistent warp-specialized GEMM of linear-bf16 stages 9-16,
// composed from typed parts. A grid of one block per SM walks the 128 x WS_BN output tiles; warpgroup
// 0 (the producer) issues every TMA load into a ring of WG_STAGES shared-memory stages whose phases
// continue across tiles; the two consumer warpgroups issue wgmma.m64nWS_BNk16 and store. WS_BN is
// 128, 192 or 256: 256 has the most reuse per loaded byte; 192 divides GPT-2's 768 into 4 columns,
// so N = 768 at M = 4096 is 128 tiles (one wave on 132 SMs) instead of 96 at 256.
//
// A rung is a recipe, PersistentRecipe<Order, Launch, Consumers, Epilogue>, one part on each axis,
// each part in its own header with one signature:
//   tile order   matmul_persistent_order.cuh     GroupedOrder;
//   launch       matmul_persistent_producer.cuh  StreamOrdered, DependentLaunch<weights early, last-tile trigger>
//                                                (the producer's loop is there too);
//   consumers    matmul_persistent_consumer.cuh  Cooperative, PingPong (and the wgmma main loop);
//   epilogue     matmul_persistent_epilogue.cuh  EpiChecked, EpiPrefetch, EpiLean, EpiBiasSmem, EpiStaged.
// The stage list also sets each part's switch as a -D define (the host reads the same list to size
// and launch the kernel): the kernel checks its recipe against them, so the two cannot disagree.
// The last rung picks each part by its switch, so its leave-one-out rows (a switch off) are its
// recipe with one part swapped for its predecessor.
//
// Timeline: 0 block start; 1 barriers ready; 2 producer past the previous grid; 3 producer's last load issued; 4 consumer 0's first stage landed; 5 consumer 0's last MMAs done; 6 consumer 0's last store issued; 7 consumer 1's first stage landed; 8 consumer 1's last MMAs done; 9 consumer 1's last store issued
// (`ladder timeline`: stamps written by thread 0 of the block, of the producer and of each consumer
// warpgroup, in builds with LADDER_TIMELINE only; "last" is the block's last tile.)
#pragma once
#include "matmul_persistent_tile.cuh"
#include "matmul_persistent_order.cuh"
#include "matmul_persistent_producer.cuh"
#include "matmul_persistent_consumer.cuh"
#include "matmul_persistent_epilogue.cuh"
#include "ladder_timeline.cuh"

// setmaxnreg: the producer warpgroup drops to 40 registers and the consumers take what is left of
// the 64K (128 x 40 + 256 x 232 <= 65536).
#define WS_CONSUMER_REGS "232"

template <class OrderPart, class LaunchPart, class ConsumersPart, class EpiloguePart>
struct PersistentRecipe {
    using Order = OrderPart;
    using Launch = LaunchPart;
    using Consumers = ConsumersPart;
    using Epilogue = EpiloguePart;
};

// The recipe's parts are the stage list's switches (which the host sized and launched it by).
template <class Recipe>
__device__ __forceinline__ constexpr bool recipe_matches_switches() {
    using L = typename Recipe::Launch;
    return Recipe::Epilogue::switches == LADDER_SWITCH(EPI_PREFETCH) + LADDER_SWITCH(EPI_LEAN) + LADDER_SWITCH(EPI_BIAS_SMEM) +
                                             LADDER_SWITCH(EPI_STAGED) &&
           L::dependent == LADDER_SWITCH(WS_PDL) && L::weights_early == LADDER_SWITCH(WS_WEIGHTS_EARLY) &&
           L::last_tile == LADDER_SWITCH(WS_PDL_LAST_TILE) && Recipe::Consumers::ping_pong == LADDER_SWITCH(WS_PINGPONG);
}

template <class Recipe, bool TAIL>
__device__ __forceinline__ void persistent_gemm(const TmaMap& map_a, const TmaMap& map_b, out_t* out,
                                                const out_t* bias, const out_t* residual, int M, int N, int K,
                                                int epilogue) {
    using Order = typename Recipe::Order;
    using Launch = typename Recipe::Launch;
    using Consumers = typename Recipe::Consumers;
    using Epi = typename Recipe::Epilogue;
    static_assert(recipe_matches_switches<Recipe>(), "the rung's recipe and its stage-list switches disagree");
    static_assert(!OUT_IS_BF16 || Epi::switches >= EpiLean::switches, "OUT_BF16: the lean stores only (stages 12-16)");
    static_assert(Consumers::sets * WS_BN <= 384, "WS_BN <= 192 with two accumulator sets a consumer (PingPong)");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const Ring<Epi::smem_bytes> ring(smem_raw);
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    if (tid == 0) ladder_stamp(0);
    const int tiles_m = (M + WS_BM - 1) / WS_BM, tiles_n = (N + WS_BN - 1) / WS_BN;
    const int tiles = tiles_m * tiles_n;
    const int ktiles = (K + WS_BK - 1) / WS_BK;
    // The block's first tile of the walk, and its stride.
    const int first = blockIdx.x, stride = gridDim.x;

    Launch::at_start();
    if (tid == 0) {
        for (int s = 0; s < WG_STAGES; ++s) {
            mbar_init(ring.full(s), 1);
            mbar_init(ring.empty(s), Consumers::stage_users);  // one arrival per consumer of the stage
        }
        Consumers::init_turns(ring);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (tid == 0) ladder_stamp(1);
    Launch::after_init();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) produce<Order, Launch>(ring, map_a, map_b, first, stride, tiles, tiles_m, tiles_n, ktiles);
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 " WS_CONSUMER_REGS ";\n");
    Launch::consumer_start();
    const int c = wg - 1;
    const int first_row = Consumers::first_row(c);
    const int warp = (tid >> 5) & 3;
    const EpiArgs e{out, bias, residual, M, N, epilogue, warp, lane >> 2, lane & 3, lane, (N & 1) == 0};
    const EpiSmem es = Epi::setup(smem_raw, ring.epilogue(), c, warp, tid, bias);

    int it = 0;
    FirstLanding landing;
    int walked = 0;  // the block's tiles so far, both consumers' (PingPong's count)
    for (int i = first; i < tiles; i += stride) {
        if (!Consumers::take(ring, c, walked, it, ktiles)) continue;
        int tm, tn;
        Order::coords(i, tiles_m, tiles_n, tm, tn);
        Epi::copy_bias(es, bias, tn, N, c, tid);
        float d[Consumers::sets][WS_BN / 2];
        mma_tile(ring, d, it, ktiles, first_row, tid, landing, 4 + 3 * c);
        Consumers::pass_turn(ring, c, tid);
        wgmma_wait_all();
        if ((tid & 127) == 0) mbar_arrive(ring.empty((it - 1) % WG_STAGES));  // the tile's last stage
        if ((tid & 127) == 0) ladder_stamp(5 + 3 * c);

        const int m0 = tm * WS_BM, n0 = tn * WS_BN;
        Epi::bias_landed(bias, c);
#pragma unroll
        for (int h = 0; h < Consumers::sets; ++h)
            Epi::template store<TAIL>(e, es, d[h], m0, n0, m0 + first_row + 64 * h);
        if ((tid & 127) == 0) ladder_stamp(6 + 3 * c);
    }
}

// Stages 12-16: an entry whose tail is the constant `tail` (0, EPI_GELU or EPI_RESIDUAL).
#define LEAN_ENTRY(name, recipe, tail)                                                                       \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1)                                              \
        name(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, out_t* out,        \
             const out_t* bias, const out_t* residual, int M, int N, int K) {                                \
        persistent_gemm<recipe, true>(map_a, map_b, out, bias, residual, M, N, K, tail);                     \
    }
