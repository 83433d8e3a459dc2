// matmul_gemv.cuh: the decode GEMV stages' shared pieces. out[M, N] = inp[M, K] . W[N, K]^T (+ bias),
// then the layer's tail (GELU, or plus a residual that may be out itself), inp fp32 or bf16, out fp32,
// W bf16 (the weights converted once), fp32 accumulation; M is small (1..64). Every stage stores
// through gemv_out, so every stage takes every tail, and reads inp through dot8 / gemv_in (its own
// fragments in stage 4), so every stage takes either input type.
#pragma once
#include <cuda_bf16.h>
#include "ladder.cuh"
#include "ladder_reduce.cuh"
#include "matmul_tail.cuh"

// Output element idx (column n) of a stage's dot product s: plus the bias, then the tail (`tail`
// one of MM_TAIL_*): GELU, or plus residual[idx]. residual may be out itself (the decode step's
// residual stream updated in place): the thread that writes an element is the one that read it.
__device__ __forceinline__ float gemv_out(float s, const float* bias, const float* residual, int tail, int n,
                                          size_t idx) {
    const float v = s + (bias != nullptr ? bias[n] : 0.0f);
    return tail == MM_TAIL_GELU ? mm_gelu_tanh(v) : tail == MM_TAIL_RESIDUAL ? v + residual[idx] : v;
}

// gemv_out with its operands already read: bias_n (0 without a bias) and the residual element.
__device__ __forceinline__ float gemv_tail(float s, float bias_n, float residual_v, int tail) {
    const float v = s + bias_n;
    return tail == MM_TAIL_GELU ? mm_gelu_tanh(v) : tail == MM_TAIL_RESIDUAL ? v + residual_v : v;
}

// Eight bf16 weights (16 bytes) dotted with eight fp32 inputs (two 16-byte loads).
__device__ __forceinline__ float dot8(const uint4& w, const float* x) {
    const float4 a = *reinterpret_cast<const float4*>(x);
    const float4 b = *reinterpret_cast<const float4*>(x + 4);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
    const float2 w0 = __bfloat1622float2(h[0]), w1 = __bfloat1622float2(h[1]);
    const float2 w2 = __bfloat1622float2(h[2]), w3 = __bfloat1622float2(h[3]);
    return a.x * w0.x + a.y * w0.y + a.z * w1.x + a.w * w1.y + b.x * w2.x + b.y * w2.y + b.z * w3.x + b.w * w3.y;
}

// Eight bf16 weights dotted with eight bf16 inputs (one 16-byte load), fp32 products and sums.
__device__ __forceinline__ float dot8(const uint4& w, const __nv_bfloat16* x) {
    const uint4 xv = *reinterpret_cast<const uint4*>(x);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
    const __nv_bfloat162* v = reinterpret_cast<const __nv_bfloat162*>(&xv);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 a = __bfloat1622float2(v[i]), b = __bfloat1622float2(h[i]);
        s += a.x * b.x + a.y * b.y;
    }
    return s;
}

// A 16-byte chunk c of a weight row (eight bf16 at columns 8c..) into the lane sums acc[i] of rows
// m0 + i < M of inp.
template <int MT, typename In>
__device__ __forceinline__ void gemv_chunk_dot(float (&acc)[MT], const uint4 wc, const In* inp, int c, int m0, int M,
                                               int K) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
        if (m0 + i < M) acc[i] += dot8(wc, inp + (size_t)(m0 + i) * K + 8 * c);
}

// The lane sums acc[i] of rows m0 + i of out, for row n of W: reduced across the warp, then the
// bias and the tail, lane 0 storing.
template <int MT>
__device__ __forceinline__ void gemv_warp_store(float (&acc)[MT], float* out, const float* bias, const float* residual,
                                                int tail, int m0, int M, int N, int n) {
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const float s = warp_sum(acc[i]);
        if ((threadIdx.x & 31) == 0 && m0 + i < M) {
            const size_t idx = (size_t)(m0 + i) * N + n;
            out[idx] = gemv_out(s, bias, residual, tail, n, idx);
        }
    }
}

// A stage's passes over M, MT rows of inp each (M > MT re-reads the row of W, from L2): each pass's
// lane sums acc[0..MT) start at zero and go to pass(acc, m0), which accumulates and stores them.
template <int MT, typename Pass>
__device__ __forceinline__ void gemv_passes(int M, const Pass& pass) {
    for (int m0 = 0; m0 < M; m0 += MT) {
        float acc[MT];
#pragma unroll
        for (int i = 0; i < MT; ++i) acc[i] = 0.0f;
        pass(acc, m0);
    }
}

// The warp-row frame (gemv stage 1, gemv-fp8 stages 0 and 2): warp n of the grid takes row n of W
// (elements of type Wt, read as 16-byte pieces), a whole warp returning past N; each pass's lane sums
// come from walk(acc, row, n, m0, lane), the stage's walk over the row's pieces, then gemv_warp_store.
template <int MT, typename Wt, typename Walk>
__device__ __forceinline__ void gemv_warp_row_passes(float* out, const Wt* w, const float* bias, const float* residual,
                                                     int tail, int M, int N, int K, const Walk& walk) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;  // warp-uniform
    const uint4* row = reinterpret_cast<const uint4*>(w + (size_t)n * K);
    gemv_passes<MT>(M, [&](float (&acc)[MT], int m0) {
        walk(acc, row, n, m0, lane);
        gemv_warp_store(acc, out, bias, residual, tail, m0, M, N, n);
    });
}

__device__ __forceinline__ float gemv_in(float x) { return x; }
__device__ __forceinline__ float gemv_in(__nv_bfloat16 x) { return __bfloat162float(x); }

// The entry points of a stage's kernel template KERNEL<MT, In>, one per rows-per-pass MT: gemv_m{MT}
// on fp32 inp, gemv_bf16_m{MT} on bf16 inp (the decode step's attention output as it lies).
#define GEMV_ENTRY(KERNEL, MT)                                                                             \
    extern "C" __global__ void gemv_m##MT(float* out, const float* inp, const __nv_bfloat16* w,             \
                                          const float* bias, const float* residual, int tail, int M, int N, \
                                          int K) {                                                          \
        KERNEL<MT>(out, inp, w, bias, residual, tail, M, N, K);                                             \
    }                                                                                                      \
    extern "C" __global__ void gemv_bf16_m##MT(float* out, const __nv_bfloat16* inp, const __nv_bfloat16* w, \
                                               const float* bias, const float* residual, int tail, int M,   \
                                               int N, int K) {                                              \
        KERNEL<MT>(out, inp, w, bias, residual, tail, M, N, K);                                             \
    }
#define GEMV_ENTRIES(KERNEL) \
    GEMV_ENTRY(KERNEL, 1)    \
    GEMV_ENTRY(KERNEL, 2)    \
    GEMV_ENTRY(KERNEL, 4)    \
    GEMV_ENTRY(KERNEL, 8)
