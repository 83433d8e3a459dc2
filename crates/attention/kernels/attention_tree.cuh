// attention_tree.cuh: the shared-memory tree reduction of the report's reduction stage, used by
// prefill stages 02 and 03. Every thread stores its value in buf[threadIdx.x]; the stride starts at
// blockDim.x / 2 and halves, the lower half of the still-active threads folding in the upper half,
// with a barrier between steps (log2(blockDim.x) barriers in all). Needs blockDim.x to be a power of
// two and buf to hold blockDim.x floats. Every thread gets the result; the barrier at the end lets
// the caller reuse buf at once.
#pragma once
#include "ladder_reduce.cuh"

template <typename Op>
__device__ __forceinline__ float tree_reduce(float* buf, float v) {
    const unsigned tid = threadIdx.x;
    buf[tid] = v;
    for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        __syncthreads();
        if (tid < stride) buf[tid] = Op::apply(buf[tid], buf[tid + stride]);
    }
    __syncthreads();
    float r = buf[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float tree_sum(float* buf, float v) { return tree_reduce<LadderSum>(buf, v); }
__device__ __forceinline__ float tree_max(float* buf, float v) { return tree_reduce<LadderMax>(buf, v); }
