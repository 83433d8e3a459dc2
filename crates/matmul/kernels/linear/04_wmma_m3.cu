// Linear forward, stage 4: WMMA with many warps per block (the report's milestone 3: 1.208 ms,
//   26x naive, 41.9% of cuBLAS on its largest call).
// Changed from previous (kernel body in matmul_wmma.cuh, mm_wmma_m3):
//   - 32 warps per block (block 32 x 32 = 1024 threads), laid side by side along N: the 32 warps
//     share one 16-row strip of the fp16 input, so 31 of 32 fragment loads of it hit L1, and the
//     grid shrinks 32x;
//   - offset pointers into the operands, advanced by a constant per k-step (fewer IMADs);
//   - LAUNCH_BOUNDS: __launch_bounds__(1024, 1);
//   - DOUBLE_BUFFER: two fragment sets, loads of step t+1 issued before the mma of step t;
//   - FUSED_PREP: the weights are transposed and converted by one kernel (mm_transpose_convert_f16)
//     instead of two, saving the fp32 round trip of the transposed copy (report: 1.76x faster
//     preprocessing).
// Why it should be faster: L1 reuse of the input strip roughly halves L2 traffic per mma, bigger
//   blocks keep more warps resident; expect ~2x stage 3 (the report's ratio), still limited by
//   operands fetched fragment-by-fragment from L1/L2 instead of staged in shared memory.
// Launch: prep kernels, then grid (Mp/16, ceil(Np/16/32)), block (32, 32), 32 KB static shared
//   memory (one 16 x 16 fp32 stage per warp). Constraints and tolerance as stage 3.
#include "matmul_wmma.cuh"

MM_DEFINE_WMMA_M3(linear_wmma_m3, MM_EPI_BIAS)
