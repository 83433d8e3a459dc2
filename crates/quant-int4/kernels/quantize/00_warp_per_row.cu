// quantize, stage 0: one warp per row (the plain quantizer).
// Changed from previous: - (the only stage).
// What it does: bf16 cache rows [rows, D] -> INT4 rows in the format of qi4_format.cuh (G = 1 row-wise
//   or G = 4 group-wise). Each lane holds D/32 consecutive values; min/max per group are reduced
//   with xor shuffles inside the group's 32/G lanes; each lane packs its codes into a partial word
//   and the lanes sharing a word OR their parts together; one lane per word stores it, one lane
//   per group stores the (scale, shift) pair.
// Why this shape: reads and writes are coalesced per row (a warp reads 2D contiguous bytes); the
//   op is a one-off conversion, so no further optimisation is laddered.
// Launch: grid ceil(rows / QZ_WARPS), block 32 * QZ_WARPS (declared 8 warps = 8 rows), no shared
//   memory.
// Constraints: D in {64, 128}, G in {1, 4}, rows >= 1. Output must match the CPU quantizer byte
//   for byte (the verification counts mismatching bytes; tolerance 0).
// Limits: D in {64, 128}; groups in {1 (row-wise), 4 (group-wise)}
#include "qi4_format.cuh"

template <int D, int G>
__device__ __forceinline__ void quantize_row(unsigned char* __restrict__ out_row,
                                             const __nv_bfloat16* __restrict__ in_row, int lane) {
    constexpr int E = D / 32;          // values per lane: 4 or 2
    constexpr int LPG = 32 / G;        // lanes per group
    constexpr int LPW = 8 / E;         // lanes per packed word
    float x[E];
#pragma unroll
    for (int i = 0; i < E; ++i) x[i] = __bfloat162float(in_row[lane * E + i]);
    int q[E];
    const Qi4Scales sc = qi4_quantize_group<E, LPG>(x, q);
    unsigned part = 0;
#pragma unroll
    for (int i = 0; i < E; ++i) part |= (unsigned)q[i] << qi4_nibble_shift((lane * E + i) & 7);
#pragma unroll
    for (int off = 1; off < LPW; off <<= 1) part |= __shfl_xor_sync(0xffffffffu, part, off);
    if (lane % LPW == 0) {
        reinterpret_cast<unsigned*>(out_row + 4 * G)[lane / LPW] = part;
    }
    if (lane % LPG == 0) {
        reinterpret_cast<unsigned*>(out_row)[lane / LPG] = sc.pair();
    }
}

#ifndef QZ_WARPS
#error "QZ_WARPS (warps = rows per block) is a tunable: the stage list sets it"
#endif

extern "C" __global__ void __launch_bounds__(32 * QZ_WARPS)
quantize_int4(unsigned char* __restrict__ out, const __nv_bfloat16* __restrict__ inp, int rows, int D, int G) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // whole warps leave together: the shuffles stay full-warp
    const long long row_bytes = 4 * G + D / 2;
    unsigned char* o = out + row * row_bytes;
    const __nv_bfloat16* x = inp + row * D;
    if (D == 128) {
        if (G == 1) quantize_row<128, 1>(o, x, lane); else quantize_row<128, 4>(o, x, lane);
    } else {
        if (G == 1) quantize_row<64, 1>(o, x, lane); else quantize_row<64, 4>(o, x, lane);
    }
}
