// Decode attention, stage 5: gqa-packed (the query heads of one KV head in one block).
// Changed from stage 2: block (split, KV head, sequence) computes all G = HQ/HKV query heads that
//   share the KV head: each K row is loaded once and dotted with G queries held in registers, each
//   V row once and accumulated into G outputs. Each thread group keeps max(1, DA_ROWS/G) rows in
//   flight (all their loads issued before the first is used; DA_ROWS = 4), and the split count keeps
//   a block's scores to at most 2048 floats, so shared memory does not cap the blocks per SM. Splits
//   and the combine are stage 2's.
// Why it should be faster: stage 2 reads every K/V row G times (once per query head of the group);
//   here once, so the bytes read drop by G at GQA shapes (8x at 32:4). MHA (G = 1) runs the same
//   kernel with a KV-head grid. Measured (H100, docs/notes/attention.md): without rows in flight
//   or the cap, 25-33% of copy bandwidth at GQA (1-2 blocks per SM, limited by shared memory); with
//   4 rows in flight for every G, 168 registers at G = 8 and no better; hence the shared budget.
// Launch: decode_gqa_{bf16,f16}_d{64,128}_g{1,2,4,8}: grid (splits, HKV, B), block DA_THREADS (128),
//   dynamic shared memory 4*G*ceil(Tmax/splits) bytes; decode_combine_{bf16,f16} (stage 2's).
// Constraints: D in {64, 128}; HQ/HKV in {1, 2, 4, 8}; 1 <= splits <= 256;
//   G*ceil(Tmax/splits) <= 32768. Tolerance: rel L2 <= 1e-2.
// Limits: D in {64, 128}; HQ % HKV == 0; B <= 65535; B * HQ * Tmax < 2^31; splits <= 256; HQ / HKV in {1, 2, 4, 8}; G * Tmax / splits <= 32768
#include "attention_decode.cuh"

#if !defined(DA_THREADS) || !defined(DA_ROWS)
#error "DA_THREADS (threads per block) and DA_ROWS (rows in flight per group) are tunables: the stage list sets them"
#endif

template <typename T, int D, int G>
__device__ __forceinline__ void gqa_packed(float* o_part, float* m_part, float* l_part, const T* q, const T* k,
                                           const T* v, const int* seq_lens, const float* slopes, int Tmax,
                                           float scale) {
    extern __shared__ float s[];
    const int split = blockIdx.x, splits = gridDim.x, kvh = blockIdx.y, HKV = gridDim.y, b = blockIdx.z;
    const int HQ = HKV * G, hq0 = kvh * G, len = seq_lens[b];
    const int chunk = (len + splits - 1) / splits;
    const int t_begin = min(split * chunk, len), t_end = min(t_begin + chunk, len);
    const size_t kv0 = ((size_t)b * Tmax * HKV + kvh) * D;
    float o[G], m[G], l[G];
    // The q and output registers grow with G: the rows in flight share DA_ROWS rows of budget.
    constexpr int R = DA_ROWS / G > 1 ? DA_ROWS / G : 1;
    decode_block<T, D, DA_THREADS, G, R>(o, m, l, q + ((size_t)b * HQ + hq0) * D, k + kv0, v + kv0, (size_t)HKV * D,
                                      t_begin, t_end, len, scale, slopes, hq0, s);
#pragma unroll
    for (int h = 0; h < G; ++h) {
        const size_t part = ((size_t)b * HQ + hq0 + h) * splits + split;
        if (threadIdx.x < D) o_part[part * D + threadIdx.x] = o[h];
        if (threadIdx.x == 0) {
            m_part[part] = m[h];
            l_part[part] = l[h];
        }
    }
}

#define GQA_ENTRY(SUFFIX, T, D, G)                                                                                \
    extern "C" __global__ void __launch_bounds__(DA_THREADS)                                                     \
        decode_gqa_##SUFFIX##_d##D##_g##G(float* o_part, float* m_part, float* l_part, const T* q, const T* k,  \
                                          const T* v, const int* seq_lens, const float* slopes, int Tmax,        \
                                          float scale) {                                                         \
        gqa_packed<T, D, G>(o_part, m_part, l_part, q, k, v, seq_lens, slopes, Tmax, scale);                      \
    }
#define GQA_ENTRIES(SUFFIX, T, D) GQA_ENTRY(SUFFIX, T, D, 1) GQA_ENTRY(SUFFIX, T, D, 2) GQA_ENTRY(SUFFIX, T, D, 4) GQA_ENTRY(SUFFIX, T, D, 8)
GQA_ENTRIES(bf16, __nv_bfloat16, 64)
GQA_ENTRIES(bf16, __nv_bfloat16, 128)
GQA_ENTRIES(f16, __half, 64)
GQA_ENTRIES(f16, __half, 128)

DECODE_COMBINE_ENTRIES
