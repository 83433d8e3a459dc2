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
#include "ladder_mma.cuh"
#include "ladder_reduce.cuh"
#include "gpt2_pointwise.cuh"
#include "ladder_timeline.cuh"

#ifndef MK_THREADS
#error "MK_THREADS is a tunable: the host sets it"
#endif
#ifndef MK_EARLY_WEIGHTS
#define MK_EARLY_WEIGHTS 0
#endif
#define MK_WARPS (MK_THREADS / 32)
#define MK_HEAD 64
#define MK_BMAX 32
#define MK_TILES (MK_BMAX / 8)
#define MK_CMAX 1024
#define MK_PROJ_CHUNK 256
#define MK_UNROLL 4
#define MK_ATT_ILP 4
#define MK_WAIT_NS 500000000ull
#define MK_ERR_BARRIER 1
#define MK_LOG2E 1.4426950408889634f

typedef __nv_bfloat16 bf16;

// One block's parameters: the LayerNorm-folded QKV and MLP up (W', bias'), the two projections,
// and its layer of the contiguous bf16 cache, [B, tmax, C] each.
struct MkLayer {
    const bf16* qkv_w;
    const float* qkv_b;
    const bf16* proj_w;
    const float* proj_b;
    const bf16* fc_w;
    const float* fc_b;
    const bf16* fcproj_w;
    const float* fcproj_b;
    bf16* k;
    bf16* v;
};

// Everything a step reads and writes (the host's `MkArgs`, field for field).
struct MkArgs {
    const MkLayer* layers;
    const float* wte;
    const float* wpe;
    const bf16* head_w;  // ln_f folded into the padded LM head, [Vp, C]
    const float* head_b;
    const int* ids;
    const int* pos;
    const int* lens;  // lengths after this step's append
    float* x;         // residual stream [B, C]
    float* q;         // [B, C]
    bf16* att;        // attention output [B, C]
    bf16* h;          // GELU(MLP up) [B, 4C]
    float* logits;    // [B, Vp]
    int* next;        // [B]
    float* part;      // attention partials [B * H * splits][MK_HEAD + 2]
    unsigned* tickets;  // [B * H], zero between launches
    float* best_v;      // [gridDim.x][MK_BMAX]
    int* best_i;
    unsigned* sync;  // [0] barrier arrivals, [1] exits, [2] argmax ticket; zero between launches
    int* error;      // nonzero: a wait timed out
    int B, C, H, L, V, Vp, tmax, splits, first, last;
};

// Phases: 0 the embedding; 1 + 5l + {0 QKV and kv-append, 1 attention, 2 projection, 3 MLP up,
// 4 MLP down} for layer l; 1 + 5L the LM head and argmax.
enum { PH_QKV = 0, PH_ATTN = 1, PH_PROJ = 2, PH_FC = 3, PH_FCPROJ = 4 };

__device__ __forceinline__ unsigned long long mk_now() {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
}

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

__device__ __forceinline__ void mk_stamp(int slot) {
    if (slot >= 0) ladder_stamp(slot);
}

__device__ __forceinline__ unsigned mk_load_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Weights are read once per step: no L1 allocation.
__device__ __forceinline__ uint4 mk_load_weights(const bf16* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Waits until *p >= want; false when another block reported an error or MK_WAIT_NS passed (then
// this one reports it): the kernel returns instead of spinning forever.
__device__ bool mk_wait_at_least(const unsigned* p, unsigned want, int* error) {
    const unsigned long long start = mk_now();
    for (unsigned spin = 0; mk_load_acquire(p) < want; ++spin) {
        // The error word and the clock every 64 polls: the poll itself is the hot loop.
        if ((spin & 63) != 63) continue;
        if (*reinterpret_cast<volatile int*>(error) != 0) return false;
        if (mk_now() - start > MK_WAIT_NS) {
            atomicCAS(error, 0, MK_ERR_BARRIER);
            return false;
        }
    }
    return true;
}

// The grid barrier in two halves, so that loads independent of the phase before can be issued
// between them: every block's writes before mk_arrive are visible to every block after mk_wait.
// `arrived` counts the arrivals this block expects in all (the counter only grows within a launch).
__device__ __forceinline__ void mk_arrive(const MkArgs& a, unsigned& arrived) {
    __syncthreads();
    arrived += gridDim.x;
    // A release add: the block's writes (ordered before it by the __syncthreads above) are visible
    // to whoever acquires the count; no separate fence. It waits for the issuing thread's memory
    // operations before it, so nothing should be issued ahead of it that need not be.
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&a.sync[0]) : "memory");
}

__device__ bool mk_wait(const MkArgs& a, unsigned arrived) {
    __shared__ int ok;
    if (threadIdx.x == 0) {
        ok = mk_wait_at_least(&a.sync[0], arrived, a.error);
        // A failed step picks no token: -1 tells the host to read the error.
        if (!ok)
            for (int b = 0; b < a.B; ++b) a.next[b] = -1;
    }
    __syncthreads();
    return ok;
}

// The end of a launch: the last block out resets the counters for the next launch (every other
// block has passed its last wait by then).
__device__ void mk_exit(const MkArgs& a) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&a.sync[1], 1u) == gridDim.x - 1) {
            a.sync[0] = 0;
            a.sync[1] = 0;
            __threadfence();
        }
    }
}

// Shared memory carve-up (dynamic): staged rows, partial tiles, attention scores, statistics.
struct MkSmem {
    bf16* xs;      // [8 * tiles][C + 8]
    float* red;    // [MK_WARPS][16][MK_BMAX]
    float* score;  // [tmax]
    float* rstd;   // [MK_BMAX]
    float* misc;   // [32]
    int stride;
};

__device__ __forceinline__ MkSmem mk_smem(unsigned char* base, const MkArgs& a, int tiles) {
    MkSmem s;
    s.stride = a.C + 8;
    s.xs = reinterpret_cast<bf16*>(base);
    s.red = reinterpret_cast<float*>(base + (size_t)8 * tiles * s.stride * 2);
    s.score = s.red + MK_WARPS * 16 * MK_BMAX;
    s.rstd = s.score + a.tmax;
    s.misc = s.rstd + MK_BMAX;
    return s;
}

// The LayerNorm folded into the next GEMV: each row b < B of x as bf16(x - mean) into xs and its
// rstd; rows up to the padded batch are zeros.
__device__ void mk_stage_ln_rows(const MkArgs& a, const MkSmem& s, int tiles) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, C = a.C;
    for (int b = warp; b < 8 * tiles; b += MK_WARPS) {
        bf16* row = s.xs + (size_t)b * s.stride;
        if (b >= a.B) {
            for (int k = 2 * lane; k < C; k += 64) *reinterpret_cast<unsigned*>(row + k) = 0u;
            continue;
        }
        float4 v[MK_CMAX / 128];
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < MK_CMAX / 128; ++i) {
            const int k = 128 * i + 4 * lane;
            v[i] = k < C ? __ldcg(reinterpret_cast<const float4*>(a.x + (size_t)b * C + k)) : make_float4(0, 0, 0, 0);
            sum += (v[i].x + v[i].y) + (v[i].z + v[i].w);
        }
        const float mean = warp_sum(sum) / C;
        float sq = 0.0f;
#pragma unroll
        for (int i = 0; i < MK_CMAX / 128; ++i) {
            if (128 * i + 4 * lane < C) {
                const float dx = v[i].x - mean, dy = v[i].y - mean, dz = v[i].z - mean, dw = v[i].w - mean;
                sq += dx * dx + dy * dy + dz * dz + dw * dw;
            }
        }
        const float rstd = rsqrtf(warp_sum(sq) / C + 1e-5f);
#pragma unroll
        for (int i = 0; i < MK_CMAX / 128; ++i) {
            const int k = 128 * i + 4 * lane;
            if (k < C) {
                uint2 p = make_uint2(pack_bf16x2(v[i].x - mean, v[i].y - mean), pack_bf16x2(v[i].z - mean, v[i].w - mean));
                *reinterpret_cast<uint2*>(row + k) = p;
            }
        }
        if (lane == 0) s.rstd[b] = rstd;
    }
    __syncthreads();
}

// One GEMV work unit: 16 rows n0.. of a weight matrix (row stride ld) over the K range
// [k0, k0 + klen).
struct MkTile {
    const bf16* w;
    int ld, n0, k0, klen;
    __device__ __forceinline__ const bf16* row(int r) const { return w + (size_t)(n0 + r) * ld + k0; }
};

// The B operand's eight bf16 of row `row` from k: staged rows in shared memory.
struct MkSmemRows {
    const bf16* xs;
    int stride;
    __device__ __forceinline__ uint4 piece(int row, int k) const {
        return *reinterpret_cast<const uint4*>(xs + (size_t)row * stride + k);
    }
};

// The same from a bf16 activation in global memory written earlier in this launch (L2, not L1).
struct MkGlobalRows {
    const bf16* p;
    int ld, B;
    __device__ __forceinline__ uint4 piece(int row, int k) const {
        return row < B ? __ldcg(reinterpret_cast<const uint4*>(p + (size_t)row * ld + k)) : make_uint4(0, 0, 0, 0);
    }
};

// The weights of this block's unit i of `phase` (false: the phase reads none, or the block has no
// unit i). Units are strided over the grid, u = blockIdx.x + i gridDim.x. Every N is a multiple of
// 16 (3C, C, 4C, the padded vocabulary), so a unit's rows are all in range.
__device__ bool mk_unit(const MkArgs& a, int phase, int i, MkTile& t) {
    const int C = a.C, row_tiles = C / 16, u = blockIdx.x + i * gridDim.x;
    if (phase <= 0 || phase > 1 + 5 * a.L) return false;
    if (phase == 1 + 5 * a.L) {
        t = {a.head_w, C, 16 * u, 0, C};
        return u < a.Vp / 16;
    }
    const MkLayer& L = a.layers[(phase - 1) / 5];
    switch ((phase - 1) % 5) {
        case PH_QKV:
            t = {L.qkv_w, C, 16 * u, 0, C};
            return u < 3 * row_tiles;
        case PH_PROJ:
            // K split into ranges of MK_PROJ_CHUNK so every SM has work at N = C.
            t = {L.proj_w, C, 16 * (u % row_tiles), MK_PROJ_CHUNK * (u / row_tiles), MK_PROJ_CHUNK};
            return u < row_tiles * (C / MK_PROJ_CHUNK);
        case PH_FC:
            t = {L.fc_w, C, 16 * u, 0, C};
            return u < 4 * row_tiles;
        case PH_FCPROJ:
            t = {L.fcproj_w, 4 * C, 16 * (u % row_tiles), C * (u / row_tiles), C};
            return u < 4 * row_tiles;
        default:
            return false;
    }
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

// The warps' partial tiles summed: epi(b, n, sum, j, valid) for each output (row n0 + r, batch
// column b), j = which of the thread's outputs (a thread's columns are the same in every unit of a
// phase).
template <class Epi>
__device__ __forceinline__ void mk_reduce(float (&acc)[MK_TILES][4], const MkSmem& s, int tiles, int n0, int B,
                                          Epi& epi, int partial_slot) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    float* mine = s.red + warp * 16 * MK_BMAX;
#pragma unroll
    for (int i = 0; i < MK_TILES; ++i) {
        if (i < tiles) {
            const int c = 8 * i + 2 * t;
            mine[g * MK_BMAX + c] = acc[i][0];
            mine[g * MK_BMAX + c + 1] = acc[i][1];
            mine[(g + 8) * MK_BMAX + c] = acc[i][2];
            mine[(g + 8) * MK_BMAX + c + 1] = acc[i][3];
        }
    }
    __syncthreads();
    mk_stamp(partial_slot);
    const int outputs = 16 * 8 * tiles;
    for (int idx = threadIdx.x, j = 0; idx < outputs; idx += MK_THREADS, ++j) {
        const int r = idx & 15, b = idx >> 4;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < MK_WARPS; ++w) sum += s.red[w * 16 * MK_BMAX + r * MK_BMAX + b];
        epi(b, n0 + r, sum, j, b < B);
    }
    __syncthreads();
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

__device__ void mk_embed(const MkArgs& a) {
    const int n = a.B * a.C;
    for (int i = blockIdx.x * MK_THREADS + threadIdx.x; i < n; i += gridDim.x * MK_THREADS) {
        const int b = i / a.C, c = i % a.C;
        a.x[i] = a.wte[(size_t)a.ids[b] * a.C + c] + a.wpe[(size_t)a.pos[b] * a.C + c];
    }
}

// QKV with ln_1 folded in; q to a.q, k and v into the cache at each sequence's position.
struct MkQkvEpi {
    const MkArgs& a;
    const MkLayer& L;
    const float* rstd;
    __device__ __forceinline__ void operator()(int b, int n, float sum, int, bool valid) const {
        if (!valid) return;
        const int C = a.C;
        const float v = rstd[b] * sum + L.qkv_b[n];
        if (n < C) {
            a.q[(size_t)b * C + n] = v;
        } else {
            bf16* cache = n < 2 * C ? L.k : L.v;
            const size_t cell = ((size_t)b * a.tmax + a.pos[b]) * C;
            cache[cell + (n % C)] = __float2bfloat16_rn(v);
        }
    }
};

// The MLP up with ln_2 folded in, GELU in the epilogue, bf16 out.
struct MkFcEpi {
    const MkArgs& a;
    const MkLayer& L;
    const float* rstd;
    __device__ __forceinline__ void operator()(int b, int n, float sum, int, bool valid) const {
        if (valid) a.h[(size_t)b * 4 * a.C + n] = __float2bfloat16_rn(gelu_tanh(rstd[b] * sum + L.fc_b[n]));
    }
};

// A projection's K range added into the residual stream; the first range adds the bias.
struct MkResidualEpi {
    const MkArgs& a;
    const float* bias;
    bool first;
    __device__ __forceinline__ void operator()(int b, int n, float sum, int, bool valid) const {
        if (valid) atomicAdd(a.x + (size_t)b * a.C + n, sum + (first ? bias[n] : 0.0f));
    }
};

// The LM head with ln_f folded in: logits out, and each thread's best (value, index) so far for its
// two batch columns (ties: the lowest index).
struct MkHeadEpi {
    const MkArgs& a;
    const float* rstd;
    float best_v[2];
    int best_i[2];
    __device__ __forceinline__ void operator()(int b, int n, float sum, int j, bool valid) {
        if (!valid) return;
        const float v = rstd[b] * sum + a.head_b[n];
        a.logits[(size_t)b * a.Vp + n] = v;
        if (n < a.V && (v > best_v[j] || (v == best_v[j] && n < best_i[j]))) {
            best_v[j] = v;
            best_i[j] = n;
        }
    }
};

__device__ __forceinline__ void mk_better(float& v, int& i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

// The block's best per batch column to best_v/best_i[blockIdx.x]; the last block to finish merges
// every block's into a.next.
__device__ void mk_argmax_merge(const MkArgs& a, MkHeadEpi& epi, const MkSmem& s, int tiles) {
    const int outputs = 16 * 8 * tiles;
    for (int idx = threadIdx.x, j = 0; idx < outputs; idx += MK_THREADS, ++j) {
        float v = epi.best_v[j];
        int i = epi.best_i[j];
        // The 16 threads of one column are consecutive lanes.
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) mk_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
        if ((idx & 15) == 0) {
            a.best_v[blockIdx.x * MK_BMAX + (idx >> 4)] = v;
            a.best_i[blockIdx.x * MK_BMAX + (idx >> 4)] = i;
        }
    }
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&a.sync[2], 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int b = warp; b < a.B; b += MK_WARPS) {
        float v = -INFINITY;
        int i = 0x7fffffff;
        for (int k = lane; k < gridDim.x; k += 32) mk_better(v, i, __ldcg(a.best_v + k * MK_BMAX + b), __ldcg(a.best_i + k * MK_BMAX + b));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mk_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
        if (lane == 0) a.next[b] = i;
    }
    if (threadIdx.x == 0) a.sync[2] = 0;
}

// Output dim d of (sequence, head) bh merged over its S split partials (o unnormalized, the max in
// log2 units, the sum), read from L2: they were written in this launch.
__device__ __forceinline__ float mk_merge(const float* part, int bh, int S, int d) {
    const float* p0 = part + (size_t)bh * S * (MK_HEAD + 2);
    float mx = -INFINITY;
    for (int k = 0; k < S; ++k) mx = fmaxf(mx, __ldcg(p0 + k * (MK_HEAD + 2) + MK_HEAD));
    float sum = 0.0f, acc = 0.0f;
    for (int k = 0; k < S; ++k) {
        const float* pk = p0 + k * (MK_HEAD + 2);
        const float w = exp2f(__ldcg(pk + MK_HEAD) - mx);
        sum += w * __ldcg(pk + MK_HEAD + 1);
        acc += w * __ldcg(pk + d);
    }
    return acc / sum;
}

// Where attention unit u reads: sequence b, head h, the split's tokens [t0, t1), and this lane's
// column offset in the cache (8 lanes a token, 8 dims a lane).
struct MkAttUnit {
    int b, h, bh, split, len, t0, t1;
    size_t base;
};

__device__ __forceinline__ MkAttUnit mk_att_unit(const MkArgs& a, int u) {
    MkAttUnit w;
    const int S = a.splits, j = threadIdx.x & 7;
    w.split = u % S;
    w.bh = u / S;
    w.h = w.bh % a.H;
    w.b = w.bh / a.H;
    w.len = a.lens[w.b];
    const int chunk = (w.len + S - 1) / S;
    w.t0 = min(w.len, w.split * chunk);
    w.t1 = min(w.len, w.t0 + chunk);
    w.base = (size_t)w.b * a.tmax * a.C + w.h * MK_HEAD + 8 * j;
    return w;
}

// Loads one cache's rows of pass `first` of unit w: lane group grp's tokens first + i GROUPS + grp
// (zeros past the split's end).
__device__ __forceinline__ void mk_att_load(uint4 (&k)[MK_ATT_ILP], const bf16* cache, const MkArgs& a,
                                            const MkAttUnit& w, int first) {
    constexpr int GROUPS = MK_THREADS / 8;
    const int grp = threadIdx.x >> 3;
#pragma unroll
    for (int i = 0; i < MK_ATT_ILP; ++i) {
        const int t = first + i * GROUPS + grp;
        k[i] = t < w.t1 ? __ldcg(reinterpret_cast<const uint4*>(cache + w.base + (size_t)t * a.C)) : make_uint4(0, 0, 0, 0);
    }
}

// One (sequence b, head h, split) of decode attention over the cache (the new token included):
// scores of its token range into shared memory, their max and exponentials, P.V; the partial
// (o, max, sum) to a.part; the (b, h)'s last split to finish merges all of them into a.att.
__device__ void mk_attention_unit(const MkArgs& a, const MkLayer& L, int u, const MkSmem& s, int scores_slot) {
    const MkAttUnit w = mk_att_unit(a, u);
    const int h = w.h, b = w.b, bh = w.bh, t0 = w.t0, t1 = w.t1, C = a.C, S = a.splits;
    const int grp = threadIdx.x >> 3, j = threadIdx.x & 7;  // 8 lanes a token, 8 dims a lane
    constexpr int GROUPS = MK_THREADS / 8;
    float qv[8];
    {
        const float* qp = a.q + (size_t)b * C + h * MK_HEAD + 8 * j;
        const float4 q0 = __ldcg(reinterpret_cast<const float4*>(qp)), q1 = __ldcg(reinterpret_cast<const float4*>(qp + 4));
        const float sc = rsqrtf((float)MK_HEAD) * MK_LOG2E;
        qv[0] = q0.x * sc; qv[1] = q0.y * sc; qv[2] = q0.z * sc; qv[3] = q0.w * sc;
        qv[4] = q1.x * sc; qv[5] = q1.y * sc; qv[6] = q1.z * sc; qv[7] = q1.w * sc;
    }
    // Every lane runs every pass (the shuffles take the whole warp); lanes past t1 load nothing.
    // Each pass issues MK_ATT_ILP tokens' loads a lane before using any.
    float mloc = -INFINITY;
    for (int first = t0; first < t1; first += GROUPS * MK_ATT_ILP) {
        uint4 kk[MK_ATT_ILP];
        mk_att_load(kk, L.k, a, w, first);
#pragma unroll
        for (int i = 0; i < MK_ATT_ILP; ++i) {
            const int t = first + i * GROUPS + grp;
            const unsigned kw[4] = {kk[i].x, kk[i].y, kk[i].z, kk[i].w};
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float2 f = unpack_bf16x2(kw[e]);
                d += qv[2 * e] * f.x + qv[2 * e + 1] * f.y;
            }
            d += __shfl_xor_sync(0xffffffffu, d, 1);
            d += __shfl_xor_sync(0xffffffffu, d, 2);
            d += __shfl_xor_sync(0xffffffffu, d, 4);
            if (t < t1) {
                if (j == 0) s.score[t - t0] = d;
                mloc = fmaxf(mloc, d);
            }
        }
    }
    const float m = block_max(mloc, s.misc);  // synchronises: the scores are visible
    mk_stamp(scores_slot);
    float o[8] = {0, 0, 0, 0, 0, 0, 0, 0}, l = 0.0f;
    for (int first = t0; first < t1; first += GROUPS * MK_ATT_ILP) {
        uint4 vv[MK_ATT_ILP];
        mk_att_load(vv, L.v, a, w, first);
#pragma unroll
        for (int i = 0; i < MK_ATT_ILP; ++i) {
            const int t = first + i * GROUPS + grp;
            if (t >= t1) break;
            const float p = exp2f(s.score[t - t0] - m);
            l += p;
            const unsigned vw[4] = {vv[i].x, vv[i].y, vv[i].z, vv[i].w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float2 f = unpack_bf16x2(vw[e]);
                o[2 * e] += p * f.x;
                o[2 * e + 1] += p * f.y;
            }
        }
    }
    // Across the token groups: [GROUPS][64] partial outputs, [GROUPS] partial sums, in s.red.
#pragma unroll
    for (int e = 0; e < 8; ++e) s.red[grp * MK_HEAD + 8 * j + e] = o[e];
    if (j == 0) s.red[GROUPS * MK_HEAD + grp] = l;
    __syncthreads();
    float* part = a.part + (size_t)u * (MK_HEAD + 2);
    if (threadIdx.x < MK_HEAD) {
        float acc = 0.0f;
        for (int g = 0; g < GROUPS; ++g) acc += s.red[g * MK_HEAD + threadIdx.x];
        part[threadIdx.x] = acc;
    } else if (threadIdx.x == MK_HEAD) {
        float acc = 0.0f;
        for (int g = 0; g < GROUPS; ++g) acc += s.red[GROUPS * MK_HEAD + g];
        part[MK_HEAD] = m;
        part[MK_HEAD + 1] = acc;
    }
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&a.tickets[bh], 1u) == (unsigned)S - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x < MK_HEAD) a.att[(size_t)b * C + h * MK_HEAD + threadIdx.x] = __float2bfloat16_rn(mk_merge(a.part, bh, S, threadIdx.x));
    if (threadIdx.x == 0) a.tickets[bh] = 0;
    __syncthreads();
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
    const MkSmemRows staged{s.xs, s.stride};
    if (phase == 1 + 5 * a.L) {
        mk_stage_ln_rows(a, s, tiles);
        mk_stamp(sl.staged);
        MkHeadEpi epi{a, s.rstd, {-INFINITY, -INFINITY}, {0x7fffffff, 0x7fffffff}};
        for (int i = 0; mk_unit(a, phase, i, t); ++i) early = mk_gemv_unit(a, s, phase, i, tiles, staged, epi, sl, pre, early);
        mk_argmax_merge(a, epi, s, tiles);
        return;
    }
    const MkLayer& L = a.layers[(phase - 1) / 5];
    switch ((phase - 1) % 5) {
        case PH_QKV: {
            mk_stage_ln_rows(a, s, tiles);
            mk_stamp(sl.staged);
            MkQkvEpi epi{a, L, s.rstd};
            for (int i = 0; mk_unit(a, phase, i, t); ++i) early = mk_gemv_unit(a, s, phase, i, tiles, staged, epi, sl, pre, early);
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
            mk_stage_ln_rows(a, s, tiles);
            mk_stamp(sl.staged);
            MkFcEpi epi{a, L, s.rstd};
            for (int i = 0; mk_unit(a, phase, i, t); ++i) early = mk_gemv_unit(a, s, phase, i, tiles, staged, epi, sl, pre, early);
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
    mk_exit(a);
    ladder_stamp(28);
}
