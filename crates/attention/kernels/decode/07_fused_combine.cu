// Decode attention, stage 7: fused-combine (one launch per call, splits only where the SMs are idle).
// Changed from stage 6: what happens around the kernel, not inside it.
//   - The split count fills the SMs at most once instead of four times: s = max(1, floor(SMs /
//     (B*HKV))), at most one split per 128 tokens, so any shape with B*HKV >= SMs/2 runs unsplit.
//     A block keeps 2 x 8 KiB tiles in flight per warp, so even one block per SM has far more bytes
//     in flight than the copy rate needs (about 18 KiB per SM at ~0.8 us latency), and every extra
//     split costs a pipeline fill, a merge and partials.
//   - With one split the block writes O / l and the lse itself: no partials, no second kernel.
//   - With several, each block, after writing its partial, takes a ticket from a per-(sequence, KV
//     head) counter (__threadfence, then atomicAdd); the block that draws the last ticket merges
//     the splits of its G query heads (through L2, stage 2's logsumexp rescaling) and resets the
//     counter for the next call, so graph replays need no reset.
// Why it should be faster: measured on stage 6 (H100, docs/notes/attention.md), one split beat the
//   heuristic's 2-5 at every long shape (GQA 32:4 B = 32: 185 us at 1 split against 198 us at 5),
//   and the combine is a second launch and gap of a few us, a fifth of the call at GPT-2's B = 1.
//   A first version that always merged through the ticket, with splits sized to whole waves, was
//   slower: 17-33 splits, and even at one split the in-kernel merge cost 8%; so did a kernel that
//   held both epilogues behind a branch on gridDim.x (they are now two entry points). The merging
//   path is for small batches only. Predicted: long shapes at stage 6's one-split times less the
//   combine (GQA B = 32 about 182 us, 97% of copy); GPT-2 B = 1 and 8 about 1-2 us faster.
// Stage 8 (DECODE_BATCHED_MERGE): the last block's merge requests every split's m, l and o at once
//   (merge_column_batched, 16 splits a round trip) instead of one split after another, each split's
//   l and o waiting for its m behind a branch. Why: in the decode step's chain (`ladder timeline gpt2
//   --op decode-step`, B = 1: 8 splits a head) the merge took 2.8 us from the last ticket to the
//   block's return, on every layer's critical path; one L2 round trip is ~0.7 us. Predicted: the
//   merge ~1 us, the attention link ~1.8 us shorter at B = 1 (~22 us a step); unsplit shapes as
//   stage 7.
// Stage 9 (DECODE_EARLY_CACHE): a block requests its split's first tiles (two a warp: the whole split
//   of 125 keys at GPT-2's B = 1) before it waits for the kernel before it, and q and the step's own
//   K/V row after (attention_decode_mma.cuh: no kernel of the step writes the rows before it). Why:
//   in the decode step's chain at B = 1 (stage 12's timeline) a split took 4.6 us from its wait to
//   its partials, a trip for q, then K, then V, while the QKV GEMV before it runs for ~2.3 us with
//   the attention blocks already resident. Predicted: the split's K/V trip under the QKV GEMV, the
//   attention link 8.1 -> ~6 us at B = 1 (~20 us a step); at B = 8 and 32 (one split of 1000 keys)
//   only the first two tiles a warp, ~0.5 us a layer. Measured (H100, decode-step 13): the link
//   8.1 -> 6.2 us, the step 259.8 -> 246.2 / 368.4 -> 349.9 / 1027 -> 991 us at B = 1 / 8 / 32;
//   alone, with no kernel before it to hide under, 0.95x stage 8 at B = 1 (one more trip).
// Stage 11 (DECODE_WARPS_BY_SHAPE): every entry also at 8 and 16 warps a block (`_w4`, `_w8`, `_w16`),
//   and the host launches the most warps that leave each warp two 16-token tiles of its split and
//   every block of the launch resident at once. Why: a warp keeps STAGES - 1 = 2 tile pairs in flight,
//   4 KB each at D = 64, so a 4-warp block has 16 KB in flight; at ~1 us of loaded DRAM latency that
//   is 16 GB/s a block, and GPT-2's B = 8 (96 unsplit blocks on 96 SMs) reads its 25 MB at 1.8 TB/s
//   (13.5 us from the wait in the decode step's chain, H200; 15.4 us alone on an H100, 54% of copy).
//   Splitting further costs a merge (in the step, the projection's merge grew to 11 us at 4 splits);
//   more warps a block keep the merge in shared memory and 4x the bytes in flight. Predicted: B = 8
//   ~6-7 us in the chain (the bytes at ~4 TB/s), the step ~70 us shorter; B = 1 and B >= 32 (where the
//   splits or the blocks already fill the SMs) unchanged. Measured (H200, decode-step 17): in the
//   chain the attention's last return after its wait 14.1 -> 8.3 us at B = 8, the step 334 -> 284 us
//   (1.17x); B = 1 and 32 equal. Alone 1.03x at B = 8 (14.3 against 14.8 us, most of it the call's
//   fixed cost: B = 1 takes 9.5), 1.01-1.03x where D = 128 runs 8 warps, the rest equal. With 16
//   warps, stage 9's early tiles are half of a B = 8 split (32 of 63 tiles) instead of an eighth.
// Launch: decode_tc_single_{bf16,f16}_d{64,128} (one split) or decode_tc_fused_* (several): grid
//   (splits, HKV, B), block 32*TC_WARPS, dynamic shared memory TC_WARPS*TC_STAGES*2*16*D*2 bytes;
//   the fused entry takes a zeroed int ticket per (sequence, KV head).
//   Built with LADDER_DEPENDENT (a link of the decode step's dependent chain, ladder_dependent.cuh)
//   both entries first wait for the previous kernel, then let the next one launch.
// Constraints: stage 6's. Tolerance: rel L2 <= 1e-2.
// Limits: D in {64, 128}; HQ % HKV == 0; B <= 65535; B * HQ * Tmax < 2^31; splits <= 256; HQ / HKV <= 16
#include "attention_decode_mma.cuh"
#include "ladder_dependent.cuh"

#if !defined(TC_WARPS) || !defined(TC_STAGES)
#error "TC_WARPS (warps per block) and TC_STAGES (K/V tiles per warp ring) are tunables: the stage list sets them"
#endif

// Stage 8's part: splits merged 16 at a time, their loads together (0: one split at a time).
#ifdef DECODE_BATCHED_MERGE
constexpr int kMergeBatch = 16;
#else
constexpr int kMergeBatch = 0;
#endif

// The chain's wait, then its trigger (ladder_dependent.cuh).
__device__ __forceinline__ void decode_chain_wait() {
    ladder_wait_prerequisites();
    ladder_launch_dependents();
}

// Stage 9's part: the split's first K/V tiles requested before the chain's wait, which the split
// kernel then takes (LateCache: after the entry's wait).
#ifdef DECODE_EARLY_CACHE
using SplitCache = EarlyCache<decode_chain_wait>;
#else
using SplitCache = LateCache;
#endif

// The chain's wait and trigger at the top of an entry, unless the split kernel takes them itself
// after its early tiles.
__device__ __forceinline__ void decode_entry_prerequisites() {
    if constexpr (!SplitCache::early) decode_chain_wait();
}

// Several splits: each writes its partial; the last of a (sequence, KV head) to finish merges.
template <typename T, int D, int W>
__device__ __forceinline__ void fused_combine_decode(T* out, float* lse, float* o_part, float* m_part, float* l_part,
                                                     int* tickets, const T* q, const T* k, const T* v,
                                                     const int* seq_lens, const float* slopes, int Tmax, int G,
                                                     float scale) {
    tensor_core_decode<T, D, W, TC_STAGES, DecodeOut::GlobalPartials, SplitCache>(nullptr, nullptr, o_part, m_part,
                                                                               l_part, q, k, v, seq_lens, slopes,
                                                                               Tmax, G, scale);
    ladder_chain_mark(0);
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
    ladder_chain_mark(1);
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int r = idx / D, d = idx % D;
        const size_t row = (size_t)b * HQ + hq0 + r;
        decode_merge_row<T, kMergeBatch>(out + row * D, lse + row, o_part + row * splits * D, m_part + row * splits,
                                         l_part + row * splits, splits, D, d, false);
    }
}

// The entries of one dtype, head size and warp count W, named with NAME after the head size.
#define FUSED_ENTRY(SUFFIX, T, D, W, NAME)                                                                        \
    extern "C" __global__ void __launch_bounds__(W * 32) decode_tc_fused_##SUFFIX##_d##D##NAME(                   \
        T* out, float* lse, float* o_part, float* m_part, float* l_part, int* tickets, const T* q, const T* k,   \
        const T* v, const int* seq_lens, const float* slopes, int Tmax, int G, float scale) {                    \
        LADDER_CHAIN_BLOCK();                                                                                    \
        decode_entry_prerequisites();                                                                            \
        fused_combine_decode<T, D, W>(out, lse, o_part, m_part, l_part, tickets, q, k, v, seq_lens, slopes, Tmax, \
                                      G, scale);                                                                 \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(W * 32) decode_tc_single_##SUFFIX##_d##D##NAME(                  \
        T* out, float* lse, const T* q, const T* k, const T* v, const int* seq_lens, const float* slopes, int Tmax, \
        int G, float scale) {                                                                                     \
        LADDER_CHAIN_BLOCK();                                                                                     \
        decode_entry_prerequisites();                                                                             \
        tensor_core_decode<T, D, W, TC_STAGES, DecodeOut::Final, SplitCache>(out, lse, nullptr, nullptr, nullptr, q, \
                                                                            k, v, seq_lens, slopes, Tmax, G, scale); \
    }                                                                                                             \
    PARTIALS_ENTRY(SUFFIX, T, D, W, NAME)
#ifdef DECODE_PARTIALS_OUT
// DECODE_PARTIALS_OUT (a host switch of the decode step's attention, `decode-step` 14): several
// splits, each writing its partial and nothing else: no fence, ticket or merging block. The next
// kernel, the attention projection (gemv's GEMV_MERGE_SPLITS), merges them as it stages its input.
#define PARTIALS_ENTRY(SUFFIX, T, D, W, NAME)                                                                    \
    extern "C" __global__ void __launch_bounds__(W * 32) decode_tc_partials_##SUFFIX##_d##D##NAME(                \
        float* o_part, float* m_part, float* l_part, const T* q, const T* k, const T* v, const int* seq_lens,   \
        const float* slopes, int Tmax, int G, float scale) {                                                     \
        LADDER_CHAIN_BLOCK();                                                                                    \
        decode_entry_prerequisites();                                                                            \
        tensor_core_decode<T, D, W, TC_STAGES, DecodeOut::GlobalPartials, SplitCache>(                          \
            nullptr, nullptr, o_part, m_part, l_part, q, k, v, seq_lens, slopes, Tmax, G, scale);                \
        ladder_chain_mark(0);                                                                                    \
    }
#else
#define PARTIALS_ENTRY(SUFFIX, T, D, W, NAME)
#endif

// Every dtype at head size D and W warps a block.
#define ENTRIES_AT(D, W, NAME)                    \
    FUSED_ENTRY(bf16, __nv_bfloat16, D, W, NAME)  \
    FUSED_ENTRY(f16, __half, D, W, NAME)

#ifdef DECODE_WARPS_BY_SHAPE
// Stage 11's part: the warp counts the host chooses from (decode.rs's WARP_CHOICES), the fewest being
// the stage's TC_WARPS.
// At D = 128 a 16-warp block's ring (384 KB) does not fit shared memory: 4 and 8 warps only.
static_assert(TC_WARPS == 4, "stage 11's entries are 4, 8 and 16 warps a block");
ENTRIES_AT(64, 4, _w4)
ENTRIES_AT(64, 8, _w8)
ENTRIES_AT(64, 16, _w16)
ENTRIES_AT(128, 4, _w4)
ENTRIES_AT(128, 8, _w8)
#else
ENTRIES_AT(64, TC_WARPS, )
ENTRIES_AT(128, TC_WARPS, )
#endif
