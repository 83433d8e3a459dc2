// Attention prefill in bf16, stage 5: intra-warpgroup pipelining: a warpgroup's softmax of key
// tile j runs while its own P.V of tile j - 1 is still on the tensor cores.
// Changed from stage 4: a turn still issues S = Q.K^T of tile j and O += P.V of tile j - 1, but as
//   two commit groups, S first; the warpgroup waits for S alone (wgmma.wait_group 1), computes the
//   softmax of tile j while P.V runs, and only then waits for P.V, rescales O by the softmax's
//   alpha (O is the wgmma's until it lands) and builds P of tile j. The accumulators are pinned
//   after each wait, so no ordinary instruction touching them is scheduled above it.
// Why it should be faster: in stage 4 a warpgroup's softmax starts only when both of its GEMMs are
//   done, so its P.V (half its tensor work) and its softmax run one after the other; here they
//   overlap, and the tensor cores see this warpgroup's P.V and the other's GEMMs while it computes.
//   Predicted 1.1-1.2x over stage 4.
// The first and last turns are peeled (the first issues S of tile 0 alone, the last P.V of the last
//   tile alone), so the steady-state turn has no branch around a wgmma and always two commit groups.
//   Written with the branch inside the turn, ptxas serialized every wgmma (C7514: a wait for each
//   before the next, `ladder sass`) and the rung measured 0.99-1.03x stage 4.
// Measured (H100, 2026-11-26, peeled): 1.14-1.18x stage 4 in the same call (B=8, T=2048, HS=128:
//   365 us causal, 615 non-causal; T=16384: 2.17 ms; GPT-2's shape 42.4 us), 0.91-0.93x stage 10
//   at HS = 128. ptxas still waits for P.V (`DEPBAR.LE gsb0, 0x0`) before the softmax's
//   exponentials, where the PTX has them between the two waits (docs/notes/attention.md).
// P.V's wait below the softmax: ptxas schedules a wgmma.wait_group as early as its basic block
//   allows, and the softmax shares that block, so the wait went to the block's top. The next
//   tile's full-barrier wait (a spin loop: a block boundary) now stands just before it, and the
//   SASS has the 66 MUFU.EX2 between DEPBAR.LE gsb0 0x1 and 0x0 (`ladder sass`). Measured (H100,
//   2026-11-27): 1.12-1.18x stage 4 in the same call (368.6 against 424.5 us at B=8, T=2048,
//   HS=128 causal, 614.7 against 725.4 non-causal, 2.32 against 2.61 ms at T=16384, 42.8 against
//   47.8 us at GPT-2's shape), as with the wait above the softmax: where P.V's wait sits is not
//   what limits this stage.
// Launch: grid (ceil(T/128), NH, B), block 384 (producer warpgroup + 2 consumer warpgroups);
//   entries attention_bf16_overlap_hs{64,128}; a CUtensorMap of qkv as [B*T, 3C] bf16 in 64 x 64
//   boxes (128-byte swizzle) by value; dynamic shared memory (128 + 3 * 2 * 128) * HS * 2 bytes +
//   1 KB alignment + barriers (113 KB at HS = 64, 225 KB at HS = 128).
// Constraints: sm_90a; HS in {64, 128}; NH, B <= 65535; B*T*3C < 2^31; any T >= 1 (rows past T
//   read the next sequence's rows or the TMA's zero fill; they are masked or not stored).
// Tolerance: as stage 0 (bf16 operands and output, rel L2 <= 1e-2; lse against score magnitudes).
// Limits: HS in {64, 128}; NH <= 65535 and B <= 65535; B * T * 3C < 2^31
#include "attention_flash_bf16.cuh"
#include "attention_wgmma.cuh"

constexpr int STAGES = 3;

template <int D>
__device__ __forceinline__ void flash_overlap(const TmaMap* map, __nv_bfloat16* out, float* lse, int T, int NH,
                                            float scale, int causal) {
    constexpr int NT = WG_BC / 8, DT = D / 8;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const TileRing<D, STAGES> r = tile_ring<D, STAGES>(smem_raw);
    const WsBlock k = ws_block<D>(T, NH, causal);
    if (!ws_consumer(r, map, k)) return;
    const int tid = k.tid, warp = k.warp, lane = k.lane, h = k.h, b = k.b, q0 = k.q0, tiles = k.tiles;
    const int wg = (tid >> 7) - 1;  // consumer warpgroup

    float m[2], l[2], o[DT][4];
    softmax_state_init(m, l, o);
    const int row = q0 + 64 * wg + 16 * warp + (lane >> 2);
    const unsigned qa = r.q() + wg * 64 * 128;  // this warpgroup's 64 rows of each column block
    mbar_wait(r.q_full(), 0);

    // Turns: warpgroup w waits on barrier 1 + w and hands over on the other's. Warpgroup 0 goes
    // first; warpgroup 1 skips its last hand-over, which nobody would wait for.
    constexpr int TURN_THREADS = 256;
    if (wg == 1) named_barrier_arrive(1, TURN_THREADS);
    float sc[NT][4];
    unsigned p[WG_BC / 16][4];  // the previous tile's P, as P.V's A fragments
    // One turn: S of tile j (when j < tiles) and P.V of tile j - 1 (when j > 0) on the tensor cores,
    // the softmax of tile j under P.V, then O rescaled and P of tile j built. The first and last
    // turns are peeled, so the steady-state body has no branch around a wgmma (a compiler-inserted
    // warpgroup.arrive on a divergent path serializes the pipeline, ptxas C7520) and always two
    // commit groups (a wait count that depends on j made ptxas treat the softmax's reads of S as
    // reads inside P.V's stage, C7514).
    auto scores = [&](int j, float (&alpha)[2]) {
        const int k0 = j * WG_BC;
        const bool check = k0 + WG_BC > T || (causal && k0 + WG_BC > q0);
        softmax_scores(sc, m, l, alpha, scale * LOG2E, row, k0, T, causal, check);
    };
    auto release = [&](int slot) {
        // This warp no longer reads the slot.
        __syncwarp();
        if (lane == 0) mbar_arrive(r.empty(slot));
    };
    // Turn 0: S of tile 0 alone.
    mbar_wait(r.full(0), 0);
    named_barrier(1 + wg, TURN_THREADS);
    wgmma_fence();
    issue_qk<D>(sc, qa, r.k(0));
    wgmma_commit();
    named_barrier_arrive(2 - wg, TURN_THREADS);
    wgmma_wait_all();
    fence_operands(sc);
    float alpha[2];
    scores(0, alpha);
    rescale(o, alpha);
#pragma unroll
    for (int kk = 0; kk < WG_BC / 16; ++kk) p_fragment(p[kk], sc, kk);
    // Turns 1 .. tiles - 1: S of tile j and P.V of tile j - 1.
    for (int j = 1; j < tiles; ++j) {
        const int s = j % STAGES, prev = (j + STAGES - 1) % STAGES;
        mbar_wait(r.full(s), (j / STAGES) & 1);
        named_barrier(1 + wg, TURN_THREADS);
        wgmma_fence();
        issue_qk<D>(sc, qa, r.k(s));
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < WG_BC / 16; ++kk) issue_pv<D>(o, p[kk], r.v(prev), kk);
        wgmma_commit();
        named_barrier_arrive(2 - wg, TURN_THREADS);
        wgmma_wait_one();  // S of tile j has landed; P.V of tile j - 1 may still run
        fence_operands(sc);
        scores(j, alpha);
        fence_operands(sc);  // the probabilities are made before the wait below, under P.V
        // ptxas hoists a wgmma wait to the top of its basic block, above an unrelated softmax; the
        // next tile's barrier wait (a spin loop, so a block boundary) ahead of it keeps P.V's wait
        // below the exponentials. The next turn's own wait then returns at once.
        if (j + 1 < tiles) mbar_wait(r.full((j + 1) % STAGES), ((j + 1) / STAGES) & 1);
        wgmma_wait_all();
        fence_operands(o);
        release(prev);
        rescale(o, alpha);
#pragma unroll
        for (int kk = 0; kk < WG_BC / 16; ++kk) p_fragment(p[kk], sc, kk);
    }
    // The last turn: P.V of the last tile alone.
    {
        const int prev = (tiles + STAGES - 1) % STAGES;
        named_barrier(1 + wg, TURN_THREADS);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BC / 16; ++kk) issue_pv<D>(o, p[kk], r.v(prev), kk);
        wgmma_commit();
        if (wg == 0) named_barrier_arrive(2 - wg, TURN_THREADS);
        wgmma_wait_all();
        fence_operands(o);
        release(prev);
    }
    store_rows(out, lse, o, m, l, row, b, h, T, NH);
}

#define BF16_OVERLAP_ENTRY(D)                                                                                 \
    extern "C" __global__ void __launch_bounds__(384, 1) attention_bf16_overlap_hs##D(                                  \
        const __grid_constant__ TmaMap map, __nv_bfloat16* out, float* lse, int T, int NH, float scale, int causal) { \
        flash_overlap<D>(&map, out, lse, T, NH, scale, causal);                                                    \
    }
BF16_OVERLAP_ENTRY(64)
BF16_OVERLAP_ENTRY(128)
