// matmul_wmma.cuh: the pieces of the WMMA (tensor-core, fp16 x fp16 -> fp32) GEMM stages.
// Operands are prepared by matmul_aux.cuh's kernels: a = inp as fp16, Mp x Kp row-major; bt = the
// weights transposed to Kp x Np row-major as fp16; Mp, Np, Kp are M, N, K rounded up to 16 and the
// padding holds zeros, so every 16 x 16 x 16 fragment load is in bounds and 32-byte aligned.
// The accumulator tile goes through a per-warp shared-memory stage so the store can skip the
// padded rows/columns and apply the epilogue (bias, optionally GELU or a residual) element-wise.
#pragma once
#include <mma.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include "matmul_aux.cuh"

#define MM_EPI_BIAS 0
#define MM_EPI_GELU 1
#define MM_EPI_RESIDUAL 2

// Writes the 16 x 16 tile `stage` (row-major, fp32) to out[row0.., col0..] within M x N, adding
// bias[col] (when bias != NULL) and then GELU (EPI 1) or residual[row, col] (EPI 2). Each of the
// 8 steps writes two 16-float row segments per warp.
template <int EPI>
__device__ __forceinline__ void mm_store_tile(const float* stage, float* out, const float* bias, const float* residual,
                                              int row0, int col0, int M, int N) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int idx = i * 32 + lane;
        int row = row0 + (idx >> 4), col = col0 + (idx & 15);
        if (row < M && col < N) {
            float v = stage[idx];
            if (bias != nullptr) v += bias[col];
            size_t o = (size_t)row * N + col;
            if (EPI == MM_EPI_GELU) v = mm_gelu_tanh(v);
            if (EPI == MM_EPI_RESIDUAL) v += residual[o];
            out[o] = v;
        }
    }
}
