// attention_decode.cuh: the pieces the decode-attention stages share. One query token per sequence:
// q [B, HQ, D], per-sequence lengths seq_lens[B], query head hq reads KV head hq / (HQ / HKV); the
// cache element type T is __nv_bfloat16 or __half, all arithmetic fp32. Scores are
// scale * q.k + slope[hq] * (t - (len - 1)) with ALiBi (slopes == nullptr: none); lse is the natural
// logsumexp of those scores.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "ladder.cuh"
#include "ladder_convert.cuh"
#include "ladder_reduce.cuh"
#include "ladder_split_merge.cuh"

// The ALiBi bias of key t for a query at position len - 1.
__device__ __forceinline__ float decode_alibi(const float* slopes, int hq, int t, int len) {
    return slopes != nullptr ? slopes[hq] * (float)(t - (len - 1)) : 0.0f;
}

// Eight consecutive cache elements (16 bytes, aligned) as floats.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float* out) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = to_float(e[i]);
}

// A thread group's rows of one step of decode_block (rows base + r * GROUPS + gw for r < R, those
// before t_end) of a K or V cache with rows `stride` elements apart: the group's lane gl loads
// columns gl * 8 .. gl * 8 + 7 of each.
template <int GROUPS, int R, typename T>
__device__ __forceinline__ void load_step_rows(float (&x)[R][8], const T* __restrict__ rows, size_t stride, int base,
                                               int gw, int gl, int t_end) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int t = base + r * GROUPS + gw;
        if (t < t_end) load8(rows + (size_t)t * stride + gl * 8, x[r]);
    }
}

// decode_block's step loop over rows [first, t_end) of K or V, GROUPS * R rows a block step:
// a group's R rows loaded together (load_step_rows), then row(x, t) for each, rows t >= t_end
// included (x unread there) so that the scores' shuffles run with the full warp.
template <int GROUPS, int R, typename T, typename Row>
__device__ __forceinline__ void walk_step_rows(const T* __restrict__ rows, size_t stride, int first, int t_end, int gw,
                                               int gl, const Row& row) {
    for (int base = first; base < t_end; base += GROUPS * R) {
        float x[R][8];
        load_step_rows<GROUPS>(x, rows, stride, base, gw, gl, t_end);
#pragma unroll
        for (int r = 0; r < R; ++r) row(x[r], base + r * GROUPS + gw);
    }
}

// Output column d of one (sequence, query head) row merged over its S split partials
// (ladder_split_merge.cuh; o holds the row's S partials of D floats, m and l its S maxima and sums;
// `normalized`: each o_s is already divided by its l_s); writes out[d], and *lse when d == 0.
// BATCH: 0 merges a split at a time (merge_column), else BATCH splits' loads at once
// (merge_column_batched, decode stage 8).
template <typename T, int BATCH = 0>
__device__ __forceinline__ void decode_merge_row(T* out, float* lse, const float* o, const float* m, const float* l,
                                                 int splits, int D, int d, bool normalized) {
    const SplitArrays</*same launch*/ true> parts{o, m, l, D};
    SplitMerged r;
    if constexpr (BATCH == 0) {
        r = merge_column(parts, splits, d, normalized);
    } else {
        r = merge_column_batched<BATCH>(parts, splits, d, normalized);
    }
    out[d] = from_float<T>(r.value);
    if (d == 0) *lse = r.mx + __logf(r.sum);
}

// Merges the partials of every (sequence, query head): grid (HQ, B), block D threads.
template <typename T>
__device__ __forceinline__ void decode_combine(T* out, float* lse, const float* o_part, const float* m_part,
                                               const float* l_part, int splits, int D, bool normalized) {
    const size_t row = (size_t)blockIdx.y * gridDim.x + blockIdx.x;
    decode_merge_row(out + row * D, lse + row, o_part + row * splits * D, m_part + row * splits,
                     l_part + row * splits, splits, D, threadIdx.x, normalized);
}

// One block of THREADS threads over tokens [t_begin, t_end) of one sequence of a contiguous cache,
// for the G query heads hq0 .. hq0+G-1 that share one KV head (G = 1: the decoding-attention design;
// G > 1: each K and V row read once for the whole group). Thread groups of GS = D/8 lanes each hold
// one key row per step, one 16-byte load per lane, and reduce each head's dot product with xor
// shuffles inside the group; scores go to shared memory `s` (G rows of n = t_end - t_begin floats);
// softmax per head with block reductions; P.V with each group accumulating its keys' rows, then a
// shuffle reduction across the groups of a warp and a shared-memory one across warps. Returns, for
// output column threadIdx.x < D, each head's unnormalized output, and each head's max and sum of
// exp; an empty range gives -inf and 0. Each group keeps R rows in flight: it issues the loads of R
// rows (R*16 bytes per lane) before it uses the first.
template <typename T, int D, int THREADS, int G, int R>
__device__ __forceinline__ void decode_block(float (&o)[G], float (&m)[G], float (&l)[G], const T* __restrict__ q0,
                                             const T* __restrict__ kbase, const T* __restrict__ vbase, size_t stride,
                                             int t_begin, int t_end, int len, float scale, const float* slopes,
                                             int hq0, float* s) {
    constexpr int GS = D / 8;            // lanes per key row
    constexpr int GPW = 32 / GS;         // groups (rows in flight) per warp
    constexpr int WARPS = THREADS / 32;
    constexpr int GROUPS = WARPS * GPW;  // rows per block step and unroll slot
    __shared__ float scratch[32];
    __shared__ float red[WARPS][G][D];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gw = lane / GS, gl = lane % GS;
    const int n = t_end - t_begin;
    float q[G][8];
#pragma unroll
    for (int h = 0; h < G; ++h) load8(q0 + (size_t)h * D + gl * 8, q[h]);

    // S = scale * q.K^T (+ ALiBi), one row per group per step; the step loop is warp-uniform so the
    // shuffles always run with the full warp.
    float lmax[G];
#pragma unroll
    for (int h = 0; h < G; ++h) lmax[h] = -INFINITY;
    walk_step_rows<GROUPS, R>(kbase, stride, t_begin + warp * GPW, t_end, gw, gl, [&](const float (&k)[8], int t) {
        float acc[G];
#pragma unroll
        for (int h = 0; h < G; ++h) {
            acc[h] = 0.0f;
            if (t < t_end) {
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[h] += q[h][i] * k[i];
            }
        }
#pragma unroll
        for (int h = 0; h < G; ++h) {
#pragma unroll
            for (int off = GS / 2; off > 0; off >>= 1) acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], off);
            if (t < t_end && gl == 0) {
                const float v = acc[h] * scale + decode_alibi(slopes, hq0 + h, t, len);
                s[h * n + t - t_begin] = v;
                lmax[h] = fmaxf(lmax[h], v);
            }
        }
    });
#pragma unroll
    for (int h = 0; h < G; ++h) {
        m[h] = block_max(lmax[h], scratch);
        float lsum = 0.0f;
        for (int i = tid; i < n; i += THREADS) {
            const float p = __expf(s[h * n + i] - m[h]);
            s[h * n + i] = p;
            lsum += p;
        }
        l[h] = block_sum(lsum, scratch);  // also orders the p writes before the reads below
    }

    // O = P.V: each group accumulates its rows' 8 columns, for every head.
    float acc[G][8];
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[h][i] = 0.0f;
    }
    walk_step_rows<GROUPS, R>(vbase, stride, t_begin + warp * GPW, t_end, gw, gl, [&](const float (&v)[8], int t) {
        if (t < t_end) {
#pragma unroll
            for (int h = 0; h < G; ++h) {
                const float p = s[h * n + t - t_begin];
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[h][i] += p * v[i];
            }
        }
    });
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
            for (int off = GS; off < 32; off <<= 1) acc[h][i] += __shfl_xor_sync(0xffffffffu, acc[h][i], off);
        }
        if (gw == 0) {
#pragma unroll
            for (int i = 0; i < 8; ++i) red[warp][h][gl * 8 + i] = acc[h][i];
        }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < G; ++h) {
        o[h] = 0.0f;
        if (tid < D) {
#pragma unroll
            for (int w = 0; w < WARPS; ++w) o[h] += red[w][h][tid];
        }
    }
}

// The entry points of decode_combine (unnormalized partials), one per element type.
#define DECODE_COMBINE_ENTRIES                                                                                    \
    extern "C" __global__ void decode_combine_bf16(__nv_bfloat16* out, float* lse, const float* o_part,          \
                                                   const float* m_part, const float* l_part, int splits, int D) { \
        decode_combine<__nv_bfloat16>(out, lse, o_part, m_part, l_part, splits, D, false);                        \
    }                                                                                                             \
    extern "C" __global__ void decode_combine_f16(__half* out, float* lse, const float* o_part, const float* m_part, \
                                                  const float* l_part, int splits, int D) {                      \
        decode_combine<__half>(out, lse, o_part, m_part, l_part, splits, D, false);                               \
    }
