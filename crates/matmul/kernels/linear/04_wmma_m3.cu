// Linear forward, stage 4: WMMA with many warps per block (the report's milestone 3: 1.208 ms,
//   26x naive, 41.9% of cuBLAS on its largest call), made block-tiled.
// Changed from previous (kernel body in matmul_wmma.cuh, mm_wmma_m3_bt; toggles cumulative):
//   - BLOCK_TILE: a block of 8 warps computes a 128 x 128 output tile; its warps sit 4 side by
//     side along N (OC) and 2 along M, each owning 64 x 32 outputs = 4 x 2 WMMA accumulators. Per
//     16-wide k-step a warp loads 2 B and 4 A fragments for 8 mma_sync (M2/flat M3: 2 loads per
//     mma), and the fragments come from shared memory: the block copies each 128 x 32 A tile and
//     32 x 128 B tile once, with 16-byte cp.async (cuda_pipeline.h), rows padded by 8 halves so
//     ldmatrix phases hit distinct banks. Without BLOCK_TILE the kernel is the report's literal
//     M3 (32 warps along N, one 16 x 16 tile each, fragments straight from L1/L2);
//   - offset pointers: per-warp offsets into the shared stages fixed once, the tile loader's
//     addresses advance by the k-tile;
//   - LAUNCH_BOUNDS: __launch_bounds__(256, 2) (flat: (1024, 1));
//   - DOUBLE_BUFFER: a 3-stage cp.async pipeline, tiles t+1 and t+2 in flight while tile t is
//     multiplied (without: load, wait, multiply; flat: two fragment register sets);
//   - FUSED_PREP: the weights are transposed and converted by one kernel (mm_transpose_convert_f16)
//     instead of two, saving the fp32 round trip of the transposed copy (report: 1.76x faster
//     preprocessing).
// Why it should be faster: M2 and the flat M3 move 1 KiB of fragments per 4096-MAC mma_sync from
//   L1/L2 (the L2->SM path is the limit, ~10 ms at the LM head). Here a block reads
//   (128 + 128) x 32 halves from L2 per 128 x 128 x 32 MACs, 1/16 of the flat kernel's bytes per
//   mma; the rest is shared-memory traffic (6 fragment loads per 8 mma). Expect ~4-5x stage 3,
//   i.e. roughly 150-250 TFLOP/s of GEMM plus the prep and the fp32 output write.
// Launch: prep kernels, then grid ceil(M/128) * ceil(Np/128) (1-D, M tiles fastest so concurrent
//   blocks share weight tiles in L2), block 256, dynamic shared memory 3 x 18944 B = 56832 B
//   (18944 B without DOUBLE_BUFFER); measured here with ptxas: 122-124 registers, no spills, so
//   2 blocks (16 warps) per SM. The epilogue reuses the operand stages as 8 per-warp 1 KiB fp32
//   stages (bias, GELU or residual applied while storing, padding skipped).
// Constraints: any M, N, K >= 1 (operands zero-padded to 16; the loader zero-fills chunks past
//   Mp, Kp, Np, so K tiles of 16 and partial 128 tiles are fine); padded sizes < 2^31 elements.
//   Tolerance: fp16 operands, fp32 accumulation, rel L2 <= 1e-2.
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K <= 65535 * 32
#include "matmul_wmma_m3.cuh"

MM_DEFINE_WMMA_M3(linear_wmma_m3, MM_EPI_BIAS)
