// Sampling, stage 0: threshold search (a block per row, the row in shared memory).
// What it does: ids[b] is drawn from softmax(logits[b, :V] / T) restricted to the top-k tokens and
//   then to the top-p nucleus, with uniforms[b] in [0, 1) as the draw. No sort: the weights
//   e_i = exp((x_i - max) / T) are positive floats, whose bit patterns order like their values, so
//   "the k largest" and "the smallest set of largest weights with mass >= p" are both the tokens
//   whose bits are >= a threshold, found by binary search over the 31 bits: the largest t with
//   count(bits >= t) >= k, then the largest t' >= t with sum(e_i : bits >= t') >= p * sum(e_i :
//   bits >= t). The kept tokens are then walked in index order (any fixed order draws from the same
//   distribution): a block-wide prefix sum finds the first index whose running mass exceeds
//   u * (kept mass). Ties at a threshold are all kept (the host sampler's rule too).
// Why: the host path downloads B x V logits (200 KB a row) and sorts 50257 floats per row on the
//   CPU; here B ints come back. Each search step is one pass over the row in shared memory and a
//   block reduction, about 31 of them per search; skipped when k >= V or p = 1.
// Launch: sample_threshold: grid B, block 1024, dynamic shared memory 4 V bytes.
// Constraints: V <= 56 * 1024 (the row in shared memory); ld >= V; B * ld < 2^31; T > 0;
//   1 <= top_k (>= V: off); 0 < top_p <= 1.
// Tolerance: exact ids, except a draw within 1e-5 of a token boundary (fp32 sums; checked on the host).
// Limits: V <= 57344; B * ld < 2^31; ld >= V
#include "ladder.cuh"
#include "ladder_reduce.cuh"

#define SAMPLE_THREADS 1024

// Sum (or count) over the block; every thread gets the result. `red` holds 32 floats.
__device__ __forceinline__ float block_sum_all(float x, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = warp_sum(x);
    __syncthreads();  // red may still be read by the previous call
    if (lane == 0) red[warp] = x;
    __syncthreads();
    x = lane < SAMPLE_THREADS / 32 ? red[lane] : 0.0f;
    return warp_sum(x);
}

__device__ __forceinline__ float block_max_all(float x, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) red[warp] = x;
    __syncthreads();
    x = lane < SAMPLE_THREADS / 32 ? red[lane] : -INFINITY;
    return warp_max(x);
}

// Count (count = true) or mass of the weights whose bits are >= t.
__device__ __forceinline__ float above(const float* e, int V, unsigned t, bool count, float* red) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < V; i += SAMPLE_THREADS) {
        const float x = e[i];
        if (__float_as_uint(x) >= t) acc += count ? 1.0f : x;
    }
    return block_sum_all(acc, red);
}

// The largest t in [lo, 2^31) with above(t) >= target (above(lo) >= target holds).
__device__ unsigned search(const float* e, int V, unsigned lo, float target, bool count, float* red) {
    unsigned hi = 0x7f800001u;  // past +inf: above(hi) = 0 < target
    while (hi - lo > 1) {
        const unsigned mid = lo + (hi - lo) / 2;
        if (above(e, V, mid, count, red) >= target) lo = mid;
        else hi = mid;
    }
    return lo;
}

extern "C" __global__ void sample_threshold(int* ids, const float* logits, const float* uniforms, int V, int ld,
                                            float inv_temp, int top_k, float top_p) {
    extern __shared__ float e[];
    __shared__ float red[32];
    __shared__ int found;
    const float* row = logits + (size_t)blockIdx.x * ld;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < V; i += SAMPLE_THREADS) m = fmaxf(m, row[i]);
    m = block_max_all(m, red);
    for (int i = threadIdx.x; i < V; i += SAMPLE_THREADS) e[i] = __expf((row[i] - m) * inv_temp);
    __syncthreads();

    unsigned t = 0;
    if (top_k < V) t = search(e, V, 0, (float)top_k, true, red);
    if (top_p < 1.0f) {
        const float mass = above(e, V, t, false, red);
        t = search(e, V, t, top_p * mass, false, red);
    }
    const float kept = above(e, V, t, false, red);
    const float target = uniforms[blockIdx.x] * kept;

    // Thread j walks indices [j * chunk, (j + 1) * chunk): its kept mass, an exclusive block scan,
    // then the thread whose range holds the target finds the index.
    const int chunk = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int begin = min((int)threadIdx.x * chunk, V), end = min(begin + chunk, V);
    float mine = 0.0f;
    for (int i = begin; i < end; ++i)
        if (__float_as_uint(e[i]) >= t) mine += e[i];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float incl = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    __syncthreads();
    if (lane == 31) red[warp] = incl;
    if (threadIdx.x == 0) found = -1;
    __syncthreads();
    float before = incl - mine;
    for (int w = 0; w < warp; ++w) before += red[w];
    if (before <= target && target < before + mine) {
        float run = before;
        for (int i = begin; i < end; ++i) {
            if (__float_as_uint(e[i]) < t) continue;
            run += e[i];
            if (run > target) {
                found = i;  // one thread's range holds the target (a rounding tie: any writer is valid)
                break;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int id = found;
        if (id < 0) {
            // The target fell past the last kept token's running sum by rounding: the last kept token.
            for (int i = V - 1; i >= 0; --i)
                if (__float_as_uint(e[i]) >= t) {
                    id = i;
                    break;
                }
        }
        ids[blockIdx.x] = id;
    }
}
