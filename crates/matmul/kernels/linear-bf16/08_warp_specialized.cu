// linear-bf16, stage 8: warp-specialized (a producer warpgroup feeds two consumer warpgroups).
// Changed from stage 7: warpgroup 0 only issues the TMA loads (one thread) and gives its registers
//   away (setmaxnreg.dec to 40); warpgroups 1 and 2 only issue wgmma (setmaxnreg.inc to 232). Each
//   stage has a "full" mbarrier (the TMA's bytes arrived) and an "empty" one (both consumers are
//   done with it), so the producer refills a stage as soon as it is free instead of the whole block
//   meeting at __syncthreads after every K step. The consumers keep one wgmma group in flight
//   (wait_group 1: the previous K step's MMAs must be done before its stage is released), so the
//   tensor cores no longer idle between K steps. The tile grows to 128 x 256 (each consumer issues
//   wgmma.m64n256k16: 128 accumulators a thread), halving the loads per MMA of B's side.
// Why it should be faster: stage 7 waits for its own MMAs at every K step and then for the slowest
//   warp at a block barrier; here the MMA stream is continuous while TMA loads run WG_STAGES - 1
//   steps ahead. Predicted 1.2-1.4x stage 7 at 4096^3 (toward cuBLASLt).
// Launch: linear_bf16_ws: grid (ceil(N/256), ceil(M/128)), block 384 (3 warpgroups), dynamic
//   shared memory WG_STAGES * 48 KiB + 1 KiB (alignment) + barriers; two CUtensorMaps by value (A
//   boxes of 128 rows, B boxes of 256 rows).
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; M <= 65535 * 128.
// Tolerance: bf16 preset (operands bf16, fp32 accumulation).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; M <= 65535 * 128; K % 8 == 0
#include "matmul_wgmma.cuh"

#ifndef WG_STAGES
#error "WG_STAGES is a tunable: the stage list sets it"
#endif

#define WS_BM 128
#define WS_BN 256
#define WS_BK 64
#define WS_A_BYTES (WS_BM * WS_BK * 2)
#define WS_B_BYTES (WS_BN * WS_BK * 2)
#define WS_STAGE_BYTES (WS_A_BYTES + WS_B_BYTES)

extern "C" __global__ void __launch_bounds__(384, 1)
    linear_bf16_ws(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, float* out,
                   const float* bias, int M, int N, int K) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned base = (smem_u32(smem_raw) + 1023) & ~1023u;  // the 128-byte swizzle's alignment
    auto a_tile = [&](int s) { return base + (unsigned)s * WS_STAGE_BYTES; };
    auto b_tile = [&](int s) { return base + (unsigned)s * WS_STAGE_BYTES + WS_A_BYTES; };
    const unsigned bars = base + WG_STAGES * WS_STAGE_BYTES;
    auto full = [&](int s) { return bars + 8u * s; };
    auto empty = [&](int s) { return bars + 8u * (WG_STAGES + s); };

    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    const int m0 = blockIdx.y * WS_BM, n0 = blockIdx.x * WS_BN;
    const int ktiles = (K + WS_BK - 1) / WS_BK;

    if (tid == 0) {
        for (int s = 0; s < WG_STAGES; ++s) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), 2);  // one arrival per consumer warpgroup
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        // Producer: one thread issues every load; the warpgroup's registers go to the consumers.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) {
            for (int kt = 0; kt < ktiles; ++kt) {
                const int s = kt % WG_STAGES;
                if (kt >= WG_STAGES) mbar_wait(empty(s), ((kt / WG_STAGES) - 1) & 1);
                mbar_expect_tx(full(s), WS_STAGE_BYTES);
                tma_load(a_tile(s), &map_a, full(s), kt * WS_BK, m0);
                tma_load(b_tile(s), &map_b, full(s), kt * WS_BK, n0);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1;  // consumer c takes rows 64 c .. 64 c + 63 of the tile
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.0f;
    for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt % WG_STAGES;
        mbar_wait(full(s), (kt / WG_STAGES) & 1);
        const unsigned a = a_tile(s) + c * 64 * 128, b = b_tile(s);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < WS_BK / 16; ++kk) wgmma_m64n256k16(d, wgmma_desc(a + 32 * kk), wgmma_desc(b + 32 * kk));
        wgmma_commit();
        // The previous step's group is done: its stage can be refilled.
        wgmma_wait_one();
        if (kt > 0 && (tid & 127) == 0) mbar_arrive(empty((kt - 1) % WG_STAGES));
    }
    wgmma_wait_all();

    const int warp = (tid >> 5) & 3;
    store_m64_bias<256>(d, out, bias, m0 + 64 * c + 16 * warp + (lane >> 2), n0, M, N);
}
