// matmul/quantize-fp8, stage 0: group-reduce. bf16 [M, K] to e4m3 codes and fp32 scales, DeepGEMM's
// fine-grained scheme (matmul::fp8 is the CPU quantizer it matches byte for byte): activations one
// scale per row per 128 channels (quantize_rows_fp8), weights one per 128 x 128 block
// (quantize_blocks_fp8). A group's scale is amax / 448 over its finite magnitudes (amax at least
// 1e-30), each code e4m3(x * (448 / amax)) rounded to nearest even and saturated
// (cvt.rn.satfinite.e4m3x2.f32); a non-finite element gets the NaN code 0x7F and stays out of amax.
// Why this shape: the first rung, the scheme as written: one warp a row group (its 128 elements,
//   four a lane, then a shuffle max) and one block a weight block (128 rows of 128, a block max);
//   each element is read twice (the max, then the codes), the second time from L1. Bytes: 2 read +
//   1 written an element, plus a scale a group; the floor is those bytes at the copy rate.
// Measured (H100): rows 9.3 us at 4096 x 768 and 23.3 us at 4096 x 3072 (34% / 54% of the copy
//   rate); weight blocks 38-39 us, latency-bound (2-byte loads, 108-144 blocks).
// Launch: rows: grid ceil(M * G / 8) x 256 threads, warp w of block b takes group 8b + w (G =
//   ceil(K / 128) groups a row); blocks: grid ceil(M / 128) * G x 256 threads, block b takes block
//   row b / G, block column b % G.
// Constraints: M, K >= 1; M * K < 2^31; sm_89+ for the e4m3 conversion (built for sm_90).
// Tolerance: exact (codes and scales bit for bit).
// Limits: M * K < 2^31
#include "matmul_fp8_quantize.cuh"

__device__ __forceinline__ unsigned char qf8_code(float x, float mul) {
    if (!isfinite(x)) return QF8_NAN;
    unsigned short pair;
    // The low byte is the second operand's code.
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(__fmul_rn(x, mul)));
    return (unsigned char)(pair & 0xFF);
}

extern "C" __global__ void __launch_bounds__(256) quantize_rows_fp8(unsigned char* __restrict__ codes,
                                                                   float* __restrict__ scales,
                                                                   const __nv_bfloat16* __restrict__ x, int M,
                                                                   int K) {
    const int G = (K + QF8_GROUP - 1) / QF8_GROUP, lane = threadIdx.x & 31;
    const long long group = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (group >= (long long)M * G) return;
    const int row = (int)(group / G), g = (int)(group % G);
    const int k0 = g * QF8_GROUP, n = min(QF8_GROUP, K - k0);
    const __nv_bfloat16* src = x + (size_t)row * K + k0;
    float v[QF8_GROUP / 32];
    float amax = QF8_AMAX_FLOOR;
#pragma unroll
    for (int i = 0; i < QF8_GROUP / 32; ++i) {
        const int k = lane + 32 * i;
        v[i] = k < n ? __bfloat162float(src[k]) : 0.0f;
        amax = fmaxf(amax, qf8_mag(v[i]));
    }
    amax = warp_max(amax);
    const float mul = __fdiv_rn(QF8_MAX, amax);
    unsigned char* dst = codes + (size_t)row * K + k0;
#pragma unroll
    for (int i = 0; i < QF8_GROUP / 32; ++i) {
        const int k = lane + 32 * i;
        if (k < n) dst[k] = qf8_code(v[i], mul);
    }
    if (lane == 0) scales[group] = __fdiv_rn(amax, QF8_MAX);
}

extern "C" __global__ void __launch_bounds__(256) quantize_blocks_fp8(unsigned char* __restrict__ codes,
                                                                     float* __restrict__ scales,
                                                                     const __nv_bfloat16* __restrict__ w, int N,
                                                                     int K) {
    __shared__ float scratch[32];
    const int G = (K + QF8_GROUP - 1) / QF8_GROUP;
    const int br = blockIdx.x / G, bc = blockIdx.x % G;
    const int r0 = br * QF8_GROUP, k0 = bc * QF8_GROUP;
    const int rows = min(QF8_GROUP, N - r0), cols = min(QF8_GROUP, K - k0);
    float amax = QF8_AMAX_FLOOR;
    for (int i = threadIdx.x; i < rows * QF8_GROUP; i += blockDim.x) {
        const int r = i / QF8_GROUP, c = i % QF8_GROUP;
        if (c < cols) amax = fmaxf(amax, qf8_mag(__bfloat162float(w[(size_t)(r0 + r) * K + k0 + c])));
    }
    amax = block_max(amax, scratch);
    const float mul = __fdiv_rn(QF8_MAX, amax);
    for (int i = threadIdx.x; i < rows * QF8_GROUP; i += blockDim.x) {
        const int r = i / QF8_GROUP, c = i % QF8_GROUP;
        if (c < cols) {
            const size_t at = (size_t)(r0 + r) * K + k0 + c;
            codes[at] = qf8_code(__bfloat162float(w[at]), mul);
        }
    }
    if (threadIdx.x == 0) scales[blockIdx.x] = __fdiv_rn(amax, QF8_MAX);
}
