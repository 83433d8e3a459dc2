// Decode attention, stage 3: paged-v1 (vLLM's v1 kernel on the paged cache, reference 001).
// Changed from stage 1: the cache is a pool of blocks of BS tokens reached through a block table
//   (vLLM's layout: K [blocks, HKV, D/x, BS, x], V [blocks, HKV, D, BS]). Thread groups are sized so
//   a warp covers one KV block and each group reads 16 bytes per key per step; q sits in registers;
//   V is read 16 bytes (8 tokens) of a row at a time; the tail block's slots past the length are
//   never used as data (kernel body: paged_attention in attention_paged.cuh).
// Why it should be as fast as stage 1: the same bytes, in 16-byte loads; the indirection costs one
//   table read per block. It has stage 1's limit too: B*HQ blocks, so short batches underfill the GPU.
// Launch: grid (HQ, B), block PA_THREADS (128), dynamic shared memory 4 * max_blocks * BS bytes.
//   Entries decode_paged_v1_{bf16,f16}_d{64,128}_bs{16,32}.
// Constraints: D in {64, 128}; block_size in {16, 32}; HQ % HKV == 0; max_blocks * block_size <= 32768
//   (the scores in shared memory); block-table entries inside the pool and lengths inside their
//   blocks (checked on the host). Tolerance: rel L2 <= 1e-2.
// Limits: D in {64, 128}; HQ % HKV == 0; B <= 65535; block_size in {16, 32}; max_blocks * block_size <= 32768
#include "attention_paged.cuh"

#define PA_V1_ENTRY(SUFFIX, T, D, BS)                                                                             \
    extern "C" __global__ void __launch_bounds__(PA_THREADS) decode_paged_v1_##SUFFIX##_d##D##_bs##BS(           \
        T* out, float* lse, const T* q, const T* kc, const T* vc, const int* block_tables, const int* seq_lens,  \
        const float* slopes, int HKV, int max_blocks, float scale) {                                             \
        paged_attention<T, D, BS, 0>(out, lse, nullptr, nullptr, nullptr, q, kc, vc, block_tables, seq_lens,     \
                                     slopes, HKV, max_blocks, scale);                                            \
    }
PA_ENTRIES(PA_V1_ENTRY)
