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
//   Past the reference (stage 10's counters at B = 512: DRAM 25%, SM 58%, stalls on fixed-latency
//   dependencies and the shared-memory queue, i.e. the tile's instruction traffic, not HBM):
//   OPT11 the tile's traffic in 16-byte instructions: K fragments by ldmatrix.x4 (4 a tile's n-tile
//         instead of 16 32-bit loads), V fragments by ldmatrix.x4.trans (8 a tile instead of 64
//         16-bit loads and 32 shifts/ORs), the dequantized tile written in 16-byte stores; rows
//         padded by 8 bf16 so each row starts on a 16-byte boundary (OPT10's pad of 2 is replaced).
//         Predicted 1.2-1.3x (the MIO share of the stalls). Measured (H100, B = 32 / 128 / 512,
//         row-wise): 1.05 / 1.15 / 1.12x stage 10; group-wise 1.01 / 1.17 / 1.07x stage 15.
//   OPT12 the codes go into the tile as the exact bf16 values 128 + q (a shift and an AND-OR a pair,
//         no float conversion, subtract or FMA); the affine map moves to where it is cheap: a score
//         is scale (S' - 128 sum(Q)) + shift sum(Q) per group (S' = Q.(128 + q) exact in fp32), and
//         P.V is (P scale).(128 + q) + corr, corr = sum over tokens of P shift - 128 bf16(P scale)
//         (the same rounded values as the mma's, so the 128 cancels exactly), a scalar per head and
//         group rescaled with O. The cache values are no longer rounded to bf16 (error 4.6e-3 ->
//         3.7e-3). Predicted 1.1-1.2x (dequantization was ~10 instructions a pair). Measured
//         row-wise 1.12 / 1.17 / 1.17x stage 16; group-wise 0.94 / 0.83 / 0.89x stage 19 (147 ->
//         183 registers: one accumulator a group for the scores and four P fragments, 2 blocks an SM).
//   OPT13 __launch_bounds__(128, 4): at most 128 registers, 4 blocks an SM, a few spills (row-wise
//         143 -> 128 with 92 bytes, group-wise 183 -> 128 with 80). Predicted ~1.1x where the block
//         count rises. Measured row-wise 1.01 / 0.84 / 1.05x stage 17; group-wise 1.11 / 1.03 / 1.21x
//         stage 20 (row-wise counters at B = 512: occupancy 17% -> 25%, L2 hit rate 7% -> 43%, the
//         spills).
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
#include "ladder.cuh"
#include "ladder_reduce.cuh"
#include "ladder_convert.cuh"
#include "qi4_format.cuh"
#include "ladder_mma.cuh"
#include "attention_decode.cuh"

#ifndef QI4_KV_BF16
#define QI4_KV_BF16 0
#endif
#ifndef OPT1
#define OPT1 0
#endif
#ifndef OPT2
#define OPT2 0
#endif
#ifndef OPT3
#define OPT3 0
#endif
#ifndef OPT4
#define OPT4 0
#endif
#ifndef OPT5
#define OPT5 0
#endif
#ifndef OPT6
#define OPT6 0
#endif
#ifndef OPT7
#define OPT7 0
#endif
#ifndef OPT8
#define OPT8 0
#endif
#ifndef OPT9
#define OPT9 0
#endif
#ifndef OPT10
#define OPT10 0
#endif
#ifndef OPT11
#define OPT11 0
#endif
#ifndef OPT12
#define OPT12 0
#endif
#ifndef OPT13
#define OPT13 0
#endif
// OPT13 asks ptxas for 4 blocks an SM (at most 128 registers a thread at 128 threads). Without it
// the bounds name no block count: a minimum of 1 is not the same request (ptxas then took up to 225
// registers where it takes 128).
#if OPT13
#define QI4_BOUNDS __launch_bounds__(QI4_THREADS, 4)
#else
#define QI4_BOUNDS __launch_bounds__(QI4_THREADS)
#endif
#if QI4_KV_BF16 && OPT12
#error "OPT12 folds the INT4 affine map into the products; the bf16 cache has none"
#endif
#if QI4_KV_BF16 && OPT6
#error "OPT6 is the group-wise INT4 format; it does not apply to the bf16 cache"
#endif

#ifndef QI4_WARPS
#error "QI4_WARPS (warps per block) is a tunable: the stage list sets it"
#endif
constexpr int QI4_THREADS = 32 * QI4_WARPS;
constexpr int QI4_TILE = 16;                               // tokens per warp tile (one mma k-step of P.V)
constexpr int QI4_PASS = 256;                              // tokens per pass (scores kept in shared memory)
constexpr int QI4_TPW = QI4_PASS / (QI4_TILE * QI4_WARPS);  // tiles per warp per pass
constexpr int QI4_MAXH = 8;                                // query heads per KV head
// OPT11 reads the tile with ldmatrix and writes it with 16-byte stores: rows 16-byte aligned (pad 8,
// 272 bytes at D = 128: eight rows start in eight different 16-byte bank groups).
constexpr int QI4_PAD = OPT11 ? 8 : (OPT10 ? 2 : 0);
constexpr int QI4_G = OPT6 ? 4 : 1;
// k-steps (16 dims) per scale group at head size D.
#define KS_PER_GROUP_ANY(D) ((D) / 16 / QI4_G)
static_assert(QI4_PASS == 2 * QI4_THREADS, "OPT2 converts one fp32 pair per thread per head");
static_assert(QI4_PASS % 64 == 0, "the OPT9 swizzle permutes 8-column chunks within 64");

template <int D>
struct Qi4Cfg {
    static constexpr int KSTRIDE = D + QI4_PAD;  // bf16 elements per shared tile row
    static constexpr int ROW_BYTES = QI4_KV_BF16 ? 2 * D : 4 * QI4_G + D / 2;
    static constexpr int UNITS = D / 16;         // 8-value units per lane (half a row)
};

// A lane's half row, raw: 8-value units (a 32-bit word of codes, or a 16-byte bf16 vector).
template <int D>
struct KvRaw {
#if QI4_KV_BF16
    uint4 u[D / 16];
#else
    unsigned u[D / 16];
    unsigned s0, s1;  // (scale, shift) pairs of the lane's first and second half (equal row-wise)
#endif
};

__device__ __forceinline__ int qi4_swz(int h, int i) {
#if OPT9
    return i ^ ((h & 7) << 3);
#else
    return i;
#endif
}

// Loads a lane's half row (hf = 0: values 0..D/2-1, hf = 1: D/2..D-1) into registers.
template <int D>
__device__ __forceinline__ void kv_load(KvRaw<D>& r, const unsigned char* __restrict__ row, int hf) {
#if QI4_KV_BF16
    const uint4* p = reinterpret_cast<const uint4*>(row + hf * D);
#pragma unroll
    for (int i = 0; i < D / 16; ++i) r.u[i] = p[i];
#elif OPT6
    const uint2 sc = reinterpret_cast<const uint2*>(row)[hf];  // groups 2hf, 2hf+1
    r.s0 = sc.x;
    r.s1 = sc.y;
    const uint2* p = reinterpret_cast<const uint2*>(row + 4 * QI4_G + hf * (D / 4));
#pragma unroll
    for (int j = 0; j < D / 32; ++j) {
        const uint2 v = p[j];
        r.u[2 * j] = v.x;
        r.u[2 * j + 1] = v.y;
    }
#else
    r.s0 = *reinterpret_cast<const unsigned*>(row);
    r.s1 = r.s0;
    const unsigned* p = reinterpret_cast<const unsigned*>(row + 4 + hf * (D / 4));
#pragma unroll
    for (int i = 0; i < D / 16; ++i) r.u[i] = p[i];
#endif
}

// Dequantizes (or copies) a loaded half row into shared memory: D/4 32-bit stores (OPT11: D/16
// 16-byte stores). With OPT12 the tile gets the codes as the exact bf16 values 128 + q (one shift and
// one AND-OR a pair) and `par` the token's (scale, shift) for the groups of this half: the products
// take the affine map afterwards (see decode_splitk).
template <int D>
__device__ __forceinline__ void kv_store(const KvRaw<D>& r, unsigned* dst, float2* par, int hf) {
#if QI4_KV_BF16
#pragma unroll
    for (int i = 0; i < D / 16; ++i) {
        dst[4 * i + 0] = r.u[i].x;
        dst[4 * i + 1] = r.u[i].y;
        dst[4 * i + 2] = r.u[i].z;
        dst[4 * i + 3] = r.u[i].w;
    }
#else
    const float2 sz0 = unpack_half2(r.s0);
    const float2 sz1 = unpack_half2(r.s1);
#if OPT12
    if (QI4_G == 1) {
        if (hf == 0) par[0] = sz0;
    } else {
        par[2 * hf] = sz0;
        par[2 * hf + 1] = sz1;
    }
#endif
#pragma unroll
    for (int i = 0; i < D / 16; ++i) {
        unsigned w[4];
#if OPT12
#pragma unroll
        for (int k = 0; k < 4; ++k) w[k] = qi4_code_pair(r.u[i], k);
#else
        const float2 sz = (i < D / 32) ? sz0 : sz1;  // a group is D/32 words
        qi4_dequant_word(r.u[i], sz.x, sz.y, w);
#endif
#if OPT11
        *reinterpret_cast<uint4*>(dst + 4 * i) = make_uint4(w[0], w[1], w[2], w[3]);
#else
#pragma unroll
        for (int k = 0; k < 4; ++k) dst[4 * i + k] = w[k];
#endif
    }
#endif
}

// The baseline path: 16 values (2 units) loaded, converted and stored per iteration, not unrolled.
template <int D>
__device__ __forceinline__ void kv_load_store_chunked(const unsigned char* __restrict__ row, int hf, unsigned* dst,
                                                      float2* par) {
#if QI4_KV_BF16
    const uint4* p = reinterpret_cast<const uint4*>(row + hf * D);
#pragma unroll 1
    for (int c = 0; c < D / 32; ++c) {
        const uint4 a = p[2 * c];
        const uint4 b = p[2 * c + 1];
        unsigned* o = dst + 8 * c;
        o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
        o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
    }
#else
#if OPT6
    const uint2 sc = reinterpret_cast<const uint2*>(row)[hf];
    const unsigned s0 = sc.x, s1 = sc.y;
    const uint2* p2 = reinterpret_cast<const uint2*>(row + 4 * QI4_G + hf * (D / 4));
#else
    const unsigned s0 = *reinterpret_cast<const unsigned*>(row), s1 = s0;
    const unsigned* p = reinterpret_cast<const unsigned*>(row + 4 + hf * (D / 4));
#endif
#pragma unroll 1
    for (int c = 0; c < D / 32; ++c) {
#if OPT6
        const uint2 v = p2[c];
        const unsigned w0 = v.x, w1 = v.y;
#else
        const unsigned w0 = p[2 * c], w1 = p[2 * c + 1];
#endif
        const float2 sz = unpack_half2((2 * c < D / 32) ? s0 : s1);
#if OPT12
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            dst[8 * c + k] = qi4_code_pair(w0, k);
            dst[8 * c + 4 + k] = qi4_code_pair(w1, k);
        }
        (void)sz;
#else
        qi4_dequant_word(w0, sz.x, sz.y, dst + 8 * c);
        qi4_dequant_word(w1, sz.x, sz.y, dst + 8 * c + 4);
#endif
    }
#if OPT12
    if (QI4_G == 1) {
        if (hf == 0) par[0] = unpack_half2(s0);
    } else {
        par[2 * hf] = unpack_half2(s0);
        par[2 * hf + 1] = unpack_half2(s1);
    }
#else
    (void)par;
#endif
#endif
}

// A token past the split's end: zeros (OPT12: and zero (scale, shift), so that P = 0 times its
// stale parameters cannot make a NaN).
template <int D>
__device__ __forceinline__ void kv_zero(unsigned* dst, float2* par, int hf) {
#pragma unroll
    for (int i = 0; i < D / 4; ++i) dst[i] = 0u;
#if OPT12
    if (hf == 0)
#pragma unroll
        for (int j = 0; j < QI4_G; ++j) par[j] = make_float2(0.0f, 0.0f);
#endif
}

template <int D>
__device__ __forceinline__ void decode_splitk(float* __restrict__ o_part, float* __restrict__ m_part,
                                              float* __restrict__ l_part, const __nv_bfloat16* __restrict__ q,
                                              const unsigned char* __restrict__ kc,
                                              const unsigned char* __restrict__ vc,
                                              const int* __restrict__ seq_lens, int tmax, int hkv, int nh,
                                              int splits, float qk_scale) {
    using C = Qi4Cfg<D>;
    __shared__ __align__(16) float s_p[QI4_MAXH * QI4_PASS];
#if !OPT2 && !OPT8
    __shared__ __align__(16) __nv_bfloat16 s_pb[QI4_MAXH * QI4_PASS];
#endif
    __shared__ __align__(16) unsigned char s_kv[QI4_WARPS * QI4_TILE * C::KSTRIDE * 2];
    __shared__ float s_red[QI4_WARPS * QI4_MAXH];
    __shared__ float s_m[QI4_MAXH], s_l[QI4_MAXH], s_alpha[QI4_MAXH];
#if OPT12
    __shared__ float2 s_par[QI4_WARPS][QI4_TILE][QI4_G];  // the warp tile's tokens' (scale, shift)
#endif
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
#if OPT12
    // With the tile holding 128 + q, a group's slice of Q.K^T is scale (S' - 128 sum(Q)) + shift
    // sum(Q) (S' = Q.(128 + q), exact products in fp32): sum(Q) of head g over each group's dims,
    // from the bf16 values the mma multiplies. P.V becomes (P scale).(128 + q) + corr with corr =
    // sum over tokens of P shift - 128 bf16(P scale), one per group and head, rescaled with O.
    constexpr int KS_PER_GROUP = D / 16 / QI4_G;
    float qsum[QI4_G], corr[QI4_G];
#pragma unroll
    for (int j = 0; j < QI4_G; ++j) {
        float sum = 0.0f;
#pragma unroll
        for (int ks = j * KS_PER_GROUP; ks < (j + 1) * KS_PER_GROUP; ++ks) {
            const float2 a = unpack_bf16x2(qa[ks][0]), c = unpack_bf16x2(qa[ks][1]);
            sum += (a.x + a.y) + (c.x + c.y);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        qsum[j] = sum + __shfl_xor_sync(0xffffffffu, sum, 2);
        corr[j] = 0.0f;
    }
    float2* my_par = s_par[warp][r];
#else
    float2* my_par = nullptr;
#endif
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
#if OPT7
        float lane_max = -INFINITY;
#endif
#pragma unroll 1
        for (int j = 0; j < QI4_TPW; ++j) {
            const int li0 = (j * QI4_WARPS + warp) * QI4_TILE;
            if (pass0 + li0 >= t_end) {
                if (g < nh) {
                    const float2 ninf = make_float2(-INFINITY, -INFINITY);
                    *reinterpret_cast<float2*>(&s_p[g * QI4_PASS + qi4_swz(g, li0 + 2 * t)]) = ninf;
                    *reinterpret_cast<float2*>(&s_p[g * QI4_PASS + qi4_swz(g, li0 + 8 + 2 * t)]) = ninf;
                }
                continue;
            }
            const int tok = pass0 + li0 + r;
            if (tok < t_end) {
                const unsigned char* row = kbase + (size_t)tok * tok_stride;
#if OPT1
                KvRaw<D> raw;
                kv_load<D>(raw, row, hf);
                kv_store<D>(raw, my_dst, my_par, hf);
#else
                kv_load_store_chunked<D>(row, hf, my_dst, my_par);
#endif
            } else {
                kv_zero<D>(my_dst, my_par, hf);
            }
            __syncwarp();
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                // One accumulator per group under OPT12 (each takes its own scale), else one.
                constexpr int NACC = OPT12 ? QI4_G : 1;
                float acc[NACC][4];
#pragma unroll
                for (int j = 0; j < NACC; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#if OPT11
                // B = K^T straight from the token-major tile: ldmatrix's matrix j is dims 32p + 8j of
                // the n-tile's 8 tokens, i.e. (b0b1, b2b3) of k-steps 2p and 2p + 1.
#pragma unroll
                for (int p = 0; p < D / 32; ++p) {
                    unsigned kb[4];
                    ldmatrix_x4(kb, smem_u32(kv_w + (nt * 8 + (lane & 7)) * C::KSTRIDE + 32 * p + 8 * (lane >> 3)));
                    float (&a0)[4] = acc[OPT12 ? (2 * p) / KS_PER_GROUP_ANY(D) : 0];
                    float (&a1)[4] = acc[OPT12 ? (2 * p + 1) / KS_PER_GROUP_ANY(D) : 0];
                    mma_16816<__nv_bfloat16>(a0, qa[2 * p][0], 0u, qa[2 * p][1], 0u, kb[0], kb[1]);
                    mma_16816<__nv_bfloat16>(a1, qa[2 * p + 1][0], 0u, qa[2 * p + 1][1], 0u, kb[2], kb[3]);
                }
#else
                const unsigned* krow = reinterpret_cast<const unsigned*>(kv_w + (nt * 8 + g) * C::KSTRIDE);
#pragma unroll
                for (int ks = 0; ks < D / 16; ++ks) {
                    mma_16816<__nv_bfloat16>(acc[OPT12 ? ks / KS_PER_GROUP_ANY(D) : 0], qa[ks][0], 0u, qa[ks][1], 0u,
                                             krow[ks * 8 + t], krow[ks * 8 + 4 + t]);
                }
#endif
                const int li = li0 + nt * 8 + 2 * t;
#if OPT12
                float sc0 = 0.0f, sc1 = 0.0f;
#pragma unroll
                for (int j = 0; j < QI4_G; ++j) {
                    const float2 p0 = s_par[warp][nt * 8 + 2 * t][j], p1 = s_par[warp][nt * 8 + 2 * t + 1][j];
                    sc0 += p0.x * (acc[j][0] - 128.0f * qsum[j]) + p0.y * qsum[j];
                    sc1 += p1.x * (acc[j][1] - 128.0f * qsum[j]) + p1.y * qsum[j];
                }
#else
                const float sc0 = acc[0][0], sc1 = acc[0][1];
#endif
                const float s0 = (pass0 + li < t_end) ? sc0 * qk_scale : -INFINITY;
                const float s1 = (pass0 + li + 1 < t_end) ? sc1 * qk_scale : -INFINITY;
                if (g < nh) *reinterpret_cast<float2*>(&s_p[g * QI4_PASS + qi4_swz(g, li)]) = make_float2(s0, s1);
#if OPT7
                lane_max = fmaxf(lane_max, fmaxf(s0, s1));
#endif
            }
            __syncwarp();
        }
#if OPT7
        lane_max = fmaxf(lane_max, __shfl_xor_sync(0xffffffffu, lane_max, 1));
        lane_max = fmaxf(lane_max, __shfl_xor_sync(0xffffffffu, lane_max, 2));
        if (t == 0 && g < nh) s_red[warp * QI4_MAXH + g] = lane_max;
#endif
#if OPT5
        KvRaw<D> vraw;  // the first V tile of this warp, in flight during the softmax
        {
            const int tok = pass0 + warp * QI4_TILE + r;
            if (tok < t_end) kv_load<D>(vraw, vbase + (size_t)tok * tok_stride, hf);
        }
#endif
        __syncthreads();

        // ---- 2. per-head max of the pass
#if !OPT7
#if OPT3
#pragma unroll 1
        for (int h = 0; h < nh; ++h) {
            float m = -INFINITY;
            for (int i = tid; i < QI4_PASS; i += QI4_THREADS) m = fmaxf(m, s_p[h * QI4_PASS + i]);
            m = warp_max(m);
            if (lane == 0) s_red[warp * QI4_MAXH + h] = m;
        }
#else
        float tmax_h[QI4_MAXH];
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
#endif
        __syncthreads();
#endif
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
#if OPT4
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
#else
        float tsum_h[QI4_MAXH];
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
#endif
        __syncthreads();
        if (tid < nh) {
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < QI4_WARPS; ++w) s += s_red[w * QI4_MAXH + tid];
            s_l[tid] = s_l[tid] * s_alpha[tid] + s;
        }

        // ---- 4. P to bf16 (OPT8 converts while building the fragment instead)
#if !OPT8
#if OPT2
        {
            float2 v[QI4_MAXH];
#pragma unroll
            for (int h = 0; h < QI4_MAXH; ++h)
                if (h < nh) v[h] = reinterpret_cast<const float2*>(s_p + h * QI4_PASS)[tid];
            __syncthreads();
#pragma unroll
            for (int h = 0; h < QI4_MAXH; ++h)
                if (h < nh)
                    reinterpret_cast<__nv_bfloat162*>(s_p + h * QI4_PASS)[tid] = __floats2bfloat162_rn(v[h].x, v[h].y);
        }
#else
        for (int i = tid; i < nh * QI4_PASS; i += QI4_THREADS) s_pb[i] = __float2bfloat16_rn(s_p[i]);
#endif
        __syncthreads();
#endif

        // ---- 5. O = O * alpha + P.V
        {
            const float a = (g < nh) ? s_alpha[g] : 0.0f;
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                o[nt][0] *= a;
                o[nt][1] *= a;
            }
#if OPT12
#pragma unroll
            for (int j = 0; j < QI4_G; ++j) corr[j] *= a;
#endif
        }
#pragma unroll 1
        for (int j = 0; j < QI4_TPW; ++j) {
            const int li0 = (j * QI4_WARPS + warp) * QI4_TILE;
            if (pass0 + li0 >= t_end) break;
            const int tok = pass0 + li0 + r;
#if OPT5
            if (tok < t_end) kv_store<D>(vraw, my_dst, my_par, hf); else kv_zero<D>(my_dst, my_par, hf);
            {
                const int ntok = tok + QI4_WARPS * QI4_TILE;
                if (j + 1 < QI4_TPW && ntok < t_end) kv_load<D>(vraw, vbase + (size_t)ntok * tok_stride, hf);
            }
#else
            if (tok < t_end) kv_load_store_chunked<D>(vbase + (size_t)tok * tok_stride, hf, my_dst, my_par);
            else kv_zero<D>(my_dst, my_par, hf);
#endif
            __syncwarp();
            unsigned pa0 = 0u, pa2 = 0u;  // A = P: a0 = P[g][2t..], a2 = P[g][2t+8..]; rows g+8 zero
            float2 f0 = make_float2(0.0f, 0.0f), f1 = f0;  // the same four P values in fp32
            if (g < nh) {
                const int i0 = qi4_swz(g, li0 + 2 * t), i1 = qi4_swz(g, li0 + 8 + 2 * t);
#if OPT8
                f0 = *reinterpret_cast<const float2*>(s_p + g * QI4_PASS + i0);
                f1 = *reinterpret_cast<const float2*>(s_p + g * QI4_PASS + i1);
                pa0 = pack_bf16x2(f0.x, f0.y);
                pa2 = pack_bf16x2(f1.x, f1.y);
#elif OPT2
                const __nv_bfloat16* prow = reinterpret_cast<const __nv_bfloat16*>(s_p + g * QI4_PASS);
                pa0 = *reinterpret_cast<const unsigned*>(prow + i0);
                pa2 = *reinterpret_cast<const unsigned*>(prow + i1);
                f0 = unpack_bf16x2(pa0);
                f1 = unpack_bf16x2(pa2);
#else
                pa0 = *reinterpret_cast<const unsigned*>(s_pb + g * QI4_PASS + i0);
                pa2 = *reinterpret_cast<const unsigned*>(s_pb + g * QI4_PASS + i1);
                f0 = unpack_bf16x2(pa0);
                f1 = unpack_bf16x2(pa2);
#endif
            }
#if OPT12
            // A = P scale per group (scale is per token: the A operand's k), and the group's
            // correction from the same rounded values.
            unsigned pg0[QI4_G], pg2[QI4_G];
#pragma unroll
            for (int j = 0; j < QI4_G; ++j) {
                const float2 v0 = s_par[warp][2 * t][j], v1 = s_par[warp][2 * t + 1][j];
                const float2 v8 = s_par[warp][2 * t + 8][j], v9 = s_par[warp][2 * t + 9][j];
                pg0[j] = pack_bf16x2(f0.x * v0.x, f0.y * v1.x);
                pg2[j] = pack_bf16x2(f1.x * v8.x, f1.y * v9.x);
                const float2 r0 = unpack_bf16x2(pg0[j]), r2 = unpack_bf16x2(pg2[j]);
                corr[j] += (f0.x * v0.y + f0.y * v1.y + f1.x * v8.y + f1.y * v9.y) -
                           128.0f * ((r0.x + r0.y) + (r2.x + r2.y));
            }
#define QI4_PA0(nt) pg0[(nt) * 8 * QI4_G / D]
#define QI4_PA2(nt) pg2[(nt) * 8 * QI4_G / D]
#else
#define QI4_PA0(nt) pa0
#define QI4_PA2(nt) pa2
#endif
#if OPT11
            // B = V from the token-major tile, transposed by ldmatrix: matrix j is tokens 8 (j & 1)..
            // and dims 8 (nt + j / 2)..: (b0b1, b2b3) of n-tiles nt and nt + 1.
#pragma unroll
            for (int nt = 0; nt < D / 8; nt += 2) {
                unsigned vb[4];
                const int j = lane >> 3;
                ldmatrix_x4_trans(vb, smem_u32(kv_w + ((j & 1) * 8 + (lane & 7)) * C::KSTRIDE + (nt + (j >> 1)) * 8));
                mma_16816<__nv_bfloat16>(o[nt], QI4_PA0(nt), 0u, QI4_PA2(nt), 0u, vb[0], vb[1]);
                mma_16816<__nv_bfloat16>(o[nt + 1], QI4_PA0(nt + 1), 0u, QI4_PA2(nt + 1), 0u, vb[2], vb[3]);
            }
#else
            const unsigned short* vs = reinterpret_cast<const unsigned short*>(kv_w);
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                const int d = nt * 8 + g;
                const unsigned b0 = (unsigned)vs[(2 * t) * C::KSTRIDE + d] |
                                    ((unsigned)vs[(2 * t + 1) * C::KSTRIDE + d] << 16);
                const unsigned b1 = (unsigned)vs[(2 * t + 8) * C::KSTRIDE + d] |
                                    ((unsigned)vs[(2 * t + 9) * C::KSTRIDE + d] << 16);
                mma_16816<__nv_bfloat16>(o[nt], QI4_PA0(nt), 0u, QI4_PA2(nt), 0u, b0, b1);
            }
#endif
#undef QI4_PA0
#undef QI4_PA2
            __syncwarp();
        }
        __syncthreads();  // s_p, s_red, s_alpha and the tiles are rewritten by the next pass
    }

#if OPT12
    // The correction of head g's group: the sum over the lane's tokens, then over the 4 lanes t.
#pragma unroll
    for (int j = 0; j < QI4_G; ++j) {
        corr[j] += __shfl_xor_sync(0xffffffffu, corr[j], 1);
        corr[j] += __shfl_xor_sync(0xffffffffu, corr[j], 2);
    }
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
        o[nt][0] += corr[nt * 8 * QI4_G / D];
        o[nt][1] += corr[nt * 8 * QI4_G / D];
    }
#endif
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
        decode_splitk<DIM>(o_part, m_part, l_part, q, kc, vc, seq_lens, tmax, hkv, nh, splits, qk_scale);    \
    }
QI4_DECODE_ENTRY(qi4_decode_d64, 64)
QI4_DECODE_ENTRY(qi4_decode_d128, 128)

// The splits are merged by attention's decode_combine (attention_decode.cuh): the partials are in
// its layout, [B*HQ, splits] rows, with natural-log maxima.
DECODE_COMBINE_ENTRIES
