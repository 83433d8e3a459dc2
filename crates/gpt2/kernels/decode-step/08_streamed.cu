// gpt2/decode-step, stage 8: streamed. The whole step in one persistent kernel with no grid
// barrier: a loader warp a block streams its GEMV units' weights through a ring of shared-memory
// pages (at B = 1 about a layer and a half of the block's units) ahead of the consumer warps, which
// wait only on counters of the producers whose output they read.
// Changed from stage 5 (the barrier megakernel with early weights) and stage 7 (the dependent
// chain): in both, an op's activation-dependent work starts only after every block of the op
// before it has finished (a grid barrier, or `griddepcontrol.wait` on the whole previous grid), and
//   each op's weights are still a round trip inside its chain. Here:
//   - per-SM instruction lists: each block's work is the same sequence of units as stage 5's (unit
//     u of a phase to block u mod grid, `mk_unit`), which the loader and the consumers both walk;
//   - the loader warp (the block's last) issues each GEMV unit's 16 weight rows as 1-D bulk copies
//     into 8.4-KB pages (16 rows x 256 of K, rows padded for ldmatrix), full/empty mbarriers per
//     page; it never waits on activations, only for a free page, so the weights are in shared memory
//     before the rows they multiply exist (measured at B = 1: a layer's first page is issued 25 us
//     before its consumers reach it);
//   - counters in global memory instead of barriers, one per dependency (released with a gpu-scope
//     red.release after the block's stores, polled with ld.acquire by one thread):
//       QKV waits for the residual stream (every MLP-down unit of the layer before, or the
//         embedding), then counts its units per head;
//       attention (b, h, split) waits for head h's 12 QKV units only;
//       a projection unit over K chunk c (4 heads) waits for those 4 heads' merges of every
//         sequence, and for every QKV block to have staged its rows (it adds into the stream they
//         read);
//       MLP up waits for every projection unit (its LayerNorm needs the whole row);
//       an MLP-down unit over K range c waits for the 48 MLP-up units that write it, and for every
//         MLP-up block to have staged its rows;
//     so three waits a layer take one head's or one K range's producers, not the slowest block's,
//     and two (the LayerNorms) take the whole op, as they must.
// Why it should be faster: stage 5's timeline has ~29 us a layer, of which the weights' first
//   round trip and the barriers' polls are ~2 us a phase, and stage 7 is ~5.4 us a kernel. With the
//   weights resident and fine-grained waits a layer is the chain of its dependent round trips
//   (the rows' statistics, the reduction and the stores, the poll): ~3 us for QKV, ~4 for attention,
//   ~2 for each projection, ~3 for MLP up: ~14 us a layer, ~170 us for 12 layers and ~25 for the LM
//   head. Predicted ~200 us at B = 1 (stage 7: 338), ~1.1x stage 7 at B = 8 and 32.
// Measured (H100, B = 1 / 8 / 32 at 1000 cached tokens): 379 / 624 / 1190 us against stage 7's
//   336 / 435 / 1145 and stage 5's 423 / 628 / 1288 in the same call (1.12x / 1.01x / 1.08x stage 5,
//   0.89x / 0.70x / 0.96x stage 7). Refuted: a layer takes ~28 us, not 14. The timeline (slots
//   below) has the weights resident, so the bytes are off the chain, and every step of a unit still
//   ~1 us: the poll after the producer's release, the LayerNorm rows' staging (1.5-1.8 us with its
//   release), the pages' mmas, the reduction and epilogue, the release. All the consumer warps of a
//   block walk one unit's chain in lockstep. With one block an SM it was 490 / 737 / 1407 us;
//   two blocks (the declared configuration) overlap two chains. Three rungs on top did not move it
//   (docs/notes/gpt2.md): a unit's pages waited for together and its fragment loads issued before
//   the first mma (419 / 658 / 1234 us), the epilogue's bias and positions prefetched at the unit's
//   start (414 / 660 / 1233), the first attention unit's cache rows pulled into L2 at the layer's
//   start (381 / 627 / 1151).
// Launch: decode_step(MkArgs) cooperative, grid = SMs x MK_BLOCKS_PER_SM (2; any smaller grid is
//   correct: units are strided over gridDim.x), block MK_THREADS consumer threads (256: 8 warps,
//   each two k16 steps of a 256-wide page) + 32 (the loader warp); dynamic shared memory: stage 5's
//   carve-up (staged rows, partial tiles, scores, statistics), then 2 x ring_pages mbarriers, then
//   ring_pages pages of 16 x (256 + 8) bf16 (the host fills a block's share of the SM: 9 pages at
//   B = 1, two blocks an SM; the kernel checks the size it was given).
// Constraints: those of stage 5 (B <= 32; head size 64; C % 256 == 0, C <= 1024; every cached
//   length in [1, tmax); the vocabulary padded to a multiple of 16), sm_90 (bulk copies and
//   transaction mbarriers); `sync` holds 4 + 32 L words, zero between launches (the last block out
//   zeroes them; after a failed wait the host does).
// Tolerance: 1e-2 preset (bf16 weights and staged activations, fp32 accumulation and residual stream).
// Timeline: 0 block start; 1 QKV past its wait (layer L/2); 2 QKV rows staged; 3 QKV units done; 4 attention first unit past its wait; 5 attention units done; 6 projection first unit past its wait; 7 projection units done; 8 MLP up past its wait; 9 MLP up rows staged; 10 MLP up units done; 11 MLP down first unit past its wait; 12 MLP down units done; 13 LM head past its wait; 14 LM head rows staged; 15 LM head units done; 16 block exit; 17 loader issues layer L/2's first page; 18 loader issues the LM head's first page; 19 loader done; 20 QKV first unit: first page's wait begun; 21 its first page ready; 22 its pages read; 23 its reduction and epilogue done; 24 it is counted; 25 LM head first unit: first page's wait begun; 26 its first page ready; 27 its pages read; 28 its reduction and epilogue done; 29 LM head unit 12: first page's wait begun; 30 its first page ready; 31 its reduction and epilogue done
// Limits: B <= 32; head size == 64; C % 256 == 0; C <= 1024
#include "gpt2_decode_step.cuh"
#include "ladder_hopper.cuh"

#ifndef MK_LOADER_WARPS
#error "MK_LOADER_WARPS is a tunable: the host sets it"
#endif
#if MK_LOADER_WARPS != 1
#error "the weights' ring has one loader warp"
#endif
#define SG_PAGE_K 256
#define SG_ROW (SG_PAGE_K + 8)  // a page row in bf16, padded 16 bytes: ldmatrix's 8 rows hit 8 bank groups
#define SG_PAGE_BYTES (16 * SG_ROW * 2)
#define SG_STEPS (SG_PAGE_K / 16 / MK_WARPS)  // k16 steps of a page per consumer warp
#define SG_LAYER_WORDS 32
#define SG_EMBED 3  // sync[3]: blocks done with the embedding; each layer's counters from sync[4]
#define SG_FIRST 4
#define SG_ERR_RING 2
#define SG_ERR_SETUP 3
static_assert(SG_STEPS * 16 * MK_WARPS == SG_PAGE_K, "a page's k16 steps split evenly over the consumer warps");
static_assert(MK_PROJ_CHUNK == SG_PAGE_K, "a projection unit is one page");

// A layer's counters (offsets in its SG_LAYER_WORDS words).
enum {
    SG_QKV_HEAD = 0,    // [H <= 16] QKV units done per head (12 a head: q, k and v rows)
    SG_QKV_READ = 16,   // QKV blocks done staging the residual stream
    SG_ATT_CHUNK = 17,  // [C / 256 <= 4] (sequence, head) merges done per 256 columns
    SG_PROJ_DONE = 21,  // projection units done
    SG_FC_READ = 22,    // MLP-up blocks done staging the residual stream
    SG_FC_CHUNK = 23,   // [4] MLP-up units done per C columns of the hidden layer
    SG_FCPROJ_DONE = 27 // MLP-down units done
};

// The ring in shared memory: pages [n] of 16 x SG_ROW bf16, and a full and an empty mbarrier each.
struct SgRing {
    unsigned pages, bars;
    int n;
    __device__ __forceinline__ unsigned page(unsigned slot) const { return pages + slot * SG_PAGE_BYTES; }
    __device__ __forceinline__ unsigned full(unsigned slot) const { return bars + 8 * slot; }
    __device__ __forceinline__ unsigned empty(unsigned slot) const { return bars + 8 * (n + slot); }
};

__device__ __forceinline__ unsigned sg_dynamic_smem() {
    unsigned bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}

// The ring after stage 5's carve-up; false when the launch gave less shared memory than it needs.
__device__ __forceinline__ bool sg_ring(unsigned char* base, const MkSmem& s, const MkArgs& a, SgRing& r) {
    const unsigned start = (unsigned)(reinterpret_cast<unsigned char*>(s.misc + 32) - base);
    const unsigned bars = (start + 127) & ~127u, pages = (bars + 16 * a.ring_pages + 127) & ~127u;
    const unsigned at = (unsigned)__cvta_generic_to_shared(base);
    r = {at + pages, at + bars, a.ring_pages};
    return a.ring_pages >= 2 && pages + a.ring_pages * SG_PAGE_BYTES <= sg_dynamic_smem();
}

// Waits for an mbarrier's phase; false when another block or warp reported an error or
// wait_ns passed (then this one reports it).
__device__ bool sg_page_wait(unsigned bar, unsigned parity, int* error, unsigned long long wait_ns) {
    unsigned long long start = 0;
    for (unsigned spin = 0; !mbar_try_wait(bar, parity); ++spin) {
        if ((spin & 63) != 63) continue;
        if (*reinterpret_cast<volatile int*>(error) != 0) return false;
        if (start == 0) start = mk_now();
        if (mk_now() - start > wait_ns) {
            atomicCAS(error, 0, SG_ERR_RING);
            return false;
        }
    }
    return true;
}

__device__ __forceinline__ void sg_stamp(bool stamped, int slot) {
    if (stamped) ladder_stamp(slot);
}

// The timeline's slots inside one GEMV unit (-1: not stamped): its first page's wait begun and
// ended, its pages read, its reduction and epilogue done.
struct SgUnitSlots {
    int wait, ready, read, reduced;
};
#define SG_UNSTAMPED (SgUnitSlots{-1, -1, -1, -1})

// The loader warp: every GEMV unit of this block, in the consumers' order, page by page into the
// ring; it waits only for a page to be free.
__device__ void sg_load_weights(const MkArgs& a, const SgRing& r) {
    const int lane = threadIdx.x & 31;
    unsigned n = 0;  // pages issued
    for (int phase = 1; phase <= 1 + 5 * a.L; ++phase) {
        MkTile t;
        for (int i = 0; mk_unit(a, phase, i, t); ++i) {
            for (int k = 0; k < t.klen; k += SG_PAGE_K, ++n) {
                const unsigned slot = n % r.n, round = n / r.n;
                if (round > 0 && !sg_page_wait(r.empty(slot), (round - 1) & 1, a.error, a.wait_ns)) return;
                sg_stamp(k == 0 && i == 0 && (phase == 1 + 5 * (a.L / 2)), 17);
                sg_stamp(k == 0 && i == 0 && phase == 1 + 5 * a.L, 18);
                if (lane == 0) mbar_expect_tx(r.full(slot), 16 * SG_PAGE_K * 2);
                __syncwarp();
                if (lane < 16) bulk_load(r.page(slot) + lane * SG_ROW * 2, t.row(lane) + k, SG_PAGE_K * 2, r.full(slot));
            }
        }
    }
    ladder_stamp(19);
}

// One thread waits until *p >= want (and *p2 >= want2 when p2 is given); false for every consumer
// thread when a wait failed (then no id is picked: -1 tells the host to read the error).
__device__ bool sg_wait(const MkArgs& a, const unsigned* p, unsigned want, const unsigned* p2 = nullptr,
                        unsigned want2 = 0) {
    __shared__ int ok;
    if (threadIdx.x == 0) {
        ok = mk_wait_at_least(p, want, a.error, a.wait_ns) &&
             (p2 == nullptr || mk_wait_at_least(p2, want2, a.error, a.wait_ns));
        if (!ok)
            for (int b = 0; b < a.B; ++b) a.next[b] = -1;
    }
    mk_sync();
    return ok;
}

// Counts this block's stores so far (every consumer thread's, ordered by the barrier) as done.
__device__ __forceinline__ void sg_bump(unsigned* counter) {
    mk_sync();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}

// B rows of a bf16 activation written in this launch, columns [k0, k0 + klen) of row stride ld,
// into the staged rows at column 0 (rows up to the padded batch zero).
__device__ void sg_stage_rows(const MkSmem& s, const bf16* src, int ld, int k0, int klen, int B, int tiles) {
    const int per_row = klen / 8;
    for (int idx = threadIdx.x; idx < 8 * tiles * per_row; idx += MK_THREADS) {
        const int b = idx / per_row, k = 8 * (idx % per_row);
        *reinterpret_cast<uint4*>(s.xs + (size_t)b * s.stride + k) =
            b < B ? __ldcg(reinterpret_cast<const uint4*>(src + (size_t)b * ld + k0 + k)) : make_uint4(0, 0, 0, 0);
    }
    mk_sync();
}

// The B operand of k16 step kk of page p for batch tile i: row 8i + g of the staged rows.
__device__ __forceinline__ void sg_b_frag(unsigned& b0, unsigned& b1, const MkSmem& s, int i, int k) {
    const int lane = threadIdx.x & 31;
    const bf16* x = s.xs + (size_t)(8 * i + (lane >> 2)) * s.stride + k + 2 * (lane & 3);
    b0 = *reinterpret_cast<const unsigned*>(x);
    b1 = *reinterpret_cast<const unsigned*>(x + 8);
}

// The A operand's ldmatrix address of k16 step kk in a page: row lane % 16, column kk + 8 (lane / 16).
__device__ __forceinline__ unsigned sg_a_addr(const SgRing& r, unsigned slot, int kk) {
    const int lane = threadIdx.x & 31;
    return r.page(slot) + ((lane & 15) * SG_ROW + kk + 8 * (lane >> 4)) * 2;
}

// One GEMV unit from the ring, page by page (wait; each warp's two k16 steps of the page, A by
// ldmatrix from it, B from the staged rows at the unit's local K; hand it back), then the reduction
// and the epilogue. A page wait that failed leaves the error set and goes on: the next counter wait
// ends the kernel for every consumer thread together. Every consumer thread hands a page back itself
// (its own reads ordered by its own release), not one lane a warp after __syncwarp: compute-
// sanitizer's racecheck counts only the former as ordering the loader's next copy into the page
// after the reads. (Waiting for all of a unit's pages and issuing every fragment load before the
// first mma was slower: docs/notes/gpt2.md.)
template <class Epi>
__device__ void sg_gemv_unit(const MkArgs& a, const MkSmem& s, const SgRing& r, unsigned& n, const MkTile& t,
                             int tiles, Epi& epi, SgUnitSlots sl = SG_UNSTAMPED) {
    const int warp = threadIdx.x >> 5;
    float acc[MK_TILES][4];
#pragma unroll
    for (int i = 0; i < MK_TILES; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    for (int k = 0; k < t.klen; k += SG_PAGE_K, ++n) {
        const unsigned slot = n % r.n;
        mk_stamp(k == 0 ? sl.wait : -1);
        sg_page_wait(r.full(slot), (n / r.n) & 1, a.error, a.wait_ns);
        mk_stamp(k == 0 ? sl.ready : -1);
#pragma unroll
        for (int j = 0; j < SG_STEPS; ++j) {
            const int kk = 16 * (warp * SG_STEPS + j);
            unsigned w[4];
            ldmatrix_x4(w, sg_a_addr(r, slot, kk));
#pragma unroll
            for (int i = 0; i < MK_TILES; ++i) {
                if (i < tiles) {
                    unsigned b0, b1;
                    sg_b_frag(b0, b1, s, i, k + kk);
                    mma_16816<bf16>(acc[i], w[0], w[1], w[2], w[3], b0, b1);
                }
            }
        }
        mbar_arrive(r.empty(slot));
    }
    mk_stamp(sl.read);
    mk_reduce(acc, s, tiles, t.n0, a.B, epi, -1);
    mk_stamp(sl.reduced);
}

// The consumer warps: the embedding, then each layer's five ops unit by unit, each behind the
// counters of exactly what it reads, then the LM head and the argmax.
__device__ void sg_consume(const MkArgs& a, const MkSmem& s, const SgRing& r, int tiles) {
    const int C = a.C, G = gridDim.x, mid = a.L / 2;
    const unsigned qkv_blocks = min(G, 3 * C / 16), fc_blocks = min(G, 4 * C / 16);
    const unsigned proj_units = (C / 16) * (C / MK_PROJ_CHUNK), fcproj_units = 4 * C / 16;
    unsigned n = 0;  // pages taken from the ring
    MkTile t;
    mk_embed(a);
    sg_bump(a.sync + SG_EMBED);
    const unsigned* stream_ready = a.sync + SG_EMBED;
    unsigned stream_want = G;
    for (int l = 0; l < a.L; ++l) {
        const MkLayer& L = a.layers[l];
        unsigned* c = a.sync + SG_FIRST + l * SG_LAYER_WORDS;
        const bool st = l == mid;
        const int ph = 1 + 5 * l;
        if (blockIdx.x < qkv_blocks) {
            if (!sg_wait(a, stream_ready, stream_want)) return;
            sg_stamp(st, 1);
            mk_stage_ln_rows(a, s, tiles);
            sg_bump(c + SG_QKV_READ);
            sg_stamp(st, 2);
            MkQkvEpi epi{a, L, s.rstd};
            for (int i = 0; mk_unit(a, ph + PH_QKV, i, t); ++i) {
                const bool first = st && i == 0;
                sg_gemv_unit(a, s, r, n, t, tiles, epi, first ? SgUnitSlots{20, 21, 22, 23} : SG_UNSTAMPED);
                sg_bump(c + SG_QKV_HEAD + (t.n0 % C) / MK_HEAD);
                sg_stamp(first, 24);
            }
            sg_stamp(st, 3);
        }
        for (int u = blockIdx.x; u < a.B * a.H * a.splits; u += G) {
            const int h = (u / a.splits) % a.H;
            if (!sg_wait(a, c + SG_QKV_HEAD + h, 3 * MK_HEAD / 16)) return;
            sg_stamp(st && u == (int)blockIdx.x, 4);
            if (mk_attention_unit(a, L, u, s, -1)) sg_bump(c + SG_ATT_CHUNK + h * MK_HEAD / MK_PROJ_CHUNK);
        }
        sg_stamp(st && (int)blockIdx.x < a.B * a.H * a.splits, 5);
        for (int i = 0; mk_unit(a, ph + PH_PROJ, i, t); ++i) {
            const int chunk = t.k0 / MK_PROJ_CHUNK;
            if (!sg_wait(a, c + SG_ATT_CHUNK + chunk, a.B * (MK_PROJ_CHUNK / MK_HEAD), c + SG_QKV_READ, qkv_blocks))
                return;
            sg_stamp(st && i == 0, 6);
            sg_stage_rows(s, a.att, C, t.k0, t.klen, a.B, tiles);
            MkResidualEpi epi{a, L.proj_b, t.k0 == 0};
            sg_gemv_unit(a, s, r, n, t, tiles, epi);
            sg_bump(c + SG_PROJ_DONE);
        }
        sg_stamp(st && blockIdx.x < proj_units, 7);
        if (blockIdx.x < fc_blocks) {
            if (!sg_wait(a, c + SG_PROJ_DONE, proj_units)) return;
            sg_stamp(st, 8);
            mk_stage_ln_rows(a, s, tiles);
            sg_bump(c + SG_FC_READ);
            sg_stamp(st, 9);
            MkFcEpi epi{a, L, s.rstd};
            for (int i = 0; mk_unit(a, ph + PH_FC, i, t); ++i) {
                sg_gemv_unit(a, s, r, n, t, tiles, epi);
                sg_bump(c + SG_FC_CHUNK + t.n0 / C);
            }
            sg_stamp(st, 10);
        }
        for (int i = 0; mk_unit(a, ph + PH_FCPROJ, i, t); ++i) {
            if (!sg_wait(a, c + SG_FC_CHUNK + t.k0 / C, C / 16, c + SG_FC_READ, fc_blocks)) return;
            sg_stamp(st && i == 0, 11);
            sg_stage_rows(s, a.h, 4 * C, t.k0, t.klen, a.B, tiles);
            MkResidualEpi epi{a, L.fcproj_b, t.k0 == 0};
            sg_gemv_unit(a, s, r, n, t, tiles, epi);
            sg_bump(c + SG_FCPROJ_DONE);
        }
        sg_stamp(st && blockIdx.x < fcproj_units, 12);
        stream_ready = c + SG_FCPROJ_DONE;
        stream_want = fcproj_units;
    }
    if (!sg_wait(a, stream_ready, stream_want)) return;
    ladder_stamp(13);
    mk_stage_ln_rows(a, s, tiles);
    ladder_stamp(14);
    MkHeadEpi epi{a, s.rstd, {-INFINITY, -INFINITY}, {0x7fffffff, 0x7fffffff}};
    for (int i = 0; mk_unit(a, 1 + 5 * a.L, i, t); ++i) {
        const SgUnitSlots sl = i == 0 ? SgUnitSlots{25, 26, 27, 28} : i == 12 ? SgUnitSlots{29, 30, -1, 31} : SG_UNSTAMPED;
        sg_gemv_unit(a, s, r, n, t, tiles, epi, sl);
    }
    ladder_stamp(15);
    mk_argmax_merge(a, epi, s, tiles);
    mk_exit(a, a.sync_words);
    ladder_stamp(16);
}

extern "C" __global__ void __launch_bounds__(MK_THREADS + 32 * MK_LOADER_WARPS, MK_BLOCKS_PER_SM)
    decode_step(const MkArgs a) {
    extern __shared__ __align__(128) unsigned char mk_shared[];
    const int tiles = (a.B + 7) / 8;
    const MkSmem s = mk_smem(mk_shared, a, tiles);
    SgRing r;
    // A launch that does not match the kernel fails whole, before any barrier.
    if (!sg_ring(mk_shared, s, a, r) || a.sync_words < SG_FIRST + SG_LAYER_WORDS * a.L) {
        if (threadIdx.x == 0) atomicCAS(a.error, 0, SG_ERR_SETUP);
        if (threadIdx.x < a.B && blockIdx.x == 0) a.next[threadIdx.x] = -1;
        return;
    }
    if (threadIdx.x == 0) {
        for (int i = 0; i < r.n; ++i) {
            mbar_init(r.full(i), 1);
            mbar_init(r.empty(i), MK_THREADS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    ladder_stamp(0);
    if (threadIdx.x >= MK_THREADS) {
        sg_load_weights(a, r);
        return;
    }
    sg_consume(a, s, r, tiles);
}
