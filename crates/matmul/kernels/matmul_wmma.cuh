// matmul_wmma.cuh: the pieces of the WMMA (tensor-core, fp16 x fp16 -> fp32) GEMM stages.
// Operands are prepared by matmul_aux.cuh's kernels: a = inp as fp16, Mp x Kp row-major; bt = the
// weights transposed to Kp x Np row-major as fp16; Mp, Np, Kp are M, N, K rounded up to 16 and the
// padding holds zeros, so every 16 x 16 x 16 fragment load is in bounds and 32-byte aligned.
// The accumulator tile goes through a per-warp shared-memory stage so the store can skip the
// padded rows/columns and apply the epilogue (bias, optionally GELU or a residual) element-wise.
#pragma once
#include <mma.h>
#include <cuda_fp16.h>
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

// ---- Stage 4 (wmma-m3): MM_M3_WARPS warps per block, side by side along N. ----
// Block (32, MM_M3_WARPS): warp y of block (bx, by) computes the output tile (bx, by*WARPS + y).
// All warps of a block share the same 16-row strip of `a`, so after the first warp reads a
// fragment the others find it in L1. Toggles (cumulative, leave-one-out in the ablation):
//   LAUNCH_BOUNDS  __launch_bounds__(WARPS*32, 1): tells the compiler the block size, so register
//                  allocation targets exactly this launch;
//   DOUBLE_BUFFER  two fragment sets: the loads of k-step t+1 are issued before the mma of step t;
//   FUSED_PREP     (read by the Rust launcher) one transpose-and-convert kernel for the weights
//                  instead of a transpose then a conversion.
#ifndef MM_M3_WARPS
#define MM_M3_WARPS 32
#endif
#ifdef LAUNCH_BOUNDS
#define MM_M3_BOUNDS __launch_bounds__(MM_M3_WARPS * 32, 1)
#else
#define MM_M3_BOUNDS
#endif

template <int EPI>
__device__ __forceinline__ void mm_wmma_m3(float* out, const __half* a, const __half* bt, const float* bias,
                                           const float* residual, int M, int N, int Kp, int Np, float* stage) {
    using namespace nvcuda;
    const int tm = blockIdx.x;
    const int tn = blockIdx.y * MM_M3_WARPS + threadIdx.y;
    if (tn * 16 >= Np) return;  // whole warp leaves; the kernel has no block-wide barrier
    // Offset pointers: the start of this tile's operands, advanced by a constant each k-step.
    const __half* ap = a + (size_t)tm * 16 * Kp;
    const __half* bp = bt + (size_t)tn * 16;
    const size_t bstep = (size_t)16 * Np;
    const int tiles = Kp / 16;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#ifdef DOUBLE_BUFFER
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a0, a1;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b0, b1;
    wmma::load_matrix_sync(a0, ap, Kp);
    wmma::load_matrix_sync(b0, bp, Np);
    int t = 0;
    for (; t + 1 < tiles; t += 2) {
        wmma::load_matrix_sync(a1, ap + 16, Kp);
        wmma::load_matrix_sync(b1, bp + bstep, Np);
        wmma::mma_sync(acc, a0, b0, acc);
        ap += 32;
        bp += 2 * bstep;
        if (t + 2 < tiles) {
            wmma::load_matrix_sync(a0, ap, Kp);
            wmma::load_matrix_sync(b0, bp, Np);
        }
        wmma::mma_sync(acc, a1, b1, acc);
    }
    if (t < tiles) wmma::mma_sync(acc, a0, b0, acc);
#else
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> af;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> bf;
    for (int t = 0; t < tiles; t++) {
        wmma::load_matrix_sync(af, ap, Kp);
        wmma::load_matrix_sync(bf, bp, Np);
        wmma::mma_sync(acc, af, bf, acc);
        ap += 16;
        bp += bstep;
    }
#endif
    wmma::store_matrix_sync(stage, acc, 16, wmma::mem_row_major);
    __syncwarp();
    mm_store_tile<EPI>(stage, out, bias, residual, tm * 16, tn * 16, M, N);
}

// An entry point of the stage-4 GEMM with epilogue EPI. Launch: grid (Mp/16, ceil(Np/16/WARPS)),
// block (32, WARPS), 1 KiB of static shared memory per warp.
#define MM_DEFINE_WMMA_M3(NAME, EPI)                                                                        \
    extern "C" __global__ void MM_M3_BOUNDS NAME(float* out, const __half* a, const __half* bt,              \
                                                 const float* bias, const float* residual, int M, int N,     \
                                                 int Kp, int Np) {                                           \
        __shared__ __align__(32) float stage[MM_M3_WARPS][256];                                              \
        mm_wmma_m3<EPI>(out, a, bt, bias, residual, M, N, Kp, Np, stage[threadIdx.y]);                       \
    }
