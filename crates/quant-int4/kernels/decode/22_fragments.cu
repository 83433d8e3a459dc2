// decode, stages 22-25: fragment-direct INT4 decode. The codes go from global memory straight into
// the mma fragments (no dequantized tile in shared memory), each warp runs its own online softmax
// over its own chunks (no block barrier in the token loop), and a warp has its next chunks' loads in
// flight while it computes the current ones.
//   QI4F_GROUPS=1  stage 22 `int4-row-fragments`: the row-wise cache in the fragment layout.
//   QI4F_GROUPS=4  stage 23 `int4-group-fragments`: the group-wise cache in the fragment layout.
//   +QI4F_WARP_MERGE  stages 24 / 25 `+warp-merge`: the splits merged by qi4_frag_merge (below), a
//                  warp a row, instead of attention's combine.
// Changed from stages 18 / 21 (the split kernel's best): the cache layout and the kernel, not a switch.
// Stage 18's counters at B = 512 (DRAM 34%, SM 41%, long-scoreboard stalls first) show warps waiting
// on their own chains - load a tile, dequantize it into shared memory, barrier, mma, block softmax -
// with about 1 KB a warp in flight. Here a warp's chain per chunk of 16 tokens is: 16-byte loads
// (issued one step ahead) -> shift + AND-OR a pair -> 8 mma for the scores -> softmax in registers
// -> 2 movmatrix -> 8 mma for P.V; nothing else waits on another warp until the block's end.
//
// The fragment layout (src/format.rs, `Layout::Fragments`): per (sequence, KV head) the tokens in
// chunks of 16; a chunk is 16 * 4G bytes of fp16 (scale, shift) pairs, token t's G pairs in slot
// 2 (t % 8) + t / 8 (a lane's tokens g and g + 8 side by side), then 16 * D/2 bytes of codes placed
// so that lane L = 4g + c's loads are exactly its fragments (g = L / 4, c = L % 4, nibble pairs as
// in qi4_format.cuh: a word's pair p at bits 4p and 16 + 4p):
//   K, the A operand of S^T = K.Q^T (rows = tokens, k = dims): lane L reads D/8 bytes of token g and
//     D/8 bytes of token g + 8 (at 4D bytes further); its word j holds k-steps s = 2j, 2j + 1, pairs
//     (s, dims 16s + 2c, +1), (s, 16s + 2c + 8, +9), (s + 1, ...), (s + 1, ...) = a0|a1, a2|a3.
//   V, the A operand of O^T = V^T.P^T (rows = dims, k = tokens): lane L's word i (m-tile i, 16 bytes
//     a lane per 4 m-tiles, 512 bytes a warp) holds dims 16i + g (+8) x tokens 2c, 2c + 1 (+8): the
//     pairs are a0..a3 directly, two consecutive tokens in one word.
// The codes become the exact bf16 128 + q with a shift and an AND-OR (OPT12's trick). For K the
// affine map is folded into the score: scale (S' - 128 sum(Q)) + shift sum(Q) per group (a sum over
// D products only). For V one bf16x2 subtract more gives q itself, and P.V is (P scale).q + corr with
// corr = sum of P shift: OPT12's fold here would make the accumulator ~136x the result over a whole
// split, and the tensor cores' fp32 accumulation error with it (8e-3 against 4e-3 at 8,192 tokens).
// S^T comes out of the mma with rows = tokens: its C fragment, packed to bf16, is transposed by
// movmatrix into the B fragment of P^T, so no head row of either mma is padding.
//
// Why faster (bytes): the HBM bytes are those of stage 18 (the cache once, Q, the partials); what
// changes is how many are in flight: a warp has QI4F_CHUNKS chunks (1.1-1.3 KB each of K and of V)
// loading while it computes the previous ones, about 12 warps an SM -> 50-60 KB an SM in flight
// (Little: 3 TB/s x ~1.5 us / 132 SMs = 34 KB), against ~1 KB a warp for stage 18. The first step's
// loads are issued before Q is read. Predicted: 1.5x stage 18 at B = 512 (~340 us, 60% of the read
// floor), less at B = 32 (one wave of short splits).
// Measured (H100, B = 32 / 128 / 512, docs/notes/quant-int4.md): row-wise 29.7 / 64.9 / 219.3 us,
// 1.62 / 2.09 / 2.28x stage 18, 87% of the copy rate at B = 512; group-wise 31.4 / 75.5 / 272.3 us,
// 1.74 / 2.11 / 2.17x stage 21. QI4F_CHUNKS = 2 is best row-wise (1 chunk: 0.95x at B = 512; 3
// chunks spill under 3 blocks an SM), 1 group-wise (its parameters are 4x the registers).
// Stages 24 / 25 (QI4F_WARP_MERGE) predicted: attention's combine takes 10.3 us of Nsight Compute
// time at B = 32 (12 splits, a thread walking them a load at a time), so a few us there, nothing at
// 3 splits. Measured 1.06 / 1.01 / 1.02x row-wise, 1.06 / 1.00 / 1.01x group-wise.
// Measured and not kept (docs/notes/quant-int4.md): merging the splits in this launch (the last
// block of a sequence, a ticket; 0.91-0.97x), a cp.async ring of 4 chunks a warp in shared memory
// (0.90-1.02x), one chunk a step at 4 blocks an SM (1.00-1.01x row-wise, 0.68-0.81x group-wise).
// Launch: qi4_frag_decode_d{64,128}: grid (splits, HKV, B), block 32 * QI4F_WARPS, static shared
//   W * 8 * D * 4 bytes (16 KiB at D = 128) for the block's merge; then decode_combine_bf16
//   (attention's: grid (HQ, B), block D) or qi4_frag_merge_d{64,128} (grid ceil(B * HQ /
//   QI4F_MERGE_WARPS), block 32 * QI4F_MERGE_WARPS) merges the splits.
// Constraints: D in {64, 128}; HQ/HKV <= 8; 1 <= seq_lens[b] <= Tmax; 1 <= splits <= 256; B and HKV
//   <= 65535 (grid z, y); B * HKV * ceil(Tmax / 16) * 16 < 2^31 rows. Tokens past seq_lens[b] are
//   loaded with their chunk but masked by select (scores -inf, P and the affine map 0), so NaN there
//   never reaches the output (the tests fill them with NaN).
// Tolerance: rel L2 <= 1e-2 against the f64 reference on the dequantized cache.
// Limits: D in {64, 128}; B <= 65535; HKV <= 65535; HQ / HKV <= 8; B * Tmax * HKV < 2^31; splits <= 256
#include "ladder.cuh"
#include "ladder_convert.cuh"
#include "ladder_mma.cuh"
#include "ladder_reduce.cuh"
#include "qi4_format.cuh"
#include "attention_decode.cuh"

#ifndef QI4F_GROUPS
#error "QI4F_GROUPS (scale groups a row: 1 or 4) is set by the stage"
#endif
#ifndef QI4F_WARPS
#error "QI4F_WARPS (warps per block) is a tunable: the stage list sets it"
#endif
#ifndef QI4F_CHUNKS
#error "QI4F_CHUNKS (chunks of 16 tokens a warp computes per step) is a tunable: the stage list sets it"
#endif
#ifndef QI4F_WARP_MERGE
#define QI4F_WARP_MERGE 0
#endif
#ifndef QI4F_MIN_BLOCKS
#error "QI4F_MIN_BLOCKS (blocks an SM asked of ptxas) is a tunable: the stage list sets it"
#endif

constexpr int QG = QI4F_GROUPS;
constexpr int QW = QI4F_WARPS;
constexpr int QN = QI4F_CHUNKS;
constexpr int QF_THREADS = 32 * QW;
constexpr int QF_CHUNK = 16;  // tokens a chunk: one m-tile of the scores, one k-step of P.V
constexpr int QF_MAXH = 8;    // query heads per KV head: the n of both mma
static_assert(QG == 1 || QG == 4, "row-wise or 4 groups");

template <int D>
struct Frag {
    static constexpr int ROW_BYTES = 4 * QG + D / 2;
    static constexpr int CHUNK_BYTES = QF_CHUNK * ROW_BYTES;
    static constexpr int CODES = QF_CHUNK * 4 * QG;  // the codes' offset in a chunk
    static constexpr int KSTEPS = D / 16;             // k-steps of K.Q^T = m-tiles of V^T.P^T
    static constexpr int KWORDS = D / 32;             // K words a lane holds of each of its 2 tokens
    static constexpr int VWORDS = D / 16;             // V words a lane holds (one an m-tile)
    static constexpr int KS_PER_GROUP = KSTEPS / QG;
    static_assert(CHUNK_BYTES % 16 == 0 && CODES % 16 == 0, "16-byte loads");
};

// A lane's share of one chunk, raw.
template <int D>
struct Chunk {
    unsigned kp[2 * QG], vp[2 * QG];  // fp16 (scale, shift): token g's G groups, then token g + 8's
    unsigned kw[2][Frag<D>::KWORDS];  // K codes of tokens g and g + 8
    unsigned vw[Frag<D>::VWORDS];     // V codes, word i = m-tile i
};

// Read-once streaming loads (no L1 allocation, 256-byte L2 prefetch: a warp's requests cover whole
// 512-byte runs).
__device__ __forceinline__ void ld_stream4(unsigned* d, const unsigned char* p) {
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "l"(p));
}
__device__ __forceinline__ void ld_stream2(unsigned* d, const unsigned char* p) {
    asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];" : "=r"(d[0]), "=r"(d[1]) : "l"(p));
}
template <int NW>
__device__ __forceinline__ void ld_words(unsigned* d, const unsigned char* p) {
    static_assert(NW == 2 || NW % 4 == 0, "8-byte or 16-byte vectors");
    if constexpr (NW == 2) {
        ld_stream2(d, p);
    } else {
#pragma unroll
        for (int i = 0; i < NW / 4; ++i) ld_stream4(d + 4 * i, p + 16 * i);
    }
}

template <int D>
__device__ __forceinline__ void load_chunk(Chunk<D>& c, const unsigned char* kch, const unsigned char* vch, int lane) {
    using F = Frag<D>;
    const int g = lane >> 2;
    ld_words<2 * QG>(c.kp, kch + 8 * QG * g);
    ld_words<2 * QG>(c.vp, vch + 8 * QG * g);
    ld_words<F::KWORDS>(c.kw[0], kch + F::CODES + lane * (D / 8));
    ld_words<F::KWORDS>(c.kw[1], kch + F::CODES + 4 * D + lane * (D / 8));  // tokens 8..15
#pragma unroll
    for (int h = 0; h < F::VWORDS / 4; ++h) ld_words<4>(c.vw + 4 * h, vch + F::CODES + 512 * h + 16 * lane);
}


// The same pair as (q0, q1): one bf16x2 subtract of 128, exact. V's codes take it so that P.V
// accumulates values of the size of the result: with 128 + q the accumulator holds ~136x the
// result until the correction cancels the 128, and the tensor cores' fp32 accumulation error,
// which grows with the tokens a warp sums, grows with it (measured: 4e-3 at 2,700 tokens a split,
// 8e-3 at 8,192).
__device__ __forceinline__ unsigned code_pair_q(unsigned w, int p) {
    unsigned c = qi4_code_pair(w, p);
    const __nv_bfloat162 q = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&c), __float2bfloat162_rn(128.0f));
    return *reinterpret_cast<const unsigned*>(&q);
}

// The transpose of an 8x8 bf16 matrix held as a fragment (lane l: row l/4, columns 2(l%4), +1).
__device__ __forceinline__ unsigned movmatrix_trans(unsigned x) {
    unsigned y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

// A warp's running state: O^T (rows = dims, columns = its heads 2c, 2c + 1), the running max, the
// lane's partial row sums and the affine corrections, all in base 2.
template <int D>
struct WarpState {
    float o[Frag<D>::KSTEPS][4];  // m-tile i: (16i + g, 2c), (16i + g, 2c + 1), (16i + g + 8, 2c), (.., 2c + 1)
    float m[2], l[2], corr[QG][2];
};

// One step: QN chunks starting at chunk `ch0` (token 16 ch0), tokens at or past t_end masked.
template <int D>
__device__ __forceinline__ void decode_step(WarpState<D>& st, const Chunk<D> (&cur)[QN], int ch0, int t_end,
                                            const unsigned (&qb)[Frag<D>::KSTEPS][2], const float (&qsum)[QG][2],
                                            float qk_scale, int lane) {
    using F = Frag<D>;
    const int g = lane >> 2;
    float s[QN][4];  // S^T: (token g, head 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1)
    bool valid[QN][2];
#pragma unroll
    for (int n = 0; n < QN; ++n) {
        float r[QG][4];
#pragma unroll
        for (int j = 0; j < QG; ++j) r[j][0] = r[j][1] = r[j][2] = r[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < F::KSTEPS; ++ks) {
            const int w = ks >> 1, p = 2 * (ks & 1);
            mma_16816<__nv_bfloat16>(r[ks / F::KS_PER_GROUP], qi4_code_pair(cur[n].kw[0][w], p),
                                     qi4_code_pair(cur[n].kw[1][w], p), qi4_code_pair(cur[n].kw[0][w], p + 1),
                                     qi4_code_pair(cur[n].kw[1][w], p + 1), qb[ks][0], qb[ks][1]);
        }
        const int tok0 = (ch0 + n) * QF_CHUNK + g;
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // token g + 8h
            valid[n][h] = tok0 + 8 * h < t_end;
#pragma unroll
            for (int e = 0; e < 2; ++e) {  // head 2c + e
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < QG; ++j) {
                    const float2 sz = unpack_half2(cur[n].kp[h * QG + j]);  // (scale, shift)
                    acc = fmaf(sz.x, r[j][2 * h + e] - 128.0f * qsum[j][e], acc);
                    acc = fmaf(sz.y, qsum[j][e], acc);
                }
                s[n][2 * h + e] = valid[n][h] ? acc * qk_scale : -INFINITY;
            }
        }
    }
    // Online softmax per head over the step's tokens: the 8 lanes of a column hold its 16 QN tokens.
    float alpha[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        float mx = st.m[e];
#pragma unroll
        for (int n = 0; n < QN; ++n) mx = fmaxf(mx, fmaxf(s[n][e], s[n][2 + e]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        alpha[e] = exp2f(st.m[e] - mx);  // the first step: exp2(-inf) = 0; mx is finite (token t_begin)
        st.m[e] = mx;
        st.l[e] *= alpha[e];
#pragma unroll
        for (int j = 0; j < QG; ++j) st.corr[j][e] *= alpha[e];
    }
#pragma unroll
    for (int i = 0; i < F::KSTEPS; ++i) {
        st.o[i][0] *= alpha[0];
        st.o[i][1] *= alpha[1];
        st.o[i][2] *= alpha[0];
        st.o[i][3] *= alpha[1];
    }
#pragma unroll
    for (int n = 0; n < QN; ++n) {
        float p[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            p[k] = exp2f(s[n][k] - st.m[k & 1]);
            st.l[k & 1] += p[k];
        }
#pragma unroll
        for (int j = 0; j < QG; ++j) {
            // B = (P scale)^T for this group: the C layout (rows = tokens) packed, then transposed.
            unsigned x[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float2 sz = unpack_half2(cur[n].vp[h * QG + j]);
                if (!valid[n][h]) sz = make_float2(0.0f, 0.0f);  // NaN past the length never multiplies
                x[h] = pack_bf16x2(p[2 * h] * sz.x, p[2 * h + 1] * sz.x);
                st.corr[j][0] += p[2 * h] * sz.y;
                st.corr[j][1] += p[2 * h + 1] * sz.y;
            }
            const unsigned b0 = movmatrix_trans(x[0]), b1 = movmatrix_trans(x[1]);
#pragma unroll
            for (int i = j * F::KS_PER_GROUP; i < (j + 1) * F::KS_PER_GROUP; ++i) {
                const unsigned w = cur[n].vw[i];
                mma_16816<__nv_bfloat16>(st.o[i], code_pair_q(w, 0), code_pair_q(w, 1), code_pair_q(w, 2),
                                         code_pair_q(w, 3), b0, b1);
            }
        }
    }
}

template <int D>
__device__ __forceinline__ void load_step(Chunk<D> (&dst)[QN], int ch0, int ch_end, const unsigned char* kbase,
                                          const unsigned char* vbase, int lane) {
#pragma unroll
    for (int n = 0; n < QN; ++n) {
        const size_t off = (size_t)(ch0 + n) * Frag<D>::CHUNK_BYTES;
        if (ch0 + n < ch_end) {
            load_chunk<D>(dst[n], kbase + off, vbase + off, lane);
        } else {  // past the split: masked by position, but no register is read uninitialized
            dst[n] = Chunk<D>{};
        }
    }
}

// Head h, dim d of the block's warps merged: the sum of their O scaled to the common max `mx`, and
// `l` the same sum of their row sums.
template <int D>
__device__ __forceinline__ float merge_warps(const float (*s_o)[QF_MAXH][D], const float (*s_m)[QF_MAXH],
                                             const float (*s_l)[QF_MAXH], int h, int d, float& mx, float& l) {
    mx = s_m[0][h];
#pragma unroll
    for (int w = 1; w < QW; ++w) mx = fmaxf(mx, s_m[w][h]);
    float o = 0.0f;
    l = 0.0f;
#pragma unroll
    for (int w = 0; w < QW; ++w) {
        const float a = exp2f(s_m[w][h] - mx);
        o += a * s_o[w][h][d];
        l += a * s_l[w][h];
    }
    return o;
}

template <int D>
__device__ __forceinline__ void decode_fragments(float* __restrict__ o_part, float* __restrict__ m_part,
                                                 float* __restrict__ l_part, const __nv_bfloat16* __restrict__ q,
                                                 const unsigned char* __restrict__ kc,
                                                 const unsigned char* __restrict__ vc,
                                                 const int* __restrict__ seq_lens, int tmax, int hkv, int nh,
                                                 int splits, float qk_scale) {
    using F = Frag<D>;
    __shared__ __align__(16) float s_o[QW][QF_MAXH][D];
    __shared__ float s_m[QW][QF_MAXH], s_l[QW][QF_MAXH];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;

    const int len = seq_lens[b];
    const Qi4Split sp = qi4_split<D, QF_CHUNK>(len, splits, split, b, kvh, hkv, nh, o_part, m_part, l_part);
    const int t_begin = sp.begin, t_end = sp.end;
    float *const o_split = sp.o, *const m_split = sp.m, *const l_split = sp.l;
    if (t_begin >= t_end) {  // an empty split (uniform for the block)
        qi4_empty_split<D, QF_THREADS>(sp, tid, nh, splits);
        return;
    }

    // Warp w's steps are chunks ch_begin + (k W + w) QN + n: the block sweeps its split in rounds of
    // W QN contiguous chunks. Two register buffers in turn: the next step loads while this one computes.
    const size_t nchunks = (size_t)(tmax + QF_CHUNK - 1) / QF_CHUNK;
    const unsigned char* kbase = kc + ((size_t)b * hkv + kvh) * nchunks * F::CHUNK_BYTES;
    const unsigned char* vbase = vc + ((size_t)b * hkv + kvh) * nchunks * F::CHUNK_BYTES;
    const int ch_end = (t_end + QF_CHUNK - 1) / QF_CHUNK;
    constexpr int ROUND = QW * QN;
    int ch0 = t_begin / QF_CHUNK + warp * QN;
    Chunk<D> buf_a[QN], buf_b[QN];
    // The first step's loads go out before Q is read: its latency hides theirs.
    if (ch0 < ch_end) load_step<D>(buf_a, ch0, ch_end, kbase, vbase, lane);

    // Q^T as the B fragments of the scores: b0 = Q[head g][16ks + 2c, +1], b1 = [.. + 8, + 9]; heads
    // g >= nh are zero.
    unsigned qb[F::KSTEPS][2];
    {
        const unsigned* qrow =
            reinterpret_cast<const unsigned*>(q + ((size_t)b * hkv * nh + kvh * nh + min(g, nh - 1)) * D);
#pragma unroll
        for (int ks = 0; ks < F::KSTEPS; ++ks) {
            qb[ks][0] = (g < nh) ? qrow[8 * ks + c] : 0u;
            qb[ks][1] = (g < nh) ? qrow[8 * ks + 4 + c] : 0u;
        }
    }
    // sum(Q) of each group for the lane's score columns (heads 2c, 2c + 1), from the bf16 values the
    // mma multiplies: head h's sum is reduced in lanes 4h..4h+3.
    float qsum[QG][2];
#pragma unroll
    for (int j = 0; j < QG; ++j) {
        float sum = 0.0f;
#pragma unroll
        for (int ks = j * F::KS_PER_GROUP; ks < (j + 1) * F::KS_PER_GROUP; ++ks) {
            const float2 a = unpack_bf16x2(qb[ks][0]), d = unpack_bf16x2(qb[ks][1]);
            sum += (a.x + a.y) + (d.x + d.y);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        qsum[j][0] = __shfl_sync(0xffffffffu, sum, 8 * c);
        qsum[j][1] = __shfl_sync(0xffffffffu, sum, 8 * c + 4);
    }

    WarpState<D> st;
#pragma unroll
    for (int i = 0; i < F::KSTEPS; ++i) st.o[i][0] = st.o[i][1] = st.o[i][2] = st.o[i][3] = 0.0f;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        st.m[e] = -INFINITY;
        st.l[e] = 0.0f;
#pragma unroll
        for (int j = 0; j < QG; ++j) st.corr[j][e] = 0.0f;
    }

    while (ch0 < ch_end) {
        if (ch0 + ROUND < ch_end) load_step<D>(buf_b, ch0 + ROUND, ch_end, kbase, vbase, lane);
        decode_step<D>(st, buf_a, ch0, t_end, qb, qsum, qk_scale, lane);
        ch0 += ROUND;
        if (ch0 >= ch_end) break;
        if (ch0 + ROUND < ch_end) load_step<D>(buf_a, ch0 + ROUND, ch_end, kbase, vbase, lane);
        decode_step<D>(st, buf_b, ch0, t_end, qb, qsum, qk_scale, lane);
        ch0 += ROUND;
    }

    // The lane sums over its column's 8 lanes; O gets its group's correction.
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) {
            st.l[e] += __shfl_xor_sync(0xffffffffu, st.l[e], off);
#pragma unroll
            for (int j = 0; j < QG; ++j) st.corr[j][e] += __shfl_xor_sync(0xffffffffu, st.corr[j][e], off);
        }
    }
#pragma unroll
    for (int i = 0; i < F::KSTEPS; ++i) {
        const int j = i / F::KS_PER_GROUP;
#pragma unroll
        for (int k = 0; k < 4; ++k) st.o[i][k] += st.corr[j][k & 1];
    }
    // The block's warps merged in shared memory (a warp without tokens has m = -inf, l = O = 0).
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int h = 2 * c + e;
        if (h < nh) {
#pragma unroll
            for (int i = 0; i < F::KSTEPS; ++i) {
                s_o[warp][h][16 * i + g] = st.o[i][e];
                s_o[warp][h][16 * i + g + 8] = st.o[i][2 + e];
            }
            if (g == 0) {
                s_m[warp][h] = st.m[e];
                s_l[warp][h] = st.l[e];
            }
        }
    }
    __syncthreads();
    for (int i = tid; i < nh * D; i += QF_THREADS) {
        const int h = i / D, d = i % D;
        float mx, l;
        o_split[h * splits * D + d] = merge_warps<D>(s_o, s_m, s_l, h, d, mx, l);
        if (d == 0) {
            m_split[h * splits] = mx * 0.69314718f;  // base-2 max to natural log (ln 2)
            l_split[h * splits] = l;
        }
    }
}

#define QI4F_DECODE_ENTRY(NAME, DIM)                                                                            \
    extern "C" __global__ void __launch_bounds__(QF_THREADS, QI4F_MIN_BLOCKS)                                 \
        NAME(float* __restrict__ o_part, float* __restrict__ m_part, float* __restrict__ l_part,             \
             const __nv_bfloat16* __restrict__ q, const unsigned char* __restrict__ kc,                      \
             const unsigned char* __restrict__ vc, const int* __restrict__ seq_lens, int tmax, int hkv, int nh, \
             int splits, float qk_scale) {                                                                  \
        decode_fragments<DIM>(o_part, m_part, l_part, q, kc, vc, seq_lens, tmax, hkv, nh, splits, qk_scale); \
    }
QI4F_DECODE_ENTRY(qi4_frag_decode_d64, 64)
QI4F_DECODE_ENTRY(qi4_frag_decode_d128, 128)

// The splits are merged by attention's decode_combine (attention_decode.cuh), or with QI4F_WARP_MERGE
// by qi4_frag_merge below.
DECODE_COMBINE_ENTRIES

// QI4F_WARP_MERGE: the split merge (ladder_split_merge.cuh) one warp a (sequence, query head) row,
// merge_row_warp. attention's combine (merge_column) gives a row a block of D threads that each walk
// the splits in two passes, a load and its use at a time: ~2 splits dependent L2 round trips a row,
// 10.3 us at B = 32 (12 splits) against 22.5 us for the split kernel (Nsight Compute). Here the
// lanes load the splits' maxima and sums at once (a lane a split), reduce them with shuffles, and
// each lane sums its D/32 columns over the splits with four splits' loads in flight. Launch: qi4_frag_merge_d{64,128}: grid ceil(rows / QF_MERGE_WARPS), block
// 32 * QF_MERGE_WARPS; rows = B * HQ, the partials in attention's split layout.
#if QI4F_WARP_MERGE
#ifndef QI4F_MERGE_WARPS
#error "QI4F_MERGE_WARPS (rows a merge block) is a tunable: the stage list sets it"
#endif
constexpr int QF_MERGE_WARPS = QI4F_MERGE_WARPS;
template <int D>
__device__ __forceinline__ void frag_merge(__nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                                           const float* __restrict__ o_part, const float* __restrict__ m_part,
                                           const float* __restrict__ l_part, int rows, int splits) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * QF_MERGE_WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;  // whole warps leave together: the shuffles stay full-warp
    const SplitArrays</*same launch*/ false> p{o_part + (size_t)row * splits * D, m_part + (size_t)row * splits, l_part + (size_t)row * splits, D};
    float v[D / 32];
    const SplitMerged r = merge_row_warp<D>(p, splits, lane, v);
#pragma unroll
    for (int k = 0; k < D / 32; ++k) out[(size_t)row * D + lane + 32 * k] = __float2bfloat16_rn(v[k]);
    if (lane == 0) lse[row] = r.mx + __logf(r.sum);
}

#define QI4F_MERGE_ENTRY(NAME, DIM)                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * QF_MERGE_WARPS)                                       \
        NAME(__nv_bfloat16* __restrict__ out, float* __restrict__ lse, const float* __restrict__ o_part,     \
             const float* __restrict__ m_part, const float* __restrict__ l_part, int rows, int splits) {     \
        frag_merge<DIM>(out, lse, o_part, m_part, l_part, rows, splits);                                    \
    }
QI4F_MERGE_ENTRY(qi4_frag_merge_d64, 64)
QI4F_MERGE_ENTRY(qi4_frag_merge_d128, 128)
#endif
