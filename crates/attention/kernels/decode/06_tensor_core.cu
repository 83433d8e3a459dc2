// Decode attention, stage 6: tensor-core (the query heads of one KV head as the rows of mma.sync tiles).
// Changed from stage 5: the G = HQ/HKV query heads of a KV head become the rows of a 16-row A tile
//   (rows G..15 are zero and never written), and both products run on the tensor cores with
//   mma.sync.m16n8k16 (bf16 or fp16 in, fp32 accumulate): S[16 x 16 tokens] = Q.K^T over D/16
//   k-steps, then O[16 x D] += P.V with P packed from the S accumulators straight into an A fragment.
//   Each warp owns every TC_WARPS-th 16-token tile of its split and keeps its own online softmax
//   (running max and sum per row, O rescaled when the max grows), so no scores are stored and warps
//   never wait for each other until the final merge. K and V tiles go global -> shared with 16-byte
//   cp.async into a per-warp ring of TC_STAGES tiles (TC_STAGES - 1 in flight while one is used),
//   XOR-swizzled by 16-byte chunk so every ldmatrix phase hits 8 distinct bank groups; rows past the
//   split's end are zero-filled, never read. The warps' states merge through shared memory into the
//   split's partial (stage 2's workspace and combine).
// Why it should be faster: stage 5 spends G x 8 FMAs per 16 bytes of K on the FMA pipe and 128
//   registers of q and accumulators per thread; here a warp's 16 x 16 x D products are D/8 mma
//   instructions, so the arithmetic stops binding at GQA and the kernel can approach the copy
//   bandwidth: each K/V byte is read once per KV head, with (TC_STAGES - 1) x 2 x 16 x D x 2 bytes
//   in flight per warp. At G = 1 the tile is 15/16 padding, but the op stays memory-bound.
// Launch: decode_tc_{bf16,f16}_d{64,128}: grid (splits, HKV, B), block 32*TC_WARPS, dynamic shared
//   memory TC_WARPS*TC_STAGES*2*16*D*2 bytes; decode_combine_{bf16,f16} (stage 2's).
// Constraints: D in {64, 128}; HQ/HKV <= 16; 1 <= splits <= 256; sm_80+ (mma.sync, cp.async,
//   ldmatrix). Tolerance: rel L2 <= 1e-2 (P is rounded to the cache's 16-bit type before P.V, as in
//   FlashAttention-2).
// Limits: D in {64, 128}; HQ % HKV == 0; B <= 65535; B * HQ * Tmax < 2^31; splits <= 256; HQ / HKV <= 16
#include "attention_decode_mma.cuh"

#if !defined(TC_WARPS) || !defined(TC_STAGES)
#error "TC_WARPS (warps per block) and TC_STAGES (K/V tiles per warp ring) are tunables: the stage list sets them"
#endif

#define TC_ENTRY(SUFFIX, T, D)                                                                                    \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32)                                                  \
        decode_tc_##SUFFIX##_d##D(float* o_part, float* m_part, float* l_part, const T* q, const T* k,          \
                                  const T* v, const int* seq_lens, const float* slopes, int Tmax, int G,         \
                                  float scale) {                                                                 \
        tensor_core_decode<T, D, TC_WARPS, TC_STAGES, DecodeOut::GlobalPartials>(nullptr, nullptr, o_part, m_part, l_part, q, k, v, seq_lens, slopes, Tmax, G, scale);              \
    }
TC_ENTRY(bf16, __nv_bfloat16, 64)
TC_ENTRY(bf16, __nv_bfloat16, 128)
TC_ENTRY(f16, __half, 64)
TC_ENTRY(f16, __half, 128)

DECODE_COMBINE_ENTRIES
