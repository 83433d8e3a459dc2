// gpt2/decode-step, stages 2, 3 and 5: the whole decode step (embedding, 12 blocks, the final
// LayerNorm, the LM head and the argmax) in one persistent kernel, its ops as phases separated by
// grid barriers. Stage 2 launches it once per layer (the phases of one block, the embedding with the
// first, the LM head with the last); stage 3 launches it once for the whole step; stage 5
// (MK_EARLY_WEIGHTS) also issues weight loads before the waits they do not depend on.
// Changed from stage 0 (the composed bf16 step replayed as a CUDA graph: 75 kernels at batch 1):
//   every op is a phase of one cooperative kernel; each block takes a phase's work units (16 weight
//   rows by one K range of a GEMV, a (sequence, head, split) of attention) unit u = blockIdx.x,
//   + gridDim.x, ..., and a grid barrier separates phases that depend on each other. The
//   LayerNorms stay folded into the GEMVs after them (stage 0's gemv 05: W' = W * gamma, bias' =
//   W . beta + bias, each block takes its rows' statistics and stages bf16(x - mean) in shared
//   memory); kv-append is the QKV phase's epilogue (k and v columns go to the cache as bf16, q to
//   an fp32 buffer); the attention split merge is done by the last block of each (sequence, head)
//   (a ticket); the projections add into the fp32 residual stream with atomics (their K is split
//   into ranges so every SM has work at N = C = 768); GELU is the MLP up's epilogue; the argmax
//   runs in the LM head's epilogue (a running best per thread, one partial per block, the last
//   block merges).
// Why it should be faster: stage 0 pays a kernel boundary (~1 us of launch and ~3 us of ramp and
//   tail, measured) 75 times; here a phase boundary is a grid barrier (an atomic and a spin, ~1-2
//   us predicted) and no block is ever launched again. 62 phases at batch 1: predicted ~62 x (1.5 us
//   barrier + ~1 us first loads) + 89 us of bytes ~ 240 us for stage 3 (403 us at stage 0), and
//   stage 2 ~ 12 x 4 us more.
// Measured (H100, B = 1 / 8 / 32 at 1000 cached tokens): stage 2 500 / 740 / 1457 us, stage 3
//   472 / 686 / 1385 us, against stage 0's 403 / 472 / 1204 us. Refuted: the timeline (slots
//   below) puts ~0.9 us in each barrier and 2.5-6 us in each phase, 28 us a layer where the
//   prediction had 12: a phase is a chain of dependent round trips (the rows' statistics from L2,
//   the weights, the reduction through shared memory, the epilogue's stores), and its slowest
//   block runs ~2 us behind the mean (144 or 192 units on 132 blocks). The notes say what was
//   tried next (an L2 prefetch a phase ahead, a TMA weight ring, two units a pass, counters in place
//   of three barriers a layer, a warp a weight row: all slower).
// Stage 5 (MK_EARLY_WEIGHTS), changed from stage 3: the timeline with stamps inside each phase (the
//   slots below; layer 6 at B = 1) showed the first unit's weights arriving 1.8-3.2 us after its
//   barrier, behind the rows' staging (1.25 us), and a block's second unit paying the whole load
//   again. A block's first unit of a phase now has its weights loaded into registers between the
//   barrier's arrival and its wait, and each unit issues its next unit's loads as soon as its mmas
//   have read the registers, ahead of its reduction and epilogue. Issued before the arrival instead,
//   the release add waited for them: the barrier went from ~1 to ~2 us and the step did not move
//   (479 vs 481 us). Predicted ~1.5 us a GEMV phase, ~70 us a step at B = 1. Measured 424 / 624 /
//   1285 us against stage 3's 472 / 686 / 1385 in the same call (1.11x / 1.10x / 1.08x); still
//   0.95x / 0.76x / 0.94x stage 0. 160 registers. Tried on top and not kept (each measured at every
//   default shape; docs/notes/gpt2.md section 5): the residual projections' K steps dealt out evenly
//   over the blocks (slower), the attention's cache rows loaded before its barrier's wait (equal:
//   the phase ends with the merging splits), the split merge moved into the projection's row
//   staging (slower).
// Launch: decode_step(MkArgs) cooperative, grid = SMs x MK_BLOCKS_PER_SM (any smaller grid is
//   correct: units are strided over gridDim.x), block MK_THREADS = 384 (measured 2-12% faster than
//   256; 512 does not fit the registers); dynamic shared memory 8 ceil(B / 8) x (C + 8) bf16
//   (staged rows) + MK_WARPS x 16 x 32 floats (partial tiles) + tmax floats (attention scores) +
//   64 floats. Attention issues MK_ATT_ILP = 4 tokens' loads a lane before using any.
// Constraints: B <= 32; head size 64; C % 256 == 0, C <= 1024; every cached length in [1, tmax);
//   the vocabulary padded to a multiple of 16.
// Tolerance: 1e-2 preset (bf16 weights and staged activations, fp32 accumulation and residual stream).
// Timeline: 0 block start; 1 layer L/2 QKV start (its barrier passed); 2 QKV rows staged; 3 QKV first unit's partials in shared memory; 4 QKV first unit done; 5 QKV done; 6 attention start; 7 attention first unit's scores; 8 attention first unit done; 9 attention done; 10 projection start; 11 projection first unit's partials; 12 projection first unit done; 13 projection done; 14 MLP up start; 15 MLP up rows staged; 16 MLP up first unit's partials; 17 MLP up first unit done; 18 MLP up done; 19 MLP down start; 20 MLP down first unit's partials; 21 MLP down first unit done; 22 MLP down done; 23 LM head start; 24 LM head rows staged; 25 LM head first unit's partials; 26 LM head first unit done; 27 LM head units done; 28 block exit
// Limits: B <= 32; head size == 64; C % 256 == 0; C <= 1024
#include "gpt2_decode_step.cuh"

#ifndef MK_EARLY_WEIGHTS
#define MK_EARLY_WEIGHTS 0
#endif
#define MK_UNROLL 4

// The timeline's slots of a stamped phase (the five of layer L/2, and the LM head): its start, its
// rows staged, its first unit's partial tiles in shared memory (attention: its scores), that unit
// done, and the phase done; -1 where a phase has no such point or is not stamped.
struct MkSlots {
    int start, staged, partial, unit, done;
};

__device__ __forceinline__ MkSlots mk_slots(const MkArgs& a, int phase) {
    const int mid = 1 + 5 * (a.L / 2);
    if (phase == 1 + 5 * a.L) return {23, 24, 25, 26, 27};
    switch (phase - mid) {
        case PH_QKV: return {1, 2, 3, 4, 5};
        case PH_ATTN: return {6, -1, 7, 8, 9};
        case PH_PROJ: return {10, -1, 11, 12, 13};
        case PH_FC: return {14, 15, 16, 17, 18};
        case PH_FCPROJ: return {19, -1, 20, 21, 22};
        default: return {-1, -1, -1, -1, -1};
    }
}

// Weights are read once per step: no L1 allocation.
__device__ __forceinline__ uint4 mk_load_weights(const bf16* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// The grid barrier in two halves, so that loads independent of the phase before can be issued
// between them: every block's writes before mk_arrive are visible to every block after mk_wait.
// `arrived` counts the arrivals this block expects in all (the counter only grows within a launch).
__device__ __forceinline__ void mk_arrive(const MkArgs& a, unsigned& arrived) {
    mk_sync();
    arrived += gridDim.x;
    // A release add: the block's writes (ordered before it by the mk_sync above) are visible
    // to whoever acquires the count; no separate fence. It waits for the issuing thread's memory
    // operations before it, so nothing should be issued ahead of it that need not be.
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&a.sync[0]) : "memory");
}

__device__ bool mk_wait(const MkArgs& a, unsigned arrived) {
    __shared__ int ok;
    if (threadIdx.x == 0) {
        ok = mk_wait_at_least(&a.sync[0], arrived, a.error, a.wait_ns);
        // A failed step picks no token: -1 tells the host to read the error.
        if (!ok)
            for (int b = 0; b < a.B; ++b) a.next[b] = -1;
    }
    mk_sync();
    return ok;
}

// A unit's weights in registers: each lane's 16 bytes of rows g and g + 8 for each of its warp's
// 32-wide steps of K (steps warp, warp + MK_WARPS, ...). A unit is one pass: its K range is at most
// C <= 1024, 32 steps, within MK_WARPS x MK_UNROLL = 48.
struct MkFrags {
    uint4 a[MK_UNROLL], b[MK_UNROLL];
};

__device__ __forceinline__ void mk_issue(MkFrags& f, const MkTile& t) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const bf16* ra = t.row(g);
    const bf16* rb = t.row(g + 8);
#pragma unroll
    for (int u = 0; u < MK_UNROLL; ++u) {
        const int s = warp + u * MK_WARPS, k = 32 * s + 8 * q;
        if (s < t.klen / 32) {
            f.a[u] = mk_load_weights(ra + k);
            f.b[u] = mk_load_weights(rb + k);
        }
    }
}

// acc[i] (batch columns 8i..8i+7) = W[16 rows, klen] . X[8i.., k0 ..]^T on the tensor cores (the
// layout of matmul/gemv 04: each lane's 16 contiguous bytes of rows g and g + 8 are the A fragments
// of two k16 steps, and the same eight elements of X the B fragments).
template <class Rows>
__device__ __forceinline__ void mk_mma_frags(float (&acc)[MK_TILES][4], const MkFrags& f, int k0, int klen,
                                             int tiles, const Rows& rows) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int i = 0; i < MK_TILES; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
#pragma unroll
    for (int u = 0; u < MK_UNROLL; ++u) {
        const int s = warp + u * MK_WARPS, k = 32 * s + 8 * q;
        if (s >= klen / 32) break;
#pragma unroll
        for (int i = 0; i < MK_TILES; ++i) {
            if (i < tiles) {
                const uint4 x = rows.piece(8 * i + g, k0 + k);
                mma_16816<bf16>(acc[i], f.a[u].x, f.b[u].x, f.a[u].y, f.b[u].y, x.x, x.y);
                mma_16816<bf16>(acc[i], f.a[u].z, f.b[u].z, f.a[u].w, f.b[u].w, x.z, x.w);
            }
        }
    }
}

// One GEMV unit: its weights (in f already when `issued`), the mmas against the rows `rows` gives,
// and the epilogue. With MK_EARLY_WEIGHTS the loads of the block's next unit of the phase go into f
// as soon as the mmas have read it, ahead of this unit's reduction and epilogue; returns whether
// they did. The block's first unit of a stamped phase stamps its partials and its end.
template <class Rows, class Epi>
__device__ __forceinline__ bool mk_gemv_unit(const MkArgs& a, const MkSmem& s, int phase, int i, int tiles,
                                             const Rows& rows, Epi& epi, const MkSlots& sl, MkFrags& f,
                                             bool issued) {
    MkTile t;
    mk_unit(a, phase, i, t);
    if (!issued) mk_issue(f, t);
    float acc[MK_TILES][4];
    mk_mma_frags(acc, f, t.k0, t.klen, tiles, rows);
    bool next = false;
#if MK_EARLY_WEIGHTS
    MkTile tn;
    next = mk_unit(a, phase, i + 1, tn);
    if (next) mk_issue(f, tn);
#endif
    const bool first = i == 0;
    mk_reduce(acc, s, tiles, t.n0, a.B, epi, first ? sl.partial : -1);
    if (first) mk_stamp(sl.unit);
    return next;
}

// A phase whose input is the LayerNorm's rows (the LM head, QKV, MLP up): the rows staged in
// shared memory, then this block's units of it with epilogue `epi`.
template <class Epi>
__device__ __forceinline__ void mk_staged_phase(const MkArgs& a, int phase, const MkSmem& s, int tiles,
                                                const MkSlots& sl, MkFrags& pre, bool early, Epi& epi) {
    mk_stage_ln_rows(a, s, tiles);
    mk_stamp(sl.staged);
    const MkSmemRows staged{s.xs, s.stride};
    MkTile t;
    for (int i = 0; mk_unit(a, phase, i, t); ++i) early = mk_gemv_unit(a, s, phase, i, tiles, staged, epi, sl, pre, early);
}

// One phase: this block's units of it, u = blockIdx.x, + gridDim.x, ...
// `pre` holds the weights of the block's first unit when `early` (issued before the barrier's wait).
__device__ void mk_phase(const MkArgs& a, int phase, const MkSmem& s, int tiles, const MkSlots& sl, MkFrags& pre,
                         bool early) {
    const int C = a.C, G = gridDim.x;
    if (phase == 0) {
        mk_embed(a);
        return;
    }
    MkTile t;
    if (phase == 1 + 5 * a.L) {
        MkHeadEpi epi{a, s.rstd, {-INFINITY, -INFINITY}, {0x7fffffff, 0x7fffffff}};
        mk_staged_phase(a, phase, s, tiles, sl, pre, early, epi);
        mk_argmax_merge(a, epi, s, tiles);
        return;
    }
    const MkLayer& L = a.layers[(phase - 1) / 5];
    switch ((phase - 1) % 5) {
        case PH_QKV: {
            MkQkvEpi epi{a, L, s.rstd};
            mk_staged_phase(a, phase, s, tiles, sl, pre, early, epi);
            break;
        }
        case PH_ATTN:
            for (int u = blockIdx.x; u < a.B * a.H * a.splits; u += G) {
                mk_attention_unit(a, L, u, s, u == (int)blockIdx.x ? sl.partial : -1);
                if (u == (int)blockIdx.x) mk_stamp(sl.unit);
            }
            break;
        case PH_PROJ:
            for (int i = 0; mk_unit(a, phase, i, t); ++i) {
                MkResidualEpi epi{a, L.proj_b, t.k0 == 0};
                early = mk_gemv_unit(a, s, phase, i, tiles, MkGlobalRows{a.att, C, a.B}, epi, sl, pre, early);
            }
            break;
        case PH_FC: {
            MkFcEpi epi{a, L, s.rstd};
            mk_staged_phase(a, phase, s, tiles, sl, pre, early, epi);
            break;
        }
        case PH_FCPROJ:
            for (int i = 0; mk_unit(a, phase, i, t); ++i) {
                MkResidualEpi epi{a, L.fcproj_b, t.k0 == 0};
                early = mk_gemv_unit(a, s, phase, i, tiles, MkGlobalRows{a.h, 4 * C, a.B}, epi, sl, pre, early);
            }
            break;
    }
}

extern "C" __global__ void __launch_bounds__(MK_THREADS, 1) decode_step(const MkArgs a) {
    extern __shared__ __align__(16) unsigned char mk_shared[];
    const int tiles = (a.B + 7) / 8;
    const MkSmem s = mk_smem(mk_shared, a, tiles);
    unsigned arrived = 0;
    ladder_stamp(0);
    MkFrags pre;
    for (int phase = a.first; phase < a.last; ++phase) {
        if (phase > a.first) mk_arrive(a, arrived);
        bool early = false;
#if MK_EARLY_WEIGHTS
        // The weights of this block's first unit do not depend on the phase before: their loads go
        // out between the barrier's arrival and its wait (before the arrival, the release would wait
        // for them), so their latency overlaps the wait and the rows' staging.
        MkTile first;
        early = phase > a.first && mk_unit(a, phase, 0, first);
        if (early) mk_issue(pre, first);
#endif
        if (phase > a.first && !mk_wait(a, arrived)) return;
        const MkSlots sl = mk_slots(a, phase);
        mk_stamp(sl.start);
        mk_phase(a, phase, s, tiles, sl, pre, early);
        mk_stamp(sl.done);
    }
    mk_exit(a, 2);
    ladder_stamp(28);
}
