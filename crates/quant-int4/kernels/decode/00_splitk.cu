// decode, stages 0-21: split-K GQA decode attention over a bf16 or INT4 KV cache, one kernel file
// whose defines are the ladder.
//   QI4_KV_BF16=1   stage 0 `bf16-splitk`: the bf16 cache (the BF16 CU baseline).
//   no define       stage 1 `int4-splitk`: row-wise INT4 dequantized in the kernel (the INT4 CU baseline).
//   OPT1..OPT10     the reference's ten optimizations, each a switch (see the list below); the
//                   row-wise ladder adds 1..5 then 7..10 (6 is the group-wise format itself), the
//                   group-wise ladder starts from 1..6 and adds 7..10.
//   OPT11..OPT13    ours, past the reference: added to each format's all-on stage (row-wise stages
//                   16-18, group-wise 19-21).
// Changed from previous: every stage adds one switch; the table is in src/decode.rs.
// Structure: the kernel is decode_splitk<R, D> below, one body for every stage; each switch picks a
// typed part for one role (qi4_decode_parts.cuh: the write-up's parts; qi4_decode_wide.cuh: ours),
// the recipe `Qi4Recipe` after the switches' defaults names them, and the kernel calls their hooks in
// order. The write-up's parts: OPT1 KUnrolled, OPT2 PInPlaceBf16, OPT3 MaxRegister, OPT4 SumRegister,
// OPT5 VPrefetch, OPT6 Int4Rows<4>, OPT7 MaxFromFragment, OPT8 PFromFp32, OPT9 PSwizzled, OPT10
// ScalarTile<2>; ours: OPT11 WideTile, OPT12 BiasedCodes.
//
// Work split (the CU design): one block of 4 warps per (sequence b, KV head, split). The split's
// tokens [t_begin, t_end) are processed in passes of PASS = 256 tokens; within a pass the 16
// tiles of 16 tokens go to the warps round-robin (tile j*4 + warp). Per pass:
//   1. S = Q.K^T: the warp dequantizes its K tile into its own shared tile [16][D + pad] (lane =
//      (token lane/2, half lane&1)), then mma.m16n8k16 with A = Q (rows = the nh query heads of
//      this KV head, rows nh..15 zero) and B = K^T; scores * log2(e)/sqrt(D) go to s_p[head][PASS]
//      (fp32), masked tokens as -inf.
//   2. per-head max over the pass -> running max m, rescale factor alpha = 2^(m_old - m_new).
//   3. p = 2^(s - m) in place, per-head sums -> running sum l = l*alpha + sum.
//   4. P fp32 -> bf16 for the second product.
//   5. O = O*alpha + P.V: the warp dequantizes its V tiles into the same shared tile and runs
//      mma with A = P (16 heads x 16 tokens) and B = V (16 tokens x 8 dims).
// At the end the 4 warps' partial O are summed in shared memory and the block writes
// (O unnormalized, m, l) for its split in attention's split layout ([B*HQ, splits] rows, m as a
// natural log: the base-2 running max times ln 2, l and O unchanged since 2^(s2 - m2) = e^(s - m));
// attention's decode_combine merges the splits and writes the lse.
//
// Optimizations (the reference's numbering):
//   OPT1  K loads unrolled: a lane's D/16 32-bit words (8 for D=128) are all in flight before the
//         first is dequantized; without it a `#pragma unroll 1` loop loads 2 words, converts, stores.
//   OPT2  P conversion in place by all 128 threads, 2 consecutive fp32 -> one bf162 each, all loads
//         before one __syncthreads and all stores after; without it a strided 16-bit copy to a
//         separate bf16 buffer (bank conflicts, 2x the shared traffic).
//   OPT3  per-head max with one float per thread (heads in turn, warp shuffle + shared memory
//         across warps); without it a float[8] indexed by the runtime head count (local memory).
//   OPT4  the same for the row sums.
//   OPT5  V prefetch: the next V tile's raw words are loaded into registers right after the
//         current tile is stored to shared memory (the first tile's before the softmax), so the
//         loads overlap the mma and the softmax.
//   OPT6  group-wise INT4 (4 groups, 80-byte rows for D=128): rows are 8-byte aligned, so scales
//         and codes come in 8-byte (uint2) vector loads instead of 32-bit ones.
//   OPT7  max of Q.K^T read from the accumulator fragment (c0, c1 = head g, tokens 2t, 2t+1) while
//         the scores are written; phase 2 disappears.
//   OPT8  P read as fp32 pairs from s_p and packed straight into the A fragment registers of P.V;
//         phase 4 and its __syncthreads disappear.
//   OPT9  swizzled P layout: column i of head h lives at i ^ (8h), so the 8 heads of one fragment
//         load/store hit different banks (stride PASS alone maps them all to the same 8 banks).
//   OPT10 shared-memory rows of the dequantized K/V tile padded by 2 bf16 (D + 2), spreading the
//         dequantize stores and the fragment loads over more banks.
//   OPT11..OPT13  ours, past the reference: OPT11 (WideTile) and OPT12 (BiasedCodes) are parts of
//         their own in qi4_decode_wide.cuh, documented and measured there; OPT13 is the launch
//         bounds below.
// Why faster: each switch removes stalls the reference profiled (global latency: 1, 5, 6; shared
//   memory conflicts/indirection: 2, 8, 9, 10; local memory: 3, 4; shared round trip: 7); none
//   changes the bytes read from HBM: K, V (+ scales) once, Q and the partials.
// Launch: qi4_decode_d{64,128}: grid (splits, HKV, B), block 128, static shared ~21-29 KiB;
//   decode_combine_bf16 (attention's): grid (HQ, B), block D.
// Constraints: D in {64, 128}; HQ/HKV <= 8; 1 <= seq_lens[b] <= Tmax; 1 <= splits <= 256; B and
//   HKV <= 65535 (grid z, y); B*Tmax*HKV < 2^31 rows. Tokens past seq_lens[b] are never read (the
//   tests fill them with NaN). QI4_WARPS = 4: the pass layout below is written for 128 threads.
// Tolerance: rel L2 <= 1e-2 against the f64 reference on the same (dequantized) cache: bf16
//   products and P, fp32 accumulation and softmax.
// Limits: D in {64, 128}; B <= 65535; HKV <= 65535; HQ / HKV <= 8; B * Tmax * HKV < 2^31; splits <= 256
#include "qi4_decode_parts.cuh"
#include "qi4_decode_wide.cuh"
#include "attention_decode.cuh"

// The stage's switches (ladder_recipe.cuh: on where the stage list defines them); OPT[i] is OPTi
// (OPT13 is the launch bounds, below).
constexpr bool KV_BF16 = LADDER_SWITCH(QI4_KV_BF16);
constexpr bool OPT[13] = {false,
                          LADDER_SWITCH(OPT1),  LADDER_SWITCH(OPT2),  LADDER_SWITCH(OPT3),  LADDER_SWITCH(OPT4),
                          LADDER_SWITCH(OPT5),  LADDER_SWITCH(OPT6),  LADDER_SWITCH(OPT7),  LADDER_SWITCH(OPT8),
                          LADDER_SWITCH(OPT9),  LADDER_SWITCH(OPT10), LADDER_SWITCH(OPT11), LADDER_SWITCH(OPT12)};
static_assert(!(KV_BF16 && OPT[12]), "OPT12 folds the INT4 affine map into the products; the bf16 cache has none");
static_assert(!(KV_BF16 && OPT[6]), "OPT6 is the group-wise INT4 format; it does not apply to the bf16 cache");

// The recipe: one part a role, picked by the stage's switches (the reference's numbering).
struct Qi4Recipe {
    using Cache = Pick<KV_BF16, Bf16Rows, Int4Rows<OPT[6] ? 4 : 1>>;                      // stage 0; OPT6
    using KLoad = Pick<OPT[1], KUnrolled, KChunked>;                                      // OPT1
    using PConv = Pick<OPT[8], PFromFp32, Pick<OPT[2], PInPlaceBf16, PCopyBf16>>;         // OPT2, OPT8
    using Max = Pick<OPT[7], MaxFromFragment, Pick<OPT[3], MaxRegister, MaxLocalArray>>;  // OPT3, OPT7
    using Sum = Pick<OPT[4], SumRegister, SumLocalArray>;                                 // OPT4
    using VLoad = Pick<OPT[5], VPrefetch, VChunked>;                                      // OPT5
    using PLayout = Pick<OPT[9], PSwizzled, PRowMajor>;                                   // OPT9
    using Tile = Pick<OPT[11], WideTile, ScalarTile<OPT[10] ? 2 : 0>>;                    // OPT10; ours: OPT11
    using Values = Pick<OPT[12], BiasedCodes<Cache::G>, Dequantized>;                     // ours: OPT12
};

// OPT13 (ours) __launch_bounds__(128, 4): at most 128 registers, 4 blocks an SM, a few spills
// (row-wise 143 -> 128 with 92 bytes, group-wise 183 -> 128 with 80). Predicted ~1.1x where the block
// count rises. Measured row-wise 1.01 / 0.84 / 1.05x stage 17; group-wise 1.11 / 1.03 / 1.21x stage 20
// (row-wise counters at B = 512: occupancy 17% -> 25%, L2 hit rate 7% -> 43%, the spills). Without it
// the bounds name no block count: a minimum of 1 is not the same request (ptxas then took up to 225
// registers where it takes 128).
#ifdef OPT13
#define QI4_BOUNDS __launch_bounds__(QI4_THREADS, 4)
#else
#define QI4_BOUNDS __launch_bounds__(QI4_THREADS)
#endif

template <class R, int D>
__device__ __forceinline__ void decode_splitk(float* __restrict__ o_part, float* __restrict__ m_part,
                                              float* __restrict__ l_part, const __nv_bfloat16* __restrict__ q,
                                              const unsigned char* __restrict__ kc,
                                              const unsigned char* __restrict__ vc,
                                              const int* __restrict__ seq_lens, int tmax, int hkv, int nh,
                                              int splits, float qk_scale) {
    using C = Qi4Cfg<R, D>;
    using Values = typename R::Values;
    using Tile = typename R::Tile;
    using Max = typename R::Max;
    using PConv = typename R::PConv;
    using PLayout = typename R::PLayout;
    __shared__ __align__(16) float s_p[QI4_MAXH * QI4_PASS];
    __shared__ __align__(16) __nv_bfloat16 s_pb[QI4_MAXH * QI4_PASS];  // PCopyBf16's only (else unused, dropped)
    __shared__ __align__(16) unsigned char s_kv[QI4_WARPS * QI4_TILE * C::KSTRIDE * 2];
    __shared__ float s_red[QI4_WARPS * QI4_MAXH];
    __shared__ float s_m[QI4_MAXH], s_l[QI4_MAXH], s_alpha[QI4_MAXH];
    // The warp tile's tokens' (scale, shift): BiasedCodes' only (else unused, dropped).
    __shared__ float2 s_par[QI4_WARPS][QI4_TILE][C::G];
    static_assert(QI4_WARPS * QI4_TILE * C::KSTRIDE * 2 >= QI4_MAXH * D * 4, "s_kv holds the O reduction");

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;   // mma fragment coordinates
    const int r = lane >> 1, hf = lane & 1;  // tile loader coordinates: token r, half hf
    const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;

    const int len = seq_lens[b];
    const Qi4Split sp = qi4_split<D, QI4_TILE>(len, splits, split, b, kvh, hkv, nh, o_part, m_part, l_part);
    const int t_begin = sp.begin, t_end = sp.end;
    float *const o_split = sp.o, *const m_split = sp.m, *const l_split = sp.l;

    if (t_begin >= t_end) {  // an empty split (uniform for the block)
        qi4_empty_split<D, QI4_THREADS>(sp, tid, nh, splits);
        return;
    }

    // Q as the A fragment: rows = heads g < nh, rows 8..15 (a1, a3) are zero.
    unsigned qa[D / 16][2];
    {
        const int hq = kvh * nh + min(g, nh - 1);
        const unsigned* qrow = reinterpret_cast<const unsigned*>(q + ((size_t)b * hkv * nh + hq) * D);
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            qa[ks][0] = (g < nh) ? qrow[ks * 8 + t] : 0u;
            qa[ks][1] = (g < nh) ? qrow[ks * 8 + 4 + t] : 0u;
        }
    }
    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    // BiasedCodes' (OPT12) sum(Q) and P.V correction a group (Dequantized: empty).
    typename Values::Groups qsum, corr;
    Values::template init<D>(qa, qsum, corr);
    float2* my_par = Values::par_slot(s_par[warp][r]);
    if (tid < QI4_MAXH) {
        s_m[tid] = -INFINITY;
        s_l[tid] = 0.0f;
    }

    const size_t tok_stride = (size_t)hkv * C::ROW_BYTES;
    const unsigned char* kbase = kc + ((size_t)b * tmax * hkv + kvh) * C::ROW_BYTES;
    const unsigned char* vbase = vc + ((size_t)b * tmax * hkv + kvh) * C::ROW_BYTES;
    __nv_bfloat16* kv_w = reinterpret_cast<__nv_bfloat16*>(s_kv) + warp * QI4_TILE * C::KSTRIDE;
    unsigned* my_dst = reinterpret_cast<unsigned*>(kv_w + r * C::KSTRIDE + hf * (D / 2));

    for (int pass0 = t_begin; pass0 < t_end; pass0 += QI4_PASS) {
        // ---- 1. S = Q.K^T for this warp's tiles
        float lane_max = Max::init();  // MaxFromFragment's running max (unused by the others)
#pragma unroll 1
        for (int j = 0; j < QI4_TPW; ++j) {
            const int li0 = (j * QI4_WARPS + warp) * QI4_TILE;
            if (pass0 + li0 >= t_end) {
                if (g < nh) {
                    const float2 ninf = make_float2(-INFINITY, -INFINITY);
                    *reinterpret_cast<float2*>(&s_p[g * QI4_PASS + PLayout::col(g, li0 + 2 * t)]) = ninf;
                    *reinterpret_cast<float2*>(&s_p[g * QI4_PASS + PLayout::col(g, li0 + 8 + 2 * t)]) = ninf;
                }
                continue;
            }
            const int tok = pass0 + li0 + r;
            if (tok < t_end) {
                typename R::Cache::template Raw<D> kraw;  // KUnrolled's registers
                R::KLoad::template tile<R, D>(kraw, kbase + (size_t)tok * tok_stride, hf, my_dst, my_par);
            } else {
                qi4_tile_zero<R, D>(my_dst, my_par, hf);
            }
            __syncwarp();
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                float acc[Values::NACC][4];
#pragma unroll
                for (int j = 0; j < Values::NACC; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
                Tile::template scores<D, C::KSTRIDE, Values, C::KS_PER_GROUP>(acc, qa, kv_w, nt, lane, g, t);
                const int li = li0 + nt * 8 + 2 * t;
                float sc0, sc1;
                Values::scores(acc, qsum, s_par, warp, nt, t, sc0, sc1);
                const float s0 = (pass0 + li < t_end) ? sc0 * qk_scale : -INFINITY;
                const float s1 = (pass0 + li + 1 < t_end) ? sc1 * qk_scale : -INFINITY;
                if (g < nh) *reinterpret_cast<float2*>(&s_p[g * QI4_PASS + PLayout::col(g, li)]) = make_float2(s0, s1);
                lane_max = Max::score(lane_max, s0, s1);
            }
            __syncwarp();
        }
        Max::scores_done(lane_max, s_red, warp, g, t, nh);
        typename R::Cache::template Raw<D> vraw;  // VPrefetch's registers: the warp's first V tile
        R::VLoad::template first<R, D>(vraw, vbase, pass0 + warp * QI4_TILE + r, t_end, tok_stride, hf);
        __syncthreads();

        // ---- 2. per-head max of the pass (MaxFromFragment has it already)
        typename Max::Scratch max_scratch;
        Max::pass(max_scratch, s_p, s_red, nh, tid, lane, warp);
        if (tid < nh) {
            float mp = s_red[tid];
#pragma unroll
            for (int w = 1; w < QI4_WARPS; ++w) mp = fmaxf(mp, s_red[w * QI4_MAXH + tid]);
            const float m_old = s_m[tid];
            const float m_new = fmaxf(m_old, mp);
            s_alpha[tid] = exp2f(m_old - m_new);  // 0 on the first pass (m_old = -inf)
            s_m[tid] = m_new;
        }
        __syncthreads();

        // ---- 3. p = 2^(s - m) in place, per-head sums
        typename R::Sum::Scratch sum_scratch;
        R::Sum::pass(sum_scratch, s_p, s_m, s_red, nh, tid, lane, warp);
        __syncthreads();
        if (tid < nh) {
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < QI4_WARPS; ++w) s += s_red[w * QI4_MAXH + tid];
            s_l[tid] = s_l[tid] * s_alpha[tid] + s;
        }

        // ---- 4. P to bf16 (PFromFp32 converts while building the fragment instead)
        {
            typename PConv::Scratch p_scratch;  // PInPlaceBf16's registers
            PConv::convert(p_scratch, s_p, s_pb, nh, tid);
        }

        // ---- 5. O = O * alpha + P.V
        {
            const float a = (g < nh) ? s_alpha[g] : 0.0f;
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                o[nt][0] *= a;
                o[nt][1] *= a;
            }
            Values::rescale(corr, a);
        }
#pragma unroll 1
        for (int j = 0; j < QI4_TPW; ++j) {
            const int li0 = (j * QI4_WARPS + warp) * QI4_TILE;
            if (pass0 + li0 >= t_end) break;
            const int tok = pass0 + li0 + r;
            if (tok < t_end) R::VLoad::template tile<R, D>(vraw, vbase + (size_t)tok * tok_stride, hf, my_dst, my_par);
            else qi4_tile_zero<R, D>(my_dst, my_par, hf);
            R::VLoad::template next<R, D>(vraw, vbase, tok + QI4_WARPS * QI4_TILE, j + 1 < QI4_TPW, t_end, tok_stride,
                                          hf);
            __syncwarp();
            unsigned pa0 = 0u, pa2 = 0u;  // A = P: a0 = P[g][2t..], a2 = P[g][2t+8..]; rows g+8 zero
            float2 f0 = make_float2(0.0f, 0.0f), f1 = f0;  // the same four P values in fp32
            if (g < nh) {
                const int i0 = PLayout::col(g, li0 + 2 * t), i1 = PLayout::col(g, li0 + 8 + 2 * t);
                const Qi4PFragment pf = PConv::fragment(s_p, s_pb, g, i0, i1);
                f0 = pf.f0;
                f1 = pf.f1;
                pa0 = pf.pa0;
                pa2 = pf.pa2;
            }
            unsigned a0[Values::NP], a2[Values::NP];  // P's A fragments (OPT12: one a group, P scale)
            Values::p_fragments(corr, s_par, warp, t, f0, f1, pa0, pa2, a0, a2);
            Tile::template pv<D, C::KSTRIDE, Values>(o, a0, a2, kv_w, lane, g, t);
            __syncwarp();
        }
        __syncthreads();  // s_p, s_red, s_alpha and the tiles are rewritten by the next pass
    }

    Values::template finish<D>(corr, o);
    // ---- the 4 warps' partial O summed in shared memory (the tile buffer is free now)
    float* s_o = reinterpret_cast<float*>(s_kv);
#pragma unroll 1
    for (int w = 0; w < QI4_WARPS; ++w) {
        if (warp == w && g < nh) {
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                float* dst = s_o + g * D + nt * 8 + 2 * t;
                if (w == 0) {
                    dst[0] = o[nt][0];
                    dst[1] = o[nt][1];
                } else {
                    dst[0] += o[nt][0];
                    dst[1] += o[nt][1];
                }
            }
        }
        __syncthreads();
    }
    for (int i = tid; i < nh * D; i += QI4_THREADS) o_split[(i / D) * splits * D + i % D] = s_o[i];
    if (tid < nh) {
        m_split[tid * splits] = s_m[tid] * 0.69314718f;  // base-2 max to natural log (ln 2)
        l_split[tid * splits] = s_l[tid];
    }
}

#define QI4_DECODE_ENTRY(NAME, DIM)                                                                             \
    extern "C" __global__ void QI4_BOUNDS                                                                    \
        NAME(float* __restrict__ o_part, float* __restrict__ m_part, float* __restrict__ l_part,             \
             const __nv_bfloat16* __restrict__ q, const unsigned char* __restrict__ kc,                      \
             const unsigned char* __restrict__ vc, const int* __restrict__ seq_lens, int tmax, int hkv, int nh, \
             int splits, float qk_scale) {                                                                  \
        decode_splitk<Qi4Recipe, DIM>(o_part, m_part, l_part, q, kc, vc, seq_lens, tmax, hkv, nh, splits,      \
                                      qk_scale);                                                             \
    }
QI4_DECODE_ENTRY(qi4_decode_d64, 64)
QI4_DECODE_ENTRY(qi4_decode_d128, 128)

// The splits are merged by attention's decode_combine (attention_decode.cuh): the partials are in
// its layout, [B*HQ, splits] rows, with natural-log maxima.
DECODE_COMBINE_ENTRIES
