// linear-fp8, stage 0: wgmma-scaled (e4m3 warpgroup MMA with fine-grained scales promoted in fp32:
// DeepGEMM's scheme in linear-bf16 stage 7's frame).
// What it does: out[M, N] = dequant(A)[M, K] . dequant(W)[N, K]^T (+ bias), A and W in matmul::fp8's
//   format: e4m3 codes with an fp32 scale per row per 128 channels (A) and per 128 x 128 block (W).
//   The tiles are 128 x 128 x 128 (a K step of 128 codes is one 128-byte swizzled row, as linear-bf16
//   stage 7's 64 bf16), loaded by TMA into WG_STAGES stages; each of 2 warpgroups issues 4
//   wgmma.m64n128k32.e4m3 per K step into a fresh fp32 tile (the first with the accumulator off),
//   then adds it into its own fp32 accumulator times the step's scales: its two rows' A scales and
//   the block's W scale (one 128-wide K step is one scale group of both operands, and the block's
//   128 columns one W block). Promoting every 4 instructions (128 of K) is DeepGEMM's cure for
//   Hopper's FP8 accumulation, which keeps ~14 bits.
// Why it should be faster than linear-bf16 stage 7: wgmma on e4m3 runs at twice the bf16 rate (1,979
//   against 989 dense TFLOP/s on an H100 SXM) and a tile's bytes are half; the promotion costs 64
//   FFMA a thread a K step (against 4 wgmma of 64 x 128 x 32). Predicted ~1.6x stage 7 at 4096^3;
//   like stage 7, each K step waits for its own wgmma and TMA refill, so far from the FP8 rate.
// Measured (H100): 840 TFLOP/s at 4096^3 (1.40x linear-bf16 stage 16, 0.62x torch._scaled_mm), 804 at
//   8192^3; 0.50-0.60x _scaled_mm and 0.66-0.82x the bf16 best at GPT-2's shapes (latency-bound).
// Launch: linear_fp8_wgmma: grid (ceil(N / 128), ceil(M / 128)), block 256 (2 warpgroups), dynamic
//   shared memory WG_STAGES * 32 KiB + 1 KiB (alignment) + barriers; two CUtensorMaps by value.
// Constraints: sm_90a; K % 16 == 0 (the TMA's global row stride is a multiple of 16 bytes); M, N,
//   K >= 1; M * K, N * K, M * N < 2^31; M <= 65535 * 128; scales as matmul::fp8 lays them out.
// Tolerance: 1e-2 preset against the f64 product of the dequantized operands (exact e4m3 products,
//   fp32 promotion every 128 of K).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; M <= 65535 * 128; K % 16 == 0; out = 32; epi = 0
#include "matmul_fp8_gemm.cuh"

// Recipe: fp8_ring (its `full` barriers), Fp8Ring::load, fp8_consume_waited with a block barrier and
// the refill as its release, store_m64_bias<128>.

extern "C" __global__ void __launch_bounds__(256, 1)
    linear_fp8_wgmma(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, float* out,
                     const float* a_scales, const float* b_scales, const float* bias, int M, int N, int K) {
    const Fp8Ring<WG_STAGES> ring = fp8_ring<WG_STAGES>();  // its `full` barriers only
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int m0 = blockIdx.y * F8_BM, n0 = blockIdx.x * F8_BN;
    const int ktiles = (K + F8_BK - 1) / F8_BK;  // = the scale groups of K

    if (tid == 0) ring.init<0>();
    __syncthreads();
    auto issue = [&](int kt) { ring.load(kt % WG_STAGES, &map_a, &map_b, kt, m0, n0); };
    if (tid == 0)
        for (int kt = 0; kt < WG_STAGES && kt < ktiles; ++kt) issue(kt);

    const int row0 = m0 + 64 * wg + 16 * warp + (lane >> 2);
    const StepScales scales(a_scales, b_scales, row0, n0, M, ktiles);

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    const auto release = [&](int kt, int) {
        __syncthreads();  // both warpgroups are done with stage s: it can be refilled
        if (tid == 0 && kt + WG_STAGES < ktiles) issue(kt + WG_STAGES);
    };
    // Warpgroup wg takes rows 64 wg .. 64 wg + 63 of the A tile (8 KiB in: a 1024-byte multiple).
    fp8_consume_waited(acc, ring, wg * 64 * F8_BK, scales, ktiles, release);

    store_m64_bias<128>(acc, out, bias, row0, n0, M, N);
}
