// Decode attention, stage 10: cluster-merge (a (sequence, KV head)'s splits as one thread-block
// cluster, merged through distributed shared memory).
// Changed from stage 9: with several splits, the splits of a (sequence, KV head) are the blocks of
//   one cluster (the host launches clusters of `splits` blocks along x, so at most 8 splits). Each
//   block leaves its partial (O [G][D], m and l per row) in its own shared memory; a cluster barrier
//   (arrive.release / wait.acquire) makes them visible, and the cluster's blocks merge the G * D
//   outputs by reading every split's partial from its block's shared memory (stage 8's batched
//   merge, one request a split); a second barrier keeps each block's shared memory alive until its
//   peers have read it. No partials in global memory, no fence, no ticket, no last block.
//   One split runs stage 9's single-split entry.
// Why it should be faster: in the decode step's chain at B = 1 (decode-step 13's timeline, 8 splits a
//   head) the split's partials are done 2.4 us after the wait, the ticket (a fence for the partials'
//   stores to reach L2, then an atomic) takes 1.25 us more and the last block's merge, from L2,
//   1.35 us. A cluster barrier and reads of peers' shared memory stay inside the GPC: predicted the
//   attention link 6.2 -> ~4.5 us at B = 1 (~20 us a step); one split (B >= 6 at GPT-2's shape) as
//   stage 9. Measured (H100): alone at GPT-2's B = 1, 9.06 us against stage 9's 10.18 (1.12x); in
//   the decode step's chain slower (252.4 against 246.2 us a step): a cluster's blocks must be
//   resident on one GPC together, and under the QKV GEMV some came late (docs/notes/attention.md).
// Launch: decode_tc_single_{bf16,f16}_d{64,128} (one split: stage 9's) or decode_tc_cluster_*
//   (several): grid (splits, HKV, B), cluster (splits, 1, 1), block 32*TC_WARPS, dynamic shared
//   memory TC_WARPS*TC_STAGES*2*16*D*2 bytes (the ring), static 16*D + 32 floats (the partial).
//   Built with LADDER_DEPENDENT, both entries request their first tiles, then wait for the previous
//   kernel, then let the next one launch (stage 9).
// Constraints: stage 7's; sm_90 (clusters). Tolerance: rel L2 <= 1e-2.
// Limits: D in {64, 128}; HQ % HKV == 0; B <= 65535; B * HQ * Tmax < 2^31; splits <= 8; HQ / HKV <= 16
#include "attention_decode_mma.cuh"
#include "ladder_dependent.cuh"
#include "ladder_hopper.cuh"
#include "ladder_split_merge.cuh"

#if !defined(TC_WARPS) || !defined(TC_STAGES)
#error "TC_WARPS (warps per block) and TC_STAGES (K/V tiles per warp ring) are tunables: the stage list sets them"
#endif

// Split s's partial of one row, in the shared memory of the cluster's block s (ladder_split_merge's
// layout signature): written by every split, empty ones included (m = -inf, l = 0, O = 0).
struct SplitClusterPeers {
    const float* o;   // this block's row: o[d]
    const float* m_;  // this block's m of the row
    const float* l_;
    __device__ __forceinline__ float m(int s) const { return *cluster_peer(m_, s); }
    __device__ __forceinline__ float l(int s) const { return *cluster_peer(l_, s); }
    __device__ __forceinline__ float o_at(int s, int d) const { return *cluster_peer(o + d, s); }
    __device__ __forceinline__ static float weight(float ms, float mx) { return __expf(ms - mx); }
    static constexpr bool zeros_when_empty = true;
};

constexpr int kClusterMaxSplits = 8;  // the portable cluster size

// The chain's wait, then its trigger (ladder_dependent.cuh), which the split kernel takes after its
// first K/V tiles (stage 9's part).
__device__ __forceinline__ void decode_chain_wait() {
    ladder_wait_prerequisites();
    ladder_launch_dependents();
}

template <typename T, int D>
__device__ __forceinline__ void cluster_merge_decode(T* out, float* lse, const T* q, const T* k, const T* v,
                                                     const int* seq_lens, const float* slopes, int Tmax, int G,
                                                     float scale) {
    __shared__ float part_o[16 * D], part_m[16], part_l[16];
    tensor_core_decode<T, D, TC_WARPS, TC_STAGES, DecodeOut::SharedPartials, EarlyCache<decode_chain_wait>>(
        nullptr, nullptr, part_o, part_m, part_l, q, k, v, seq_lens, slopes, Tmax, G, scale);
    ladder_chain_mark(0);
    cluster_sync_all();  // every split's partial is in its block's shared memory
    ladder_chain_mark(1);
    const int splits = gridDim.x, b = blockIdx.z, HQ = gridDim.y * G, hq0 = blockIdx.y * G;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < G * D; idx += splits * blockDim.x) {
        const int r = idx / D, d = idx % D;
        const SplitMerged m = merge_column_batched<kClusterMaxSplits>(
            SplitClusterPeers{part_o + r * D, part_m + r, part_l + r}, splits, d, false);
        const size_t row = (size_t)b * HQ + hq0 + r;
        out[row * D + d] = from_float<T>(m.value);
        if (d == 0) lse[row] = m.mx + __logf(m.sum);
    }
    cluster_sync_relaxed();  // no block leaves while a peer may still read its shared memory
}

#define CLUSTER_ENTRY(SUFFIX, T, D)                                                                               \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32) decode_tc_cluster_##SUFFIX##_d##D(              \
        T* out, float* lse, const T* q, const T* k, const T* v, const int* seq_lens, const float* slopes, int Tmax, \
        int G, float scale) {                                                                                     \
        LADDER_CHAIN_BLOCK();                                                                                     \
        cluster_merge_decode<T, D>(out, lse, q, k, v, seq_lens, slopes, Tmax, G, scale);                          \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32) decode_tc_single_##SUFFIX##_d##D(               \
        T* out, float* lse, const T* q, const T* k, const T* v, const int* seq_lens, const float* slopes, int Tmax, \
        int G, float scale) {                                                                                     \
        LADDER_CHAIN_BLOCK();                                                                                     \
        tensor_core_decode<T, D, TC_WARPS, TC_STAGES, DecodeOut::Final, EarlyCache<decode_chain_wait>>(                                    \
            out, lse, nullptr, nullptr, nullptr, q, k, v, seq_lens, slopes, Tmax, G, scale);                      \
    }
CLUSTER_ENTRY(bf16, __nv_bfloat16, 64)
CLUSTER_ENTRY(bf16, __nv_bfloat16, 128)
CLUSTER_ENTRY(f16, __half, 64)
CLUSTER_ENTRY(f16, __half, 128)
