// matmul_aux.cuh: the small kernels around the GEMMs of the matmul family. Included by every stage
// file, so any stage's module (and the naive stage's, which the cuBLAS rows borrow) has them:
//   - weight/input preprocessing for the WMMA stages: fp32 transpose, fp32 -> fp16 conversion with
//     zero padding, and the fused transpose-and-convert of stage 4;
//   - the bias pass after a cuBLAS GEMM (llm.c's / the report's prepareOut, applied after the GEMM);
//   - fp16 -> fp32 with bias, after a cuBLAS fp16 GEMM.
// Every kernel covers its whole (padded) output and writes zeros into the padding, so scratch
// buffers never need clearing. Element counts are < 2^31 (checked by the Rust launcher); offsets
// are computed in size_t anyway.
#pragma once
#include <cuda_fp16.h>
#include "matmul_tail.cuh"


// wt[k, n] = convert(w[n, k]) for k < Kp, n < Np (zero outside N x K). w is N x K row-major, wt
// Kp x Np. Block (32, 8) transposes a 32 x 32 tile through shared memory: both the read (along k)
// and the write (along n) are coalesced. Grid (ceil(Np/32), ceil(Kp/32)).
template <typename T, typename Convert>
__device__ __forceinline__ void mm_transpose_tile(const float* w, T* wt, int N, int K, int Np, int Kp,
                                                  Convert convert) {
    __shared__ float tile[32][33];
    const int n0 = blockIdx.x * 32, k0 = blockIdx.y * 32;
    for (int j = threadIdx.y; j < 32; j += 8) {
        int n = n0 + j, k = k0 + threadIdx.x;
        tile[j][threadIdx.x] = (n < N && k < K) ? w[(size_t)n * K + k] : 0.0f;
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += 8) {
        int k = k0 + j, n = n0 + threadIdx.x;
        if (k < Kp && n < Np) wt[(size_t)k * Np + n] = convert(tile[threadIdx.x][j]);
    }
}

// wt[k, n] = w[n, k]: mm_transpose_tile in fp32.
extern "C" __global__ void mm_transpose_f32(const float* w, float* wt, int N, int K, int Np, int Kp) {
    mm_transpose_tile(w, wt, N, K, Np, Kp, [](float x) { return x; });
}

// dst[r, c] = half(src[r, c]) for r < rows_p, c < cols_p, zero outside rows x cols. src is
// rows x cols row-major, dst rows_p x cols_p. One thread per destination element, grid
// ceil(rows_p * cols_p / 256), block 256.
extern "C" __global__ void mm_convert_f16(const float* src, __half* dst, int rows, int cols, int rows_p, int cols_p) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows_p * cols_p) return;
    int r = (int)(i / cols_p), c = (int)(i % cols_p);
    float v = (r < rows && c < cols) ? src[(size_t)r * cols + c] : 0.0f;
    dst[i] = __float2half_rn(v);
}

// The two preprocessing passes of the weights in one: wt[k, n] = half(w[n, k]), zero padded
// (mm_transpose_tile converting to fp16); the fp32 intermediate (4 bytes written and read again
// per weight) disappears.
extern "C" __global__ void mm_transpose_convert_f16(const float* w, __half* wt, int N, int K, int Np, int Kp) {
    mm_transpose_tile(w, wt, N, K, Np, Kp, [](float x) { return __float2half_rn(x); });
}

// out[r, c] += bias[c] over rows x cols. Grid ceil(rows*cols/256), block 256.
extern "C" __global__ void mm_bias_add(float* out, const float* bias, int rows, int cols) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * cols) return;
    out[i] += bias[i % cols];
}

// out[r, c] = float(src[r, c]) (+ bias[c] when bias != NULL). Grid ceil(rows*cols/256), block 256.
extern "C" __global__ void mm_half_to_float_bias(const __half* src, const float* bias, float* out, int rows, int cols) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * cols) return;
    float v = __half2float(src[i]);
    if (bias != nullptr) v += bias[i % cols];
    out[i] = v;
}
