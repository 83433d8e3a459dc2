// attention_decode_mma.cuh: the tensor-core split kernel of decode stages 6 and 7 (see
// decode/06_tensor_core.cu for the design). Block (split, KV head, sequence) of WARPS warps
// computes, for the G query heads of its KV head, the split's unnormalized partial O, max m and sum
// l: into global memory (DecodeOut::GlobalPartials, exactly the layout decode_combine merges) or
// into the caller's shared arrays, row r at o[r * D], m[r], l[r] (SharedPartials, for a merge
// through the cluster); or, with a single split (Final), the output O and lse themselves.
// Cache: when the split's first K/V tiles are requested. LateCache: after the caller has waited for
// the kernel before it. EarlyCache (decode stages 9-10): the block requests its first STAGES - 1
// tiles a warp, then calls Cache::wait() (the chain's wait and trigger, ladder_dependent.cuh), since
// no kernel of the step writes the cached rows before the step's own token; q, and that one row,
// are read after the wait.
#pragma once
#include "attention_decode.cuh"
#include "ladder_mma.cuh"

// Where the split's result goes (above).
enum class DecodeOut { Final, GlobalPartials, SharedPartials };

// The split's tiles all requested after the caller's wait (stages 6-8).
struct LateCache {
    static constexpr bool early = false;
    __device__ static void wait() {}
};
// The first tiles before the wait; WAIT is the stage file's function that takes the chain's wait and
// trigger (stages 9-10).
template <void (*WAIT)()>
struct EarlyCache {
    static constexpr bool early = true;
    __device__ static void wait() { WAIT(); }
};

constexpr int TC_TILE = 16;  // tokens per warp tile: the n of two m16n8 tiles, the k of one P.V step

// The address in a tile of [16 rows][D] 16-bit elements of chunk c (8 elements) of row r: chunks are
// XOR-swizzled by the row's low three bits, so the 8 rows an ldmatrix phase reads at one logical
// chunk land in 8 different 16-byte bank groups (D*2 bytes per row is a multiple of 128).
template <int D>
__device__ __forceinline__ int tc_swizzle(int r, int c) {
    return r * D + ((c ^ (r & 7)) << 3);
}

template <typename T, int D, int WARPS, int STAGES, DecodeOut OUT, class Cache = LateCache>
__device__ __forceinline__ void tensor_core_decode(T* out, float* lse, float* o_part, float* m_part, float* l_part, const T* q,
                                                   const T* k, const T* v, const int* seq_lens, const float* slopes,
                                                   int Tmax, int G, float scale) {
    static_assert(STAGES >= 2, "one tile is consumed while the next is in flight");
    constexpr int W = WARPS;
    constexpr int CH = D / 8;               // 16-byte chunks per row
    constexpr int KS = D / 16;              // k-steps of Q.K^T
    constexpr int NT = D / 8;               // 8-column n-tiles of O
    constexpr int TILE = TC_TILE * D;       // elements of one K (or V) tile
    constexpr int LOADS = TC_TILE * CH / 32; // 16-byte copies per lane per tile
    extern __shared__ __align__(16) unsigned char tc_smem[];
    __shared__ float red_m[W][16], red_l[W][16];

    const int split = blockIdx.x, splits = gridDim.x, kvh = blockIdx.y, HKV = gridDim.y, b = blockIdx.z;
    const int HQ = HKV * G, hq0 = kvh * G, len = seq_lens[b];
    const int chunk = (len + splits - 1) / splits;
    const int t_begin = min(split * chunk, len), t_end = min(t_begin + chunk, len);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const size_t stride = (size_t)HKV * D;
    const size_t kv0 = ((size_t)b * Tmax * HKV + kvh) * D;
    const T* kb = k + kv0;
    const T* vb = v + kv0;
    T* ring = reinterpret_cast<T*>(tc_smem) + (size_t)warp * STAGES * 2 * TILE;

    // Q as A fragments for every k-step: rows g and g + 8 are query heads hq0 + g and hq0 + g + 8.
    unsigned qa[KS][4];
    const T* q0 = q + ((size_t)b * HQ + hq0) * D;
    const bool lo_ok = g < G, hi_ok = g + 8 < G;
    auto load_q = [&]() {
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const int c = ks * 16 + 2 * tq;
            qa[ks][0] = lo_ok ? *reinterpret_cast<const unsigned*>(q0 + g * D + c) : 0u;
            qa[ks][1] = hi_ok ? *reinterpret_cast<const unsigned*>(q0 + (g + 8) * D + c) : 0u;
            qa[ks][2] = lo_ok ? *reinterpret_cast<const unsigned*>(q0 + g * D + c + 8) : 0u;
            qa[ks][3] = hi_ok ? *reinterpret_cast<const unsigned*>(q0 + (g + 8) * D + c + 8) : 0u;
        }
    };
    if constexpr (!Cache::early) load_q();
    const float slope_lo = (slopes != nullptr && lo_ok) ? slopes[hq0 + g] : 0.0f;
    const float slope_hi = (slopes != nullptr && hi_ok) ? slopes[hq0 + g + 8] : 0.0f;

    // This warp's tiles: W-strided 16-token tiles of [t_begin, t_end).
    const int tiles = (t_end - t_begin + TC_TILE - 1) / TC_TILE;
    const int mine = tiles > warp ? (tiles - warp + W - 1) / W : 0;
    // Rows from `bound` on are zero-filled (and masked by t_end in the softmax).
    auto load_tile = [&](int i, int bound) {
        if (i >= mine) return;
        T* ks_ = ring + (i % STAGES) * 2 * TILE;
        const int t0 = t_begin + (warp + i * W) * TC_TILE;
#pragma unroll
        for (int e = 0; e < LOADS; ++e) {
            const int idx = lane + 32 * e, r = idx / CH, c = idx % CH, t = t0 + r;
            const bool ok = t < bound;
            const size_t off = ok ? (size_t)t * stride + c * 8 : 0;
            cp_async_16(smem_u32(ks_ + tc_swizzle<D>(r, c)), kb + off, ok);
            cp_async_16(smem_u32(ks_ + TILE + tc_swizzle<D>(r, c)), vb + off, ok);
        }
    };

    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

    // Early, the step's own row (len - 1, written by the kernel waited for) is left out of the first
    // tiles and read after the wait.
    const int first_bound = Cache::early ? min(t_end, len - 1) : t_end;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        load_tile(s, first_bound);
        cp_async_commit();
    }
    if constexpr (Cache::early) {
        Cache::wait();
        load_q();
        const int j = len - 1 - t_begin;  // the step's row in this split's tiles
        const int tile = j / TC_TILE;
        if (j >= 0 && len - 1 < t_end && tile % W == warp && tile / W < STAGES - 1) {
            cp_async_wait<0>();  // its zero fill (by other lanes) has landed before the row is written
            __syncwarp();
            T* ks_ = ring + (tile / W % STAGES) * 2 * TILE;
            const size_t row = (size_t)(len - 1) * stride;
            for (int c = lane; c < CH; c += 32) {
                const uint4 kc = *reinterpret_cast<const uint4*>(kb + row + c * 8);
                const uint4 vc = *reinterpret_cast<const uint4*>(vb + row + c * 8);
                *reinterpret_cast<uint4*>(ks_ + tc_swizzle<D>(j % TC_TILE, c)) = kc;
                *reinterpret_cast<uint4*>(ks_ + TILE + tc_swizzle<D>(j % TC_TILE, c)) = vc;
            }
            __syncwarp();
        }
    }
    for (int i = 0; i < mine; ++i) {
        load_tile(i + STAGES - 1, t_end);
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        __syncwarp();
        const T* ks_ = ring + (i % STAGES) * 2 * TILE;
        const T* vs = ks_ + TILE;

        // S = Q.K^T: n-tile 0 is tokens 0..7 of the tile, n-tile 1 tokens 8..15.
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        const int kr = (lane & 7) + ((lane >> 4) << 3), kc = (lane >> 3) & 1;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            unsigned kf[4];
            ldmatrix_x4(kf, smem_u32(ks_ + tc_swizzle<D>(kr, 2 * ks + kc)));
            mma_16816<T>(s[0], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], kf[0], kf[1]);
            mma_16816<T>(s[1], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], kf[2], kf[3]);
        }

        // Online softmax on rows g (elements 0, 1) and g + 8 (elements 2, 3); a row's 16 scores
        // are spread over the 4 lanes of a quad.
        const int t0 = t_begin + (warp + i * W) * TC_TILE;
        float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int t = t0 + 8 * n + 2 * tq + (e & 1);
                float x = s[n][e] * scale + (e < 2 ? slope_lo : slope_hi) * (float)(t - (len - 1));
                x = t < t_end ? x : -INFINITY;
                s[n][e] = x;
                if (e < 2) mx_lo = fmaxf(mx_lo, x);
                else mx_hi = fmaxf(mx_hi, x);
            }
        }
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
            mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
        }
        const float new_lo = fmaxf(m_lo, mx_lo), new_hi = fmaxf(m_hi, mx_hi);
        // A row with no score yet keeps max -inf; exponentiate against 0 then so nothing is NaN.
        const float base_lo = new_lo == -INFINITY ? 0.0f : new_lo, base_hi = new_hi == -INFINITY ? 0.0f : new_hi;
        const float alpha_lo = __expf(m_lo - base_lo), alpha_hi = __expf(m_hi - base_hi);
        m_lo = new_lo;
        m_hi = new_hi;
        float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
            s[n][0] = __expf(s[n][0] - base_lo);
            s[n][1] = __expf(s[n][1] - base_lo);
            s[n][2] = __expf(s[n][2] - base_hi);
            s[n][3] = __expf(s[n][3] - base_hi);
            sum_lo += s[n][0] + s[n][1];
            sum_hi += s[n][2] + s[n][3];
        }
        l_lo = l_lo * alpha_lo + sum_lo;
        l_hi = l_hi * alpha_hi + sum_hi;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            o[n][0] *= alpha_lo;
            o[n][1] *= alpha_lo;
            o[n][2] *= alpha_hi;
            o[n][3] *= alpha_hi;
        }

        // O += P.V: the two S accumulators are exactly one A fragment over the tile's 16 tokens.
        const unsigned pa0 = pack2<T>(s[0][0], s[0][1]), pa1 = pack2<T>(s[0][2], s[0][3]);
        const unsigned pa2 = pack2<T>(s[1][0], s[1][1]), pa3 = pack2<T>(s[1][2], s[1][3]);
        const int vr = (lane & 7) + (((lane >> 3) & 1) << 3), vc = lane >> 4;
#pragma unroll
        for (int p = 0; p < NT / 2; ++p) {
            unsigned vf[4];
            ldmatrix_x4_trans(vf, smem_u32(vs + tc_swizzle<D>(vr, 2 * p + vc)));
            mma_16816<T>(o[2 * p], pa0, pa1, pa2, pa3, vf[0], vf[1]);
            mma_16816<T>(o[2 * p + 1], pa0, pa1, pa2, pa3, vf[2], vf[3]);
        }
        __syncwarp();  // every lane is done with this slot before a later iteration refills it
    }
    cp_async_wait<0>();

    // Merge the warps: per row, the block max M, each warp's O scaled by exp(m_w - M), summed.
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
        l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
    }
    if (tq == 0) {
        red_m[warp][g] = m_lo;
        red_m[warp][g + 8] = m_hi;
        red_l[warp][g] = l_lo;
        red_l[warp][g + 8] = l_hi;
    }
    __syncthreads();  // also: every warp is done with its ring, which now holds the scaled O
    float big_lo = -INFINITY, big_hi = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) {
        big_lo = fmaxf(big_lo, red_m[w][g]);
        big_hi = fmaxf(big_hi, red_m[w][g + 8]);
    }
    const float w_lo = __expf(m_lo - (big_lo == -INFINITY ? 0.0f : big_lo));
    const float w_hi = __expf(m_hi - (big_hi == -INFINITY ? 0.0f : big_hi));
    float* ored = reinterpret_cast<float*>(tc_smem);  // [W][16][D]: W*64*D bytes <= the ring's W*128*D
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const int c = 8 * n + 2 * tq;
        ored[(warp * 16 + g) * D + c] = o[n][0] * w_lo;
        ored[(warp * 16 + g) * D + c + 1] = o[n][1] * w_lo;
        ored[(warp * 16 + g + 8) * D + c] = o[n][2] * w_hi;
        ored[(warp * 16 + g + 8) * D + c + 1] = o[n][3] * w_hi;
    }
    __syncthreads();
    // Row r's block max and sum of exp over the warps.
    auto row_stats = [&](int r, float& big, float& sum) {
        big = -INFINITY;
        sum = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) big = fmaxf(big, red_m[w][r]);
        const float base = big == -INFINITY ? 0.0f : big;
#pragma unroll
        for (int w = 0; w < W; ++w) sum += red_l[w][r] * __expf(red_m[w][r] - base);
    };
    for (int idx = threadIdx.x; idx < G * D; idx += W * 32) {
        const int r = idx / D, c = idx % D;
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) acc += ored[(w * 16 + r) * D + c];
        if constexpr (OUT == DecodeOut::Final) {
            float big, sum;
            row_stats(r, big, sum);
            out[((size_t)b * HQ + hq0 + r) * D + c] = from_float<T>(acc / sum);
        } else if constexpr (OUT == DecodeOut::GlobalPartials) {
            o_part[(((size_t)b * HQ + hq0 + r) * splits + split) * D + c] = acc;
        } else {
            o_part[r * D + c] = acc;
        }
    }
    if (threadIdx.x < G) {
        const int r = threadIdx.x;
        float big, sum;
        row_stats(r, big, sum);
        if constexpr (OUT == DecodeOut::Final) {
            lse[(size_t)b * HQ + hq0 + r] = big + __logf(sum);
        } else if constexpr (OUT == DecodeOut::GlobalPartials) {
            const size_t part = ((size_t)b * HQ + hq0 + r) * splits + split;
            m_part[part] = big;
            l_part[part] = sum;
        } else {
            m_part[r] = big;
            l_part[r] = sum;
        }
    }
}

