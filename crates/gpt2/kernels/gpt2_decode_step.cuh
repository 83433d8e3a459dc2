// gpt2_decode_step.cuh: the parts the decode-step megakernels share (02_megakernel.cu's barrier
// stages and 08_streamed.cu's counters and weight ring): the step's arguments, the bounded wait on a
// counter in global memory, the shared-memory carve-up, the LayerNorm folded into the row staging,
// the GEMV work units and their reduction and epilogues, decode attention as (sequence, head,
// split) units with the split merge by the last split, and the argmax merge.
// MK_THREADS (a host tunable) is the number of threads that run these parts: the whole block in
// 02, the consumer warps in 08 (its loader warp comes after them and never joins their barrier,
// hardware barrier 1, which mk_sync is).
#pragma once
#include "ladder_mma.cuh"
#include "ladder_reduce.cuh"
#include "ladder_split_merge.cuh"
#include "gpt2_pointwise.cuh"
#include "ladder_timeline.cuh"

#ifndef MK_THREADS
#error "MK_THREADS is a tunable: the host sets it"
#endif
#define MK_WARPS (MK_THREADS / 32)
#define MK_HEAD 64
#define MK_BMAX 32
#define MK_TILES (MK_BMAX / 8)
#define MK_CMAX 1024
#define MK_PROJ_CHUNK 256
#define MK_ATT_ILP 4
#define MK_ERR_BARRIER 1
#define MK_LOG2E 1.4426950408889634f

typedef __nv_bfloat16 bf16;
static_assert(16 * 8 * MK_TILES <= 2 * MK_THREADS, "a thread holds at most two outputs of a unit (MkHeadEpi's)");

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
    unsigned long long wait_ns;  // a wait's bound (the host's default 0.5 s; longer under a sanitizer)
    int B, C, H, L, V, Vp, tmax, splits, first, last;
    int ring_pages;  // the streamed kernel's shared-memory pages of weights (08_streamed.cu)
    int sync_words;  // words of `sync` (the streamed kernel's counters follow the first four)
};

// Phases: 0 the embedding; 1 + 5l + {0 QKV and kv-append, 1 attention, 2 projection, 3 MLP up,
// 4 MLP down} for layer l; 1 + 5L the LM head and argmax.
enum { PH_QKV = 0, PH_ATTN = 1, PH_PROJ = 2, PH_FC = 3, PH_FCPROJ = 4 };

// The barrier of the MK_THREADS threads that run the step's parts.
__device__ __forceinline__ void mk_sync() { asm volatile("bar.sync 1, %0;" ::"n"(MK_THREADS) : "memory"); }

// The maximum over the MK_THREADS threads (`scratch` holds MK_WARPS floats); every thread gets it.
__device__ __forceinline__ float mk_block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    mk_sync();
    v = warp_max(lane < MK_WARPS ? scratch[lane] : -INFINITY);
    mk_sync();
    return v;
}

__device__ __forceinline__ unsigned long long mk_now() {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
}

__device__ __forceinline__ void mk_stamp(int slot) {
    if (slot >= 0) ladder_stamp(slot);
}

__device__ __forceinline__ unsigned mk_load_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Waits until *p >= want; false when another block reported an error or wait_ns passed (then
// this one reports it): the kernel returns instead of spinning forever.
__device__ bool mk_wait_at_least(const unsigned* p, unsigned want, int* error, unsigned long long wait_ns) {
    const unsigned long long start = mk_now();
    for (unsigned spin = 0; mk_load_acquire(p) < want; ++spin) {
        // The error word and the clock every 64 polls: the poll itself is the hot loop.
        if ((spin & 63) != 63) continue;
        if (*reinterpret_cast<volatile int*>(error) != 0) return false;
        if (mk_now() - start > wait_ns) {
            atomicCAS(error, 0, MK_ERR_BARRIER);
            return false;
        }
    }
    return true;
}

// Whether this block is the last of `count` to take a ticket from *ticket (the launch's exits, the
// argmax merge, a (b, h)'s splits): thread 0 fences the block's writes before its atomicAdd, so the
// last block, once it fences too, reads every other block's.
__device__ __forceinline__ bool mk_last_arrival(unsigned* ticket, unsigned count) {
    __shared__ bool last;
    mk_sync();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(ticket, 1u) == count - 1;
    }
    mk_sync();
    return last;
}

// The end of a launch: the last block out zeroes sync[0 .. words) for the next launch (every other
// block has passed its last wait by then).
__device__ void mk_exit(const MkArgs& a, int words) {
    if (!mk_last_arrival(&a.sync[1], gridDim.x)) return;
    for (int i = threadIdx.x; i < words; i += MK_THREADS) a.sync[i] = 0;
    __threadfence();
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
    mk_sync();
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
    mk_sync();
    mk_stamp(partial_slot);
    const int outputs = 16 * 8 * tiles;
    for (int idx = threadIdx.x, j = 0; idx < outputs; idx += MK_THREADS, ++j) {
        const int r = idx & 15, b = idx >> 4;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < MK_WARPS; ++w) sum += s.red[w * 16 * MK_BMAX + r * MK_BMAX + b];
        epi(b, n0 + r, sum, j, b < B);
    }
    mk_sync();
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
    if (!mk_last_arrival(&a.sync[2], gridDim.x)) return;
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

// A unit's passes over one cache (the scores' K, then P.V's V): each pass issues MK_ATT_ILP tokens'
// loads a lane (mk_att_load) before using any, then row(kv, t) for each of them, tokens t >= w.t1
// included (zeros) so that the scores' shuffles run with the whole warp.
template <typename Row>
__device__ __forceinline__ void mk_att_walk(const bf16* cache, const MkArgs& a, const MkAttUnit& w, const Row& row) {
    constexpr int GROUPS = MK_THREADS / 8;
    const int grp = threadIdx.x >> 3;
    for (int first = w.t0; first < w.t1; first += GROUPS * MK_ATT_ILP) {
        uint4 kv[MK_ATT_ILP];
        mk_att_load(kv, cache, a, w, first);
#pragma unroll
        for (int i = 0; i < MK_ATT_ILP; ++i) row(kv[i], first + i * GROUPS + grp);
    }
}

// One (sequence b, head h, split) of decode attention over the cache (the new token included):
// scores of its token range into shared memory, their max and exponentials, P.V; the partial
// (o, max, sum) to a.part; the (b, h)'s last split to finish merges all of them into a.att
// (returns true in that block).
__device__ bool mk_attention_unit(const MkArgs& a, const MkLayer& L, int u, const MkSmem& s, int scores_slot) {
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
    float mloc = -INFINITY;
    mk_att_walk(L.k, a, w, [&](const uint4& k, int t) {
        const unsigned kw[4] = {k.x, k.y, k.z, k.w};
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
    });
    const float m = mk_block_max(mloc, s.misc);  // synchronises: the scores are visible
    mk_stamp(scores_slot);
    float o[8] = {0, 0, 0, 0, 0, 0, 0, 0}, l = 0.0f;
    mk_att_walk(L.v, a, w, [&](const uint4& v, int t) {
        if (t >= t1) return;
        const float p = exp2f(s.score[t - t0] - m);
        l += p;
        const unsigned vw[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float2 f = unpack_bf16x2(vw[e]);
            o[2 * e] += p * f.x;
            o[2 * e + 1] += p * f.y;
        }
    });
    // Across the token groups: [GROUPS][64] partial outputs, [GROUPS] partial sums, in s.red.
#pragma unroll
    for (int e = 0; e < 8; ++e) s.red[grp * MK_HEAD + 8 * j + e] = o[e];
    if (j == 0) s.red[GROUPS * MK_HEAD + grp] = l;
    mk_sync();
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
    if (!mk_last_arrival(&a.tickets[bh], (unsigned)S)) return false;
    __threadfence();
    if (threadIdx.x < MK_HEAD) a.att[(size_t)b * C + h * MK_HEAD + threadIdx.x] = __float2bfloat16_rn(
            merge_column(SplitRecords{a.part + (size_t)bh * S * (MK_HEAD + 2), MK_HEAD}, S, threadIdx.x, false).value);
    if (threadIdx.x == 0) a.tickets[bh] = 0;
    mk_sync();
    return true;
}
