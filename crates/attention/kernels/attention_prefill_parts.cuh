// attention_prefill_parts.cuh: the typed parts the bf16 prefill's mainloops share (prefill-bf16/02,
// whose switches stages 6-13 turn on, and 14): the tile order (which head, sequence and query tile
// a block takes), the softmax of one key tile, and the store of O. Each part has one signature; a
// stage file states its recipe by picking one of each (FlashAttention-3's hopper/ split of tile
// scheduler, mainloop and epilogue). Order and Softmax are picked here from the stage's switches,
// so every mainloop that includes this reads them the same way. Needs sm_90a.
#pragma once
#include "attention_flash_bf16.cuh"
#include "attention_wgmma.cuh"
#include "ladder_recipe.cuh"

// ---- Tile order: which (head h, sequence b, query tile) block blockIdx takes ----
// Stage 2: grid (tiles, NH, B), the heaviest query tiles of each head first.
struct HeadMajorOrder {
    __device__ __forceinline__ static void block(int, int, int, int& h, int& b, int& tile) {
        h = blockIdx.y;
        b = blockIdx.z;
        tile = gridDim.x - 1 - blockIdx.x;
    }
};
// PB_TILES_LAST: grid (NH, B, tiles), the tiles on the slowest axis: every head's heaviest tile first.
struct TilesLastOrder {
    __device__ __forceinline__ static void block(int, int, int, int& h, int& b, int& tile) {
        h = blockIdx.x;
        b = blockIdx.y;
        tile = gridDim.z - 1 - blockIdx.z;
    }
};
// PB_L2_ORDER: a 1-D grid read as (head, sequence, query tile): pairs in groups whose K and V fit
// L2_GROUP_BYTES (a third of the H100's 50 MB), each group's blocks heaviest tile first and pairs
// fastest, so blocks in flight share few pairs' K/V and the last wave holds short causal rows.
struct L2FittedOrder {
    static constexpr long long L2_GROUP_BYTES = 16ll << 20;
    __device__ __forceinline__ static void block(int T, int NH, int D, int& h, int& b, int& tile) {
        const int tq = (T + WG_BR - 1) / WG_BR, pairs = gridDim.x / tq;
        const int group = (int)max(1ll, min((long long)pairs, L2_GROUP_BYTES / (4ll * T * D)));
        const int g = blockIdx.x / (group * tq), in = blockIdx.x % (group * tq);
        const int in_group = min(group, pairs - g * group);
        const int pair = g * group + in % in_group;
        tile = tq - 1 - in / in_group;
        h = pair % NH;
        b = pair / NH;
    }
};

// ---- Softmax: one key tile's scores into P, the running max and sum, O rescaled ----
// A softmax part has two calls: scores (P, the running max and sum, and the factor alpha O is to be
// rescaled by, O untouched: for a mainloop whose P.V is still in flight on O) and step (scores,
// then O rescaled at once), which every part gets from its scores here.
template <class Part>
struct SoftmaxStep {
    template <int NT, int DT>
    __device__ __forceinline__ static void step(float (&sc)[NT][4], float (&m)[2], float (&l)[2], float (&o)[DT][4],
                                                float scale_log2, int row, int k0, int T, bool causal, bool check) {
        float alpha[2];
        Part::scores(sc, m, l, alpha, scale_log2, row, k0, T, causal, check);
        rescale(o, alpha);
    }
};
// Stage 2: the scores scaled, then the max, then exp2 of each difference (softmax_scores).
struct ScaledSoftmax : SoftmaxStep<ScaledSoftmax> {
    template <int NT>
    __device__ __forceinline__ static void scores(float (&sc)[NT][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                                  float scale_log2, int row, int k0, int T, bool causal, bool check) {
        softmax_scores(sc, m, l, alpha, scale_log2, row, k0, T, causal, check);
    }
};
// PB_FOLDED_SOFTMAX: the scale folded into one FFMA a score (softmax_scores_folded); with MUFU_EXP2
// (PB_MUFU_EXP2) each exp2 as one ex2.approx.ftz.
template <bool MUFU_EXP2>
struct FoldedSoftmax : SoftmaxStep<FoldedSoftmax<MUFU_EXP2>> {
    template <int NT>
    __device__ __forceinline__ static void scores(float (&sc)[NT][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                                  float scale_log2, int row, int k0, int T, bool causal, bool check) {
        softmax_scores_folded<MUFU_EXP2>(sc, m, l, alpha, scale_log2, row, k0, T, causal, check);
    }
};

// ---- Store of O / l and lse ----
// Stage 2: from registers (store_rows).
struct RegisterStore {
    template <int D>
    __device__ __forceinline__ static void store(const TmaMap*, unsigned, __nv_bfloat16* out, float* lse,
                                                 const float (&o)[D / 8][4], const float (&m)[2], const float (&l)[2],
                                                 int wg, int warp, int lane, int b, int h, int q0, int T, int NH) {
        store_rows(out, lse, o, m, l, q0 + 64 * wg + 16 * warp + (lane >> 2), b, h, T, NH);
    }
};
// PB_TMA_STORE: a query tile inside its sequence through Q's tile (at qs) and the TMA (map_o: out
// as [B*T, C]); lse as store_rows; edge tiles from registers. A warpgroup writes only its own 64
// rows of the tile, which only its own Q.K^T reads, so the tile is free once its last Q.K^T has
// landed. Warpgroup wg meets its 128 threads on named barrier FIRST_BARRIER + wg (ids the
// mainloop leaves alone).
template <int FIRST_BARRIER>
struct TmaStore {
    template <int D>
    __device__ __forceinline__ static void store(const TmaMap* map_o, unsigned qs, __nv_bfloat16* out, float* lse,
                                                 const float (&o)[D / 8][4], const float (&m)[2], const float (&l)[2],
                                                 int wg, int warp, int lane, int b, int h, int q0, int T, int NH) {
        if (q0 + WG_BR > T) {
            RegisterStore::store<D>(map_o, qs, out, lse, o, m, l, wg, warp, lane, b, h, q0, T, NH);
            return;
        }
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int rr = 64 * wg + 16 * warp + g + 8 * r;  // the row in the tile
            const float inv = 1.f / l[r];
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                // Column block n / 8 (64 columns), 16-byte chunk n % 8 of the row, swizzled by the row.
                const unsigned at = qs + (n / 8) * WG_BR * 128 + rr * 128 + (((n % 8) ^ (rr % 8)) * 16) + 4 * t;
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at),
                             "r"(pack_bf16x2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv))
                             : "memory");
            }
            if (t == 0) lse[((size_t)b * NH + h) * T + q0 + rr] = row_lse(m[r], l[r]);
        }
        fence_proxy_async();
        named_barrier(FIRST_BARRIER + wg, 128);  // the warpgroup's rows are in the tile
        const bool elected = (threadIdx.x & 127) == 0;
#pragma unroll
        for (int cb = 0; cb < D / 64; ++cb)
            tma_store_if(map_o, qs + cb * WG_BR * 128 + wg * 64 * 128, h * D + cb * 64, b * T + q0 + 64 * wg, elected);
        if (elected) tma_store_wait_read();  // the tile is read before the block's shared memory goes
    }
};

// ---- Masks: which key tiles' scores are checked against the causal diagonal and T ----
// A mainloop hands its turns to walk(from, to, turn, masked, first_masked): turn(j, check) runs key
// tile j, with the per-score compares when check; masked(j) says whether a mask can touch tile j;
// tiles from first_masked() on are the only ones it can (mask_tail_from).
// Stage 2: every tile works out at run time whether a mask can touch it, and the compiled turn keeps
// the compares behind branches.
struct MaskEveryTile {
    template <class Turn, class Masked, class FirstMasked>
    __device__ __forceinline__ static void walk(int from, int to, Turn turn, Masked masked, FirstMasked) {
        for (int j = from; j < to; ++j) turn(j, masked(j));
    }
};
// PB_MASK_TAIL: a mask reaches only a block's last tiles (the diagonal, T), so the turns before them
// are compiled without it and the tail's with it.
struct MaskTailTiles {
    template <class Turn, class Masked, class FirstMasked>
    __device__ __forceinline__ static void walk(int from, int to, Turn turn, Masked, FirstMasked first_masked) {
        const int split = max(from, min(to, first_masked()));
        for (int j = from; j < split; ++j) turn(j, false);
        for (int j = split; j < to; ++j) turn(j, true);
    }
};
// The first key tile of BC keys that the causal diagonal of the query tile from row q0, or T, can
// touch: every key of the tiles before it is below both.
__device__ __forceinline__ int mask_tail_from(int T, int q0, int causal, int BC) {
    return (causal ? min(q0, T) : T) / BC;
}

using Order = Pick<LADDER_SWITCH(PB_L2_ORDER), L2FittedOrder,
                   Pick<LADDER_SWITCH(PB_TILES_LAST), TilesLastOrder, HeadMajorOrder>>;
using Softmax = Pick<LADDER_SWITCH(PB_FOLDED_SOFTMAX), FoldedSoftmax<LADDER_SWITCH(PB_MUFU_EXP2)>, ScaledSoftmax>;
using Mask = Pick<LADDER_SWITCH(PB_MASK_TAIL), MaskTailTiles, MaskEveryTile>;

// PB_TMA_STORE: out's tensor map is an entry's last parameter (a per-switch signature, so the
// host's arguments for the other stages are unchanged).
#ifdef PB_TMA_STORE
#define OUT_MAP_PARAM , const __grid_constant__ TmaMap map_o
#define OUT_MAP &map_o
#else
#define OUT_MAP_PARAM
#define OUT_MAP nullptr
#endif
