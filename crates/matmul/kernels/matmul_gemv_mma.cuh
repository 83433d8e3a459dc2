// matmul_gemv_mma.cuh: the skinny tensor-core GEMV's parts, shared by gemv stages 4-6 (bf16 W) and
// gemv-fp8 stage 1 (e4m3 W): out^T[N, M] = W[N, K] . inp^T[K, M] on mma.sync.m16n8k16 with W the
// 16-row A operand and inp the 8-column B operand, a block of warps per 16 rows of W. The parts: a
// folded LayerNorm's row statistics (RowStats, row_stats), inp's B fragments (inp_fragments), the
// block's reduction of its warps' partial tiles (gemv_mma_reduce), and the store policy every stage
// has (StoreRows). A stage's main loop (how it loads and converts W) is its own.
#pragma once
#include "matmul_gemv.cuh"
#include "ladder_mma.cuh"
#include "ladder_pick.cuh"

#define GEMV_LN_EPS 1e-5f

// A folded LayerNorm's statistics of the block's rows (none without one).
template <int MT, bool LN>
struct RowStats {
    __device__ __forceinline__ float mean(int) const { return 0.0f; }
    __device__ __forceinline__ float rstd(int) const { return 1.0f; }
};

template <int MT>
struct RowStats<MT, true> {
    const float* m_;
    const float* r_;
    __device__ __forceinline__ float mean(int m) const { return m_[m]; }
    __device__ __forceinline__ float rstd(int m) const { return r_[m]; }
};

// Rows m < M of x [M, K] (K % 4 == 0): mean and rstd into mean[m], rstd[m], a warp a row, the two
// passes of LayerNorm's numerics over the row (read twice, from L2 after the first).
__device__ __forceinline__ void row_stats(float* mean, float* rstd, const float* x, int M, int K, int rows) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int m = warp; m < rows; m += warps) {
        float mu = 0.0f, r = 1.0f;
        if (m < M) {
            const float* row = x + (size_t)m * K;
            float s = 0.0f;
            for (int k = 4 * lane; k < K; k += 128) {
                const float4 v = *reinterpret_cast<const float4*>(row + k);
                s += (v.x + v.y) + (v.z + v.w);
            }
            mu = warp_sum(s) / K;
            float q = 0.0f;
            for (int k = 4 * lane; k < K; k += 128) {
                const float4 v = *reinterpret_cast<const float4*>(row + k);
                q += (v.x - mu) * (v.x - mu) + (v.y - mu) * (v.y - mu) + (v.z - mu) * (v.z - mu) +
                     (v.w - mu) * (v.w - mu);
            }
            r = rsqrtf(warp_sum(q) / K + GEMV_LN_EPS);
        }
        if (lane == 0) {
            mean[m] = mu;
            rstd[m] = r;
        }
    }
}

// Shared-memory pitch (bf16 elements) of a staged row of K: 128-byte aligned plus 64 bytes, so that
// a quarter-warp's 16-byte loads of two rows (rows g and g + 1, 64 bytes each) fall in different banks.
__device__ __forceinline__ int staged_row_pitch(int K) { return (2 * K + 127) / 128 * 64 + 32; }

// The folded LayerNorm's rows m < M of x [M, K] (K % 4 == 0, K <= 128 * VECS) read from
// memory once: a warp a row, every float4 of the lane's share requested before the first is used,
// mean and variance from the registers (row_stats' numerics: the same sums in the same order), then
// the row less its mean, as bf16, into rows[m * pitch ...] (what inp_fragments would have computed
// from memory) and the statistics into mean[m], rstd[m]. Rows M .. rows - 1 get mean 0, rstd 1 and
// no staged row (the fragments read zeros for them).
template <int VECS>
__device__ __forceinline__ void stage_ln_rows(__nv_bfloat16* staged, float* mean, float* rstd, const float* x, int M,
                                              int K, int rows) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int pitch = staged_row_pitch(K);
    for (int m = warp; m < rows; m += warps) {
        float mu = 0.0f, r = 1.0f;
        if (m < M) {
            const float* row = x + (size_t)m * K;
            float4 v[VECS];
#pragma unroll
            for (int i = 0; i < VECS; ++i) {
                const int k = 4 * lane + 128 * i;
                v[i] = k < K ? *reinterpret_cast<const float4*>(row + k) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < VECS; ++i) s += (v[i].x + v[i].y) + (v[i].z + v[i].w);
            mu = warp_sum(s) / K;
            float q = 0.0f;
#pragma unroll
            for (int i = 0; i < VECS; ++i) {
                if (4 * lane + 128 * i < K) {
                    q += (v[i].x - mu) * (v[i].x - mu) + (v[i].y - mu) * (v[i].y - mu) + (v[i].z - mu) * (v[i].z - mu) +
                         (v[i].w - mu) * (v[i].w - mu);
                }
            }
            r = rsqrtf(warp_sum(q) / K + GEMV_LN_EPS);
#pragma unroll
            for (int i = 0; i < VECS; ++i) {
                const int k = 4 * lane + 128 * i;
                if (k < K) {
                    const uint2 pair = make_uint2(pack_bf16x2(v[i].x - mu, v[i].y - mu), pack_bf16x2(v[i].z - mu, v[i].w - mu));
                    *reinterpret_cast<uint2*>(staged + (size_t)m * pitch + k) = pair;
                }
            }
        }
        if (lane == 0) {
            mean[m] = mu;
            rstd[m] = r;
        }
    }
}

// Eight consecutive fp32 of inp row m from k, less `shift` (a folded LayerNorm's row mean) and times
// `scale` (gemv-fp8's weight-block scale; zeros when the row or the piece is out of range), as the
// two B fragments of the two k16 steps that the matching piece of W feeds.
__device__ __forceinline__ void inp_fragments(unsigned (&b)[2][2], const float* inp, int m, int M, int k, bool valid,
                                              int K, float shift = 0.0f, float scale = 1.0f) {
    float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
    if (valid && m < M) {
        const float* p = inp + (size_t)m * K + k;
        x0 = *reinterpret_cast<const float4*>(p);
        x1 = *reinterpret_cast<const float4*>(p + 4);
        x0 = make_float4((x0.x - shift) * scale, (x0.y - shift) * scale, (x0.z - shift) * scale,
                         (x0.w - shift) * scale);
        x1 = make_float4((x1.x - shift) * scale, (x1.y - shift) * scale, (x1.z - shift) * scale,
                         (x1.w - shift) * scale);
    }
    b[0][0] = pack_bf16x2(x0.x, x0.y);
    b[0][1] = pack_bf16x2(x0.z, x0.w);
    b[1][0] = pack_bf16x2(x1.x, x1.y);
    b[1][1] = pack_bf16x2(x1.z, x1.w);
}

// The same eight of a bf16 inp: one 16-byte load, already the fragments' pairs (also stage_ln_rows'
// staged rows, with their pitch as K).
__device__ __forceinline__ void inp_fragments(unsigned (&b)[2][2], const __nv_bfloat16* inp, int m, int M, int k,
                                              bool valid, int K) {
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (valid && m < M) x = *reinterpret_cast<const uint4*>(inp + (size_t)m * K + k);
    b[0][0] = x.x;
    b[0][1] = x.y;
    b[1][0] = x.z;
    b[1][1] = x.w;
}

// The same eight of a bf16 inp less `shift` and times `scale`, rounded back to bf16 (gemv-fp8; the
// shift is 0 there, a folded LayerNorm reads fp32).
__device__ __forceinline__ void inp_fragments(unsigned (&b)[2][2], const __nv_bfloat16* inp, int m, int M, int k,
                                              bool valid, int K, float shift, float scale) {
    inp_fragments(b, inp, m, M, k, valid, K);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        unsigned& pair = b[j / 2][j % 2];
        pair = pack_bf16x2((__uint_as_float(pair << 16) - shift) * scale,
                           (__uint_as_float(pair & 0xFFFF0000u) - shift) * scale);
    }
}

// Where the block's outputs go. StoreRows: out[m][n] with the bias and the tail (every stage).
// Each store returns the value it stored; a store with kPicks also offers it as a greedy pick
// (StorePicking, gemv/04_skinny_mma.cu; HeldPicks below).
struct StoreRows {
    static constexpr bool kPicks = false;
    float* out;
    const float* bias;
    const float* residual;
    int tail, N;
    __device__ __forceinline__ float operator()(int m, int n, float s) const {
        return out[(size_t)m * N + n] = gemv_out(s, bias, residual, tail, n, (size_t)m * N + n);
    }
    // The epilogue in two halves (gemv stage 8): what output (m, n) reads besides its sum, bias[n]
    // and the residual element (0 where absent), then the store from those. The residual may be out
    // itself: the thread that writes an element is still the one that read it.
    __device__ __forceinline__ float2 operands(int m, int n) const {
        const size_t idx = (size_t)m * N + n;
        return make_float2(bias != nullptr ? bias[n] : 0.0f, tail == MM_TAIL_RESIDUAL ? residual[idx] : 0.0f);
    }
    __device__ __forceinline__ float operator()(int m, int n, float s, float2 ops) const {
        return out[(size_t)m * N + n] = gemv_tail(s, ops.x, ops.y, tail);
    }
};

// Where the reduction's stores find their operands: read at the store (NoEarlyOperands), or read by
// early_operands before the products, one pair a tile for the thread that stores (EarlyOperands).
struct NoEarlyOperands {
    static constexpr bool kEarly = false;
};
template <int MT>
struct EarlyOperands {
    static constexpr bool kEarly = true;
    float2 ops[MT / 8];
};
template <bool ON, int MT>
struct EarlyOperandsFor {
    using type = NoEarlyOperands;
};
template <int MT>
struct EarlyOperandsFor<true, MT> {
    using type = EarlyOperands<MT>;
};

// Each storing thread's operands (Store::operands) for every tile, in gemv_mma_reduce's mapping:
// thread (c, r) of the first 128 stores out[8i + c][n0 + r].
template <int MT, typename Store>
__device__ __forceinline__ EarlyOperands<MT> early_operands(const Store& store, int n0, int M, int N) {
    EarlyOperands<MT> e;
    const int c = threadIdx.x / 16, n = n0 + threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < MT / 8; ++i) {
        const int m = 8 * i + c;
        e.ops[i] = threadIdx.x < 128 && m < M && n < N ? store.operands(m, n) : make_float2(0.0f, 0.0f);
    }
    return e;
}

// A picking store's offers as the storing threads hold them (ladder_pick.cuh's words): thread (c, r)
// of the first 128 keeps the best word of row 8i + c over the columns it stored, tile after tile, and
// merge() takes the best of a row's 16 threads by shuffles and merges it into the block's slot of the
// row with one atomicMax (called by whole warps, after the block's last tile: nothing waits for it).
template <int MT>
struct HeldPicks {
    unsigned long long best[MT / 8] = {};
    __device__ __forceinline__ void keep(int i, unsigned long long word) { best[i] = word > best[i] ? word : best[i]; }
    __device__ __forceinline__ void merge(unsigned long long* picks) const {
#pragma unroll
        for (int i = 0; i < MT / 8; ++i) {
            const unsigned long long row_best = pick_max<16>(best[i]);
            if (threadIdx.x < 128 && (threadIdx.x & 15) == 0 && row_best != 0) {
                atomicMax(picks + pick_slot(8 * i + threadIdx.x / 16, blockIdx.x % kPickSlots), row_best);
            }
        }
    }
};

// The block's outputs from its warps' partial tiles, `part` the [split][16][8] floats of shared
// memory: acc[i] holds out^T rows g and g + 8 (rows n0 + g and n0 + g + 8 of W), columns 8i + 2t and
// 8i + 2t + 1 (rows of inp). One 8-column tile at a time through shared memory (so the split can
// grow without the buffer growing with M); each sum times its row's rstd (1 without a folded
// LayerNorm), then stored with its operands read there or early (`early`); a picking store's word
// for each value it stored is kept in `held` (HeldPicks), which its owner merges when the block's
// tiles are done.
template <int MT, bool LN, typename Store, typename Early = NoEarlyOperands, typename Held = HeldPicks<MT>>
__device__ __forceinline__ void gemv_mma_reduce(const float (&acc)[MT / 8][4], float* part,
                                                const RowStats<MT, LN>& stats, const Store& store, int n0, int M,
                                                int N, const Early& early = Early{}, Held* held = nullptr) {
    const int split = blockDim.x >> 5, warp = threadIdx.x >> 5;
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    float* mine = part + warp * 128;
#pragma unroll
    for (int i = 0; i < MT / 8; ++i) {
        mine[g * 8 + 2 * t] = acc[i][0];
        mine[g * 8 + 2 * t + 1] = acc[i][1];
        mine[(g + 8) * 8 + 2 * t] = acc[i][2];
        mine[(g + 8) * 8 + 2 * t + 1] = acc[i][3];
        __syncthreads();
        // Thread (c, r), r fastest: 16 consecutive outputs of a row of out per 16 threads.
        if (threadIdx.x < 128) {
            const int c = threadIdx.x / 16, r = threadIdx.x % 16, m = 8 * i + c, n = n0 + r;
            const bool valid = m < M && n < N;
            float stored = 0.0f;
            if (valid) {
                float s = 0.0f;
#pragma unroll
                for (int p = 0; p < split; ++p) s += part[p * 128 + r * 8 + c];
                if constexpr (Early::kEarly) {
                    stored = store(m, n, s * stats.rstd(m), early.ops[i]);
                } else {
                    stored = store(m, n, s * stats.rstd(m));
                }
            }
            if constexpr (Store::kPicks) held->keep(i, store.offer(m, n, valid, stored));
        }
        __syncthreads();  // part is rewritten by the next tile
    }
}

