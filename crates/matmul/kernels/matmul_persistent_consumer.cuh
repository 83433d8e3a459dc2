// matmul_persistent_consumer.cuh: the persistent GEMM's consumer schedule (who computes which tile)
// and its main loop (a consumer's wgmma over one tile's K steps).
//
// A schedule part has one signature:
//   sets, stage_users, turns    64-row accumulator sets a consumer holds; consumers that read each
//                               ring stage; turn mbarriers it needs in the ring;
//   first_row(c)                the tile row where consumer c's first set starts;
//   init_turns(ring)            thread 0, with the ring's mbarriers;
//   take(ring, c, walked, it, ktiles)
//                               whether consumer c computes the walk's next tile (when it does not,
//                               it steps `it` past the tile's K steps), waiting for its turn;
//   pass_turn(ring, c, tid)     once consumer c has issued the tile's MMAs.
// `ping_pong` says whether the part is the stage list's switch WS_PINGPONG.
#pragma once
#include "matmul_persistent_tile.cuh"
#include "ladder_timeline.cuh"

// Stages 9-14: the two consumers split every tile's rows, 64 each.
struct Cooperative {
    enum : bool { ping_pong = false };
    enum { sets = 1, stage_users = 2, turns = 0 };
    __device__ __forceinline__ static int first_row(int c) { return 64 * c; }
    template <class R>
    __device__ __forceinline__ static void init_turns(const R&) {}
    template <class R>
    __device__ __forceinline__ static bool take(const R&, int, int&, int&, int) {
        return true;
    }
    template <class R>
    __device__ __forceinline__ static void pass_turn(const R&, int, int) {}
};

// Stage 15 on: each consumer takes every other tile of the walk whole (two 64-row accumulator sets),
// the two taking turns on the tensor cores: one's store runs under the other's MMAs. WS_BN <= 192
// (two sets of 64 x 256 do not fit in the registers).
struct PingPong {
    enum : bool { ping_pong = true };
    enum { sets = 2, stage_users = 1, turns = 2 };
    __device__ __forceinline__ static int first_row(int) { return 0; }
    template <class R>
    __device__ __forceinline__ static void init_turns(const R& ring) {
        mbar_init(ring.turn(0), 1);
        mbar_init(ring.turn(1), 1);
    }
    // `walked` counts the block's tiles so far, both consumers': consumer c takes the ones = c mod 2.
    template <class R>
    __device__ __forceinline__ static bool take(const R& ring, int c, int& walked, int& it, int ktiles) {
        // The other consumer's tile. Its K steps still take their turn in the ring.
        if ((walked++ & 1) != c) {
            it += ktiles;
            return false;
        }
        // The MMAs start once the other consumer has issued the previous tile's: so the tensor
        // cores take the tiles in the walk's order (one consumer's store overlapping the other's
        // MMAs), and every ring stage before this tile's has been waited on, so no full barrier is
        // waited on more than one phase ahead of where it stands.
        if (walked > 1) mbar_wait(ring.turn(1 - c), ((walked - 2) >> 1) & 1);
        return true;
    }
    template <class R>
    __device__ __forceinline__ static void pass_turn(const R& ring, int c, int tid) {
        if ((tid & 127) == 0) mbar_arrive(ring.turn(c));  // the other consumer's turn on the tensor cores
    }
};

// One K step of 16 for a consumer's 64 x WS_BN accumulators (WS_BN / 2 a thread).
template <int N>
__device__ __forceinline__ void wgmma_tile(float (&d)[N], unsigned long long a, unsigned long long b) {
    if constexpr (2 * N == 256) {
        wgmma_m64n256k16(d, a, b);
    } else if constexpr (2 * N == 192) {
        wgmma_m64n192k16(d, a, b);
    } else {
        wgmma_m64n128k16(d, a, b);
    }
}

// Stamps `slot` when a consumer's first ring stage has landed (in LADDER_TIMELINE builds only).
struct FirstLanding {
    bool landed = false;
    __device__ __forceinline__ void stamp(int tid, int slot) {
        if ((tid & 127) == 0 && !landed) ladder_stamp(slot);
        landed = true;
    }
};

// A consumer's main loop over one tile: its SETS accumulator sets from row `first_row` of each ring
// stage, each stage released to the producer once the next stage's MMAs are issued (the tile's
// last stage is released by the caller, after its wait).
template <int SETS, class R>
__device__ __forceinline__ void mma_tile(const R& ring, float (&d)[SETS][WS_BN / 2], int& it, int ktiles,
                                         int first_row, int tid, FirstLanding& landing, int landed_slot) {
#pragma unroll
    for (int h = 0; h < SETS; ++h)
#pragma unroll
        for (int j = 0; j < WS_BN / 2; ++j) d[h][j] = 0.0f;
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = it % WG_STAGES;
        mbar_wait(ring.full(s), (it / WG_STAGES) & 1);
        landing.stamp(tid, landed_slot);
        const unsigned a = ring.a_tile(s) + first_row * 128, b = ring.b_tile(s);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < WS_BK / 16; ++kk)
#pragma unroll
            for (int h = 0; h < SETS; ++h)
                wgmma_tile(d[h], wgmma_desc(a + h * 64 * 128 + 32 * kk), wgmma_desc(b + 32 * kk));
        wgmma_commit();
        // The previous step's group is done: its stage can be refilled.
        wgmma_wait_one();
        if (kt > 0 && (tid & 127) == 0) mbar_arrive(ring.empty((it - 1) % WG_STAGES));
    }
}
