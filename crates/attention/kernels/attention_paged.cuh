// attention_paged.cuh: vLLM's paged-attention decode kernel (reference 001), written for this
// workspace. The cache is a pool of fixed-size blocks of BS tokens; block_tables[b, i] is the
// physical block holding tokens i*BS .. i*BS+BS-1 of sequence b.
//   K pool [num_blocks, HKV, D/X, BS, X] with X = 16 bytes / sizeof(T): the X elements of one
//     token that a 16-byte load takes are contiguous, and consecutive tokens are X elements apart.
//   V pool [num_blocks, HKV, D, BS]: one row per head dimension, the block's tokens contiguous.
// One block of PA_THREADS threads per (query head, sequence[, partition]). Each warp takes one KV
// block at a time. Thread groups of TGS = max(32/BS, 1) lanes share one token, so a warp covers a
// whole block; each lane reads VEC = 16/(TGS*sizeof(T)) elements per load (16 bytes per group), and
// holds its slice of q in registers (raw, converted on use). Scores go to shared memory. Then P.V:
// each lane owns rows of V and reads VV = 8 tokens (16 bytes) of a row per load. The tail block's
// slots past the sequence are never read: K slots are skipped, and V elements past the length are
// replaced by zeros (0 * stale data could be NaN).
// With PART > 0 (v2), blockIdx.z is a partition of PART tokens; each partition writes its output
// normalized by its own sum, with its max and sum, for decode_combine (normalized = true).
#pragma once
#include "attention_decode.cuh"

#ifndef PA_THREADS
#error "PA_THREADS (threads per block) is a tunable: the stage list sets it"
#endif

template <typename T, int N>
struct RawVec;  // N elements of T as one register-sized load
template <typename T>
struct RawVec<T, 4> {
    uint2 u;
};
template <typename T>
struct RawVec<T, 8> {
    uint4 u;
};

template <typename T, int N>
__device__ __forceinline__ RawVec<T, N> load_raw(const T* p) {
    RawVec<T, N> r;
    if constexpr (N == 4) r.u = *reinterpret_cast<const uint2*>(p);
    else r.u = *reinterpret_cast<const uint4*>(p);
    return r;
}

template <typename T, int N>
__device__ __forceinline__ float dot_raw(const RawVec<T, N>& a, const RawVec<T, N>& b) {
    const T* x = reinterpret_cast<const T*>(&a.u);
    const T* y = reinterpret_cast<const T*>(&b.u);
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) acc += to_float(x[i]) * to_float(y[i]);
    return acc;
}

template <typename T, int D, int BS, int PART>
__device__ __forceinline__ void paged_attention(T* out, float* lse, float* o_part, float* m_part, float* l_part,
                                                const T* q, const T* kc, const T* vc, const int* block_tables,
                                                const int* seq_lens, const float* slopes, int HKV, int max_blocks,
                                                float scale) {
    constexpr int WARPS = PA_THREADS / 32;
    constexpr int TGS = 32 / BS > 1 ? 32 / BS : 1;  // lanes per token
    constexpr int X = 16 / (int)sizeof(T);          // elements per 16 bytes
    constexpr int VEC = 16 / (TGS * (int)sizeof(T));
    constexpr int NVEC = D / (TGS * VEC);           // q/K vectors per lane
    constexpr int VV = 8;                           // V tokens per load
    constexpr int ROW_VECS = BS / VV;               // lanes per V row
    constexpr int ROWS_PER_ITER = 32 / ROW_VECS;
    constexpr int ROWS_PER_LANE = (D + ROWS_PER_ITER - 1) / ROWS_PER_ITER;
    static_assert(BS == 16 || BS == 32, "block size 16 or 32");
    static_assert(TGS * BS == 32, "a warp covers one KV block");

    extern __shared__ float logits[];
    __shared__ float scratch[32];
    __shared__ float red[WARPS][D];
    const int hq = blockIdx.x, b = blockIdx.y, HQ = gridDim.x;
    const int part = blockIdx.z, nparts = gridDim.z;
    const int kvh = hq / (HQ / HKV), len = seq_lens[b];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int nblocks = (len + BS - 1) / BS;
    const int per_part = PART > 0 ? PART / BS : nblocks;
    const int blk0 = PART > 0 ? part * per_part : 0;
    const size_t row = (size_t)b * HQ + hq;
    if (blk0 >= nblocks) {  // a partition past this sequence: empty for the combine
        if (PART > 0 && tid == 0) {
            m_part[row * nparts + part] = -INFINITY;
            l_part[row * nparts + part] = 0.0f;
        }
        return;
    }
    const int blk1 = min(blk0 + per_part, nblocks);
    const int tok0 = blk0 * BS, ntok = min(blk1 * BS, len) - tok0;
    const int* table = block_tables + (size_t)b * max_blocks;

    // q slice of this lane: vectors tgo, tgo + TGS, ... of VEC elements each.
    const int tg = lane / TGS, tgo = lane % TGS;
    RawVec<T, VEC> qv[NVEC];
    const T* qrow = q + row * D;
#pragma unroll
    for (int i = 0; i < NVEC; ++i) qv[i] = load_raw<T, VEC>(qrow + (tgo + i * TGS) * VEC);

    float lmax = -INFINITY;
    for (int blk = blk0 + warp; blk < blk1; blk += WARPS) {
        const T* kb = kc + ((size_t)table[blk] * HKV + kvh) * D * BS;
        const int t = blk * BS + tg;
        float qk = 0.0f;
        if (t < len) {
#pragma unroll
            for (int i = 0; i < NVEC; ++i) {
                const int e = (tgo + i * TGS) * VEC;
                qk += dot_raw<T, VEC>(qv[i], load_raw<T, VEC>(kb + ((size_t)(e / X) * BS + tg) * X + e % X));
            }
        }
#pragma unroll
        for (int off = TGS / 2; off > 0; off >>= 1) qk += __shfl_xor_sync(0xffffffffu, qk, off);
        if (tgo == 0) {
            const bool valid = t < len;
            const float sc = valid ? qk * scale + decode_alibi(slopes, hq, t, len) : 0.0f;
            logits[t - tok0] = sc;  // slots past the length hold 0 and stay out of the softmax
            if (valid) lmax = fmaxf(lmax, sc);
        }
    }
    const float m = block_max(lmax, scratch);
    float lsum = 0.0f;
    for (int i = tid; i < ntok; i += PA_THREADS) {
        const float p = __expf(logits[i] - m);
        logits[i] = p;
        lsum += p;
    }
    const float l = block_sum(lsum, scratch);
    const float inv = 1.0f / l;
    for (int i = tid; i < ntok; i += PA_THREADS) logits[i] *= inv;
    __syncthreads();

    float acc[ROWS_PER_LANE];
#pragma unroll
    for (int r = 0; r < ROWS_PER_LANE; ++r) acc[r] = 0.0f;
    const int vo = lane % ROW_VECS;  // which 8 tokens of the block this lane reads
    for (int blk = blk0 + warp; blk < blk1; blk += WARPS) {
        const T* vb = vc + ((size_t)table[blk] * HKV + kvh) * D * BS;
        const int t = blk * BS + vo * VV;
        float p[VV];
#pragma unroll
        for (int j = 0; j < VV; ++j) p[j] = t + j < len ? logits[t + j - tok0] : 0.0f;
        const bool tail = t + VV > len;
#pragma unroll
        for (int r = 0; r < ROWS_PER_LANE; ++r) {
            const int d = lane / ROW_VECS + r * ROWS_PER_ITER;
            if (d < D && t < len) {
                float v[VV];
                load8(vb + (size_t)d * BS + vo * VV, v);
                if (tail) {
#pragma unroll
                    for (int j = 0; j < VV; ++j) v[j] = t + j < len ? v[j] : 0.0f;
                }
#pragma unroll
                for (int j = 0; j < VV; ++j) acc[r] += p[j] * v[j];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS_PER_LANE; ++r) {
#pragma unroll
        for (int off = ROW_VECS / 2; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
    }
    if (vo == 0) {
#pragma unroll
        for (int r = 0; r < ROWS_PER_LANE; ++r) {
            const int d = lane / ROW_VECS + r * ROWS_PER_ITER;
            if (d < D) red[warp][d] = acc[r];
        }
    }
    __syncthreads();
    if (tid < D) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) o += red[w][tid];
        if (PART > 0) o_part[(row * nparts + part) * D + tid] = o;
        else out[row * D + tid] = from_float<T>(o);
    }
    if (tid == 0) {
        if (PART > 0) {
            m_part[row * nparts + part] = m;
            l_part[row * nparts + part] = l;
        } else {
            lse[row] = m + __logf(l);
        }
    }
}

// A paged stage's entries, ENTRY(suffix, T, D, BS) for each element type (bf16, f16), head size
// (64, 128) and block size (16, 32 tokens).
#define PA_ENTRIES(ENTRY)               \
    ENTRY(bf16, __nv_bfloat16, 64, 16)  \
    ENTRY(bf16, __nv_bfloat16, 64, 32)  \
    ENTRY(bf16, __nv_bfloat16, 128, 16) \
    ENTRY(bf16, __nv_bfloat16, 128, 32) \
    ENTRY(f16, __half, 64, 16)          \
    ENTRY(f16, __half, 64, 32)          \
    ENTRY(f16, __half, 128, 16)         \
    ENTRY(f16, __half, 128, 32)
