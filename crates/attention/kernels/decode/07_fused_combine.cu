// Decode attention, stage 7: fused-combine (one launch per call, splits sized to whole waves).
// Changed from stage 6: two things that only matter around the kernel, not inside it.
//   - The combine runs inside the split kernel: each block, after writing its partial, takes a
//     ticket from a per-(sequence, KV head) counter (__threadfence, then atomicAdd); the block that
//     draws the last ticket merges all the splits of its G query heads (through L2, stage 2's
//     logsumexp rescaling) and resets the counter for the next call, so graph replays need no reset.
//   - The split count is chosen from the occupancy the launch reports: with `slots` = resident
//     blocks per SM x SMs and P = B x HKV pairs, the count s (each split at least 128 tokens) that
//     minimizes ceil(P s / slots) x ceil(Tmax / s), the token length of the critical path in whole
//     waves; ties go to fewer splits (fewer partials).
// Why it should be faster: stage 6 pays a second launch and its gap (a few us: a third of the call at
//   GPT-2's B = 1) and, with 4 blocks per SM-pair of splits from a heuristic that ignores
//   occupancy, leaves the last wave part-empty (GQA 32:4 B = 32: 640 blocks on 264 slots, 2.4
//   waves, 90% of copy). Predicted: GPT-2 B = 1 from 11.7 us to about 8 us; GQA B = 32 from 90% to
//   about 97% of copy; the long-context shapes unchanged (already at the copy rate).
// Launch: decode_tc_fused_{bf16,f16}_d{64,128}: grid (splits, HKV, B), block 32*TC_WARPS, dynamic
//   shared memory TC_WARPS*TC_STAGES*2*16*D*2 bytes; a zeroed int ticket per (sequence, KV head).
// Constraints: stage 6's. Tolerance: rel L2 <= 1e-2.
// Limits: D in {64, 128}; HQ % HKV == 0; B <= 65535; B * HQ * Tmax < 2^31; splits <= 256; HQ / HKV <= 16
#include "attention_decode_mma.cuh"

#if !defined(TC_WARPS) || !defined(TC_STAGES)
#error "TC_WARPS (warps per block) and TC_STAGES (K/V tiles per warp ring) are tunables: the stage list sets them"
#endif

template <typename T, int D>
__device__ __forceinline__ void fused_combine_decode(T* out, float* lse, float* o_part, float* m_part, float* l_part,
                                                     int* tickets, const T* q, const T* k, const T* v,
                                                     const int* seq_lens, const float* slopes, int Tmax, int G,
                                                     float scale) {
    tensor_core_decode<T, D, TC_WARPS, TC_STAGES>(o_part, m_part, l_part, q, k, v, seq_lens, slopes, Tmax, G, scale);
    __shared__ int last;
    __threadfence();  // this block's partials are visible device-wide before its ticket is drawn
    __syncthreads();
    const int splits = gridDim.x, b = blockIdx.z, HQ = gridDim.y * G, hq0 = blockIdx.y * G;
    const int pair = blockIdx.z * gridDim.y + blockIdx.y;
    if (threadIdx.x == 0) {
        last = atomicAdd(&tickets[pair], 1) == splits - 1;
        if (last) tickets[pair] = 0;  // every other split has drawn: ready for the next call
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int r = idx / D, d = idx % D;
        const size_t row = (size_t)b * HQ + hq0 + r;
        decode_merge_row(out + row * D, lse + row, o_part + row * splits * D, m_part + row * splits,
                         l_part + row * splits, splits, D, d, false);
    }
}

#define FUSED_ENTRY(SUFFIX, T, D)                                                                                 \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32) decode_tc_fused_##SUFFIX##_d##D(                \
        T* out, float* lse, float* o_part, float* m_part, float* l_part, int* tickets, const T* q, const T* k,   \
        const T* v, const int* seq_lens, const float* slopes, int Tmax, int G, float scale) {                    \
        fused_combine_decode<T, D>(out, lse, o_part, m_part, l_part, tickets, q, k, v, seq_lens, slopes, Tmax, G, \
                                   scale);                                                                       \
    }
FUSED_ENTRY(bf16, __nv_bfloat16, 64)
FUSED_ENTRY(bf16, __nv_bfloat16, 128)
FUSED_ENTRY(f16, __half, 64)
FUSED_ENTRY(f16, __half, 128)
