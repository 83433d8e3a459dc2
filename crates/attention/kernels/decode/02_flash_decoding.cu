// Decode attention, stage 2: flash-decoding (split-K over the sequence, reference 003).
// Changed from stage 1: the sequence is split across blocks. Block (split s, query head, sequence)
//   runs stage 1's block over its ceil(len/splits) tokens and writes an unnormalized partial O, its
//   max m and its sum l to a workspace; decode_combine merges the splits of each (sequence, head) by
//   rescaling with exp(m_s - max) (logsumexp) and writes O and lse.
// Why it should be faster: B*HQ*splits blocks instead of B*HQ: the split count is chosen so the
//   grid fills the SMs several times over, so the cache is read by the whole GPU at copy bandwidth.
//   The cost is the partials (B*HQ*splits*(D+2) floats written and read) and a second launch.
// Launch: decode_flash_{bf16,f16}_d{64,128}: grid (splits, HQ, B), block DA_THREADS (128), dynamic
//   shared memory 4*ceil(Tmax/splits) bytes; decode_combine_{bf16,f16}: grid (HQ, B), block D.
// Constraints: D in {64, 128}; HQ % HKV == 0; 1 <= splits <= 256; ceil(Tmax/splits) <= 32768.
//   Splits past a sequence's length are empty (m = -inf) and skipped by the combine.
//   Tolerance: rel L2 <= 1e-2.
// Limits: D in {64, 128}; HQ % HKV == 0; B <= 65535; B * HQ * Tmax < 2^31; splits <= 256; Tmax / splits <= 32768
#include "attention_decode.cuh"

#ifndef DA_THREADS
#error "DA_THREADS (threads per block) is a tunable: the stage list sets it"
#endif

template <typename T, int D>
__device__ __forceinline__ void flash_decoding(float* o_part, float* m_part, float* l_part, const T* q, const T* k,
                                               const T* v, const int* seq_lens, const float* slopes, int Tmax,
                                               int HKV, float scale) {
    extern __shared__ float s[];
    const int split = blockIdx.x, splits = gridDim.x, hq = blockIdx.y, b = blockIdx.z, HQ = gridDim.y;
    const int kvh = hq / (HQ / HKV), len = seq_lens[b];
    const int chunk = (len + splits - 1) / splits;
    const int t_begin = min(split * chunk, len), t_end = min(t_begin + chunk, len);
    const size_t kv0 = ((size_t)b * Tmax * HKV + kvh) * D;
    float o[1], m[1], l[1];
    decode_block<T, D, DA_THREADS, 1, 1>(o, m, l, q + ((size_t)b * HQ + hq) * D, k + kv0, v + kv0, (size_t)HKV * D,
                                   t_begin, t_end, len, scale, slopes, hq, s);
    const size_t part = ((size_t)b * HQ + hq) * splits + split;
    if (threadIdx.x < D) o_part[part * D + threadIdx.x] = o[0];
    if (threadIdx.x == 0) {
        m_part[part] = m[0];
        l_part[part] = l[0];
    }
}

#define FD_ENTRY(SUFFIX, T, D)                                                                                    \
    extern "C" __global__ void __launch_bounds__(DA_THREADS)                                                     \
        decode_flash_##SUFFIX##_d##D(float* o_part, float* m_part, float* l_part, const T* q, const T* k,       \
                                     const T* v, const int* seq_lens, const float* slopes, int Tmax, int HKV,    \
                                     float scale) {                                                              \
        flash_decoding<T, D>(o_part, m_part, l_part, q, k, v, seq_lens, slopes, Tmax, HKV, scale);               \
    }
FD_ENTRY(bf16, __nv_bfloat16, 64)
FD_ENTRY(bf16, __nv_bfloat16, 128)
FD_ENTRY(f16, __half, 64)
FD_ENTRY(f16, __half, 128)

DECODE_COMBINE_ENTRIES
