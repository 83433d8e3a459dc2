// qi4_decode_parts.cuh: the parts of the split-K decode kernel (decode/00_splitk.cu) that the write-up's
// switches choose between. Each part is a struct of static hooks; a recipe (a struct naming one
// part per role, 00_splitk.cu's `Qi4Recipe`) composes them and decode_splitk<R, D> calls the hooks
// in order. Roles, with the switch that picks each (the reference's numbering):
//   Cache   the cached rows: Bf16Rows (stage 0), Int4Rows<1> (row-wise), Int4Rows<4> (OPT6)
//   KLoad   the K tile: KChunked (baseline), KUnrolled (OPT1)
//   VLoad   the V tile: VChunked (baseline), VPrefetch (OPT5)
//   Max     the pass's per-head max: MaxLocalArray (baseline), MaxRegister (OPT3), MaxFromFragment (OPT7)
//   Sum     p = 2^(s - m) and the per-head sums: SumLocalArray (baseline), SumRegister (OPT4)
//   PConv   P to bf16 and P's A fragment: PCopyBf16 (baseline), PInPlaceBf16 (OPT2), PFromFp32 (OPT8)
//   PLayout where P's column i of head h lives: PRowMajor (baseline), PSwizzled (OPT9)
//   Tile    the shared tile's row pad, stores and fragment reads: ScalarTile<0> (baseline),
//           ScalarTile<2> (OPT10); ours past the write-up: WideTile (OPT11, qi4_decode_wide.cuh)
//   Values  what the tile holds: Dequantized (the write-up); ours: BiasedCodes<G> (OPT12,
//           qi4_decode_wide.cuh), which also takes the hooks that apply the affine map to the products
// What each switch buys is in 00_splitk.cu's header.
// The per-thread arrays a part works on (a tile's raw words, the local-array passes' scratch, the
// per-group state) are declared by the kernel, where the code before the parts declared them, and a
// part hands values back by value (PConv::fragment, Max::score): with its own locals, or writing the
// kernel's through references, a part compiled to the same instructions in another register order.
#pragma once
#include "ladder_recipe.cuh"
#include "ladder.cuh"
#include "ladder_reduce.cuh"
#include "ladder_convert.cuh"
#include "ladder_mma.cuh"
#include "qi4_format.cuh"

#ifndef QI4_WARPS
#error "QI4_WARPS (warps per block) is a tunable: the stage list sets it"
#endif
constexpr int QI4_THREADS = 32 * QI4_WARPS;
constexpr int QI4_TILE = 16;                               // tokens per warp tile (one mma k-step of P.V)
constexpr int QI4_PASS = 256;                              // tokens per pass (scores kept in shared memory)
constexpr int QI4_TPW = QI4_PASS / (QI4_TILE * QI4_WARPS);  // tiles per warp per pass
constexpr int QI4_MAXH = 8;                                // query heads per KV head
// The block's shared arrays the parts work on, passed by reference (as arrays, not pointers).
using Qi4Scores = float[QI4_MAXH * QI4_PASS];              // s_p: the pass's scores, then P
using Qi4ScoresBf16 = __nv_bfloat16[QI4_MAXH * QI4_PASS];  // s_pb: P in bf16 (PCopyBf16)
using Qi4Red = float[QI4_WARPS * QI4_MAXH];                // s_red: per-warp per-head partial max or sum
using Qi4Heads = float[QI4_MAXH];                          // s_m: per-head running max
static_assert(QI4_PASS == 2 * QI4_THREADS, "OPT2 converts one fp32 pair per thread per head");
static_assert(QI4_PASS % 64 == 0, "the OPT9 swizzle permutes 8-column chunks within 64");

// The kernel's sizes at head size D under recipe R.
template <class R, int D>
struct Qi4Cfg {
    static constexpr int G = R::Cache::G;                      // scale groups a row
    static constexpr int KSTRIDE = D + R::Tile::PAD;           // bf16 elements per shared tile row
    static constexpr int ROW_BYTES = R::Cache::template ROW_BYTES<D>;
    static constexpr int KS_PER_GROUP = D / 16 / G;            // k-steps (16 dims) per scale group
};

// ---- Values: what the tile holds (the write-up: the dequantized bf16 values; ours: OPT12) ----

// The tile holds the values themselves (dequantized, or the bf16 cache's): the products need nothing
// more, and there are no per-token parameters.
struct Dequantized {
    static constexpr int NACC = 1;  // score accumulators an n-tile
    static constexpr int NP = 1;    // P's A fragments (a register pair) a tile
    struct Groups {};               // no per-group state
    // A code word with (scale, shift) sz as four bf16x2 registers.
    static __device__ __forceinline__ void word(unsigned w, float2 sz, unsigned (&out)[4]) {
        qi4_dequant_word(w, sz.x, sz.y, out);
    }
    // The baseline's two words of chunk c, straight into the tile.
    static __device__ __forceinline__ void chunk(unsigned w0, unsigned w1, float2 sz, unsigned* dst, int c) {
        qi4_dequant_word(w0, sz.x, sz.y, dst + 8 * c);
        qi4_dequant_word(w1, sz.x, sz.y, dst + 8 * c + 4);
    }
    static __device__ __forceinline__ void params(float2*, float2, float2, int) {}
    static __device__ __forceinline__ void params_chunked(float2* par, unsigned, unsigned, int) { (void)par; }
    static __device__ __forceinline__ void zero_params(float2*, int) {}
    static __device__ __forceinline__ float2* par_slot(float2*) { return nullptr; }
    template <int D>
    static __device__ __forceinline__ void init(const unsigned (&)[D / 16][2], Groups&, Groups&) {}
    // The accumulator of k-step ks.
    template <int KS_PER_GROUP>
    static __device__ __forceinline__ constexpr int acc_of(int) {
        return 0;
    }
    // The scores of tokens 2t, 2t + 1 of n-tile nt from its accumulator.
    template <class Par>
    static __device__ __forceinline__ void scores(const float (&acc)[NACC][4], const Groups&, const Par&, int,
                                                  int, int, float& sc0, float& sc1) {
        sc0 = acc[0][0];
        sc1 = acc[0][1];
    }
    static __device__ __forceinline__ void rescale(Groups&, float) {}
    // P's A fragments from head g's P values (pa0, pa2 as bf16x2; f0, f1 in fp32).
    template <class Par>
    static __device__ __forceinline__ void p_fragments(Groups&, const Par&, int, int, const float2&, const float2&,
                                                       unsigned pa0, unsigned pa2, unsigned (&a0)[NP],
                                                       unsigned (&a2)[NP]) {
        a0[0] = pa0;
        a2[0] = pa2;
    }
    // The A fragment of n-tile nt.
    template <int D>
    static __device__ __forceinline__ constexpr int p_of(int) {
        return 0;
    }
    template <int D>
    static __device__ __forceinline__ void finish(Groups&, float (&)[D / 8][4]) {}
};

// ---- Tile: the warp's shared tile [16 tokens][D + PAD] ----

// Rows padded by PAD bf16 (OPT10: 2, spreading the dequantize stores and the fragment loads over
// more banks), written a 32-bit word at a time and read by 32-bit (K) and 16-bit (V) loads.
template <int PAD_>
struct ScalarTile {
    static constexpr int PAD = PAD_;
    static __device__ __forceinline__ void store4(unsigned* dst, const unsigned (&w)[4]) {
#pragma unroll
        for (int k = 0; k < 4; ++k) dst[k] = w[k];
    }
    // acc[] += A = Q (qa) times B = K^T from the token-major tile: n-tile nt's 8 tokens.
    template <int D, int KSTRIDE, class V, int KS_PER_GROUP>
    static __device__ __forceinline__ void scores(float (&acc)[V::NACC][4], const unsigned (&qa)[D / 16][2],
                                                  const __nv_bfloat16* kv_w, int nt, int lane, int g, int t) {
        (void)lane;
        const unsigned* krow = reinterpret_cast<const unsigned*>(kv_w + (nt * 8 + g) * KSTRIDE);
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            mma_16816<__nv_bfloat16>(acc[V::template acc_of<KS_PER_GROUP>(ks)], qa[ks][0], 0u, qa[ks][1], 0u,
                                     krow[ks * 8 + t], krow[ks * 8 + 4 + t]);
        }
    }
    // o[] += A = P (a0, a2) times B = V from the tile, two 16-bit loads a register.
    template <int D, int KSTRIDE, class V>
    static __device__ __forceinline__ void pv(float (&o)[D / 8][4], const unsigned (&a0)[V::NP],
                                              const unsigned (&a2)[V::NP], const __nv_bfloat16* kv_w, int lane,
                                              int g, int t) {
        (void)lane;
        const unsigned short* vs = reinterpret_cast<const unsigned short*>(kv_w);
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            const int d = nt * 8 + g;
            const unsigned b0 = (unsigned)vs[(2 * t) * KSTRIDE + d] | ((unsigned)vs[(2 * t + 1) * KSTRIDE + d] << 16);
            const unsigned b1 =
                (unsigned)vs[(2 * t + 8) * KSTRIDE + d] | ((unsigned)vs[(2 * t + 9) * KSTRIDE + d] << 16);
            mma_16816<__nv_bfloat16>(o[nt], a0[V::template p_of<D>(nt)], 0u, a2[V::template p_of<D>(nt)], 0u, b0,
                                     b1);
        }
    }
};

// ---- Cache: the cached rows and a lane's half row (token lane/2, half lane&1) ----

// The bf16 cache (stage 0): D/16 16-byte vectors a half row, copied into the tile.
struct Bf16Rows {
    static constexpr int G = 1;
    template <int D>
    static constexpr int ROW_BYTES = 2 * D;
    template <int D>
    struct Raw {
        uint4 u[D / 16];
    };
    template <int D>
    static __device__ __forceinline__ void load(Raw<D>& r, const unsigned char* __restrict__ row, int hf) {
        const uint4* p = reinterpret_cast<const uint4*>(row + hf * D);
#pragma unroll
        for (int i = 0; i < D / 16; ++i) r.u[i] = p[i];
    }
    template <class R, int D>
    static __device__ __forceinline__ void store(const Raw<D>& r, unsigned* dst, float2*, int) {
#pragma unroll
        for (int i = 0; i < D / 16; ++i) {
            dst[4 * i + 0] = r.u[i].x;
            dst[4 * i + 1] = r.u[i].y;
            dst[4 * i + 2] = r.u[i].z;
            dst[4 * i + 3] = r.u[i].w;
        }
    }
    // The baseline path: 2 vectors loaded and stored per iteration, not unrolled.
    template <class R, int D>
    static __device__ __forceinline__ void load_store_chunked(const unsigned char* __restrict__ row, int hf,
                                                              unsigned* dst, float2*) {
        const uint4* p = reinterpret_cast<const uint4*>(row + hf * D);
#pragma unroll 1
        for (int c = 0; c < D / 32; ++c) {
            const uint4 a = p[2 * c];
            const uint4 b = p[2 * c + 1];
            unsigned* o = dst + 8 * c;
            o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
            o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
        }
    }
};

// INT4 rows (qi4_format.cuh) with G groups: G = 1 row-wise (a 32-bit (scale, shift) word and 32-bit
// code loads), G = 4 group-wise (OPT6: rows 8-byte aligned, so scales and codes come in 8-byte
// (uint2) vector loads instead of 32-bit ones). Values (Dequantized or OPT12's codes) decides what
// the tile gets, Tile how it is stored.
template <int G_>
struct Int4Rows {
    static constexpr int G = G_;
    static_assert(G == 1 || G == 4, "row-wise or 4 groups");
    template <int D>
    static constexpr int ROW_BYTES = 4 * G + D / 2;
    // A lane's half row: D/16 words of codes and the (scale, shift) pairs of its first and second
    // half (equal row-wise).
    template <int D>
    struct Raw {
        unsigned u[D / 16];
        unsigned s0, s1;
    };
    // Loads a lane's half row (hf = 0: values 0..D/2-1, hf = 1: D/2..D-1) into registers.
    template <int D>
    static __device__ __forceinline__ void load(Raw<D>& r, const unsigned char* __restrict__ row, int hf) {
        if constexpr (G == 4) {
            const uint2 sc = reinterpret_cast<const uint2*>(row)[hf];  // groups 2hf, 2hf+1
            r.s0 = sc.x;
            r.s1 = sc.y;
            const uint2* p = reinterpret_cast<const uint2*>(row + 4 * G + hf * (D / 4));
#pragma unroll
            for (int j = 0; j < D / 32; ++j) {
                const uint2 v = p[j];
                r.u[2 * j] = v.x;
                r.u[2 * j + 1] = v.y;
            }
        } else {
            r.s0 = *reinterpret_cast<const unsigned*>(row);
            r.s1 = r.s0;
            const unsigned* p = reinterpret_cast<const unsigned*>(row + 4 + hf * (D / 4));
#pragma unroll
            for (int i = 0; i < D / 16; ++i) r.u[i] = p[i];
        }
    }
    // Converts a loaded half row into shared memory (D/16 units of 4 words) and, where the values
    // need them, `par` the token's (scale, shift) for the groups of this half.
    template <class R, int D>
    static __device__ __forceinline__ void store(const Raw<D>& r, unsigned* dst, float2* par, int hf) {
        const float2 sz0 = unpack_half2(r.s0);
        const float2 sz1 = unpack_half2(r.s1);
        R::Values::params(par, sz0, sz1, hf);
#pragma unroll
        for (int i = 0; i < D / 16; ++i) {
            unsigned w[4];
            R::Values::word(r.u[i], (i < D / 32) ? sz0 : sz1, w);  // a group is D/32 words
            R::Tile::store4(dst + 4 * i, w);
        }
    }
    // The baseline path: 16 values (2 words) loaded, converted and stored per iteration, not unrolled.
    template <class R, int D>
    static __device__ __forceinline__ void load_store_chunked(const unsigned char* __restrict__ row, int hf,
                                                              unsigned* dst, float2* par) {
        if constexpr (G == 4) {
            const uint2 sc = reinterpret_cast<const uint2*>(row)[hf];
            const unsigned s0 = sc.x, s1 = sc.y;
            const uint2* p2 = reinterpret_cast<const uint2*>(row + 4 * G + hf * (D / 4));
#pragma unroll 1
            for (int c = 0; c < D / 32; ++c) {
                const uint2 v = p2[c];
                const unsigned w0 = v.x, w1 = v.y;
                const float2 sz = unpack_half2((2 * c < D / 32) ? s0 : s1);
                R::Values::chunk(w0, w1, sz, dst, c);
            }
            R::Values::params_chunked(par, s0, s1, hf);
        } else {
            const unsigned s0 = *reinterpret_cast<const unsigned*>(row), s1 = s0;
            const unsigned* p = reinterpret_cast<const unsigned*>(row + 4 + hf * (D / 4));
#pragma unroll 1
            for (int c = 0; c < D / 32; ++c) {
                const unsigned w0 = p[2 * c], w1 = p[2 * c + 1];
                const float2 sz = unpack_half2((2 * c < D / 32) ? s0 : s1);
                R::Values::chunk(w0, w1, sz, dst, c);
            }
            R::Values::params_chunked(par, s0, s1, hf);
        }
    }
};

// A token past the split's end: zeros (and, where the values carry them, zero parameters).
template <class R, int D>
__device__ __forceinline__ void qi4_tile_zero(unsigned* dst, float2* par, int hf) {
#pragma unroll
    for (int i = 0; i < D / 4; ++i) dst[i] = 0u;
    R::Values::zero_params(par, hf);
}

// ---- KLoad: the K tile of a token that exists (`raw`: registers the kernel declares for it) ----

// Baseline: a `#pragma unroll 1` loop loads 2 words, converts, stores.
struct KChunked {
    template <class R, int D, class Raw>
    static __device__ __forceinline__ void tile(Raw&, const unsigned char* __restrict__ row, int hf, unsigned* dst,
                                                float2* par) {
        R::Cache::template load_store_chunked<R, D>(row, hf, dst, par);
    }
};

// OPT1: a lane's D/16 words (8 for D=128) all in flight before the first is converted.
struct KUnrolled {
    template <class R, int D, class Raw>
    static __device__ __forceinline__ void tile(Raw& raw, const unsigned char* __restrict__ row, int hf, unsigned* dst,
                                                float2* par) {
        R::Cache::template load<D>(raw, row, hf);
        R::Cache::template store<R, D>(raw, dst, par, hf);
    }
};

// ---- VLoad: the V tiles of a pass, a token that exists (`raw`: the prefetch's registers, declared by the
// kernel) ----

// Baseline: each V tile is loaded, converted and stored by the chunked loop when its turn comes.
struct VChunked {
    template <class R, int D, class Raw>
    static __device__ __forceinline__ void first(Raw&, const unsigned char*, int, int, size_t, int) {}
    template <class R, int D, class Raw>
    static __device__ __forceinline__ void tile(Raw&, const unsigned char* __restrict__ row, int hf, unsigned* dst,
                                                float2* par) {
        R::Cache::template load_store_chunked<R, D>(row, hf, dst, par);
    }
    template <class R, int D, class Raw>
    static __device__ __forceinline__ void next(Raw&, const unsigned char*, int, bool, int, size_t, int) {}
};

// OPT5: the next V tile's raw words are loaded into registers right after the current tile is stored
// to shared memory (the first tile's before the softmax), so the loads overlap the mma and the softmax.
struct VPrefetch {
    template <class R, int D, class Raw>
    static __device__ __forceinline__ void first(Raw& raw, const unsigned char* vbase, int tok, int t_end,
                                                 size_t tok_stride, int hf) {
        if (tok < t_end) R::Cache::template load<D>(raw, vbase + (size_t)tok * tok_stride, hf);
    }
    template <class R, int D, class Raw>
    static __device__ __forceinline__ void tile(Raw& raw, const unsigned char* __restrict__, int hf, unsigned* dst,
                                                float2* par) {
        R::Cache::template store<R, D>(raw, dst, par, hf);
    }
    // The warp's next tile (token ntok; `more`: the warp has one this pass).
    template <class R, int D, class Raw>
    static __device__ __forceinline__ void next(Raw& raw, const unsigned char* vbase, int ntok, bool more, int t_end,
                                                size_t tok_stride, int hf) {
        if (more && ntok < t_end) R::Cache::template load<D>(raw, vbase + (size_t)ntok * tok_stride, hf);
    }
};

// ---- Max: the pass's per-head max into s_red[warp][head] ----

// The scores' hooks (lane_max) are unused by the two shared-memory passes. `Scratch` is a pass's
// per-thread storage, declared by the kernel where the pass begins (so its lifetime is the kernel's).
struct MaxPass {
    static __device__ __forceinline__ float init() { return 0.0f; }
    static __device__ __forceinline__ float score(float lane_max, float, float) { return lane_max; }
    static __device__ __forceinline__ void scores_done(float, Qi4Red&, int, int, int, int) {}
};

// Baseline: a float[8] indexed by the runtime head count (local memory).
struct MaxLocalArray : MaxPass {
    using Scratch = float[QI4_MAXH];
    static __device__ __forceinline__ void pass(Scratch& tmax_h, const Qi4Scores& s_p, Qi4Red& s_red, int nh, int tid,
                                                int lane, int warp) {
#pragma unroll 1
        for (int h = 0; h < nh; ++h) tmax_h[h] = -INFINITY;
        for (int i = tid; i < QI4_PASS; i += QI4_THREADS) {
#pragma unroll 1
            for (int h = 0; h < nh; ++h) tmax_h[h] = fmaxf(tmax_h[h], s_p[h * QI4_PASS + i]);
        }
#pragma unroll 1
        for (int h = 0; h < nh; ++h) {
            const float m = warp_max(tmax_h[h]);
            if (lane == 0) s_red[warp * QI4_MAXH + h] = m;
        }
        __syncthreads();
    }
};

// OPT3: one float per thread (heads in turn, warp shuffle + shared memory across warps).
struct MaxRegister : MaxPass {
    struct Scratch {};
    static __device__ __forceinline__ void pass(Scratch&, const Qi4Scores& s_p, Qi4Red& s_red, int nh, int tid,
                                                int lane, int warp) {
#pragma unroll 1
        for (int h = 0; h < nh; ++h) {
            float m = -INFINITY;
            for (int i = tid; i < QI4_PASS; i += QI4_THREADS) m = fmaxf(m, s_p[h * QI4_PASS + i]);
            m = warp_max(m);
            if (lane == 0) s_red[warp * QI4_MAXH + h] = m;
        }
        __syncthreads();
    }
};

// OPT7: the max read from the accumulator fragment (c0, c1 = head g, tokens 2t, 2t+1) while the
// scores are written; the shared-memory pass disappears.
struct MaxFromFragment {
    static __device__ __forceinline__ float init() { return -INFINITY; }
    static __device__ __forceinline__ float score(float lane_max, float s0, float s1) {
        return fmaxf(lane_max, fmaxf(s0, s1));
    }
    static __device__ __forceinline__ void scores_done(float lane_max, Qi4Red& s_red, int warp, int g, int t, int nh) {
        lane_max = fmaxf(lane_max, __shfl_xor_sync(0xffffffffu, lane_max, 1));
        lane_max = fmaxf(lane_max, __shfl_xor_sync(0xffffffffu, lane_max, 2));
        if (t == 0 && g < nh) s_red[warp * QI4_MAXH + g] = lane_max;
    }
    struct Scratch {};
    static __device__ __forceinline__ void pass(Scratch&, const Qi4Scores&, Qi4Red&, int, int, int, int) {}
};

// ---- Sum: p = 2^(s - m) in place and the per-head sums into s_red[warp][head] ----

// Baseline: a float[8] indexed by the runtime head count.
struct SumLocalArray {
    using Scratch = float[QI4_MAXH];
    static __device__ __forceinline__ void pass(Scratch& tsum_h, Qi4Scores& s_p, const Qi4Heads& s_m, Qi4Red& s_red,
                                                int nh, int tid, int lane, int warp) {
#pragma unroll 1
        for (int h = 0; h < nh; ++h) tsum_h[h] = 0.0f;
        for (int i = tid; i < QI4_PASS; i += QI4_THREADS) {
#pragma unroll 1
            for (int h = 0; h < nh; ++h) {
                const float p = exp2f(s_p[h * QI4_PASS + i] - s_m[h]);
                s_p[h * QI4_PASS + i] = p;
                tsum_h[h] += p;
            }
        }
#pragma unroll 1
        for (int h = 0; h < nh; ++h) {
            const float s = warp_sum(tsum_h[h]);
            if (lane == 0) s_red[warp * QI4_MAXH + h] = s;
        }
    }
};

// OPT4: one float per thread, heads in turn.
struct SumRegister {
    struct Scratch {};
    static __device__ __forceinline__ void pass(Scratch&, Qi4Scores& s_p, const Qi4Heads& s_m, Qi4Red& s_red, int nh,
                                                int tid, int lane, int warp) {
#pragma unroll 1
        for (int h = 0; h < nh; ++h) {
            const float m = s_m[h];
            float sum = 0.0f;
            for (int i = tid; i < QI4_PASS; i += QI4_THREADS) {
                const float p = exp2f(s_p[h * QI4_PASS + i] - m);
                s_p[h * QI4_PASS + i] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            if (lane == 0) s_red[warp * QI4_MAXH + h] = sum;
        }
    }
};

// ---- PLayout: column i of head h's P row ----

struct PRowMajor {
    static __device__ __forceinline__ int col(int, int i) { return i; }
};

// OPT9: column i of head h lives at i ^ (8h), so the 8 heads of one fragment load/store hit different
// banks (stride PASS alone maps them all to the same 8 banks).
struct PSwizzled {
    static __device__ __forceinline__ int col(int h, int i) { return i ^ ((h & 7) << 3); }
};

// ---- PConv: P (fp32 in s_p) to bf16, and head g's A fragment of P.V: pa0 = P[g][i0, i0 + 1],
// pa2 = P[g][i1, i1 + 1] as bf16x2, f0 / f1 the same four values in fp32 ----

struct Qi4PFragment {
    unsigned pa0, pa2;
    float2 f0, f1;
};

// Baseline: a strided 16-bit copy to a separate bf16 buffer (bank conflicts, 2x the shared traffic).
struct PCopyBf16 {
    struct Scratch {};
    static __device__ __forceinline__ void convert(Scratch&, Qi4Scores& s_p, Qi4ScoresBf16& s_pb, int nh, int tid) {
        for (int i = tid; i < nh * QI4_PASS; i += QI4_THREADS) s_pb[i] = __float2bfloat16_rn(s_p[i]);
        __syncthreads();
    }
    static __device__ __forceinline__ Qi4PFragment fragment(const Qi4Scores&, const Qi4ScoresBf16& s_pb, int g,
                                                            int i0, int i1) {
        Qi4PFragment r;
        r.pa0 = *reinterpret_cast<const unsigned*>(s_pb + g * QI4_PASS + i0);
        r.pa2 = *reinterpret_cast<const unsigned*>(s_pb + g * QI4_PASS + i1);
        r.f0 = unpack_bf16x2(r.pa0);
        r.f1 = unpack_bf16x2(r.pa2);
        return r;
    }
};

// OPT2: in place by all 128 threads, 2 consecutive fp32 -> one bf162 each, all loads before one
// __syncthreads and all stores after.
struct PInPlaceBf16 {
    using Scratch = float2[QI4_MAXH];
    static __device__ __forceinline__ void convert(Scratch& v, Qi4Scores& s_p, Qi4ScoresBf16&, int nh, int tid) {
#pragma unroll
        for (int h = 0; h < QI4_MAXH; ++h)
            if (h < nh) v[h] = reinterpret_cast<const float2*>(s_p + h * QI4_PASS)[tid];
        __syncthreads();
#pragma unroll
        for (int h = 0; h < QI4_MAXH; ++h)
            if (h < nh)
                reinterpret_cast<__nv_bfloat162*>(s_p + h * QI4_PASS)[tid] = __floats2bfloat162_rn(v[h].x, v[h].y);
        __syncthreads();
    }
    static __device__ __forceinline__ Qi4PFragment fragment(const Qi4Scores& s_p, const Qi4ScoresBf16&, int g,
                                                            int i0, int i1) {
        Qi4PFragment r;
        const __nv_bfloat16* prow = reinterpret_cast<const __nv_bfloat16*>(s_p + g * QI4_PASS);
        r.pa0 = *reinterpret_cast<const unsigned*>(prow + i0);
        r.pa2 = *reinterpret_cast<const unsigned*>(prow + i1);
        r.f0 = unpack_bf16x2(r.pa0);
        r.f1 = unpack_bf16x2(r.pa2);
        return r;
    }
};

// OPT8: P read as fp32 pairs from s_p and packed straight into the A fragment registers; the
// conversion pass and its __syncthreads disappear.
struct PFromFp32 {
    struct Scratch {};
    static __device__ __forceinline__ void convert(Scratch&, Qi4Scores&, Qi4ScoresBf16&, int, int) {}
    static __device__ __forceinline__ Qi4PFragment fragment(const Qi4Scores& s_p, const Qi4ScoresBf16&, int g,
                                                            int i0, int i1) {
        Qi4PFragment r;
        r.f0 = *reinterpret_cast<const float2*>(s_p + g * QI4_PASS + i0);
        r.f1 = *reinterpret_cast<const float2*>(s_p + g * QI4_PASS + i1);
        r.pa0 = pack_bf16x2(r.f0.x, r.f0.y);
        r.pa2 = pack_bf16x2(r.f1.x, r.f1.y);
        return r;
    }
};
