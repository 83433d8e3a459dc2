// matmul_fp8_gemm.cuh: linear-fp8's parts that every stage shares: the 128 x 128 x 128-code tile, a
// thread's scales, a K step's four e4m3 wgmma into a fresh fp32 tile, and the promotion of that tile
// into the thread's fp32 accumulator (DeepGEMM's scheme; the headers of linear-fp8/ say why). A
// stage's own part is how its K loop is fed: the ring, its barriers and who refills it.
#pragma once
#include "matmul_wgmma.cuh"

#define F8_BM 128
#define F8_BN 128
#define F8_BK 128                      // codes (bytes) a K step: one scale group, one swizzled row
#define F8_TILE_BYTES (F8_BM * F8_BK)  // one operand's tile; A and B tiles are the same size

// A thread's two rows of out, row0 and row0 + 8 (wgmma's layout: d[4j + 0..1] and d[4j + 2..3]),
// their rows of A scales and the block's row of W scales (its 128 columns are one W block). A row
// past M reads row M - 1's scales; it is never stored.
struct StepScales {
    const float* a0;
    const float* a1;
    const float* w;
    __device__ __forceinline__ StepScales(const float* a_scales, const float* b_scales, int row0, int n0, int M,
                                          int ktiles)
        : a0(a_scales + (size_t)min(row0, M - 1) * ktiles),
          a1(a_scales + (size_t)min(row0 + 8, M - 1) * ktiles),
          w(b_scales + (size_t)(n0 / F8_BN) * ktiles) {}
};

// K step kt's four wgmma.m64n128k32 (32 codes = 32 bytes along the swizzled 128-byte rows) of the
// warpgroup's 64 rows at `a` and the 128 columns at `b`, into `part` (the first with the accumulator
// off), waited for.
__device__ __forceinline__ void fp8_k_step(float (&part)[64], unsigned a, unsigned b) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < F8_BK / 32; ++kk)
        wgmma_m64n128k32_e4m3(part, wgmma_desc(a + 32 * kk), wgmma_desc(b + 32 * kk), kk > 0);
    wgmma_commit();
    wgmma_wait_all();
}

// The promotion: a K step's partial tile added into the fp32 accumulator times its scales, scale0 for
// the thread's first row and scale1 for its second (the row's A scale times the block's W scale).
__device__ __forceinline__ void fp8_promote(float (&acc)[64], const float (&part)[64], float scale0, float scale1) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        acc[4 * j] += part[4 * j] * scale0;
        acc[4 * j + 1] += part[4 * j + 1] * scale0;
        acc[4 * j + 2] += part[4 * j + 2] * scale1;
        acc[4 * j + 3] += part[4 * j + 3] * scale1;
    }
}
