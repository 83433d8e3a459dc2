// Decode attention, stage 1: decoding-attention (the CUDA-core kernel of the "Decoding Attention"
//   write-up, reference 004).
// Changed from stage 0: one fused kernel, a block of DA_THREADS threads per (query head, sequence).
//   Thread groups of D/8 lanes each take one key row per step with one 16-byte load per lane and
//   reduce the dot product with xor shuffles inside the group; the scores stay in shared memory;
//   max and sum are block reductions; for P.V each group accumulates its rows' columns in
//   registers, then shuffles across the groups of a warp and shared memory across warps finish the
//   sum. (decode_block in attention_decode.cuh.)
// Why it should be faster: K and V are read once each with 16-byte coalesced loads (a row is one
//   group's D*2 contiguous bytes) and S/P never leave the SM: the bytes are the floor's. But there
//   are only B*HQ blocks: at B*HQ << #SMs (GPT-2 at B = 1: 12 blocks on 132 SMs) most of the GPU
//   idles, and a long sequence is read by one block at a few hundred GB/s.
// Launch: grid (HQ, B), block DA_THREADS (128), dynamic shared memory 4*Tmax bytes (the scores).
//   Entries decode_attention_{bf16,f16}_d{64,128}.
// Constraints: D in {64, 128}; HQ % HKV == 0; Tmax <= 32768 (the scores in 128 KiB of shared
//   memory). Tolerance: rel L2 <= 1e-2.
// Limits: D in {64, 128}; HQ % HKV == 0; B <= 65535; B * HQ * Tmax < 2^31; Tmax <= 32768
#include "attention_decode.cuh"

#ifndef DA_THREADS
#error "DA_THREADS (threads per block) is a tunable: the stage list sets it"
#endif

template <typename T, int D>
__device__ __forceinline__ void decoding_attention(T* out, float* lse, const T* q, const T* k, const T* v,
                                                   const int* seq_lens, const float* slopes, int Tmax, int HKV,
                                                   float scale) {
    extern __shared__ float s[];
    const int hq = blockIdx.x, b = blockIdx.y, HQ = gridDim.x;
    const int kvh = hq / (HQ / HKV), len = seq_lens[b];
    const size_t stride = (size_t)HKV * D;
    const size_t kv0 = ((size_t)b * Tmax * HKV + kvh) * D;
    float o[1], m[1], l[1];
    decode_block<T, D, DA_THREADS, 1, 1>(o, m, l, q + ((size_t)b * HQ + hq) * D, k + kv0, v + kv0, stride, 0, len, len,
                                   scale, slopes, hq, s);
    const size_t row = (size_t)b * HQ + hq;
    if (threadIdx.x < D) out[row * D + threadIdx.x] = from_float<T>(o[0] / l[0]);
    if (threadIdx.x == 0) lse[row] = m[0] + __logf(l[0]);
}

#define DA_ENTRY(SUFFIX, T, D)                                                                                    \
    extern "C" __global__ void __launch_bounds__(DA_THREADS)                                                     \
        decode_attention_##SUFFIX##_d##D(T* out, float* lse, const T* q, const T* k, const T* v,                 \
                                         const int* seq_lens, const float* slopes, int Tmax, int HKV, float scale) { \
        decoding_attention<T, D>(out, lse, q, k, v, seq_lens, slopes, Tmax, HKV, scale);                          \
    }
DA_ENTRY(bf16, __nv_bfloat16, 64)
DA_ENTRY(bf16, __nv_bfloat16, 128)
DA_ENTRY(f16, __half, 64)
DA_ENTRY(f16, __half, 128)
