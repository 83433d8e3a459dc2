// matmul_mma.cuh: the bf16 tensor-core GEMM of linear-bf16 stages 5 and 6 (issue 12).
// out[M, N] = inp[M, K] . W[N, K]^T (+ bias[N]): both operands bf16 and K-major (llm.c's layout;
// the weights converted once, never per call), fp32 accumulation and output.
//
// A block of 8 warps computes a 128 x 128 tile of out; warp (wm, wn) = (warp / 4, warp % 4) owns
// 64 x 32 of it, 4 x 4 mma.sync.m16n8k16 tiles (64 fp32 accumulators a thread). K advances in
// steps of 32 through a ring of MMA_STAGES shared-memory stages filled by cp.async (16-byte copies
// that bypass the registers), MMA_STAGES - 1 of them in flight while the warps compute on the
// oldest. Fragments come from shared memory by ldmatrix.x4: A's 16 x 16 fragment in one, two of
// B's 8 x 16 fragments in another (W stored [n][k] is exactly the "col" B operand mma wants).
//
// MMA_SWIZZLE (stage 6): a tile row is 64 bytes (4 pieces of 16 bytes), so the 8 rows one ldmatrix
// reads at the same piece fall on only two 16-byte slots of a 128-byte bank line: a 4-way bank
// conflict on every fragment load. With the swizzle, piece c of row r is stored at piece
// c ^ ((r >> 1) & 3): the 8 rows cover all 8 slots, conflict-free for ldmatrix and for cp.async.
//
// Tails: rows past M or N and pieces past K are zero-filled (cp.async with a source size of 0), so
// any M and N work. cp.async needs 16-byte aligned sources: with K % 8 != 0 the rows are not, and
// the tile is loaded by guarded 2-byte loads instead (the _unaligned entry; correct, not fast).
#pragma once
#include <cuda_bf16.h>
#include "ladder_mma.cuh"

#ifndef MMA_STAGES
#error "MMA_STAGES is a tunable: the stage list sets it"
#endif

#define MMA_BM 128
#define MMA_BN 128
#define MMA_BK 32
#define MMA_THREADS 256

// Byte offset of 16-byte piece c of row r in a [rows][MMA_BK] bf16 tile.
__device__ __forceinline__ unsigned mma_tile_offset(int r, int c) {
#ifdef MMA_SWIZZLE
    c ^= (r >> 1) & 3;
#endif
    return (unsigned)(r * (MMA_BK * 2) + c * 16);
}

// One operand's 128 x 32 tile at (row0, k0) of a [rows, K] matrix into shared memory at `tile`.
template <bool ALIGNED>
__device__ __forceinline__ void mma_load_tile(unsigned tile, const __nv_bfloat16* src, int rows, int K, int row0,
                                              int k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int idx = threadIdx.x + i * MMA_THREADS;  // 512 pieces: 128 rows x 4
        const int r = idx >> 2, c = idx & 3;
        const int row = row0 + r, k = k0 + 8 * c;
        const unsigned dst = tile + mma_tile_offset(r, c);
        if constexpr (ALIGNED) {
            const bool valid = row < rows && k < K;  // K % 8 == 0: a piece is all in or all out
            cp_async_16(dst, valid ? src + (size_t)row * K + k : src, valid);
        } else {
            unsigned short v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                v[j] = row < rows && k + j < K ? reinterpret_cast<const unsigned short*>(src)[(size_t)row * K + k + j]
                                               : (unsigned short)0;
            const uint4 u = make_uint4(v[0] | (v[1] << 16), v[2] | (v[3] << 16), v[4] | (v[5] << 16),
                                       v[6] | (v[7] << 16));
            asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(dst), "r"(u.x), "r"(u.y), "r"(u.z),
                         "r"(u.w));
        }
    }
}

template <bool ALIGNED>
__device__ __forceinline__ void mma_gemm(float* out, const __nv_bfloat16* inp, const __nv_bfloat16* w,
                                         const float* bias, int M, int N, int K) {
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr unsigned TILE_BYTES = MMA_BM * MMA_BK * 2;  // A and B tiles are the same size
    const unsigned base = smem_u32(smem);
    auto a_tile = [&](int s) { return base + (unsigned)s * 2 * TILE_BYTES; };
    auto b_tile = [&](int s) { return base + (unsigned)s * 2 * TILE_BYTES + TILE_BYTES; };

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int m0 = blockIdx.y * MMA_BM, n0 = blockIdx.x * MMA_BN;
    const int ktiles = (K + MMA_BK - 1) / MMA_BK;

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

    // Fill all but one stage.
#pragma unroll
    for (int s = 0; s < MMA_STAGES - 1; ++s) {
        if (s < ktiles) {
            mma_load_tile<ALIGNED>(a_tile(s), inp, M, K, m0, s * MMA_BK);
            mma_load_tile<ALIGNED>(b_tile(s), w, N, K, n0, s * MMA_BK);
        }
        cp_async_commit();
    }

    // ldmatrix addresses: lane l gives row (l % 8) + 8 * ((l / 8) % 2) and k half l / 16 of A's
    // 16 x 16 fragment; for B, n row (l % 8) + 8 * (l / 16) and k half (l / 8) % 2 of two 8-row
    // fragments.
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_half = lane >> 4;
    const int b_row = (lane & 7) + (lane >> 4) * 8, b_half = (lane >> 3) & 1;

    for (int kt = 0; kt < ktiles; ++kt) {
        cp_async_wait<MMA_STAGES - 2>();
        __syncthreads();  // tile kt is in; every warp is done with the stage about to be refilled
        const int next = kt + MMA_STAGES - 1;
        if (next < ktiles) {
            mma_load_tile<ALIGNED>(a_tile(next % MMA_STAGES), inp, M, K, m0, next * MMA_BK);
            mma_load_tile<ALIGNED>(b_tile(next % MMA_STAGES), w, N, K, n0, next * MMA_BK);
        }
        cp_async_commit();

        const unsigned at = a_tile(kt % MMA_STAGES), bt = b_tile(kt % MMA_STAGES);
#pragma unroll
        for (int kk = 0; kk < MMA_BK / 16; ++kk) {
            unsigned a[4][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                ldmatrix_x4(a[i], at + mma_tile_offset(wm * 64 + i * 16 + a_row, 2 * kk + a_half));
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                unsigned r[4];
                ldmatrix_x4(r, bt + mma_tile_offset(wn * 32 + j * 16 + b_row, 2 * kk + b_half));
                b[2 * j][0] = r[0];
                b[2 * j][1] = r[1];
                b[2 * j + 1][0] = r[2];
                b[2 * j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    mma_16816<__nv_bfloat16>(acc[i][j], a[i][0], a[i][1], a[i][2], a[i][3], b[j][0], b[j][1]);
        }
    }
    cp_async_wait<0>();

    // acc[i][j]: rows g and g + 8 of m16 tile i, columns 2t and 2t + 1 of n8 tile j.
    const int g = lane >> 2, t = lane & 3;
    const bool pairs = (N & 1) == 0;  // float2 stores need 8-byte aligned rows
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = n0 + wn * 32 + j * 8 + 2 * t;
            if (col >= N) continue;
            const float b0 = bias != nullptr ? bias[col] : 0.0f;
            const float b1 = bias != nullptr && col + 1 < N ? bias[col + 1] : 0.0f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m0 + wm * 64 + i * 16 + g + 8 * h;
                if (row >= M) continue;
                float* o = out + (size_t)row * N + col;
                const float x = acc[i][j][2 * h] + b0, y = acc[i][j][2 * h + 1] + b1;
                if (pairs) {
                    *reinterpret_cast<float2*>(o) = make_float2(x, y);
                } else {
                    o[0] = x;
                    if (col + 1 < N) o[1] = y;
                }
            }
        }
}

#define MMA_ENTRIES                                                                                           \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS) linear_bf16(                                    \
        float* out, const __nv_bfloat16* inp, const __nv_bfloat16* w, const float* bias, int M, int N, int K) { \
        mma_gemm<true>(out, inp, w, bias, M, N, K);                                                           \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS) linear_bf16_unaligned(                          \
        float* out, const __nv_bfloat16* inp, const __nv_bfloat16* w, const float* bias, int M, int N, int K) { \
        mma_gemm<false>(out, inp, w, bias, M, N, K);                                                          \
    }
