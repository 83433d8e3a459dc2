// Attention prefill in bf16, stage 14: the end point's parts on FlashAttention-3's mainloop: a
// producer warpgroup, two consumer warpgroups taking turns on the tensor cores, and each one's
// softmax of key tile j under its own P.V of tile j - 1.
// Changed from stage 13: the mainloop part. Stage 13 keeps stage 2's: both warpgroups issue
//   S = Q.K^T, wait for it, run the softmax and P.V, wait again and meet at a block barrier, so a
//   turn's chain (S, its wait, the row max and shuffles, the exponentials, P.V, its wait) is paid
//   in the open, and stage 13 hides it only by a second block on the SM (64-key tiles at HS = 128).
//   Here the chain runs under tensor work, as stage 5 arranges it: a producer warpgroup
//   (setmaxnreg 24) issues every TMA load into a three-slot ring released on empty barriers; the
//   consumers (240 registers) take turns on named barriers to issue S of tile j and P.V of tile
//   j - 1 as two commit groups, wait for S alone, and run the softmax while their P.V and the
//   other warpgroup's GEMMs run. Everything else is stage 13's recipe read from the same switches
//   (attention_prefill_parts.cuh): the folded softmax with MUFU.EX2, the L2-fitted tile order and
//   O through Q's tile and the TMA. Key tiles are 128 at both head sizes: with one block an SM the
//   consumers hold S (64), P (32) and O (64 at HS = 128) together.
// Why it should be faster: stage 5 measured 1.14-1.18x stage 4 and 0.91-0.93x stage 10 at
//   HS = 128, but it had none of stages 8-11's parts: its softmax is 1129 main-loop instructions
//   a turn where stage 10's is 933 (exp2f's compare and two predicated multiplies a score, a
//   separate scale pass), and its O leaves through 4-byte stores. Those parts gave stage 10 and 11
//   1.05-1.15x over stage 7 at HS = 128. Stage 5 x 1.10-1.20 is 1.00-1.10x stage 13 where stage 13
//   is not already past cuDNN (HS = 128 without the mask, B=8, T=2048, B=16, T=1024), with the
//   turn's whole chain hidden: predicted 1.00-1.10x stage 13 at HS = 128, below it at HS = 64
//   (stage 13's two blocks an SM there hide more than one block's pipeline).
// Measured (H100, 2026-11-27, call B5, two interleaved rounds): 0.81-1.01x stage 13 at HS = 128
//   (318 / 541 us at B=8, T=2048 causal / full; 1.96 ms at T = 16384), 0.66-0.81x at HS = 64
//   (35.6 us at GPT-2's shape): refuted as a gain, kept as stage 15's base. Q's wgmma descriptors
//   are made once before the turns (q_descriptors): computed in the turn, ptxas made all eight
//   again every turn.
// Switches, cumulative (stages 15 on turn them on after stage 13's):
//   PB_MASK_TAIL (stage 15): only a block's last key tile can reach the causal diagonal (q0 is a
//     multiple of the 128-key tile) or T, so the turns before it are compiled without the mask and
//     the last one with it (MaskTailTiles). Stage 14's turn keeps the compares behind a branch a
//     pair of scores, 32 taken branches and their predicated copies in every turn: the main loop is
//     910 instructions a turn at HS = 128 (842 at 64); without the mask 549 (481). The turn's
//     softmax sits between S's wait and P.V's, so predicted 1.05-1.15x stage 14. (On stage 2's file
//     the same split needs two copies of the turn under two blocks' 128 registers: ptxas spills
//     and serializes every wgmma, C7512, so it stays this mainloop's.) Measured (call B5):
//     1.06-1.25x stage 14; at HS = 128 1.01-1.12x stage 13 for T >= 2048 (293 / 488 us at B=8,
//     T=2048 causal / full; 1.67 / 3.36 ms, 660 / 655 TFLOP/s at T = 16384), 0.86-0.91x at B=16,
//     T=1024, where a block alone on its SM pays its start and its store of O with nothing beside
//     it; 0.73-0.93x at HS = 64. The end point at HS = 128, T >= 2048.
// Launch: stage 13's grid (a 1-D grid of ceil(T/128) * NH * B blocks under PB_L2_ORDER, else
//   (ceil(T/128), NH, B)), block 384 (producer warpgroup + 2 consumer warpgroups); entries
//   attention_bf16_pipelined_hs{64,128}; a CUtensorMap of qkv as [B*T, 3C] bf16 in 64 x 64 boxes
//   (128-byte swizzle) by value, and with PB_TMA_STORE a second one of out as [B*T, C], last;
//   dynamic shared memory (128 + 3 * 2 * 128) * HS * 2 bytes + 1 KB alignment + barriers (113 KB
//   at HS = 64, 225 KB at HS = 128).
// Constraints: sm_90a; HS in {64, 128}; NH, B <= 65535; B*T*3C < 2^31; any T >= 1 (rows past T
//   read the next sequence's rows or the TMA's zero fill; they are masked or not stored).
// Tolerance: as stage 0 (bf16 operands and output, rel L2 <= 1e-2; lse against score magnitudes).
// Limits: HS in {64, 128}; NH <= 65535 and B <= 65535; B * T * 3C < 2^31
#include "attention_prefill_parts.cuh"

// Named barriers: the turns on 1 and 2 (stage 5's), the store of O on 3 and 4.
constexpr int TURN_BARRIER = 1, STORE_BARRIER = 3;

constexpr int STAGES = 3;  // K/V slots of the producer's ring

// The recipe: stage 13's order, softmax, mask and store of O (their switches), this mainloop.
using OStore = Pick<LADDER_SWITCH(PB_TMA_STORE), TmaStore<STORE_BARRIER>, RegisterStore>;

template <int D>
__device__ __forceinline__ void flash_pipelined(const TmaMap* map, __nv_bfloat16* out, float* lse, int T, int NH,
                                                float scale, int causal, const TmaMap* map_o) {
    constexpr int NT = WG_BC / 8, DT = D / 8;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const TileRing<D, STAGES> r = tile_ring<D, STAGES>(smem_raw);
    int h, b, tile;
    Order::block(T, NH, D, h, b, tile);
    const WsBlock k = ws_block_at<D>(T, NH, causal, h, b, tile * WG_BR);
    if (!ws_consumer(r, map, k)) return;
    const int tid = k.tid, warp = k.warp, lane = k.lane, q0 = k.q0, tiles = k.tiles;
    const int wg = (tid >> 7) - 1;  // consumer warpgroup

    float m[2], l[2], o[DT][4];
    softmax_state_init(m, l, o);
    const int row = q0 + 64 * wg + 16 * warp + (lane >> 2);
    unsigned long long qd[D / 16];  // this warpgroup's 64 rows of each column block of Q
    q_descriptors<D>(qd, r.q() + wg * 64 * 128);
    mbar_wait(r.q_full(), 0);

    // Turns: warpgroup w waits on barrier TURN_BARRIER + w and hands over on the other's.
    // Warpgroup 0 goes first; warpgroup 1 skips its last hand-over, which nobody would wait for.
    constexpr int TURN_THREADS = 256;
    const int my_turn = TURN_BARRIER + wg, their_turn = TURN_BARRIER + 1 - wg;
    if (wg == 1) named_barrier_arrive(their_turn, TURN_THREADS);
    float sc[NT][4];
    unsigned p[WG_BC / 16][4];  // the previous tile's P, as P.V's A fragments
    float alpha[2];
    // Whether a mask can touch key tile j; the softmax of tile j (in sc): P, the running max and
    // sum, and O's factor alpha.
    const auto masked = [&](int j) { return (j + 1) * WG_BC > T || (causal && (j + 1) * WG_BC > q0); };
    const auto scores = [&](int j, bool check) {
        Softmax::scores(sc, m, l, alpha, scale * LOG2E, row, j * WG_BC, T, causal, check);
    };
    const auto release = [&](int slot) {
        // This warp no longer reads the slot.
        __syncwarp();
        if (lane == 0) mbar_arrive(r.empty(slot));
    };
    // The first and last turns are peeled, so the steady-state body has no branch around a wgmma
    // and always two commit groups (stage 5 says what ptxas does otherwise).
    // Turn 0: S of tile 0 alone.
    mbar_wait(r.full(0), 0);
    named_barrier(my_turn, TURN_THREADS);
    wgmma_fence();
    issue_qk_with<D>(sc, qd, r.k(0));
    wgmma_commit();
    named_barrier_arrive(their_turn, TURN_THREADS);
    wgmma_wait_all();
    fence_operands(sc);
    scores(0, masked(0));
    rescale(o, alpha);
#pragma unroll
    for (int kk = 0; kk < WG_BC / 16; ++kk) p_fragment(p[kk], sc, kk);
    // Turns 1 .. tiles - 1: S of tile j and P.V of tile j - 1.
    const auto turn = [&](int j, bool check) {
        const int s = j % STAGES, prev = (j + STAGES - 1) % STAGES;
        const unsigned phase = (j / STAGES) & 1;
        mbar_wait(r.full(s), phase);
        named_barrier(my_turn, TURN_THREADS);
        wgmma_fence();
        issue_qk_with<D>(sc, qd, r.k(s));
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < WG_BC / 16; ++kk) issue_pv<D>(o, p[kk], r.v(prev), kk);
        wgmma_commit();
        named_barrier_arrive(their_turn, TURN_THREADS);
        wgmma_wait_one();  // S of tile j has landed; P.V of tile j - 1 may still run
        fence_operands(sc);
        scores(j, check);
        fence_operands(sc);  // the probabilities are made before the wait below, under P.V
        // A block boundary keeps P.V's wait below the exponentials: a second wait on this tile's
        // full barrier, complete already (one try), as stage 12's P.V.
        mbar_wait(r.full(s), phase);
        wgmma_wait_all();
        fence_operands(o);
        release(prev);
        rescale(o, alpha);
#pragma unroll
        for (int kk = 0; kk < WG_BC / 16; ++kk) p_fragment(p[kk], sc, kk);
    };
    Mask::walk(1, tiles, turn, masked, [&] { return mask_tail_from(T, q0, causal, WG_BC); });
    // The last turn: P.V of the last tile alone.
    {
        const int prev = (tiles + STAGES - 1) % STAGES;
        named_barrier(my_turn, TURN_THREADS);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BC / 16; ++kk) issue_pv<D>(o, p[kk], r.v(prev), kk);
        wgmma_commit();
        if (wg == 0) named_barrier_arrive(their_turn, TURN_THREADS);
        wgmma_wait_all();
        fence_operands(o);
        release(prev);
    }
    OStore::store<D>(map_o, r.q(), out, lse, o, m, l, wg, warp, lane, b, h, q0, T, NH);
}

#define BF16_PIPELINED_ENTRY(D)                                                                               \
    extern "C" __global__ void __launch_bounds__(384, 1) attention_bf16_pipelined_hs##D(                      \
        const __grid_constant__ TmaMap map, __nv_bfloat16* out, float* lse, int T, int NH, float scale, int causal \
        OUT_MAP_PARAM) {                                                                                      \
        flash_pipelined<D>(&map, out, lse, T, NH, scale, causal, OUT_MAP);                                    \
    }
BF16_PIPELINED_ENTRY(64)
BF16_PIPELINED_ENTRY(128)
