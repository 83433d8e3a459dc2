// ladder_split_merge.cuh: the split merge of split-K decode attention, one for every family that
// splits a row's keys (attention's decode stages, quant-int4's decode, the GPT-2 megakernel's
// attention phase). Split s of a row leaves its running max m_s, its sum l_s = sum exp(x - m_s) and
// o_s = sum exp(x - m_s) v (unnormalized; o_s / l_s where `normalized`); an empty split has
// m_s = -inf and weighs nothing. The row: mx = max m_s, sum = sum w_s l_s, out = sum w_s o_s / sum
// (w_s l_s for normalized partials), w_s = exp(m_s - mx), and its log-sum-exp mx + log(sum).
//
// Where the partials lie is a layout, with one signature: m(s), l(s), o_at(s, d), weight(m_s, mx)
// in the base the maxima are kept in, and `zeros_when_empty`: whether an empty split's l and o are
// written as zeros (then it is weighed exp(-inf) = 0 with no branch, and a split's three loads
// issue together; else its l and o are not read). Partials written by other blocks of the same launch are read
// through L2 (__ldcg: a line this SM's L1 kept from an earlier call would be stale); those of an
// earlier launch through the read-only path (__ldg). Two thread mappings share them:
//   merge_column    a thread a column d, two passes over the splits (block-wide and fused merges);
//   merge_column_batched  the same thread mapping with every split's m, l and o requested before
//                   the first is used, CHUNK splits at a time (one round trip to L2 a chunk where
//                   merge_column makes one a split whose loads wait for its m);
//   merge_row_warp  a warp a row: the lanes read the maxima and sums a split each and reduce them by
//                   shuffles, then each lane sums its D / 32 columns with four splits' loads in flight.
#pragma once
#include "ladder.cuh"
#include "ladder_reduce.cuh"

// Attention's split layout: o [S][D], m [S], l [S] of one row; maxima as natural logs. SAME_LAUNCH:
// the partials may come from this launch.
template <bool SAME_LAUNCH>
struct SplitArrays {
    const float* o;
    const float* m_;
    const float* l_;
    int D;
    __device__ __forceinline__ static float load(const float* p) { return SAME_LAUNCH ? __ldcg(p) : __ldg(p); }
    __device__ __forceinline__ float m(int s) const { return load(m_ + s); }
    __device__ __forceinline__ float l(int s) const { return load(l_ + s); }
    __device__ __forceinline__ float o_at(int s, int d) const { return load(o + (size_t)s * D + d); }
    __device__ __forceinline__ static float weight(float ms, float mx) { return __expf(ms - mx); }
    static constexpr bool zeros_when_empty = false;
};

// The GPT-2 megakernel's records: per split D outputs, then the max in log2 units, then the sum;
// written in the same launch.
struct SplitRecords {
    const float* p;
    int D;
    __device__ __forceinline__ float m(int s) const { return __ldcg(p + s * (D + 2) + D); }
    __device__ __forceinline__ float l(int s) const { return __ldcg(p + s * (D + 2) + D + 1); }
    __device__ __forceinline__ float o_at(int s, int d) const { return __ldcg(p + s * (D + 2) + d); }
    __device__ __forceinline__ static float weight(float ms, float mx) { return exp2f(ms - mx); }
    static constexpr bool zeros_when_empty = true;  // m = -inf, l = 0, o = 0 (mk_attention)
};

// A merged row: `value` (one column's, or unused by the warp mapping), the max and the sum.
struct SplitMerged {
    float value, mx, sum;
};

// Column d of a row merged over its `splits` partials, by one thread.
template <class Layout>
__device__ __forceinline__ SplitMerged merge_column(const Layout& p, int splits, int d, bool normalized) {
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, p.m(s));
    float sum = 0.0f, acc = 0.0f;
    for (int s = 0; s < splits; ++s) {
        const float ms = p.m(s);
        if constexpr (!Layout::zeros_when_empty) {
            if (ms == -INFINITY) continue;
        }
        const float w = Layout::weight(ms, mx), ls = p.l(s);
        sum += w * ls;
        acc += (normalized ? w * ls : w) * p.o_at(s, d);
    }
    return SplitMerged{acc / sum, mx, sum};
}

// Column d of a row merged over its `splits` partials by one thread, CHUNK splits' m, l and o loaded
// together (predicated, none waiting for another) and folded into a running max, sum and column by
// rescaling (exact in exact arithmetic; with splits <= CHUNK the same sums as merge_column). An
// empty split's l and o may be unwritten: it weighs 0 by a select, never by a product.
template <int CHUNK, class Layout>
__device__ __forceinline__ SplitMerged merge_column_batched(const Layout& p, int splits, int d, bool normalized) {
    float mx = -INFINITY, sum = 0.0f, acc = 0.0f;
    for (int s0 = 0; s0 < splits; s0 += CHUNK) {
        float ms[CHUNK], ls[CHUNK], os[CHUNK];
        // The columns first: a layout whose m and l come by shuffle (gemv's WarpSplits) then has
        // its o loads out before the shuffles wait for the lanes' maxima.
#pragma unroll
        for (int j = 0; j < CHUNK; ++j) os[j] = s0 + j < splits ? p.o_at(s0 + j, d) : 0.0f;
#pragma unroll
        for (int j = 0; j < CHUNK; ++j) {
            const bool in = s0 + j < splits;
            ms[j] = in ? p.m(s0 + j) : -INFINITY;
            ls[j] = in ? p.l(s0 + j) : 0.0f;
        }
        float cmx = mx;
#pragma unroll
        for (int j = 0; j < CHUNK; ++j) cmx = fmaxf(cmx, ms[j]);
        const float r = mx == -INFINITY ? 0.0f : Layout::weight(mx, cmx);
        sum *= r;
        acc *= r;
#pragma unroll
        for (int j = 0; j < CHUNK; ++j) {
            const bool empty = ms[j] == -INFINITY;
            const float w = empty ? 0.0f : Layout::weight(ms[j], cmx);
            sum += empty ? 0.0f : w * ls[j];
            acc += empty ? 0.0f : (normalized ? w * ls[j] : w) * os[j];
        }
        mx = cmx;
    }
    return SplitMerged{acc / sum, mx, sum};
}

// A row of D columns merged over its `splits` unnormalized partials by one warp: lane `lane` gets
// columns lane + 32 k in out[k]. Every lane of the warp calls it (the shuffles are full-warp).
template <int D, class Layout>
__device__ __forceinline__ SplitMerged merge_row_warp(const Layout& p, int splits, int lane, float (&out)[D / 32]) {
    float mx = -INFINITY;
    for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, p.m(s));
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int s = lane; s < splits; s += 32) {
        const float ms = p.m(s);
        sum += (ms == -INFINITY ? 0.0f : Layout::weight(ms, mx)) * p.l(s);  // an empty split weighs 0
    }
    sum = warp_sum(sum);
    float acc[D / 32] = {};
#pragma unroll 4
    for (int s = 0; s < splits; ++s) {
        const float ms = p.m(s);
        const float w = ms == -INFINITY ? 0.0f : Layout::weight(ms, mx);
#pragma unroll
        for (int k = 0; k < D / 32; ++k) acc[k] = fmaf(w, p.o_at(s, lane + 32 * k), acc[k]);
    }
#pragma unroll
    for (int k = 0; k < D / 32; ++k) out[k] = acc[k] / sum;
    return SplitMerged{0.0f, mx, sum};
}
