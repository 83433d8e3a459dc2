// Linear forward, stage 1: shared-memory tiling.
// Changed from previous: a 32 x 32 block stages a 32 x 32 tile of inp and of W in shared memory per
//   32-wide step along K; each thread still computes one output, reading its operands from shared
//   memory.
// Why it should be faster: every global element is loaded once per block instead of once per
//   thread: global traffic drops 32x (2·M·N·K/32 floats), and both tile loads are coalesced along
//   K. The inner loop is now 2 shared loads per FMA (one a broadcast), so shared-memory bandwidth
//   bounds it: expect several times the naive rate, still well under the FMA peak.
// Layout: As[m][k] (read as a broadcast), Ws[n][k] padded to 33 columns so the 32 lanes reading
//   Ws[lane][kk] hit 32 different banks.
// Launch: block (32, 32), grid (ceil(N/32), ceil(M/32)), 8.4 KB static shared memory.
// Constraints: M, N, K >= 1 (ragged edges zero-filled, stores guarded); M*K, N*K, M*N < 2^31.
// Tolerance: fp32, rel L2 <= 1e-5.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; M <= 65535 * MM_TILE
#include "matmul_aux.cuh"

#ifndef MM_TILE
#error "MM_TILE (the square tile edge; block MM_TILE x MM_TILE) is a tunable: the stage list sets it"
#endif
#define TILE MM_TILE

extern "C" __global__ void __launch_bounds__(TILE * TILE) linear_smem_tiled(float* out, const float* inp,
                                                                             const float* w, const float* bias,
                                                                             int M, int N, int K) {
    __shared__ float As[TILE][TILE + 1];
    __shared__ float Ws[TILE][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int m = blockIdx.y * TILE + ty;
    const int n = blockIdx.x * TILE + tx;
    const int wn = blockIdx.x * TILE + ty;  // the W row this thread loads
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        int k = k0 + tx;
        As[ty][tx] = (m < M && k < K) ? inp[(size_t)m * K + k] : 0.0f;
        Ws[ty][tx] = (wn < N && k < K) ? w[(size_t)wn * K + k] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; kk++) acc += As[ty][kk] * Ws[tx][kk];
        __syncthreads();
    }
    if (m < M && n < N) out[(size_t)m * N + n] = acc + ((bias != nullptr) ? bias[n] : 0.0f);
}
