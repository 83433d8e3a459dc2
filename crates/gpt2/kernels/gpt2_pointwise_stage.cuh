// gpt2_pointwise_stage.cuh: the elementwise stages' frame (GELU and the residual add): PW_THREADS
// threads a block, and the vectorized stages' split of n elements into float4s and a tail.
#pragma once
#include "gpt2_pointwise.cuh"

#ifndef PW_THREADS
#error "PW_THREADS (threads per block) is the stage's tunable: the Rust plan passes it"
#endif

// The vectorized stages' share of n elements for thread i of the grid: i < n / 4 takes float4 i
// (vec4(i)); the next n % 4 threads take the tail's elements one each (one(j), j from 4 (n / 4)).
template <class Vec4, class One>
__device__ __forceinline__ void pw_split4(int n, Vec4 vec4, One one) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int n4 = n / 4;
    if (i < n4) {
        vec4(i);
    } else if (i - n4 < n % 4) {
        one(4 * n4 + (i - n4));
    }
}
