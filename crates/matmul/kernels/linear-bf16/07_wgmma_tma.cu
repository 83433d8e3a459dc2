// linear-bf16, stage 7: wgmma-tma (Hopper's warpgroup MMA on operands TMA put in shared memory).
// Changed from stage 6: the tiles are loaded by the tensor memory accelerator (one thread issues a
//   cp.async.bulk.tensor per 128 x 64 tile, completing on an mbarrier with the byte count), in the
//   128-byte swizzled layout wgmma reads directly through shared-memory descriptors; each of the 2
//   warpgroups issues wgmma.m64n128k16 (64 x 128 x 16 per instruction, 4 per 64-wide K step) instead
//   of 8 warps issuing m16n8k16 on ldmatrix fragments. Tails need no code: the TMA zero-fills the
//   parts of a box past M, N or K. The block tile is 128 x 128 x 64, WG_STAGES stages in flight.
//   Not yet: warp specialization (a producer warpgroup), wgmma overlapped with the next wgmma
//   (each K step waits for its own), clusters, a persistent grid: stages 8 and 9.
// Why it should be faster: wgmma runs at the Hopper tensor-core rate that mma.sync cannot reach
//   (about 2x per SM), needs no fragment loads through registers (stage 6 spends 6 ldmatrix per 16
//   mma), and the TMA replaces 256 threads' address arithmetic and cp.async. Predicted 1.5-2x stage 6
//   at 4096^3; the wait after every K step keeps it short of cuBLASLt.
// Launch: linear_bf16_wgmma: grid (ceil(N/128), ceil(M/128)), block 256 (2 warpgroups), dynamic
//   shared memory WG_STAGES * 32 KiB + 1 KiB (alignment) + barriers; two CUtensorMaps by value.
// Constraints: sm_90a; K % 8 == 0 (the TMA's global row stride is a multiple of 16 bytes); M, N,
//   K >= 1; M*K, N*K, M*N < 2^31; M <= 65535 * 128.
// Tolerance: bf16 preset (operands bf16, fp32 accumulation).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; M <= 65535 * 128; K % 8 == 0
#include "matmul_wgmma.cuh"

#ifndef WG_STAGES
#error "WG_STAGES is a tunable: the stage list sets it"
#endif

#define WG_BM 128
#define WG_BN 128
#define WG_BK 64
#define WG_TILE_BYTES (WG_BM * WG_BK * 2)  // one operand's tile; A and B tiles are the same size

extern "C" __global__ void __launch_bounds__(256, 1)
    linear_bf16_wgmma(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, float* out,
                      const float* bias, int M, int N, int K) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // The 128-byte swizzle needs 1024-byte aligned tiles.
    const unsigned base = (smem_u32(smem_raw) + 1023) & ~1023u;
    auto a_tile = [&](int s) { return base + (unsigned)s * 2 * WG_TILE_BYTES; };
    auto b_tile = [&](int s) { return base + (unsigned)s * 2 * WG_TILE_BYTES + WG_TILE_BYTES; };
    const unsigned bars = base + WG_STAGES * 2 * WG_TILE_BYTES;  // one 8-byte mbarrier per stage
    auto full = [&](int s) { return bars + 8u * s; };

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int m0 = blockIdx.y * WG_BM, n0 = blockIdx.x * WG_BN;
    const int ktiles = (K + WG_BK - 1) / WG_BK;

    if (tid == 0) {
        for (int s = 0; s < WG_STAGES; ++s) mbar_init(full(s), 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int kt) {
        const int s = kt % WG_STAGES;
        mbar_expect_tx(full(s), 2 * WG_TILE_BYTES);
        tma_load(a_tile(s), &map_a, full(s), kt * WG_BK, m0);
        tma_load(b_tile(s), &map_b, full(s), kt * WG_BK, n0);
    };
    if (tid == 0)
        for (int kt = 0; kt < WG_STAGES && kt < ktiles; ++kt) issue(kt);

    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.0f;

    for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt % WG_STAGES;
        mbar_wait(full(s), (kt / WG_STAGES) & 1);
        // Warpgroup wg takes rows 64 wg .. 64 wg + 63 of the A tile (8 KiB in: a 1024-byte multiple).
        const unsigned a = a_tile(s) + wg * 64 * 128, b = b_tile(s);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; ++kk)  // 16 bf16 = 32 bytes along the swizzled 128-byte row
            wgmma_m64n128k16(d, wgmma_desc(a + 32 * kk), wgmma_desc(b + 32 * kk));
        wgmma_commit();
        wgmma_wait_all();
        __syncthreads();  // both warpgroups are done with stage s: it can be refilled
        if (tid == 0 && kt + WG_STAGES < ktiles) issue(kt + WG_STAGES);
    }

    store_m64_bias<128>(d, out, bias, m0 + 64 * wg + 16 * warp + (lane >> 2), n0, M, N);
}
