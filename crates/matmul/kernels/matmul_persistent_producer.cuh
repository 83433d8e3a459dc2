// matmul_persistent_producer.cuh: the persistent GEMM's producer (one thread of warpgroup 0 issues
// every TMA load of every tile its block owns into the ring) and its launch parts: how a GEMM
// overlaps the kernel before it in the stream.
//
// A launch part has one signature, hooks the kernel calls in order:
//   at_start()                  every thread, first;
//   after_init()                every thread, once the ring's mbarriers are set up;
//   weights_before_wait<Order>  the producer thread, before its loads: returns how many of the first
//                               tile's ring stages already have their W tiles (and byte counts);
//   at_tile(i, stride, tiles)   the producer thread, as it starts the walk's tile i;
//   consumer_start()            every consumer thread, before its first access to global memory.
// `dependent`, `weights_early` and `last_tile` say which of the stage list's switches (WS_PDL,
// WS_WEIGHTS_EARLY, WS_PDL_LAST_TILE) the part is.
#pragma once
#include "matmul_persistent_tile.cuh"
#include "ladder_timeline.cuh"

// Stages 9-13: an ordinary launch; the stream orders it after the kernel before.
struct StreamOrdered {
    enum : bool { dependent = false, weights_early = false, last_tile = false };
    __device__ __forceinline__ static void at_start() {}
    __device__ __forceinline__ static void after_init() {}
    template <class Order, class R>
    __device__ __forceinline__ static int weights_before_wait(const R&, const TmaMap&, int, int, int, int, int) {
        return 0;
    }
    __device__ __forceinline__ static void at_tile(int, int, int) {}
    __device__ __forceinline__ static void consumer_start() {}
};

// Stage 14 on: a programmatic dependent launch (Rust launches it with the programmatic-serialization
// attribute). The next grid may launch as this one starts; every thread waits for the previous
// grid (its completion and the visibility of its writes) after the prologue, before its first
// global access, so the launch and the prologue run under that grid's tail.
//   WEIGHTS_EARLY  the producer issues the W tiles of the block's first WG_STAGES K steps before it
//                  waits (weights are no grid's output: the caller's contract), so their DRAM fetch
//                  also runs under that grid's tail; the consumers wait on their own.
//   LAST_TILE      the next grid may launch only once the producer starts the block's last tile: it
//                  is pending for the last tile round only, not the whole run.
template <bool WEIGHTS_EARLY, bool LAST_TILE>
struct DependentLaunch {
    enum : bool { dependent = true, weights_early = WEIGHTS_EARLY, last_tile = LAST_TILE };
    __device__ __forceinline__ static void at_start() {
        // The next grid may launch now. Its blocks take an SM only when one of ours has left it (ours
        // fill the shared memory and the registers), and it waits for our completion before it reads
        // or writes global memory, so an early trigger should cost nothing (LAST_TILE tests that).
        if constexpr (!LAST_TILE) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    }
    __device__ __forceinline__ static void after_init() {
        // Everything before touched only shared memory and the kernel's parameters. Every thread
        // waits for the previous grid, whose output may be this one's `inp`, `bias` or `residual`,
        // and whose inputs may be this one's `out`.
        if constexpr (!WEIGHTS_EARLY) asm volatile("griddepcontrol.wait;\n" ::: "memory");
    }
    template <class Order, class R>
    __device__ __forceinline__ static int weights_before_wait(const R& ring, const TmaMap& map_b, int first,
                                                              int tiles, int tiles_m, int tiles_n, int ktiles) {
        if constexpr (!WEIGHTS_EARLY) return 0;
        // The first tile's first ring stages get their W tiles (and the whole stage's byte count)
        // now; their A tiles follow the wait, in the producer's loop.
        int early = 0;
        if (first < tiles) {
            int tm, tn;
            Order::coords(first, tiles_m, tiles_n, tm, tn);
            early = ktiles < WG_STAGES ? ktiles : WG_STAGES;
            for (int kt = 0; kt < early; ++kt) {
                mbar_expect_tx(ring.full(kt), WS_STAGE_BYTES);
                tma_load(ring.b_tile(kt), &map_b, ring.full(kt), kt * WS_BK, tn * WS_BN);
            }
        }
        // Only this thread of the producer warpgroup touches global memory (through the TMA).
        asm volatile("griddepcontrol.wait;\n" ::: "memory");
        return early;
    }
    __device__ __forceinline__ static void at_tile(int i, int stride, int tiles) {
        // The block's last tile; the first invocation in a block is the one that counts, and the
        // producer thread is the only one to make it.
        if constexpr (LAST_TILE)
            if (i + stride >= tiles) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    }
    __device__ __forceinline__ static void consumer_start() {
        // The consumers wait for the previous grid here (the producer did on its own).
        if constexpr (WEIGHTS_EARLY) asm volatile("griddepcontrol.wait;\n" ::: "memory");
    }
};

// The producer thread: every load of every tile from `first` on, `stride` apart. `it` counts K
// steps across tiles, so the ring's stages and phases carry over from one tile to the next.
template <class Order, class Launch, class R>
__device__ __forceinline__ void produce(const R& ring, const TmaMap& map_a, const TmaMap& map_b, int first,
                                        int stride, int tiles, int tiles_m, int tiles_n, int ktiles) {
    int it = 0;
    const int early = Launch::template weights_before_wait<Order>(ring, map_b, first, tiles, tiles_m, tiles_n, ktiles);
    ladder_stamp(2);
    for (int i = first; i < tiles; i += stride) {
        Launch::at_tile(i, stride, tiles);
        int tm, tn;
        Order::coords(i, tiles_m, tiles_n, tm, tn);
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
            const int s = it % WG_STAGES;
            if (it >= WG_STAGES) mbar_wait(ring.empty(s), ((it / WG_STAGES) - 1) & 1);
            if (it >= early) mbar_expect_tx(ring.full(s), WS_STAGE_BYTES);
            tma_load(ring.a_tile(s), &map_a, ring.full(s), kt * WS_BK, tm * WS_BM);
            if (it >= early) tma_load(ring.b_tile(s), &map_b, ring.full(s), kt * WS_BK, tn * WS_BN);
        }
    }
    ladder_stamp(3);
}
