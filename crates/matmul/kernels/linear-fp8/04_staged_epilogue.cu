// linear-fp8, stage 4: staged epilogue (a tile's store runs under the next tile's first K step).
// Changed from stage 3: a consumer no longer stores its finished tile from registers with the
//   tensor cores idle. It issues the next tile's first four wgmma, then (Fp8StagedStore) writes the
//   finished accumulator plus the bias into its own 32 KiB of shared memory in the TMA's 128-byte
//   swizzle, and one thread stores it with four TMA stores; the next tile's promotion starts into
//   the zeroed accumulator only after that. The last tile is stored after the loop and waited for.
// Why it should be faster: stage 3 spends, per tile and warpgroup, 64 STG.64 with their bounds
//   checks and address math (and the bias loads) between two tiles' MMA; at GPT-2's K = 768 a tile
//   has only six K steps (~1.7 us at the FP8 rate), so that store is a large share. Here the
//   warpgroup's own next step runs under it, and the stores themselves leave as four bulk copies
//   of whole 128-byte lines. Predicted ~1.1x stage 3 at the K = 768 shapes, ~1.03x at 4096^3.
// Measured (H100, stage 3 in the same call): QKV 1.21x (33.5 us), MLP up 1.17x (40.1), attn proj
//   1.00x, MLP down 1.02x; 4096^3 and 8192^3 0.98x. Against cuBLASLt's block-scaled FP8, same call:
//   0.93x at QKV, 0.90x at MLP up. ncu at MLP up: tensor pipe 33% of active cycles (stage 3: 25%),
//   long-scoreboard stalls 2.1 (4.7). Kept for the multi-wave K = 768 shapes; at large K the staging
//   (64 STS, two named barriers) delays the next step's issue by more than the store it replaces.
//   With the tails (a later call): MLP up with GELU into bf16 35.7 us (30.1 without), attn proj and
//   MLP down adding an fp32 residual 22.9 and 39.1 us.
// Tails: the bias, then GELU (_gelu, the SFU's tanh form) or plus a residual of out's type
//   (_residual; it may be out itself, since a tile reads its residual before it is stored), as
//   linear-bf16's. The first stage with a tail or a bf16 output (stage 5 keeps them).
// Launch: linear_fp8_staged_epilogue[_gelu|_residual][_bf16] (fp32 or bf16 out): stage 3's grid and
//   block; dynamic shared memory WG_STAGES * 32 KiB +
//   2 barriers a stage, rounded up to 1 KiB, + two consumers' staging (2 x 32 KiB fp32, 2 x 16 KiB
//   bf16) + 1 KiB (alignment); a third CUtensorMap (out, boxes of 128 bytes x 64 rows) after stage
//   3's arguments, then the residual.
// Constraints: stage 3's, and 16-byte rows of out for the TMA: N % 4 == 0 (fp32), N % 8 == 0 (bf16).
// Tolerance: 1e-2 preset against the f64 product of the dequantized operands.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 16 == 0; N % 4 == 0; N % 8 == 0 at out = 16
#include "matmul_fp8_gemm.cuh"

// Recipe: fp8_ring, Fp8TileStride, fp8_consumer with fp8_produce_tiles, fp8_consume_overlapped with
// Fp8StagedStore of the previous tile under its first step.

// out is Out (fp32, or bf16); map_out its tensor map in boxes of 128 bytes x 64 rows; residual (Out,
// M x N) is read by the residual tail only.
template <class Out, int TAIL>
__device__ __forceinline__ void staged_epilogue(const TmaMap& map_a, const TmaMap& map_b, const float* a_scales,
                                                const float* b_scales, const float* bias, int M, int N, int K,
                                                const TmaMap& map_out, const Out* residual) {
    const Fp8Ring<WG_STAGES> ring = fp8_ring<WG_STAGES>();
    const unsigned staging = (ring.base + Fp8Ring<WG_STAGES>::BYTES + 1023) & ~1023u;
    const Fp8TileStride tiles(M, N);
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    const int ktiles = (K + F8_BK - 1) / F8_BK;

    if (!fp8_consumer(ring, wg, [&] { fp8_produce_tiles(ring, tiles, &map_a, &map_b, ktiles); })) return;

    const int c = wg - 1, warp = (tid >> 5) & 3;
    using Store = Fp8StagedStore<Out, TAIL>;
    const Store store{staging + c * Store::BYTES, 1 + c, (tid & 127) == 0};
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    // The tile whose result acc holds (none before the first: its store is predicated off).
    int prev_m0 = 0, prev_n0 = 0;
    bool have_prev = false;
    int first = 0;
    for (int t = tiles.first(); !tiles.done(t); t = tiles.next(t), first += ktiles) {
        const int m0 = tiles.m0(t) + 64 * c, n0 = tiles.n0(t);
        const StepScales scales(a_scales, b_scales, m0 + 16 * warp + (lane >> 2), n0, M, ktiles);
        const auto store_prev = [&] { store(acc, &map_out, bias, residual, prev_m0, prev_n0, M, N, have_prev); };
        fp8_consume_overlapped(acc, ring, c * 64 * F8_BK, scales, ktiles, first, store_prev);
        prev_m0 = m0, prev_n0 = n0, have_prev = true;
    }
    store(acc, &map_out, bias, residual, prev_m0, prev_n0, M, N, have_prev);
    tma_store_wait();
}

// `out` is unused (the stores go through map_out): the argument list is every stage's, then out's
// map and the residual (Out, M x N; null but for the residual tail).
#define STAGED_ENTRY(name, Out, TAIL)                                                                              \
    extern "C" __global__ void __launch_bounds__(384, 1)                                                           \
        name(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, void* out,                \
             const float* a_scales, const float* b_scales, const float* bias, int M, int N, int K,                 \
             const __grid_constant__ TmaMap map_out, const Out* residual) {                                        \
        staged_epilogue<Out, TAIL>(map_a, map_b, a_scales, b_scales, bias, M, N, K, map_out, residual);            \
    }

STAGED_ENTRY(linear_fp8_staged_epilogue, float, MM_TAIL_NONE)
STAGED_ENTRY(linear_fp8_staged_epilogue_gelu, float, MM_TAIL_GELU)
STAGED_ENTRY(linear_fp8_staged_epilogue_residual, float, MM_TAIL_RESIDUAL)
STAGED_ENTRY(linear_fp8_staged_epilogue_bf16, __nv_bfloat16, MM_TAIL_NONE)
STAGED_ENTRY(linear_fp8_staged_epilogue_gelu_bf16, __nv_bfloat16, MM_TAIL_GELU)
STAGED_ENTRY(linear_fp8_staged_epilogue_residual_bf16, __nv_bfloat16, MM_TAIL_RESIDUAL)
