// matmul_fp8.cuh: reading matmul::fp8's format on the device (and the bf16 its producers read): e4m3 codes with an fp32 scale per
// 128 x 128 block of a weight. Every e4m3 value is exact in f16 (exponents 2^-9 .. 2^8, 3 mantissa
// bits), and so in f32 and bf16: each conversion here is exact. cvt.rn.f16x2.e4m3x2 (sm_89 on) turns
// two codes into two halves, the low byte into the low half.
#pragma once
#include <cuda_fp16.h>
#include "ladder_mma.cuh"

// Channels (and rows of a weight) a scale covers.
#define FP8_GROUP 128

// The scales of weight row n (K channels): its block row's, one per 128 channels.
__device__ __forceinline__ const float* fp8_row_scales(const float* scales, int n, int K) {
    return scales + (size_t)(n / FP8_GROUP) * ((K + FP8_GROUP - 1) / FP8_GROUP);
}

// Eight bf16 (one 16-byte load) as floats, in order: the quantizer's input.
__device__ __forceinline__ void bf16x8_to_float(const uint4& u, float (&v)[8]) {
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
}

// Two codes, the first in the low byte, as two floats.
__device__ __forceinline__ float2 e4m3x2_to_float2(unsigned short pair) {
    unsigned h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(pair));
    return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// A 16-byte piece of codes, word by word: use(i, lo, hi) with word i's codes as float pairs, lo its
// low two (codes 4i and 4i + 1), hi its high two.
template <class Use>
__device__ __forceinline__ void e4m3x16_words(const uint4& q, const Use& use) {
    const unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 lo = e4m3x2_to_float2((unsigned short)(w[i] & 0xFFFFu));
        const float2 hi = e4m3x2_to_float2((unsigned short)(w[i] >> 16));
        use(i, lo, hi);
    }
}

// A 16-byte piece of codes as 16 floats, in order.
__device__ __forceinline__ void e4m3x16_to_float(const uint4& q, float (&v)[16]) {
    e4m3x16_words(q, [&](int i, float2 lo, float2 hi) {
        v[4 * i] = lo.x;
        v[4 * i + 1] = lo.y;
        v[4 * i + 2] = hi.x;
        v[4 * i + 3] = hi.y;
    });
}

// A 16-byte piece of codes as eight bf16 pairs: pair j holds codes 2j and 2j + 1 (the low half first,
// as an mma fragment register holds two consecutive k).
__device__ __forceinline__ void e4m3x16_to_bf16x2(const uint4& q, unsigned (&pairs)[8]) {
    e4m3x16_words(q, [&](int i, float2 lo, float2 hi) {
        pairs[2 * i] = pack_bf16x2(lo.x, lo.y);
        pairs[2 * i + 1] = pack_bf16x2(hi.x, hi.y);
    });
}
