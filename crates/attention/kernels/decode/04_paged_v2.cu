// Decode attention, stage 4: paged-v2 (vLLM's v2: partitions and a reduce, reference 001).
// Changed from stage 3: blockIdx.z is a partition of PA_PARTITION (512) tokens. Each block runs
//   stage 3's body over its partition and writes its output normalized by its own exp-sum, with its
//   max logit and exp-sum, to a workspace; decode_paged_reduce merges the partitions of each
//   (sequence, head) with weights exp-sum * exp(max - global max). Partitions past a sequence's
//   length write an empty marker and are skipped.
// Why it should be faster: Flash-Decoding's parallelism on the paged cache: B*HQ*ceil(len/512)
//   blocks; long sequences are read by many SMs, and the scores of a block fit in 2 KiB of shared
//   memory whatever the length. The cost: the workspace round trip and a second launch.
// Launch: decode_paged_v2_*: grid (HQ, B, ceil(max_blocks*BS/512)), block PA_THREADS (128), dynamic
//   shared memory 4*512 bytes; decode_paged_reduce_{bf16,f16}: grid (HQ, B), block D.
// Constraints: D in {64, 128}; block_size in {16, 32} (it divides the partition); HQ % HKV == 0;
//   block tables and lengths checked on the host. Tolerance: rel L2 <= 1e-2.
// Limits: D in {64, 128}; HQ % HKV == 0; B <= 65535; block_size in {16, 32}
#include "attention_paged.cuh"

#ifndef PA_PARTITION
#error "PA_PARTITION (tokens per partition) is a tunable: the stage list sets it"
#endif

#define PA_V2_ENTRY(SUFFIX, T, D, BS)                                                                             \
    extern "C" __global__ void __launch_bounds__(PA_THREADS) decode_paged_v2_##SUFFIX##_d##D##_bs##BS(           \
        float* o_part, float* m_part, float* l_part, const T* q, const T* kc, const T* vc, const int* block_tables, \
        const int* seq_lens, const float* slopes, int HKV, int max_blocks, float scale) {                        \
        paged_attention<T, D, BS, PA_PARTITION>(nullptr, nullptr, o_part, m_part, l_part, q, kc, vc, block_tables, \
                                                seq_lens, slopes, HKV, max_blocks, scale);                       \
    }
PA_ENTRIES(PA_V2_ENTRY)

#define PA_REDUCE_ENTRY(SUFFIX, T)                                                                                \
    extern "C" __global__ void decode_paged_reduce_##SUFFIX(T* out, float* lse, const float* o_part,              \
                                                            const float* m_part, const float* l_part, int parts, int D) { \
        decode_combine<T>(out, lse, o_part, m_part, l_part, parts, D, true);                                      \
    }
PA_REDUCE_ENTRY(bf16, __nv_bfloat16)
PA_REDUCE_ENTRY(f16, __half)
