// Decode offload, stage 2: streams (the sequence in chunks, copy of chunk i+1 under compute of chunk i).
// Changed from stage 1: the host cache is sent in `chunks` slices along the sequence, each on its own
//   stream: chunk c's K and V rows of every sequence (one strided 2D copy each),
//   then the decode stage on that chunk alone, giving O_c and lse_c. The copy engine runs the
//   copies back to back while the SMs compute on the chunks already there. This kernel merges the
//   chunks' results by logsumexp: O = sum_c exp(lse_c - M) O_c / sum_c exp(lse_c - M), lse = M + log
//   of that sum, with M the largest lse_c. Chunk c ends at token end_c, and it was decoded as if
//   its last token were the query's position: with ALiBi its scores all lack slope * (end_c - seq),
//   a constant that leaves O_c unchanged and is added to lse_c here. Chunks are balanced: chunk c
//   holds tokens [c*seq/chunks, (c+1)*seq/chunks), none empty.
// Why it should be faster: stage 1's time is copy + compute; here it is about copy + one chunk's
//   compute + this merge, so at most the compute time minus a chunk's is won. Over PCIe the copy is
//   some 50x longer than the compute, so the gain is a few percent: streams hide compute, they do not
//   make the link faster.
// Launch: offload_merge_{bf16,f16}: grid (B*HQ), block D; the chunks' O_c [B*HQ, D], lse_c [B*HQ]
//   and end_c passed in one by-value struct of OFFLOAD_MAX_CHUNKS entries.
// Constraints: the decode stage's (it computes every chunk); 1 <= chunks <= 16; chunks <= seq, so no
//   chunk is empty. Tolerance: rel L2 <= 1e-2 (each O_c is rounded to the cache type once).
// Limits: D in {64, 128}; HQ % HKV == 0; B <= 65535; B * HQ * Tmax < 2^31; HQ / HKV <= 16; 1 <= chunks <= 16; chunks <= seq
#include "ladder.cuh"
#include "ladder_convert.cuh"
#include "ladder_split_merge.cuh"

#define OFFLOAD_MAX_CHUNKS 16

template <typename T>
struct OffloadChunks {
    const T* out[OFFLOAD_MAX_CHUNKS];
    const float* lse[OFFLOAD_MAX_CHUNKS];
    int end[OFFLOAD_MAX_CHUNKS];
};

// The chunks as split partials of the split merge (ladder_split_merge.cuh): chunk c's output is
// normalized, its max its lse (shifted to its end with ALiBi), its sum 1. Chunk c's results were
// written by an earlier launch: plain loads.
template <typename T>
struct OffloadLayout {
    const OffloadChunks<T>& parts;
    int row, D, seq;
    float slope;
    __device__ __forceinline__ float m(int c) const { return parts.lse[c][row] + slope * (float)(parts.end[c] - seq); }
    __device__ __forceinline__ float l(int) const { return 1.0f; }
    __device__ __forceinline__ float o_at(int c, int d) const { return to_float(parts.out[c][(size_t)row * D + d]); }
    __device__ __forceinline__ static float weight(float ms, float mx) { return __expf(ms - mx); }
    static constexpr bool zeros_when_empty = true;  // chunks <= seq: none is empty
};

template <typename T>
__device__ __forceinline__ void offload_merge(T* out, float* lse, const OffloadChunks<T>& parts, int chunks,
                                              const float* slopes, int HQ, int seq) {
    const int row = blockIdx.x, D = blockDim.x, d = threadIdx.x;
    const float slope = slopes != nullptr ? slopes[row % HQ] : 0.0f;
    const SplitMerged r = merge_column(OffloadLayout<T>{parts, row, D, seq, slope}, chunks, d, true);
    out[(size_t)row * D + d] = from_float<T>(r.value);
    if (d == 0) lse[row] = r.mx + __logf(r.sum);
}

extern "C" __global__ void offload_merge_bf16(__nv_bfloat16* out, float* lse, OffloadChunks<__nv_bfloat16> parts,
                                              int chunks, const float* slopes, int HQ, int seq) {
    offload_merge(out, lse, parts, chunks, slopes, HQ, seq);
}
extern "C" __global__ void offload_merge_f16(__half* out, float* lse, OffloadChunks<__half> parts, int chunks,
                                             const float* slopes, int HQ, int seq) {
    offload_merge(out, lse, parts, chunks, slopes, HQ, seq);
}
