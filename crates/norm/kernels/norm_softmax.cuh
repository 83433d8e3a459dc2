// norm_softmax.cuh: the softmax stages' shared pieces.
#pragma once

// The warp-per-row stages' frame (softmax stages 2 and 3): warp w of block blockIdx.x takes row
// blockIdx.x * WARPS + w, whole warps returning past the last row, and runs body(x, o, len, lane) on
// it: the row's input and output and its length, T or, causal, the row's own position + 1 (the rest
// of a causal row's output is zero).
template <int WARPS, typename Body>
__device__ __forceinline__ void softmax_warp_row(float* __restrict__ out, const float* __restrict__ inp, int rows,
                                                 int T, int causal, const Body& body) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;
    body(inp + (size_t)row * T, out + (size_t)row * T, causal ? (row % T) + 1 : T, lane);
}
