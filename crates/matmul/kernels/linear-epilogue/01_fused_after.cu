// Linear + epilogue, stage 1: fused after the GEMM (the report's fusion: prepareOutGelu /
//   prepareOutRES).
// Changed from previous: the bias pass and the GELU / residual pass become one kernel
//   (mm_bias_gelu or mm_bias_residual) after the GEMM: one launch and one read+write of out fewer.
// Why it should be faster: saves a launch (a few us) and 8·M·N bytes of traffic: at 4096 x 3072
//   about 100 MB, ~35 us at 3 TB/s, against a GEMM of a few hundred us.
// Launch: GEMM as linear stage 4 (no bias); fused kernel grid ceil(M·N/256), block 256.
// Constraints: as linear stage 4. Tolerance: fp16 operands, rel L2 <= 1e-2.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K <= 65535 * 32
#include "matmul_wmma_m3.cuh"

MM_DEFINE_WMMA_M3(linear_wmma_m3, MM_EPI_BIAS)

// out[r, c] = GELU(out[r, c] + bias[c]).
extern "C" __global__ void mm_bias_gelu(float* out, const float* bias, int rows, int cols) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)rows * cols) out[i] = mm_gelu_tanh(out[i] + bias[i % cols]);
}

// out[r, c] = out[r, c] + bias[c] + residual[r, c].
extern "C" __global__ void mm_bias_residual(float* out, const float* bias, const float* residual, int rows, int cols) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)rows * cols) out[i] = out[i] + bias[i % cols] + residual[i];
}
