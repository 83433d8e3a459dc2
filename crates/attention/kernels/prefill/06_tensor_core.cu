// Attention prefill, stage 6: tensor-core (FlashAttention-2 on mma.sync, bf16 operands, fp32
// accumulation and softmax).
// Changed from stage 5: the two products run on tensor cores. A block of 4 warps takes 64 query
//   rows (16 per warp) and walks the key tiles of 64 up to its diagonal. Q, K and V are read as fp32
//   from qkv, rounded to bf16 once on the way into shared memory (rows padded by 8 elements, so the
//   8 row addresses of an ldmatrix fall in 8 different bank groups). Each warp keeps its Q fragments
//   in registers; S = Q.K^T is 8 n-tiles of m16n8k16 per 16 dims; the online softmax runs on the
//   accumulators (a row's 64 scores live in the 4 threads of a quad: 2 shuffles for max and sum);
//   P goes from the S accumulators straight into the A fragments of P.V (no shared memory), and V's
//   B fragments come from ldmatrix.trans of the row-major tile. Query tiles run heaviest first
//   (blockIdx.x reversed), so the causal triangle's long rows do not finish last.
// Why it should be faster: stage 5 does 2*T*T*D/2 fp32 FMAs per head at ~7 TFLOP/s; mma.sync bf16
//   runs the same products at up to ~600 TFLOP/s on an H100, so the kernel should become bound by
//   loading and converting K and V (each tile read by every query tile below it from L2) and by the
//   softmax's exp2 on the FMA pipe: predicted 5-10x over stage 5 at B=4, T=1024, HS=64.
// Launch: grid (ceil(T/64), NH, B), block 128 (4 warps); entry attention_flash_tc_hs{32,64,128}.
//   Dynamic shared memory 3 * 64 * (HS + 8) bf16: 27.6 KB at HS = 64, 52.2 KB at HS = 128.
// Constraints: HS in {32, 64, 128}; NH, B <= 65535; B*T*3C < 2^31; any T (rows and keys past T
//   are zero-filled and masked).
// Tolerance: bf16 operands (q, k, v and P rounded to 8 bits of mantissa): rel L2 <= 1e-2 for out;
//   lse's L2 error <= 1e-2 of its rows' score magnitudes (max_j scale * sum_i |q_i k_ji|), since
//   an lse may be ~0 (at T = 1 it is the one score) while the rounding of q and k is not.
// Limits: B * T * 3C < 2^31; HS in {32, 64, 128}; NH <= 65535 and B <= 65535
#include "attention_flash_bf16.cuh"

#ifndef TC_BR
#define TC_BR 64
#endif
#ifndef TC_BC
#define TC_BC 64
#endif
static_assert(TC_BR == 64 && TC_BC == 64, "4 warps of 16 query rows, key tiles of 64");

constexpr int TC_PAD = 8;  // bf16 elements of padding per shared row

// Rows row0..row0+63 of one head's q, k or v (fp32, row stride 3C) into a bf16 tile of stride
// D + TC_PAD; rows at or past T are zeros.
template <int D>
__device__ __forceinline__ void load_tile(__nv_bfloat16* tile, const float* src, int row0, int T, size_t stride) {
    constexpr int V4 = D / 4;
    for (int i = threadIdx.x; i < TC_BR * V4; i += blockDim.x) {
        const int r = i / V4, c = (i % V4) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (row0 + r < T) v = *reinterpret_cast<const float4*>(src + (size_t)(row0 + r) * stride + c);
        uint2 packed = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
        *reinterpret_cast<uint2*>(tile + r * (D + TC_PAD) + c) = packed;
    }
}

template <int D>
__device__ __forceinline__ void flash_tc(float* out, float* lse, const float* qkv, int T, int NH, float scale) {
    constexpr int S = D + TC_PAD;  // shared row stride (elements)
    constexpr int KSTEPS = D / 16;  // k-steps of Q.K^T
    constexpr int NT = TC_BC / 8;   // n-tiles of S per warp (64 keys)
    constexpr int DT = D / 8;       // n-tiles of O per warp
    extern __shared__ __align__(16) unsigned char tc_smem[];
    __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(tc_smem);
    __nv_bfloat16* ks = qs + TC_BR * S;
    __nv_bfloat16* vs = ks + TC_BC * S;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y, b = blockIdx.z;
    const int tile = gridDim.x - 1 - blockIdx.x;  // heaviest (longest) query tiles first
    const int q0 = tile * TC_BR;
    const int C = NH * D;
    const size_t C3 = 3 * (size_t)C;
    const float* qb = qkv + (size_t)b * T * C3 + (size_t)h * D;
    const float* kb = qb + C;
    const float* vb = qb + 2 * C;

    load_tile<D>(qs, qb, q0, T, C3);
    __syncthreads();
    // This warp's 16 query rows as A fragments, one set of four registers per 16 dims.
    unsigned qa[KSTEPS][4];
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk)
        ldmatrix_x4(qa[kk], smem_u32(qs + (warp * 16 + (lane & 15)) * S + kk * 16 + (lane >> 4) * 8));

    const float sl2 = scale * LOG2E;  // scores in log2 units
    // Rows g and g+8: running max (log2 units) and running sum of exp2, and their O.
    float m[2], l[2], o[DT][4];
    softmax_state_init(m, l, o);
    const int row_g = q0 + warp * 16 + g;  // this thread's two query rows: row_g and row_g + 8

    for (int j = 0; j <= tile; ++j) {
        const int k0 = j * TC_BC;
        __syncthreads();  // the previous tile's K and V are no longer read
        load_tile<D>(ks, kb, k0, T, C3);
        load_tile<D>(vs, vb, k0, T, C3);
        __syncthreads();

        float s[NT][4];
        qk_mma_sync(s, qa, [&](int key, int c, int h) { return smem_u32(ks + key * S + c * 8 + h * 8); });

        // The online softmax (attention_flash_bf16.cuh): scores into log2 units, keys past the
        // diagonal (only on it) and past T masked, O rescaled.
        const bool edge = (j == tile) || (k0 + TC_BC > T);
        online_softmax_step(s, m, l, o, sl2, row_g, k0, T, true, edge);

        // O += P.V: P's 16 keys per k-step are two S n-tiles, already in A-fragment order.
        pv_mma_sync(o, s, [&](int key, int c, int h) { return smem_u32(vs + key * S + c * 8 + h * 8); });
    }

    // O / l, and lse = (m + log2 l) * ln 2 in the natural log of the scaled scores.
    const float inv[2] = {1.f / l[0], 1.f / l[1]};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row_g + r * 8;
        if (row >= T) continue;
        float* orow = out + ((size_t)b * T + row) * C + (size_t)h * D;
#pragma unroll
        for (int n = 0; n < DT; ++n)
            *reinterpret_cast<float2*>(orow + n * 8 + 2 * t) =
                make_float2(o[n][2 * r] * inv[r], o[n][2 * r + 1] * inv[r]);
        if (t == 0) lse[((size_t)b * NH + h) * T + row] = row_lse(m[r], l[r]);
    }
}

#define FLASH_TC_ENTRY(D)                                                                                  \
    extern "C" __global__ void __launch_bounds__(128) attention_flash_tc_hs##D(                            \
        float* out, float* lse, const float* qkv, int /*B*/, int T, int NH, float scale) {                 \
        flash_tc<D>(out, lse, qkv, T, NH, scale);                                                          \
    }
FLASH_TC_ENTRY(32)
FLASH_TC_ENTRY(64)
FLASH_TC_ENTRY(128)
