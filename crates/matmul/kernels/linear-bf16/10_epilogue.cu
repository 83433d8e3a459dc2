// linear-bf16, stage 10: epilogue (bias, bias + GELU or bias + residual fused into stage 9's store).
// Changed from stage 9: the consumers apply the layer's element-wise tail to the accumulators
//   before the store: GELU (tanh form, GPT-2's) of x + bias for the MLP up projection, or
//   x + bias + residual[row, col] for the projections that feed the residual stream, chosen by the
//   `epilogue` argument (0: bias only). The rest is stage 9.
// Why it should be faster: unfused, the GEMM writes M x N fp32 and a second kernel reads it back
//   (and the residual) and writes it again: at MLP up (4096 x 3072) 50 MB written, 50 MB read and
//   50 MB written again, ~50 us at the copy rate next to a ~45 us GEMM. Fused, the tail costs the
//   residual's read only (predicted within ~10% of stage 9's time, against cuBLASLt's GELU_BIAS).
// Launch: linear_bf16_epilogue: grid min(ceil(M/128) * ceil(N/WS_BN), SMs), block 384, dynamic
//   shared memory WG_STAGES * (128 + WS_BN) * 128 B + 1 KiB + barriers; two CUtensorMaps by value.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias (the layer has one).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#include "matmul_wgmma_persistent.cuh"

using Recipe = PersistentRecipe<GroupedOrder, StreamOrdered, Cooperative, EpiChecked>;

extern "C" __global__ void __launch_bounds__(384, 1)
    linear_bf16_epilogue(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, float* out,
                         const float* bias, const float* residual, int M, int N, int K, int epilogue) {
    persistent_gemm<Recipe, true>(map_a, map_b, out, bias, residual, M, N, K, epilogue);
}
