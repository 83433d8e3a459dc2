// Linear + epilogue, stage 0: unfused (the report's structure before its kernel fusion).
// Op: out = GELU(inp . W^T + bias) (epi = 1, GELU tanh form) or out = inp . W^T + bias + residual
//   (epi = 2); row-major, fp32 in and out.
// What it does: three kernels. The stage-4 WMMA GEMM (linear/04_wmma_m3.cu, with its fused
//   preprocessing, here without bias), then a bias pass (mm_bias_add, the report's prepareOut),
//   then a GELU pass or a residual-add pass, both in place.
// Cost beyond the GEMM: two more launches and two more trips through out (bias: read+write M·N,
//   GELU: read+write M·N, residual: read 2·M·N, write M·N).
// Launch: GEMM as linear stage 4; element-wise kernels grid ceil(M·N/256), block 256.
// Constraints: as linear stage 4. Tolerance: fp16 operands, rel L2 <= 1e-2.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K <= 65535 * 32
#include "matmul_wmma_m3.cuh"

MM_DEFINE_WMMA_M3(linear_wmma_m3, MM_EPI_BIAS)

// out = GELU(out), in place.
extern "C" __global__ void mm_gelu(float* out, int n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)n) out[i] = mm_gelu_tanh(out[i]);
}

// out += residual, in place.
extern "C" __global__ void mm_residual_add(float* out, const float* residual, int n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)n) out[i] += residual[i];
}
