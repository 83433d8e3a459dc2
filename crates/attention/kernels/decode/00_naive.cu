// Decode attention, stage 0: naive (the seq_q = 1 formulation, three simple kernels).
// What it does: one query token per sequence over a contiguous cache [B, Tmax, HKV, D]:
//   decode_naive_scores: S[b, hq, t] = scale * q.k_t (+ ALiBi), one thread per score;
//   decode_naive_softmax: one thread per (b, hq) row: max, sum, normalise in place, lse;
//   decode_naive_pv: O[b, hq, d] = sum_t P[b, hq, t] v_t[d], one thread per output element.
// Why it is the baseline: S and P make a round trip through global memory (B*HQ*Tmax floats each
//   way), every K and V element is read by one thread with 2-byte loads, K is read D times less
//   coalesced than it could be (a warp's 32 scores sit 32 rows apart), and the softmax runs one
//   thread per row.
// Launch: scores grid ceil(B*HQ*Tmax/256), block 256; softmax grid ceil(B*HQ/256), block 256;
//   pv grid ceil(B*HQ*D/256), block 256. Entries decode_naive_*_{bf16,f16}.
// Constraints: D in {64, 128}; HQ % HKV == 0; 1 <= seq_lens[b] <= Tmax (checked in Rust, with the
//   lengths). Tolerance: bf16/fp16 cache, fp32 arithmetic, rel L2 <= 1e-2.
// Limits: D in {64, 128}; HQ % HKV == 0; B <= 65535; B * HQ * Tmax < 2^31
#include "attention_decode.cuh"

template <typename T>
__device__ __forceinline__ void naive_scores(float* s, const T* q, const T* k, const int* seq_lens, const float* slopes,
                                             int B, int Tmax, int HQ, int HKV, int D, float scale) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)B * HQ * Tmax) return;
    const int t = (int)(i % Tmax), hq = (int)(i / Tmax % HQ), b = (int)(i / Tmax / HQ);
    const int len = seq_lens[b];
    if (t >= len) {
        s[i] = -INFINITY;
        return;
    }
    const int kvh = hq / (HQ / HKV);
    const T* qr = q + ((size_t)b * HQ + hq) * D;
    const T* kr = k + (((size_t)b * Tmax + t) * HKV + kvh) * D;
    float acc = 0.0f;
    for (int d = 0; d < D; ++d) acc += to_float(qr[d]) * to_float(kr[d]);
    s[i] = acc * scale + decode_alibi(slopes, hq, t, len);
}

__device__ __forceinline__ void naive_softmax(float* s, float* lse, const int* seq_lens, int B, int Tmax, int HQ) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= B * HQ) return;
    const int len = seq_lens[row / HQ];
    float* r = s + (size_t)row * Tmax;
    float mx = -INFINITY;
    for (int t = 0; t < len; ++t) mx = fmaxf(mx, r[t]);
    float sum = 0.0f;
    for (int t = 0; t < len; ++t) sum += expf(r[t] - mx);
    for (int t = 0; t < len; ++t) r[t] = expf(r[t] - mx) / sum;
    lse[row] = mx + logf(sum);
}

template <typename T>
__device__ __forceinline__ void naive_pv(T* out, const float* p, const T* v, const int* seq_lens, int B, int Tmax,
                                         int HQ, int HKV, int D) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)B * HQ * D) return;
    const int d = (int)(i % D), hq = (int)(i / D % HQ), b = (int)(i / D / HQ);
    const int len = seq_lens[b], kvh = hq / (HQ / HKV);
    const float* pr = p + ((size_t)b * HQ + hq) * Tmax;
    float acc = 0.0f;
    for (int t = 0; t < len; ++t) acc += pr[t] * to_float(v[(((size_t)b * Tmax + t) * HKV + kvh) * D + d]);
    out[i] = from_float<T>(acc);
}

#define NAIVE_ENTRIES(SUFFIX, T)                                                                                  \
    extern "C" __global__ void decode_naive_scores_##SUFFIX(float* s, const T* q, const T* k, const int* seq_lens,  \
                                                            const float* slopes, int B, int Tmax, int HQ, int HKV, \
                                                            int D, float scale) {                                 \
        naive_scores<T>(s, q, k, seq_lens, slopes, B, Tmax, HQ, HKV, D, scale);                                   \
    }                                                                                                             \
    extern "C" __global__ void decode_naive_pv_##SUFFIX(T* out, const float* p, const T* v, const int* seq_lens,   \
                                                        int B, int Tmax, int HQ, int HKV, int D) {                \
        naive_pv<T>(out, p, v, seq_lens, B, Tmax, HQ, HKV, D);                                                    \
    }
NAIVE_ENTRIES(bf16, __nv_bfloat16)
NAIVE_ENTRIES(f16, __half)

extern "C" __global__ void decode_naive_softmax(float* s, float* lse, const int* seq_lens, int B, int Tmax, int HQ) {
    naive_softmax(s, lse, seq_lens, B, Tmax, HQ);
}
