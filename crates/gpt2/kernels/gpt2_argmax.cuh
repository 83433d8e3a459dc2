// gpt2_argmax.cuh: the argmax stages' merge of (value, index) pairs: the larger value wins, the lower
// index among equals (the host sampler's rule); NaN never wins (every comparison with it is false).
#pragma once
#include "ladder.cuh"

// (v, i) beats (w, j) when larger, or equal with the lower index.
__device__ __forceinline__ bool beats(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

// The warp's best pair, in every lane.
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, off);
        const int j = __shfl_xor_sync(0xffffffffu, i, off);
        if (beats(w, j, v, i)) {
            v = w;
            i = j;
        }
    }
}

// The block's (max, index) over its threads' pairs (up to 32 warps), valid in warp 0: each warp's
// best through shared memory, merged by warp 0. Both stages end their rows' scans with it.
__device__ __forceinline__ void block_argmax(float& v, int& i) {
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    warp_argmax(v, i);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        best_v[warp] = v;
        best_i[warp] = i;
    }
    __syncthreads();
    if (warp == 0) {
        const bool have = lane < (int)(blockDim.x >> 5);
        v = have ? best_v[lane] : -INFINITY;
        i = have ? best_i[lane] : 0x7fffffff;
        warp_argmax(v, i);
    }
}
