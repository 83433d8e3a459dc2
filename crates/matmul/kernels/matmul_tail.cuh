// matmul_tail.cuh: the element-wise tails a linear layer's output may take in place of a separate
// pass (GPT-2's MLP up: GELU; its projections: a residual add), shared by the GEMM stages' fused
// epilogues and the decode GEMV (matmul_gemv.cuh).
#pragma once

// GELU, tanh form (GPT-2's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
__device__ __forceinline__ float mm_gelu_tanh(float x) {
    const float k = 0.7978845608028654f;
    float inner = k * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

// The same formula on the SFU's tanh.approx.f32 (max relative error ~2^-11, far inside the bf16
// tolerance) instead of tanhf's ~20-instruction sequence, and branch-free (so it can run inside an
// open wgmma group): linear-bf16's lean stores and linear-fp8's staged store.
__device__ __forceinline__ float mm_gelu_tanh_approx(float x) {
    float th;
    asm("tanh.approx.f32 %0, %1;" : "=f"(th) : "f"(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    return 0.5f * x * (1.0f + th);
}

// Tail codes as the kernels take them (the Rust side's `Tail`): none, GELU, plus a residual.
constexpr int MM_TAIL_NONE = 0, MM_TAIL_GELU = 1, MM_TAIL_RESIDUAL = 2;
