// ladder_reduce.cuh: warp- and block-level reductions shared by every family.
// Warp reductions use __shfl_xor_sync butterflies, so every lane ends with the result.
// Block reductions go warp -> shared memory (one slot per warp) -> warp, and return the result to
// every thread; they need blockDim.x to be a multiple of 32 and at most 1024.
#pragma once
#include "ladder.cuh"

struct LadderSum {
    __device__ static float identity() { return 0.0f; }
    __device__ static float apply(float a, float b) { return a + b; }
};

struct LadderMax {
    __device__ static float identity() { return -INFINITY; }
    __device__ static float apply(float a, float b) { return fmaxf(a, b); }
};

template <typename Op>
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce<LadderSum>(v); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce<LadderMax>(v); }

// The mean of a row of len elements held by a warp, each lane's share in v (zeros past the row).
template <int S>
__device__ __forceinline__ float warp_mean(const float (&v)[S], int len) {
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < S; s++) sum += v[s];
    return warp_sum(sum) / len;
}

// `scratch` must hold 32 floats; the function synchronises before returning so `scratch` can be
// reused by the next call.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = warp_reduce<Op>(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = (lane < warps) ? scratch[lane] : Op::identity();
    v = warp_reduce<Op>(v);
    __syncthreads();
    return v;
}

__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce<LadderSum>(v, scratch); }
__device__ __forceinline__ float block_max(float v, float* scratch) { return block_reduce<LadderMax>(v, scratch); }
