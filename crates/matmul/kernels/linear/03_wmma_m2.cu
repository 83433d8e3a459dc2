// Linear forward, stage 3: tensor cores through WMMA, one warp per block (the report's milestone 2:
//   2.484 ms, 12.6x naive, 20.4% of cuBLAS on its largest call).
// Changed from previous: the products run on the tensor cores in fp16 with fp32 accumulation.
//   The launcher first runs three preprocessing kernels (matmul_aux.cuh), every launch:
//   mm_transpose_f32 (W[N,K] -> Wt[Kp,Np] fp32), mm_convert_f16 (Wt -> fp16) and mm_convert_f16
//   (inp -> fp16, Mp x Kp), all zero-padded to multiples of 16 (as the report aligned to 16). Then
//   one warp per block computes one 16 x 16 output tile, walking K in 16-wide steps with
//   load_matrix_sync / mma_sync straight from global memory (no shared-memory staging).
//   (A col_major matrix_b fragment could read W[N,K] untransposed; the transpose is kept because it
//   is what the report built and timed.)
// Why it should be faster: one mma_sync does 4096 multiply-adds; fp16 halves the operand bytes.
//   But each warp re-reads its operands from L2 with no reuse inside the block, 32-thread blocks
//   cap residency (32 blocks/SM = 1024 threads on sm_80/90), and the preprocessing (about 12 bytes
//   read+written per weight, 6 per input) is timed: expect ~10x the naive kernel, far below cuBLAS.
// Epilogue: the accumulator goes through a 1 KB shared stage; bias is added and the padding
//   skipped while storing (no separate bias kernel).
// Launch: GEMM grid (Np/16, Mp/16), block 32. Constraints: M, N, K >= 1, Mp/16 <= 65535,
//   padded sizes < 2^31 elements. Tolerance: fp16 operands, rel L2 <= 1e-2.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; M <= 65535 * 16; K <= 65535 * 32
#include "matmul_wmma.cuh"

extern "C" __global__ void linear_wmma_m2(float* out, const __half* a, const __half* bt, const float* bias, int M,
                                          int N, int Kp, int Np) {
    using namespace nvcuda;
    __shared__ __align__(32) float stage[256];
    const int tn = blockIdx.x, tm = blockIdx.y;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> af;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> bf;
    for (int k = 0; k < Kp; k += 16) {
        wmma::load_matrix_sync(af, a + (size_t)tm * 16 * Kp + k, Kp);
        wmma::load_matrix_sync(bf, bt + (size_t)k * Np + tn * 16, Np);
        wmma::mma_sync(acc, af, bf, acc);
    }
    wmma::store_matrix_sync(stage, acc, 16, wmma::mem_row_major);
    __syncwarp();
    mm_store_tile<MM_EPI_BIAS>(stage, out, bias, nullptr, tm * 16, tn * 16, M, N);
}
