// matmul_gemv.cuh: the decode GEMV stages' shared pieces. out[M, N] = inp[M, K] . W[N, K]^T (+ bias),
// inp and out fp32, W bf16 (the weights converted once), fp32 accumulation; M is small (1..64).
#pragma once
#include <cuda_bf16.h>
#include "ladder.cuh"
#include "ladder_reduce.cuh"

// Eight bf16 weights (16 bytes) dotted with eight fp32 inputs (two 16-byte loads).
__device__ __forceinline__ float dot8(const uint4& w, const float* x) {
    const float4 a = *reinterpret_cast<const float4*>(x);
    const float4 b = *reinterpret_cast<const float4*>(x + 4);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
    const float2 w0 = __bfloat1622float2(h[0]), w1 = __bfloat1622float2(h[1]);
    const float2 w2 = __bfloat1622float2(h[2]), w3 = __bfloat1622float2(h[3]);
    return a.x * w0.x + a.y * w0.y + a.z * w1.x + a.w * w1.y + b.x * w2.x + b.y * w2.y + b.z * w3.x + b.w * w3.y;
}

// The entry points of a stage's kernel template KERNEL<MT>, one per rows-per-pass MT.
#define GEMV_ENTRIES(KERNEL)                                                                                   \
    extern "C" __global__ void gemv_m1(float* out, const float* inp, const __nv_bfloat16* w, const float* bias, \
                                       int M, int N, int K) {                                                  \
        KERNEL<1>(out, inp, w, bias, M, N, K);                                                                 \
    }                                                                                                          \
    extern "C" __global__ void gemv_m2(float* out, const float* inp, const __nv_bfloat16* w, const float* bias, \
                                       int M, int N, int K) {                                                  \
        KERNEL<2>(out, inp, w, bias, M, N, K);                                                                 \
    }                                                                                                          \
    extern "C" __global__ void gemv_m4(float* out, const float* inp, const __nv_bfloat16* w, const float* bias, \
                                       int M, int N, int K) {                                                  \
        KERNEL<4>(out, inp, w, bias, M, N, K);                                                                 \
    }                                                                                                          \
    extern "C" __global__ void gemv_m8(float* out, const float* inp, const __nv_bfloat16* w, const float* bias, \
                                       int M, int N, int K) {                                                  \
        KERNEL<8>(out, inp, w, bias, M, N, K);                                                                 \
    }
