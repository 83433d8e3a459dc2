// Attention prefill in bf16, stage 8: the softmax's scale folded into one FFMA.
// Changed from stage 7: the row max is taken over the raw scores and each probability is
//   exp2(fma(s, scale * log2 e, -max)) (attention_flash_bf16.cuh's softmax_scores_folded): the
//   separate pass that multiplied all 64 scores of a thread by the scale, and the subtract before
//   each exp2, are gone. The softmax runs between a warpgroup's two GEMMs with the tensor cores
//   idle (stages 3-5 could not hide it), so its instruction count is on the critical path.
// Why it should be faster: per score the softmax did FMUL, FMAX, FADD(-max), EX2 (MUFU plus a
//   multiply), FADD(sum) and the bf16 pack; one FMUL and one FADD fewer is about a quarter of its
//   FMA-pipe instructions. Predicted 1.03-1.08x over stage 7.
// Measured (H100, 2026-11-26): 1.01-1.04x stage 7 at every default shape (30.4 us at B=4, T=1024,
//   HS=64: 212 TFLOP/s, level with cuDNN's SDPA; 2.23 ms at T=16384), the low end of the prediction.
// Launch: grid (NH, B, ceil(T/128)), block 256 (2 warpgroups); entries attention_bf16_folded_softmax_hs{64,128};
//   a CUtensorMap of qkv as [B*T, 3C] bf16 in 64 x 64 boxes (128-byte swizzle) by value; dynamic
//   shared memory (128 + 2 * 2 * 128) * HS * 2 bytes + 1 KB alignment + barriers (81 KB at HS = 64,
//   161 KB at HS = 128).
// Constraints: sm_90a; HS in {64, 128}; NH, B <= 65535; ceil(T/128) <= 65535; B*T*3C < 2^31; any T >= 1 (rows past T
//   read the next sequence's rows or the TMA's zero fill; they are masked or not stored).
// Tolerance: as stage 0 (bf16 operands and output, rel L2 <= 1e-2; lse against score magnitudes).
// Limits: HS in {64, 128}; NH <= 65535 and B <= 65535; T <= 65535 * 128; B * T * 3C < 2^31
#include "attention_flash_bf16.cuh"
#include "attention_wgmma.cuh"

constexpr int STAGES = 2;  // K/V tiles in flight

template <int D>
__device__ __forceinline__ void flash_folded_softmax(const TmaMap* map, __nv_bfloat16* out, float* lse, int T, int NH,
                                            float scale, int causal) {
    constexpr int NT = WG_BC / 8, DT = D / 8;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const TileRing<D, STAGES> r = tile_ring<D, STAGES>(smem_raw);
    const int tid = threadIdx.x, warp = (tid >> 5) & 3, lane = tid & 31;
    const int h = blockIdx.x, b = blockIdx.y;
    const int tile = gridDim.z - 1 - blockIdx.z;  // the slowest axis: every head's heaviest tile first
    const int q0 = tile * WG_BR;
    const int C = NH * D;
    const int row0 = b * T;  // global row of this sequence's token 0
    const int tiles = ((causal ? min(q0 + WG_BR, T) : T) + WG_BC - 1) / WG_BC;
    const int wg = tid >> 7;

    init_ring<0>(r);  // no producer: slots are released by the block barrier
    auto issue = [&](int j) {
        const int s = j % STAGES;
        mbar_expect_tx(r.full(s), 2 * TileRing<D, STAGES>::KV_BYTES);
        load_tile<D, WG_BC>(r.k(s), map, r.full(s), C + h * D, row0 + j * WG_BC);
        load_tile<D, WG_BC>(r.v(s), map, r.full(s), 2 * C + h * D, row0 + j * WG_BC);
    };
    if (tid == 0) {
        mbar_expect_tx(r.q_full(), TileRing<D, STAGES>::Q_BYTES);
        load_tile<D, WG_BR>(r.q(), map, r.q_full(), h * D, row0 + q0);
        for (int j = 0; j < STAGES && j < tiles; ++j) issue(j);
    }

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float o[DT][4];
#pragma unroll
    for (int n = 0; n < DT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    const int row = q0 + 64 * wg + 16 * warp + (lane >> 2);
    const unsigned qa = r.q() + wg * 64 * 128;  // this warpgroup's 64 rows of each column block
    mbar_wait(r.q_full(), 0);

    for (int j = 0; j < tiles; ++j) {
        const int s = j % STAGES, k0 = j * WG_BC;
        mbar_wait(r.full(s), (j / STAGES) & 1);

        float sc[NT][4];
        wgmma_fence();
        issue_qk<D>(sc, qa, r.k(s));
        wgmma_commit();
        wgmma_wait_all();
        fence_operands(sc);

        const bool check = k0 + WG_BC > T || (causal && k0 + WG_BC > q0);
        float alpha[2];
        softmax_scores_folded(sc, m, l, alpha, scale * LOG2E, row, k0, T, causal, check);
        rescale(o, alpha);

        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BC / 16; ++kk) {
            unsigned p[4];
            p_fragment(p, sc, kk);
            issue_pv<D>(o, p, r.v(s), kk);
        }
        wgmma_commit();
        wgmma_wait_all();
        fence_operands(o);
        __syncthreads();  // both warpgroups are done with stage s: it can be refilled
        if (tid == 0 && j + STAGES < tiles) issue(j + STAGES);
    }
    store_rows(out, lse, o, m, l, row, b, h, T, NH);
}

// Two blocks an SM at HS = 64 (128 registers a thread at most), one at HS = 128.
#define BF16_FOLDED_SOFTMAX_ENTRY(D, MIN_BLOCKS)                                                             \
    extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS) attention_bf16_folded_softmax_hs##D(        \
        const __grid_constant__ TmaMap map, __nv_bfloat16* out, float* lse, int T, int NH, float scale, int causal) { \
        flash_folded_softmax<D>(&map, out, lse, T, NH, scale, causal);                                             \
    }
BF16_FOLDED_SOFTMAX_ENTRY(64, 2)
BF16_FOLDED_SOFTMAX_ENTRY(128, 1)
