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


