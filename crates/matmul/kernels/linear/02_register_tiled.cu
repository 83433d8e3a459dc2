// Linear forward, stage 2: 2-D block tiling with register tiles (the report's "register tiling").
// Changed from previous: a 256-thread block computes a 128 x 128 output tile; each thread keeps an
//   8 x 8 patch of accumulators in registers (rows {4ty..4ty+3, 64+4ty..64+4ty+3}, the same split
//   for columns). Per 8-wide K step the block loads a 128 x 8 tile of inp and of W with one 16-byte
//   load per thread each, stores them K-major (transposed) in shared memory, and each thread then
//   reads 4 float4 per k and does 64 FMAs.
// Why it should be faster: shared-memory traffic per FMA falls from 2 loads to 1/16 float4 load
//   (outer product of two 8-vectors), global traffic per FMA falls to 1/64 of the naive one, and
//   the FMA pipes become the limit: expect most of the way to the fp32 FMA rate at large shapes.
// Layout: As[k][m] and Bs[k][n], rows padded by 4 floats so the transposed stores do not conflict;
//   the split 4+4 column ownership keeps each quarter-warp's float4 reads on distinct banks.
// Launch: block 256, grid (ceil(N/128), ceil(M/128)), 8.4 KB static shared memory.
// Constraints: M, N, K >= 1. 16-byte loads are used when K % 4 == 0 (and 16-byte stores when
//   N % 4 == 0); otherwise the same code falls back to guarded scalar accesses, zero-filling
//   beyond M, N, K. Tolerance: fp32, rel L2 <= 1e-5.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; M <= 65535 * MM_RT_TILE
#include "matmul_aux.cuh"

#ifndef MM_RT_TILE
#error "MM_RT_TILE (the square block tile; 2 * MM_RT_TILE threads) is a tunable: the stage list sets it"
#endif
// The thread mapping below (16 x 16 threads of 8 x 8 accumulators, 2 loader threads per tile row)
// is written for 128 x 128 tiles.
static_assert(MM_RT_TILE == 128, "linear_register_tiled's thread mapping needs MM_RT_TILE = 128");
#define BM MM_RT_TILE
#define BN MM_RT_TILE
#define BK 8

// Four consecutive elements k..k+3 of row `row` of a rows x K matrix, zero outside it.
__device__ __forceinline__ float4 load_row4(const float* p, int row, int rows, int k, int K, bool vec) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row < rows) {
        const float* r = p + (size_t)row * K;
        if (vec && k + 3 < K) {
            v = *reinterpret_cast<const float4*>(r + k);
        } else {
            if (k < K) v.x = r[k];
            if (k + 1 < K) v.y = r[k + 1];
            if (k + 2 < K) v.z = r[k + 2];
            if (k + 3 < K) v.w = r[k + 3];
        }
    }
    return v;
}

extern "C" __global__ void __launch_bounds__(2 * MM_RT_TILE) linear_register_tiled(float* out, const float* inp, const float* w,
                                                                        const float* bias, int M, int N, int K) {
    __shared__ __align__(16) float As[BK][BM + 4];
    __shared__ __align__(16) float Bs[BK][BN + 4];
    const int tid = threadIdx.x;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int lrow = tid >> 1;       // tile row this thread loads (of inp and of W)
    const int lk = (tid & 1) * 4;    // its 4-element k offset within the 8-wide step
    const int ty = tid >> 4, tx = tid & 15;
    const bool vec_k = (K & 3) == 0;

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
        float4 a = load_row4(inp, m0 + lrow, M, k0 + lk, K, vec_k);
        float4 b = load_row4(w, n0 + lrow, N, k0 + lk, K, vec_k);
        As[lk + 0][lrow] = a.x;
        As[lk + 1][lrow] = a.y;
        As[lk + 2][lrow] = a.z;
        As[lk + 3][lrow] = a.w;
        Bs[lk + 0][lrow] = b.x;
        Bs[lk + 1][lrow] = b.y;
        Bs[lk + 2][lrow] = b.z;
        Bs[lk + 3][lrow] = b.w;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk++) {
            float4 a0 = *reinterpret_cast<const float4*>(&As[kk][ty * 4]);
            float4 a1 = *reinterpret_cast<const float4*>(&As[kk][64 + ty * 4]);
            float4 b0 = *reinterpret_cast<const float4*>(&Bs[kk][tx * 4]);
            float4 b1 = *reinterpret_cast<const float4*>(&Bs[kk][64 + tx * 4]);
            const float ra[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float rb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] += ra[i] * rb[j];
        }
        __syncthreads();
    }

    const bool vec_n = (N & 3) == 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int row = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        if (row >= M) continue;
        float* orow = out + (size_t)row * N;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int col = n0 + h * 64 + tx * 4;
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float bj = (bias != nullptr && col + j < N) ? bias[col + j] : 0.0f;
                v[j] = acc[i][h * 4 + j] + bj;
            }
            if (vec_n && col + 3 < N) {
                *reinterpret_cast<float4*>(orow + col) = make_float4(v[0], v[1], v[2], v[3]);
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (col + j < N) orow[col + j] = v[j];
            }
        }
    }
}
