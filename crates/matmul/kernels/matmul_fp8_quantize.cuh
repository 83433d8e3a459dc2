// matmul_fp8_quantize.cuh: writing matmul::fp8's format on the device (quantize-fp8 stages 0-2):
// a group's scale amax / 448 over its finite magnitudes (amax at least 1e-30), each code
// e4m3(x * (448 / amax)) rounded to nearest even and saturated, a non-finite element the NaN code
// 0x7F; and stage 1's two quantizers (16-byte loads, 8-byte code stores), which stage 2 keeps.
#pragma once
#include <cuda_bf16.h>
#include "ladder_reduce.cuh"
#include "matmul_fp8.cuh"

#define QF8_GROUP 128
#define QF8_MAX 448.0f
#define QF8_AMAX_FLOOR 1e-30f
#define QF8_NAN 0x7Fu

__device__ __forceinline__ float qf8_mag(float x) { return isfinite(x) ? fabsf(x) : 0.0f; }

// Two codes in one conversion (the low byte is the second operand's); non-finite to the NaN code.
__device__ __forceinline__ unsigned qf8_pair(float lo, float hi, float mul) {
    unsigned short pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(__fmul_rn(hi, mul)), "f"(__fmul_rn(lo, mul)));
    unsigned p = pair;
    if (!isfinite(lo)) p = (p & 0xFF00u) | QF8_NAN;
    if (!isfinite(hi)) p = (p & 0x00FFu) | (QF8_NAN << 8);
    return p;
}

// The 8 codes of v as one 8-byte word.
__device__ __forceinline__ uint2 qf8_codes8(const float (&v)[8], float mul) {
    return make_uint2(qf8_pair(v[0], v[1], mul) | qf8_pair(v[2], v[3], mul) << 16,
                      qf8_pair(v[4], v[5], mul) | qf8_pair(v[6], v[7], mul) << 16);
}

// Rows: half-warp h of block b takes row group 16b + h (256 threads a block).
__device__ __forceinline__ void quantize_rows_vectors(unsigned char* __restrict__ codes, float* __restrict__ scales,
                                                      const __nv_bfloat16* __restrict__ x, int M, int K) {
    const int G = (K + QF8_GROUP - 1) / QF8_GROUP, half_lane = threadIdx.x & 15;
    const long long group = (long long)blockIdx.x * 16 + (threadIdx.x >> 4);
    // Both halves of a warp run the shuffles; a half past the last group works on nothing.
    const bool live = group < (long long)M * G;
    const int row = live ? (int)(group / G) : 0, g = live ? (int)(group % G) : 0;
    const int k = g * QF8_GROUP + 8 * half_lane;
    const bool mine = live && k < K;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (mine) bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(x + (size_t)row * K + k)), v);
    float amax = QF8_AMAX_FLOOR;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, qf8_mag(v[i]));
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float mul = __fdiv_rn(QF8_MAX, amax);
    if (mine) *reinterpret_cast<uint2*>(codes + (size_t)row * K + k) = qf8_codes8(v, mul);
    if (live && half_lane == 0) scales[group] = __fdiv_rn(amax, QF8_MAX);
}

// Weight blocks: block b takes block row b / G, block column b % G, 16 rows a pass (256 threads).
__device__ __forceinline__ void quantize_blocks_vectors(unsigned char* __restrict__ codes, float* __restrict__ scales,
                                                        const __nv_bfloat16* __restrict__ w, int N, int K) {
    __shared__ float scratch[32];
    const int G = (K + QF8_GROUP - 1) / QF8_GROUP;
    const int br = blockIdx.x / G, bc = blockIdx.x % G;
    const int r0 = br * QF8_GROUP, rows = min(QF8_GROUP, N - r0);
    const int c = bc * QF8_GROUP + 8 * (threadIdx.x & 15), lead = threadIdx.x >> 4;  // 16 rows a pass
    const bool col = c < K;
    float amax = QF8_AMAX_FLOOR;
    for (int r = lead; r < rows; r += 16) {
        if (!col) continue;
        float v[8];
        bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(w + (size_t)(r0 + r) * K + c)), v);
#pragma unroll
        for (int i = 0; i < 8; ++i) amax = fmaxf(amax, qf8_mag(v[i]));
    }
    amax = block_max(amax, scratch);
    const float mul = __fdiv_rn(QF8_MAX, amax);
    for (int r = lead; r < rows; r += 16) {
        if (!col) continue;
        const size_t at = (size_t)(r0 + r) * K + c;
        float v[8];
        bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(w + at)), v);
        *reinterpret_cast<uint2*>(codes + at) = qf8_codes8(v, mul);
    }
    if (threadIdx.x == 0) scales[blockIdx.x] = __fdiv_rn(amax, QF8_MAX);
}

// Stage 1's two entries, rows and weight blocks (stage 2 keeps them beside its LayerNorm entry).
#define QF8_VECTOR_ENTRIES                                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                                           \
        quantize_rows_fp8(unsigned char* __restrict__ codes, float* __restrict__ scales,                        \
                          const __nv_bfloat16* __restrict__ x, int M, int K) {                                  \
        quantize_rows_vectors(codes, scales, x, M, K);                                                          \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(256)                                                           \
        quantize_blocks_fp8(unsigned char* __restrict__ codes, float* __restrict__ scales,                      \
                            const __nv_bfloat16* __restrict__ w, int N, int K) {                                \
        quantize_blocks_vectors(codes, scales, w, N, K);                                                        \
    }
