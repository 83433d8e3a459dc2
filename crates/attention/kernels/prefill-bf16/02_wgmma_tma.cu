// Attention prefill in bf16, stage 2: wgmma on tiles the TMA puts in 128-byte-swizzled shared
// memory, completing on an mbarrier ring.
// Changed from stage 1: (1) both products run on Hopper's warpgroup MMA: a warpgroup owns 64 query
//   rows and issues S = Q.K^T as wgmma.m64n128k16 with Q and K read from shared memory through
//   descriptors (no ldmatrix through registers), and O += P.V as wgmma.m64nHSk16 with P from
//   registers (the S accumulators rounded to bf16 are, per warp, exactly mma.sync's A fragments)
//   and V read MN-major (the transpose flag) from the tile as it lies; (2) Q, K and V tiles arrive
//   by TMA, one thread issuing 64 x 64 boxes that complete on the stage's mbarrier with their byte
//   count, instead of 256 threads computing addresses for cp.async; (3) key tiles of 128, so a
//   tile's softmax and barrier are amortised over twice the keys. Two warpgroups (128 query rows)
//   share each K/V tile; two tiles in flight. Not yet: a producer warp (the issuing thread is a
//   consumer), overlap of one warpgroup's softmax with the other's GEMMs, or of a tile's softmax
//   with the next tile's S (stages 3-5).
// Why it should be faster: wgmma issues a warpgroup's 64 x 128 x 16 product in one instruction at
//   the rate mma.sync cannot reach (about 2x per SM on an H100), and the 8 ldmatrix of every 16
//   mma.sync are gone. The softmax between the two GEMMs stays serial, so predicted 1.3-1.8x over
//   stage 1 (about 190 -> 300 TFLOP/s at HS = 128, T = 2048).
// Measured (H100, 2026-11-26): 40 us (161 TFLOP/s) at B=4, T=1024, HS=64, causal; 363 us (379
//   TFLOP/s) at B=8, T=2048, HS=128, causal; 600 us (458) not causal; 2.15 ms (511) at T=16384:
//   1.6-2.1x stage 1, above the prediction; 0.74-0.92x cuDNN's SDPA in the same call.
// Switches, cumulative (stages 6 to 13 turn them on one after another; --leave-one-out takes
//   each away from stage 13):
//   PB_TWO_BLOCKS (stage 6): at HS = 64 the kernel is held to 128 registers (launch bounds of two
//     blocks an SM), so two 81 KB blocks share an SM (16 warps instead of 8) and one block's softmax
//     and barriers run under the other's GEMMs: the overlap stages 4-5 arranged by hand, left to
//     the warp schedulers. Predicted 1.2-1.4x at HS = 64 (at HS = 128 a block needs 161 KB and stays
//     alone). Measured 40.7 -> 37.5 us at B=4, T=1024 (1.08x; occupancy 13 -> 22%, tensor pipe
//     27 -> 31%).
//   PB_TILES_LAST (stage 7): the grid is (NH, B, query tiles), tiles reversed on the slowest axis,
//     so the first blocks dispatched are every head's longest causal rows and the last wave holds
//     only short ones. Predicted 1.05-1.15x when causal. Measured 1.21x at B=4, T=1024, HS=64, but
//     0.79-0.83x at B=8, T=2048, HS=128: blocks dispatched together now read different heads' K/V,
//     and 128 (head, sequence) pairs of 1 MB do not stay in the 50 MB L2 as one head's query tiles
//     in a row did. A tile order fitted to L2 is the step this one asks for.
//   PB_FOLDED_SOFTMAX (stage 8): the row max over the raw scores and each probability as
//     exp2(fma(s, scale * log2 e, -max)) (softmax_scores_folded): no multiply pass over the scores
//     and no subtract before each exp2. Predicted 1.03-1.08x; measured 1.01-1.04x (30.4 us at B=4,
//     T=1024, HS=64: 212 TFLOP/s, level with cuDNN).
//   PB_L2_ORDER (stage 9): a 1-D grid read as (head, sequence, query tile) by l2_fitted_tile:
//     (head, sequence) pairs in groups whose K and V fit 16 MB of L2, each group heaviest tile
//     first with the pairs fastest. Stage 7's order for the pairs that fit, stage 2's locality for
//     the rest. Predicted: stage 7's loss at HS = 128 recovered (>= stage 6 there), its gain at
//     HS = 64 kept. Measured 1.24-1.26x over stage 8 at B=8, T=2048, HS=128 (361 and 626 us,
//     level with stage 6; DRAM 87 -> 20% of peak, L2 hit rate 28 -> 80%, tensor pipe 38 -> 53%),
//     1.04-1.21x at FlashAttention-3's HS = 64 shapes, but 0.97x at GPT-2's (48 pairs fit L2 in any
//     order; the index arithmetic is what is left).
//   PB_MUFU_EXP2 (stage 10): each probability's exp2 as ex2.approx.ftz, one MUFU.EX2, where exp2f
//     (no fast math) adds a compare and two predicated multiplies to keep subnormal results: three
//     of about eight instructions a score. The softmax is bound by MUFU's 16 results a clock an SM
//     and the issue slots together, so predicted 1.05-1.10x; measured 1.01-1.12x (30.2 us at GPT-2's
//     shape, 213 TFLOP/s; 592 us, 464 TFLOP/s at B=8, T=2048, HS=128 full; 2.02 ms at T=16384).
//   PB_TMA_STORE (stage 11): a query tile wholly inside its sequence writes O through shared memory
//     and the TMA, as FlashAttention-3 does outside varlen: each thread puts its normalized bf16
//     pairs into Q's tile (read for the last time by the last Q.K^T, before the loop's last block
//     barrier) in the loads' 128-byte swizzle (a warp's 8 rows hit 8 different 16-byte chunks: no
//     bank conflict), and one thread a warpgroup stores its 64 rows as HS/64 boxes of 64 x 64: whole
//     128-byte lines, where the register store writes 4 bytes of a row per thread (32 STG.E a thread
//     at HS = 128, each warp instruction 8 rows x 16 bytes). Edge tiles store as before. The store
//     is a few percent of a tile's instructions and its bytes are 1/(2 T / 128) of the K/V bytes a
//     tile reads from L2, so predicted 1.00-1.03x, more at short T. Measured (H100, 2026-11-27,
//     three interleaved rounds): 1.04x at GPT-2's shape (29.8 us, 216 TFLOP/s), 1.06x / 1.04x at
//     B=8, T=2048, HS=128 causal / full (315 / 549 us), 1.04-1.10x at B=16, T=1024, HS=128; 0.97-0.98x
//     at T = 16384, where a block's store is 1/128 of its work and the elected thread's wait for the
//     store to read the tile holds the block's shared memory a little longer. Kept.
//   PB_PACKED_PV (stage 12): all of P packed into registers before P.V's first wgmma, with a
//     basic-block boundary between (ptxas schedules within a block), so S is dead when P.V
//     issues. The SASS says why: stage 11's interleaved packing holds S, P and O together (182
//     registers at HS = 128), and at HS = 64 under PB_TWO_BLOCKS' 128-register cap ptxas
//     serializes every wgmma (C7512: a wait after each of the 12 HGMMAs of a turn). Packed: 122
//     registers and no serialization at HS = 64 (8 barrier instructions in the main loop instead
//     of 27), 154 at HS = 128, where the softmax no longer runs among P.V's HGMMAs. Predicted
//     1.05-1.15x at HS = 64 (S's four HGMMAs and P.V's eight in flight together), 0.95-1.0x at
//     HS = 128 (the exponentials stage 11 hid under P.V are exposed). Measured (H100, 2026-11-27,
//     two interleaved rounds): 1.01-1.04x stage 11 at all eight HS = 64 shapes (28.4 us, 227
//     TFLOP/s at GPT-2's), 0.92-0.99x at the eight HS = 128 shapes. Stage 13's 64-key tiles fit
//     128 registers without it as well (leave-one-out 0.96-1.03x at HS = 128).
//   PB_TWO_BLOCKS_HS128 (stage 13): key tiles of 64 at HS = 128, so S is 32 registers a thread and
//     the turn fits PB_TWO_BLOCKS' 128, and a block's shared memory is 97 KB: two blocks an SM. The
//     timeline says what it is for: at B=16, T=1024, HS=128 (not causal) stage 11's block spends
//     1.9 us from its start to Q landed and 1.3 us storing O around 14.5 us of key tiles, with
//     nothing else on its SM; a second block runs its tiles through them, and each block's softmax
//     under the other's GEMMs (stage 6's gain at HS = 64). Each key now pays the turn's fixed
//     work (row max, shuffles, O rescaled) twice as often. Predicted 1.10-1.20x at T <= 2048,
//     0.95-1.05x at T = 16384, where a block's own fixed costs are 1% of it. Measured (H100,
//     2026-11-27): 127 registers, no wgmma serialized; 1.09-1.24x stage 12 at T <= 4096 (165 us
//     at B=16, T=1024, causal; 296 / 524 us at B=8, T=2048), 1.05-1.06x at T = 16384; 1.01-1.23x
//     stage 11. Tensor pipe 52 -> 59% of active cycles, achieved occupancy 12 -> 24%.
// Launch: grid (ceil(T/128), NH, B), (NH, B, ceil(T/128)) with PB_TILES_LAST, or
//   (ceil(T/128) * NH * B) with PB_L2_ORDER; block 256 (2 warpgroups); entries
//   attention_bf16_wgmma_hs{64,128};
//   a CUtensorMap of qkv as [B*T, 3C] bf16 in 64 x 64 boxes (128-byte swizzle) by value (with
//   PB_TMA_STORE a second one of out as [B*T, C], last); dynamic
//   shared memory (128 + 2 * 2 * BC) * HS * 2 bytes + 1 KB alignment + barriers, BC = 128 keys a
//   tile (81 KB at HS = 64, 161 KB at HS = 128) or 64 at HS = 128 with PB_TWO_BLOCKS_HS128 (97 KB).
// Constraints: sm_90a; HS in {64, 128}; NH, B <= 65535; ceil(T/128) <= 65535 (the z axis under
//   PB_TILES_LAST, checked for every stage of this file); B*T*3C < 2^31; any T >= 1 (rows past T
//   read the next sequence's rows or the TMA's zero fill; they are masked or not stored).
// Tolerance: as stage 0 (bf16 operands and output, rel L2 <= 1e-2; lse against score magnitudes).
// Limits: HS in {64, 128}; NH <= 65535 and B <= 65535; T <= 65535 * 128; B * T * 3C < 2^31
// Timeline: 0 block start; 1 barriers ready; 2 Q landed; 3 first key tile's scores; 4 last key tile's P.V done; 5 O stored
#include "attention_prefill_parts.cuh"
#include "ladder_timeline.cuh"

constexpr int STAGES = 2;  // K/V tiles in flight

// The kernel is a recipe of parts. Tile order, softmax and the store of O are shared with stage
// 14 (attention_prefill_parts.cuh); P.V's issue and the key tiles are this mainloop's own.

// ---- P.V: O += P.V of one key tile, P from the softmax's scores in registers ----
// Stage 2: each 16 keys' P fragment packed as its wgmma is issued. ptxas interleaves the softmax's
// last exponentials with the first HGMMAs (injecting a warpgroup.arrive before each, C7519),
// which holds S, P and O live together: 182 registers at HS = 128, and at HS = 64 under
// PB_TWO_BLOCKS' cap of 128 it serializes every wgmma instead (C7512).
struct InterleavedPv {
    template <int D, int BC>
    __device__ __forceinline__ static void issue(float (&o)[D / 8][4], const float (&sc)[BC / 8][4], unsigned v,
                                                 unsigned, unsigned) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
            unsigned p[4];
            p_fragment(p, sc, kk);
            issue_pv<D, BC>(o, p, v, kk);
        }
    }
};
// PB_PACKED_PV: all of P packed before the first wgmma, so S is dead when P.V issues and a turn
// peaks at S and O. ptxas schedules within a basic block only: a second wait on the tile's full
// barrier (complete already: one try) ends the block, so no exponential sinks below the first
// P.V HGMMA.
struct PackedPv {
    template <int D, int BC>
    __device__ __forceinline__ static void issue(float (&o)[D / 8][4], const float (&sc)[BC / 8][4], unsigned v,
                                                 unsigned full, unsigned phase) {
        unsigned p[BC / 16][4];
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) p_fragment(p[kk], sc, kk);
        mbar_wait(full, phase);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) issue_pv<D, BC>(o, p[kk], v, kk);
    }
};

// ---- Key tiles and blocks an SM of an entry ----
// Stage 2: 128 keys a tile; at HS = 64 two blocks an SM with PB_TWO_BLOCKS (128 registers a thread
// at most), else one.
template <int MIN_BLOCKS>
struct WideKeyTiles {
    enum { BC = 128, BLOCKS = MIN_BLOCKS };
};
// PB_TWO_BLOCKS_HS128 (the HS = 128 entry): 64 keys a tile, two blocks an SM.
struct NarrowKeyTiles {
    enum { BC = 64, BLOCKS = 2 };
};

// The recipe: stage 2 with the switches stages 6-13 turn on one after another (a leave-one-out row
// of stage 13 turns one off, and gets that role's stage-2 part): Order and Softmax as the parts
// header picks them, and the lines below. PB_TWO_BLOCKS and PB_TWO_BLOCKS_HS128 pick each entry's
// key tiles and launch bounds.
using OStore = Pick<LADDER_SWITCH(PB_TMA_STORE), TmaStore<1>, RegisterStore>;
using Pv = Pick<LADDER_SWITCH(PB_PACKED_PV), PackedPv, InterleavedPv>;
using KeyTiles64 = WideKeyTiles<LADDER_SWITCH(PB_TWO_BLOCKS) ? 2 : 1>;
using KeyTiles128 = Pick<LADDER_SWITCH(PB_TWO_BLOCKS_HS128), NarrowKeyTiles, WideKeyTiles<1>>;

template <int D, class KeyTiles>
__device__ __forceinline__ void flash_wgmma(const TmaMap* map, __nv_bfloat16* out, float* lse, int T, int NH,
                                            float scale, int causal, const TmaMap* map_o) {
    constexpr int BC = KeyTiles::BC, NT = BC / 8, DT = D / 8;
    using Ring = TileRing<D, STAGES, BC>;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const Ring r = tile_ring<D, STAGES, BC>(smem_raw);
    const int tid = threadIdx.x, warp = (tid >> 5) & 3, lane = tid & 31;
    int h, b, tile;
    Order::block(T, NH, D, h, b, tile);
    const int q0 = tile * WG_BR;
    const int C = NH * D;
    const int row0 = b * T;  // global row of this sequence's token 0
    const int tiles = ((causal ? min(q0 + WG_BR, T) : T) + BC - 1) / BC;
    const int wg = tid >> 7;
    if (tid == 0) ladder_stamp(0);

    init_ring<0>(r);  // no producer: slots are released by the block barrier
    if (tid == 0) ladder_stamp(1);
    auto issue = [&](int j) {
        const int s = j % STAGES;
        mbar_expect_tx(r.full(s), 2 * Ring::KV_BYTES);
        load_tile<D, BC>(r.k(s), map, r.full(s), C + h * D, row0 + j * BC);
        load_tile<D, BC>(r.v(s), map, r.full(s), 2 * C + h * D, row0 + j * BC);
    };
    if (tid == 0) {
        mbar_expect_tx(r.q_full(), Ring::Q_BYTES);
        load_tile<D, WG_BR>(r.q(), map, r.q_full(), h * D, row0 + q0);
        for (int j = 0; j < STAGES && j < tiles; ++j) issue(j);
    }

    float m[2], l[2], o[DT][4];
    softmax_state_init(m, l, o);
    const int row = q0 + 64 * wg + 16 * warp + (lane >> 2);
    const unsigned qa = r.q() + wg * 64 * 128;  // this warpgroup's 64 rows of each column block
    mbar_wait(r.q_full(), 0);
    if (tid == 0) ladder_stamp(2);

    for (int j = 0; j < tiles; ++j) {
        const int s = j % STAGES, k0 = j * BC;
        mbar_wait(r.full(s), (j / STAGES) & 1);

        float sc[NT][4];
        wgmma_fence();
        issue_qk<D, BC>(sc, qa, r.k(s));
        wgmma_commit();
        wgmma_wait_all();
        fence_operands(sc);
        if (tid == 0 && j == 0) ladder_stamp(3);

        const bool check = k0 + BC > T || (causal && k0 + BC > q0);
        Softmax::step(sc, m, l, o, scale * LOG2E, row, k0, T, causal, check);

        Pv::template issue<D, BC>(o, sc, r.v(s), r.full(s), (j / STAGES) & 1);
        wgmma_commit();
        wgmma_wait_all();
        fence_operands(o);
        __syncthreads();  // both warpgroups are done with slot s: it can be refilled
        if (tid == 0 && j + STAGES < tiles) issue(j + STAGES);
    }
    if (tid == 0) ladder_stamp(4);
    OStore::store<D>(map_o, r.q(), out, lse, o, m, l, wg, warp, lane, b, h, q0, T, NH);
    if (tid == 0) ladder_stamp(5);
}

#define BF16_WGMMA_ENTRY(D, KEY_TILES)                                                                   \
    extern "C" __global__ void __launch_bounds__(256, KEY_TILES::BLOCKS) attention_bf16_wgmma_hs##D(     \
        const __grid_constant__ TmaMap map, __nv_bfloat16* out, float* lse, int T, int NH, float scale, int causal \
        OUT_MAP_PARAM) {                                                                                     \
        flash_wgmma<D, KEY_TILES>(&map, out, lse, T, NH, scale, causal, OUT_MAP);                            \
    }
BF16_WGMMA_ENTRY(64, KeyTiles64)
BF16_WGMMA_ENTRY(128, KeyTiles128)
