// gpt2_pointwise.cuh: GPT-2's GELU (the tanh form of the original code, which Hugging Face calls
// "gelu_new"), in fp32: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once
#include "ladder.cuh"

__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
