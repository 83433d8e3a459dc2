// linear-bf16, stage 6: swizzle (stage 5 with conflict-free shared-memory tiles).
// Changed from stage 5: piece c (16 bytes) of tile row r is stored at piece c ^ ((r >> 1) & 3), so
//   the 8 rows an ldmatrix reads at one piece land on 8 different 16-byte slots of the 128-byte bank
//   line (stage 5: 2 slots, a 4-way conflict on every fragment load); cp.async writes stay
//   16-byte pieces and stay conflict-free. See matmul_mma.cuh.
// Why it should be faster: per k16 step a warp issues 6 ldmatrix.x4 for 16 mma; at 4-way conflicts
//   the fragment loads take as long as the mma issue, so removing them should give most of the gap
//   to the tensor pipe back (predicted 1.3-1.6x stage 5).
// Launch: linear_bf16 (K % 8 == 0) or linear_bf16_unaligned: grid (ceil(N/128), ceil(M/128)),
//   block 256, dynamic shared memory MMA_STAGES * 16 KiB.
// Constraints: M, N, K >= 1; M*K, N*K, M*N < 2^31; M <= 65535 * 128 (grid y).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation; ~1e-3 expected).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; M <= 65535 * 128
#define MMA_SWIZZLE
#include "matmul_mma.cuh"

MMA_ENTRIES
