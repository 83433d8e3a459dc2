// qi4_decode_wide.cuh: our parts of the split-K decode kernel, past the write-up (decode/00_splitk.cu,
// row-wise stages 16-18, group-wise 19-21): a Tile (OPT11) and a Values (OPT12) part for the roles of
// qi4_decode_parts.cuh. OPT13 is the kernel's launch bounds (00_splitk.cu).
// Why (stage 10's counters at B = 512: DRAM 25%, SM 58%, stalls on fixed-latency dependencies and
// the shared-memory queue, i.e. the tile's instruction traffic, not HBM).
#pragma once
#include "qi4_decode_parts.cuh"

// OPT11 the tile's traffic in 16-byte instructions: K fragments by ldmatrix.x4 (4 a tile's n-tile
// instead of 16 32-bit loads), V fragments by ldmatrix.x4.trans (8 a tile instead of 64 16-bit
// loads and 32 shifts/ORs), the dequantized tile written in 16-byte stores; rows padded by 8 bf16 so
// each row starts on a 16-byte boundary (272 bytes at D = 128: eight rows start in eight different
// 16-byte bank groups; OPT10's pad of 2 is replaced). Predicted 1.2-1.3x (the MIO share of the
// stalls). Measured (H100, B = 32 / 128 / 512, row-wise): 1.05 / 1.15 / 1.12x stage 10; group-wise
// 1.01 / 1.17 / 1.07x stage 15.
struct WideTile {
    static constexpr int PAD = 8;
    static __device__ __forceinline__ void store4(unsigned* dst, const unsigned (&w)[4]) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    // B = K^T straight from the token-major tile: ldmatrix's matrix j is dims 32p + 8j of the
    // n-tile's 8 tokens, i.e. (b0b1, b2b3) of k-steps 2p and 2p + 1.
    template <int D, int KSTRIDE, class V, int KS_PER_GROUP>
    static __device__ __forceinline__ void scores(float (&acc)[V::NACC][4], const unsigned (&qa)[D / 16][2],
                                                  const __nv_bfloat16* kv_w, int nt, int lane, int g, int t) {
        (void)g;
        (void)t;
#pragma unroll
        for (int p = 0; p < D / 32; ++p) {
            unsigned kb[4];
            ldmatrix_x4(kb, smem_u32(kv_w + (nt * 8 + (lane & 7)) * KSTRIDE + 32 * p + 8 * (lane >> 3)));
            float (&a0)[4] = acc[V::template acc_of<KS_PER_GROUP>(2 * p)];
            float (&a1)[4] = acc[V::template acc_of<KS_PER_GROUP>(2 * p + 1)];
            mma_16816<__nv_bfloat16>(a0, qa[2 * p][0], 0u, qa[2 * p][1], 0u, kb[0], kb[1]);
            mma_16816<__nv_bfloat16>(a1, qa[2 * p + 1][0], 0u, qa[2 * p + 1][1], 0u, kb[2], kb[3]);
        }
    }
    // B = V from the token-major tile, transposed by ldmatrix: matrix j is tokens 8 (j & 1).. and dims
    // 8 (nt + j / 2)..: (b0b1, b2b3) of n-tiles nt and nt + 1.
    template <int D, int KSTRIDE, class V>
    static __device__ __forceinline__ void pv(float (&o)[D / 8][4], const unsigned (&a0)[V::NP],
                                              const unsigned (&a2)[V::NP], const __nv_bfloat16* kv_w, int lane,
                                              int g, int t) {
        (void)g;
        (void)t;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt += 2) {
            unsigned vb[4];
            const int j = lane >> 3;
            ldmatrix_x4_trans(vb, smem_u32(kv_w + ((j & 1) * 8 + (lane & 7)) * KSTRIDE + (nt + (j >> 1)) * 8));
            mma_16816<__nv_bfloat16>(o[nt], a0[V::template p_of<D>(nt)], 0u, a2[V::template p_of<D>(nt)], 0u,
                                     vb[0], vb[1]);
            mma_16816<__nv_bfloat16>(o[nt + 1], a0[V::template p_of<D>(nt + 1)], 0u,
                                     a2[V::template p_of<D>(nt + 1)], 0u, vb[2], vb[3]);
        }
    }
};

// OPT12 the codes go into the tile as the exact bf16 values 128 + q (a shift and an AND-OR a pair,
// no float conversion, subtract or FMA); the affine map moves to where it is cheap: a score is
// scale (S' - 128 sum(Q)) + shift sum(Q) per group (S' = Q.(128 + q) exact in fp32), and P.V is
// (P scale).(128 + q) + corr, corr = sum over tokens of P shift - 128 bf16(P scale) (the same
// rounded values as the mma's, so the 128 cancels exactly), a scalar per head and group rescaled
// with O. The cache values are no longer rounded to bf16 (error 4.6e-3 -> 3.7e-3). Predicted
// 1.1-1.2x (dequantization was ~10 instructions a pair). Measured row-wise 1.12 / 1.17 / 1.17x
// stage 16; group-wise 0.94 / 0.83 / 0.89x stage 19 (147 -> 183 registers: one accumulator a group
// for the scores and four P fragments, 2 blocks an SM).
// The warp tile's tokens' (scale, shift) live in shared memory beside the tile (`par`: a lane's
// token's G pairs); a token past the split's end gets zero parameters, so that P = 0 times its stale
// parameters cannot make a NaN.
template <int G_>
struct BiasedCodes {
    static constexpr int G = G_;
    static constexpr int NACC = G;  // one score accumulator a group (each takes its own scale)
    static constexpr int NP = G;    // one P fragment a group (P scale)
    using Groups = float[G];        // a value per group: sum(Q), the P.V correction
    static __device__ __forceinline__ void word(unsigned w, float2, unsigned (&out)[4]) {
#pragma unroll
        for (int k = 0; k < 4; ++k) out[k] = qi4_code_pair(w, k);
    }
    static __device__ __forceinline__ void chunk(unsigned w0, unsigned w1, float2 sz, unsigned* dst, int c) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            dst[8 * c + k] = qi4_code_pair(w0, k);
            dst[8 * c + 4 + k] = qi4_code_pair(w1, k);
        }
        (void)sz;
    }
    // The token's (scale, shift) pairs of the groups of half hf (row-wise: the one pair, from half 0).
    static __device__ __forceinline__ void params(float2* par, float2 sz0, float2 sz1, int hf) {
        if (G == 1) {
            if (hf == 0) par[0] = sz0;
        } else {
            par[2 * hf] = sz0;
            par[2 * hf + 1] = sz1;
        }
    }
    static __device__ __forceinline__ void params_chunked(float2* par, unsigned s0, unsigned s1, int hf) {
        if (G == 1) {
            if (hf == 0) par[0] = unpack_half2(s0);
        } else {
            par[2 * hf] = unpack_half2(s0);
            par[2 * hf + 1] = unpack_half2(s1);
        }
    }
    static __device__ __forceinline__ void zero_params(float2* par, int hf) {
        if (hf == 0)
#pragma unroll
            for (int j = 0; j < G; ++j) par[j] = make_float2(0.0f, 0.0f);
    }
    static __device__ __forceinline__ float2* par_slot(float2* par) { return par; }
    // qsum: sum(Q) of head g over each group's dims; corr: the P.V correction of each group.
    template <int D>
    static __device__ __forceinline__ void init(const unsigned (&qa)[D / 16][2], float (&qsum)[G], float (&corr)[G]) {
        constexpr int KS_PER_GROUP = D / 16 / G;
#pragma unroll
        for (int j = 0; j < G; ++j) {
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
    }
    template <int KS_PER_GROUP>
    static __device__ __forceinline__ constexpr int acc_of(int ks) {
        return ks / KS_PER_GROUP;
    }
    template <class Par>
    static __device__ __forceinline__ void scores(const float (&acc)[NACC][4], const float (&qsum)[G], const Par& s_par,
                                                  int warp, int nt, int t, float& sc0, float& sc1) {
        sc0 = 0.0f;
        sc1 = 0.0f;
#pragma unroll
        for (int j = 0; j < G; ++j) {
            const float2 p0 = s_par[warp][nt * 8 + 2 * t][j], p1 = s_par[warp][nt * 8 + 2 * t + 1][j];
            sc0 += p0.x * (acc[j][0] - 128.0f * qsum[j]) + p0.y * qsum[j];
            sc1 += p1.x * (acc[j][1] - 128.0f * qsum[j]) + p1.y * qsum[j];
        }
    }
    static __device__ __forceinline__ void rescale(float (&corr)[G], float a) {
#pragma unroll
        for (int j = 0; j < G; ++j) corr[j] *= a;
    }
    // A = P scale per group (scale is per token: the A operand's k), and the group's correction from
    // the same rounded values.
    template <class Par>
    static __device__ __forceinline__ void p_fragments(float (&corr)[G], const Par& s_par, int warp, int t,
                                                       const float2& f0, const float2& f1,
                                                       unsigned, unsigned, unsigned (&pg0)[NP], unsigned (&pg2)[NP]) {
#pragma unroll
        for (int j = 0; j < G; ++j) {
            const float2 v0 = s_par[warp][2 * t][j], v1 = s_par[warp][2 * t + 1][j];
            const float2 v8 = s_par[warp][2 * t + 8][j], v9 = s_par[warp][2 * t + 9][j];
            pg0[j] = pack_bf16x2(f0.x * v0.x, f0.y * v1.x);
            pg2[j] = pack_bf16x2(f1.x * v8.x, f1.y * v9.x);
            const float2 r0 = unpack_bf16x2(pg0[j]), r2 = unpack_bf16x2(pg2[j]);
            corr[j] += (f0.x * v0.y + f0.y * v1.y + f1.x * v8.y + f1.y * v9.y) -
                       128.0f * ((r0.x + r0.y) + (r2.x + r2.y));
        }
    }
    template <int D>
    static __device__ __forceinline__ constexpr int p_of(int nt) {
        return nt * 8 * G / D;
    }
    // The correction of head g's group: the sum over the lane's tokens, then over the 4 lanes t.
    template <int D>
    static __device__ __forceinline__ void finish(float (&corr)[G], float (&o)[D / 8][4]) {
#pragma unroll
        for (int j = 0; j < G; ++j) {
            corr[j] += __shfl_xor_sync(0xffffffffu, corr[j], 1);
            corr[j] += __shfl_xor_sync(0xffffffffu, corr[j], 2);
        }
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            o[nt][0] += corr[nt * 8 * G / D];
            o[nt][1] += corr[nt * 8 * G / D];
        }
    }
};
