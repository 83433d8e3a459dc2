// matmul_gemv_fp8_streamed.cuh: gemv-fp8's streamed-rows kernel (stages 3-4; the header of
// gemv-fp8/03_streamed_rows.cu says what it does) and its part that differs: over how many warps a
// row's K is split.
#pragma once
#include "matmul_gemv_fp8.cuh"

// A row's K over KSPLIT warps of the block (the block's warps / KSPLIT rows at a time): warp rank r
// takes the row's pieces r * 32 + lane, r * 32 + lane + 32 KSPLIT, ...; the ranks' sums meet in
// shared memory. KSPLIT = 1 (stage 3): a warp a row, nothing to meet.
template <int KSPLIT>
struct SplitRows {
    static __device__ __forceinline__ int rank() { return (threadIdx.x >> 5) % KSPLIT; }
    // The row's sum from each rank's reduced sum s (every lane holds it), valid in rank 0; `turn`
    // counts the block's rows so far, so consecutive rows use alternate slots and one barrier a row
    // suffices. Every warp of the block calls it the same number of times.
    static __device__ __forceinline__ float combine(float s, int turn) {
        if constexpr (KSPLIT == 1) {
            return s;
        } else {
            __shared__ float part[2][32];  // [turn parity][warp]
            const int warp = threadIdx.x >> 5;
            if ((threadIdx.x & 31) == 0) part[turn & 1][warp] = s;
            __syncthreads();
            float total = 0.0f;
#pragma unroll
            for (int r = 0; r < KSPLIT; ++r) total += part[turn & 1][warp - rank() + r];
            return total;
        }
    }
};

template <int P, int KSPLIT, typename In>
__device__ __forceinline__ void gemv_fp8_streamed_rows(float* out, const In* inp, const unsigned char* w,
                                                       const float* scales, const float* bias,
                                                       const float* residual, int tail, int M, int N, int K) {
    using Split = SplitRows<KSPLIT>;
    const int lane = threadIdx.x & 31, rows = (blockDim.x >> 5) / KSPLIT, rank = Split::rank();
    const int first = blockIdx.x * rows + (threadIdx.x >> 5) / KSPLIT, stride = gridDim.x * rows;
    const int pieces = K / 16, groups = (K + FP8_GROUP - 1) / FP8_GROUP;
    const int c0 = rank * 32 + lane;  // this lane's first piece of every row
    // Row n's pieces (this lane's share of the row: K <= 32 * KSPLIT * P * 16) and their scales.
    auto request = [&](uint4 (&q)[P], float (&scale)[P], int n) {
        const uint4* row = reinterpret_cast<const uint4*>(w + (size_t)n * K);
        fp8_row_pieces(q, scale, row, scales + (size_t)(n / FP8_GROUP) * groups, c0, pieces, 32 * KSPLIT);
    };
    // Rows past N still meet the barriers of a split row: the loops below run on n < last, the same
    // bound for every warp of the block.
    const int last = KSPLIT == 1 ? N : (N + rows - 1) / rows * rows;
    for (int m = 0; m < M; ++m) {
        uint4 q[P];
        float scale[P];
        if (first < N) request(q, scale, first);
        float x[P][16];
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int c = c0 + 32 * KSPLIT * p;
            if (c < pieces) {
                inp16(inp + (size_t)m * K + 16 * c, x[p]);
            } else {
#pragma unroll
                for (int j = 0; j < 16; ++j) x[p][j] = 0.0f;
            }
        }
        for (int n = first, turn = 0; n < last; n += stride, ++turn) {
            uint4 q_next[P];
            float scale_next[P];
            if (n + stride < N) request(q_next, scale_next, n + stride);
            float acc = 0.0f;
#pragma unroll
            for (int p = 0; p < P; ++p) {
                if (n < N && c0 + 32 * KSPLIT * p < pieces) {
                    float wv[16];
                    e4m3x16_to_float(q[p], wv);
                    float s = 0.0f;
#pragma unroll
                    for (int j = 0; j < 16; ++j) s += wv[j] * x[p][j];
                    acc += scale[p] * s;
                }
            }
            acc = Split::combine(warp_sum(acc), turn);
            if (lane == 0 && rank == 0 && n < N) {
                const size_t idx = (size_t)m * N + n;
                out[idx] = gemv_out(acc, bias, residual, tail, n, idx);
            }
#pragma unroll
            for (int p = 0; p < P; ++p) {
                q[p] = q_next[p];
                scale[p] = scale_next[p];
            }
        }
    }
}

// The entries of a streamed-rows stage with KSPLIT warps a row: gemv_fp8{_bf16}_p{1,2,4}{SUFFIX}.
#define GEMV_FP8_STREAMED_ENTRIES(KSPLIT, SUFFIX)                           \
    GEMV_FP8_FMA_ENTRY(p1##SUFFIX, gemv_fp8_streamed_rows<1, KSPLIT>)       \
    GEMV_FP8_FMA_ENTRY(p2##SUFFIX, gemv_fp8_streamed_rows<2, KSPLIT>)       \
    GEMV_FP8_FMA_ENTRY(p4##SUFFIX, gemv_fp8_streamed_rows<4, KSPLIT>)
