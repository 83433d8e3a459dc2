// matmul_gemv_fp8.cuh: the FMA stages of gemv-fp8 (a warp per row of e4m3 W): a 16-code piece dotted
// with 16 elements of an inp row (fp32 or bf16), and the entry points, whose signature every gemv-fp8
// stage shares: (out, inp, codes, scales, bias, residual, tail, M, N, K).
#pragma once
#include "matmul_gemv.cuh"
#include "matmul_fp8.cuh"

// Sixteen consecutive elements of an inp row as floats.
__device__ __forceinline__ void inp16(const float* x, float (&v)[16]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float4 a = *reinterpret_cast<const float4*>(x + 4 * i);
        v[4 * i] = a.x;
        v[4 * i + 1] = a.y;
        v[4 * i + 2] = a.z;
        v[4 * i + 3] = a.w;
    }
}

__device__ __forceinline__ void inp16(const __nv_bfloat16* x, float (&v)[16]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const uint4 a = *reinterpret_cast<const uint4*>(x + 8 * i);
        const unsigned w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            v[8 * i + 2 * j] = __uint_as_float(w[j] << 16);
            v[8 * i + 2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
        }
    }
}

// The dot product of 16 converted codes with the 16 elements of inp at x, in fp32.
template <typename In>
__device__ __forceinline__ float fp8_dot16(const float (&w)[16], const In* x) {
    float v[16];
    inp16(x, v);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) s += w[j] * v[j];
    return s;
}

// A lane's pieces c0, c0 + step, ..., c0 + step (P - 1) of a row of codes (`pieces` of them) and
// their scales, all requested before any is used; pieces past the row are zeros.
template <int P>
__device__ __forceinline__ void fp8_row_pieces(uint4 (&q)[P], float (&scale)[P], const uint4* row,
                                               const float* row_scales, int c0, int pieces, int step = 32) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const int c = c0 + step * p;
        q[p] = c < pieces ? row[c] : make_uint4(0, 0, 0, 0);
        scale[p] = c < pieces ? row_scales[c / (FP8_GROUP / 16)] : 0.0f;
    }
}

// Those pieces, converted, dotted with rows 0 .. rows - 1 of x (stride K) and added into acc times
// their scales.
template <int MT, int P, typename In>
__device__ __forceinline__ void fp8_row_dot(float (&acc)[MT], const uint4 (&q)[P], const float (&scale)[P],
                                            const In* x, int c0, int pieces, int rows, int K) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const int c = c0 + 32 * p;
        if (c < pieces) {
            float wv[16];
            e4m3x16_to_float(q[p], wv);
#pragma unroll
            for (int i = 0; i < MT; ++i)
                if (i < rows) acc[i] += scale[p] * fp8_dot16(wv, x + (size_t)i * K + 16 * c);
        }
    }
}

// gemv_fp8_{SUFFIX} on fp32 inp and gemv_fp8_bf16_{SUFFIX} on bf16 inp, both calling the kernel
// template instance named by the remaining arguments.
#define GEMV_FP8_FMA_ENTRY(SUFFIX, ...)                                                                      \
    extern "C" __global__ void gemv_fp8_##SUFFIX(float* out, const float* inp, const unsigned char* w,       \
                                                 const float* scales, const float* bias, const float* residual, \
                                                 int tail, int M, int N, int K) {                            \
        __VA_ARGS__(out, inp, w, scales, bias, residual, tail, M, N, K);                                     \
    }                                                                                                        \
    extern "C" __global__ void gemv_fp8_bf16_##SUFFIX(float* out, const __nv_bfloat16* inp,                  \
                                                      const unsigned char* w, const float* scales,           \
                                                      const float* bias, const float* residual, int tail,    \
                                                      int M, int N, int K) {                                 \
        __VA_ARGS__(out, inp, w, scales, bias, residual, tail, M, N, K);                                     \
    }

// The entries of a stage that takes P pieces a lane at once: gemv_fp8{_bf16}_m{MT}_p{P} for MT rows
// of inp a pass (1, 2, 4, 8) and P (1, 2, 4, 8), calling KERNEL<MT, P>.
#define GEMV_FP8_PIECES_ENTRIES_MT(KERNEL, MT)              \
    GEMV_FP8_FMA_ENTRY(m##MT##_p1, KERNEL<MT, 1>)           \
    GEMV_FP8_FMA_ENTRY(m##MT##_p2, KERNEL<MT, 2>)           \
    GEMV_FP8_FMA_ENTRY(m##MT##_p4, KERNEL<MT, 4>)           \
    GEMV_FP8_FMA_ENTRY(m##MT##_p8, KERNEL<MT, 8>)
#define GEMV_FP8_PIECES_ENTRIES(KERNEL)        \
    GEMV_FP8_PIECES_ENTRIES_MT(KERNEL, 1)      \
    GEMV_FP8_PIECES_ENTRIES_MT(KERNEL, 2)      \
    GEMV_FP8_PIECES_ENTRIES_MT(KERNEL, 4)      \
    GEMV_FP8_PIECES_ENTRIES_MT(KERNEL, 8)
