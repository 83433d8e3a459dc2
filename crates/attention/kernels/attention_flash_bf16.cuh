// attention_flash_bf16.cuh: the pieces every bf16 prefill stage (prefill-bf16/) shares once its
// scores S = Q.K^T of one key tile sit in mma.sync accumulators: the online-softmax step and the
// epilogue; and the mma.sync stages' (prefill-bf16/00, 01, prefill/06) products S = Q.K^T and
// O += P.V from shared memory. A warp owns 16 query rows; with g = lane >> 2 and t = lane & 3 a
// thread holds, for each n-tile n of 8 keys, s[n][0..1] = S[g][8n + 2t .. +1] and s[n][2..3] =
// S[g + 8][8n + 2t .. +1] (ladder_mma.cuh's accumulator layout), so a row's scores live in the 4
// threads of a quad.
//
// Layout of the op: qkv[B, T, 3C] bf16 (q in columns 0..C, k in C..2C, v in 2C..3C, head h owning
// h*D..(h+1)*D of each), out[B, T, C] bf16, lse[B, NH, T] fp32 (natural log of each row's sum of
// exp(scale * q.k)); scale = 1/sqrt(D).
#pragma once
#include "ladder.cuh"
#include "ladder_convert.cuh"
#include "ladder_mma.cuh"

constexpr float LOG2E = 1.4426950408889634f;

// The end of a key tile's online-softmax step for a thread's two rows, once their new running max
// mx is known: the reference point of the exponentials (mx, or 0 while the row has seen no key),
// alpha = exp2(m - that point) (the factor the old sum and output accumulators are rescaled by),
// each score replaced by its probability prob(s, reference point), each row's sum of them met across
// its quad, then the running sum l = l * alpha + sum and the running max m = mx.
template <int NT, typename Prob>
__device__ __forceinline__ void softmax_finish(float (&s)[NT][4], const float (&mx)[2], float (&m)[2], float (&l)[2],
                                               float (&alpha)[2], Prob prob) {
    const float base[2] = {mx[0] == -INFINITY ? 0.f : mx[0], mx[1] == -INFINITY ? 0.f : mx[1]};
    alpha[0] = exp2f(m[0] - base[0]);
    alpha[1] = exp2f(m[1] - base[1]);
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = prob(s[n][e], base[e >> 1]);
            s[n][e] = p;
            sum[e >> 1] += p;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
        l[r] = l[r] * alpha[r] + sum[r];
        m[r] = mx[r];
    }
}

// One key tile's online-softmax step for a thread's two rows (row and row + 8), without touching
// the output accumulators: scores scaled into log2 units, keys past the causal diagonal (when
// `causal`) or at or past T masked with -inf, the running max m and sum l updated, s replaced by
// the unnormalised probabilities exp2(s - m), and the factor the accumulators must be rescaled by
// returned in alpha (a stage whose P.V is still in flight on them rescales once it lands). `check`
// is false for a tile no mask can touch, which skips the per-element compares. A row with every key
// so far masked keeps m = -inf and p = 0 (no NaN from -inf - -inf): that happens only to padding
// rows past T of a non-causal tile, never written.
template <int NT>
__device__ __forceinline__ void softmax_scores(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                               float scale_log2, int row, int key0, int T, bool causal, bool check) {
    const int t = threadIdx.x & 3;
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = s[n][e] * scale_log2;
            if (check) {
                const int r = row + (e >> 1) * 8;
                const int key = key0 + n * 8 + 2 * t + (e & 1);
                if (key >= T || (causal && key > r)) v = -INFINITY;
            }
            s[n][e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    softmax_finish(s, mx, m, l, alpha, [](float x, float base) { return exp2f(x - base); });
}

// 2^x as the one MUFU.EX2 instruction, subnormal results flushed to zero (exp2f without fast math
// wraps it in a compare and two predicated multiplies to keep them). -inf gives 0.
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// softmax_scores with the scale folded into the exponent: the max is taken over the raw scores
// (the scale is positive, so the order is the same), and each probability is one FFMA and an exp2,
// exp2(s * scale_log2 - m), instead of a multiply pass, a subtract and the exp2. Same arguments and
// results (m in log2 units). MUFU_EXP2 takes each probability's exp2 as exp2_ftz: probabilities
// below 2^-126 of the row's max become 0, far under bf16's resolution of P.
template <bool MUFU_EXP2, int NT>
__device__ __forceinline__ void softmax_scores_folded(float (&s)[NT][4], float (&m)[2], float (&l)[2],
                                                      float (&alpha)[2], float scale_log2, int row, int key0,
                                                      int T, bool causal, bool check) {
    const int t = threadIdx.x & 3;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (check) {
                const int r = row + (e >> 1) * 8;
                const int key = key0 + n * 8 + 2 * t + (e & 1);
                if (key >= T || (causal && key > r)) s[n][e] = -INFINITY;
            }
            mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        mx[r] = fmaxf(m[r], mx[r] * scale_log2);  // the new running max, in log2 units
    }
    softmax_finish(s, mx, m, l, alpha, [scale_log2](float x, float base) {
        const float y = fmaf(x, scale_log2, -base);
        return MUFU_EXP2 ? exp2_ftz(y) : exp2f(y);
    });
}

// The output accumulators of a thread's two rows scaled by their alpha.
template <int DT>
__device__ __forceinline__ void rescale(float (&o)[DT][4], const float (&alpha)[2]) {
#pragma unroll
    for (int n = 0; n < DT; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
    }
}

// A thread's online-softmax state for its two rows before the first key tile: running max -inf
// (no key seen), running sum 0, output accumulators 0.
template <int DT>
__device__ __forceinline__ void softmax_state_init(float (&m)[2], float (&l)[2], float (&o)[DT][4]) {
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
#pragma unroll
    for (int n = 0; n < DT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
}

// softmax_scores, then the accumulators rescaled at once: the step of a stage whose P.V of the
// previous tile has landed.
template <int NT, int DT>
__device__ __forceinline__ void online_softmax_step(float (&s)[NT][4], float (&m)[2], float (&l)[2],
                                                    float (&o)[DT][4], float scale_log2, int row, int key0,
                                                    int T, bool causal, bool check) {
    float alpha[2];
    softmax_scores(s, m, l, alpha, scale_log2, row, key0, T, causal, check);
    rescale(o, alpha);
}

// P's A fragment for keys 16kk..16kk+15: two S n-tiles side by side are exactly one A fragment
// (ladder_mma.cuh), rounded to bf16.
template <int NT>
__device__ __forceinline__ void p_fragment(unsigned (&a)[4], const float (&s)[NT][4], int kk) {
    a[0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
    a[1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
    a[2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// S = Q.K^T of a warp's 16 query rows and a tile of 8 NT keys in shared memory, with mma.sync:
// qa the rows' A fragments (16 dims a k-step), key_chunk(key, c, h) the shared address of key row
// `key`'s 16-byte chunk c + h (dims 8 (c + h) .. + 7) in the stage's layout of the tile, c even and
// h (0 or 1) the lane's half of an ldmatrix pair: the padded layout adds 8 h, the swizzle XORs c + h.
template <int NT, int KSTEPS, class KeyChunk>
__device__ __forceinline__ void qk_mma_sync(float (&s)[NT][4], const unsigned (&qa)[KSTEPS][4],
                                            const KeyChunk& key_chunk) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            // Keys n*8.. and (n+1)*8.., dims kk*16 + {0, 8}: b0/b1 of n-tile n, then of n+1.
            unsigned kb4[4];
            const int key = n * 8 + (lane & 7) + (lane >> 4) * 8;
            ldmatrix_x4(kb4, key_chunk(key, kk * 2, (lane >> 3) & 1));
            mma_16816<__nv_bfloat16>(s[n], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], kb4[0], kb4[1]);
            mma_16816<__nv_bfloat16>(s[n + 1], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], kb4[2], kb4[3]);
        }
    }
}

// O += P.V for the tile's 8 NT keys, with mma.sync: P's 16 keys a k-step are two S n-tiles, already
// in A-fragment order (p_fragment); value_chunk(key, c, h) the shared address of V row `key`'s
// 16-byte chunk c + h (key_chunk's), read transposed.
template <int DT, int NT, class ValueChunk>
__device__ __forceinline__ void pv_mma_sync(float (&o)[DT][4], const float (&s)[NT][4], const ValueChunk& value_chunk) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
        unsigned a[4];
        p_fragment(a, s, kk);
#pragma unroll
        for (int n = 0; n < DT; n += 2) {
            // Keys kk*16 + {0, 8}, dims n*8 and (n+1)*8, transposed: b0/b1 of n, then of n+1.
            unsigned vb4[4];
            const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            ldmatrix_x4_trans(vb4, value_chunk(key, n, lane >> 4));
            mma_16816<__nv_bfloat16>(o[n], a[0], a[1], a[2], a[3], vb4[0], vb4[1]);
            mma_16816<__nv_bfloat16>(o[n + 1], a[0], a[1], a[2], a[3], vb4[2], vb4[3]);
        }
    }
}

// A row's log-sum-exp in natural log from its running max and sum in base 2 (the scores are
// scaled by log2(e)): what every stage writes to lse.
__device__ __forceinline__ float row_lse(float m, float l) { return (m + log2f(l)) * 0.6931471805599453f; }

// O / l as bf16 pairs into out[b, row, h*D ..] for the thread's rows row and row + 8 (rows at or
// past T skipped), and lse = (m + log2 l) * ln 2 from the quad's first thread.
template <int DT>
__device__ __forceinline__ void store_rows(__nv_bfloat16* out, float* lse, const float (&o)[DT][4],
                                           const float (&m)[2], const float (&l)[2], int row, int b, int h,
                                           int T, int NH) {
    constexpr int D = DT * 8;
    const int t = threadIdx.x & 3;
    const size_t C = (size_t)NH * D;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int q = row + r * 8;
        if (q >= T) continue;
        const float inv = 1.f / l[r];
        __nv_bfloat16* orow = out + ((size_t)b * T + q) * C + (size_t)h * D;
#pragma unroll
        for (int n = 0; n < DT; ++n)
            *reinterpret_cast<unsigned*>(orow + n * 8 + 2 * t) = pack_bf16x2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        if (t == 0) lse[((size_t)b * NH + h) * T + q] = row_lse(m[r], l[r]);
    }
}
