// Attention prefill in bf16, stage 2: wgmma on tiles the TMA puts in 128-byte-swizzled shared
// memory, completing on an mbarrier ring.
// Changed from stage 1: (1) both products run on Hopper's warpgroup MMA: a warpgroup owns 64 query
//   rows and issues S = Q.K^T as wgmma.m64n128k16 with Q and K read from shared memory through
//   descriptors (no ldmatrix through registers), and O += P.V as wgmma.m64nHSk16 with P from
//   registers (the S accumulators rounded to bf16 are, per warp, exactly mma.sync's A fragments)
//   and V read MN-major (the transpose flag) from the tile as it lies; (2) Q, K and V tiles arrive
//   by TMA, one thread issuing 64 x 64 boxes that complete on the stage's mbarrier with their byte
//   count, instead of 256 threads computing addresses for cp.async; (3) key tiles of 128, so a
//   tile's softmax and barrier are amortised over twice the keys. Two warpgroups (128 query rows)
//   share each K/V tile; two tiles in flight. Not yet: a producer warp (the issuing thread is a
//   consumer), overlap of one warpgroup's softmax with the other's GEMMs, or of a tile's softmax
//   with the next tile's S (stages 3-5).
// Why it should be faster: wgmma issues a warpgroup's 64 x 128 x 16 product in one instruction at
//   the rate mma.sync cannot reach (about 2x per SM on an H100), and the 8 ldmatrix of every 16
//   mma.sync are gone. The softmax between the two GEMMs stays serial, so predicted 1.3-1.8x over
//   stage 1 (about 190 -> 300 TFLOP/s at HS = 128, T = 2048).
// Measured (H100, 2026-11-26): 40 us (161 TFLOP/s) at B=4, T=1024, HS=64, causal; 363 us (379
//   TFLOP/s) at B=8, T=2048, HS=128, causal; 600 us (458) not causal; 2.15 ms (511) at T=16384:
//   1.6-2.1x stage 1, above the prediction; 0.74-0.92x cuDNN's SDPA in the same call.
// Launch: grid (ceil(T/128), NH, B), block 256 (2 warpgroups); entries attention_bf16_wgmma_hs{64,128};
//   a CUtensorMap of qkv as [B*T, 3C] bf16 in 64 x 64 boxes (128-byte swizzle) by value; dynamic
//   shared memory (128 + 2 * 2 * 128) * HS * 2 bytes + 1 KB alignment + barriers (81 KB at HS = 64,
//   161 KB at HS = 128).
// Constraints: sm_90a; HS in {64, 128}; NH, B <= 65535; B*T*3C < 2^31; any T >= 1 (rows past T
//   read the next sequence's rows or the TMA's zero fill; they are masked or not stored).
// Tolerance: as stage 0 (bf16 operands and output, rel L2 <= 1e-2; lse against score magnitudes).
// Limits: HS in {64, 128}; NH <= 65535 and B <= 65535; B * T * 3C < 2^31
#include "attention_flash_bf16.cuh"
#include "attention_wgmma.cuh"

constexpr int STAGES = 2;  // K/V tiles in flight

template <int D>
__device__ __forceinline__ void flash_wgmma(const TmaMap* map, __nv_bfloat16* out, float* lse, int T, int NH,
                                            float scale, int causal) {
    constexpr int NT = WG_BC / 8, DT = D / 8;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const TileRing<D, STAGES> r = tile_ring<D, STAGES>(smem_raw);
    const int tid = threadIdx.x, warp = (tid >> 5) & 3, lane = tid & 31;
    const int h = blockIdx.y, b = blockIdx.z;
    const int tile = gridDim.x - 1 - blockIdx.x;  // heaviest query tiles first
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
        online_softmax_step(sc, m, l, o, scale * LOG2E, row, k0, T, causal, check);

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

#define BF16_WGMMA_ENTRY(D)                                                                              \
    extern "C" __global__ void __launch_bounds__(256, 1) attention_bf16_wgmma_hs##D(                     \
        const __grid_constant__ TmaMap map, __nv_bfloat16* out, float* lse, int T, int NH, float scale, int causal) { \
        flash_wgmma<D>(&map, out, lse, T, NH, scale, causal);                                             \
    }
BF16_WGMMA_ENTRY(64)
BF16_WGMMA_ENTRY(128)
