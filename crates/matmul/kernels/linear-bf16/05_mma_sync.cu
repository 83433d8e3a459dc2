// linear-bf16, stage 5: mma-sync (bf16 mma.sync.m16n8k16, ldmatrix, a cp.async multi-stage pipeline).
// Changed from linear stage 4 (WMMA M3, the report's last rung): the operands are bf16 and prepared
//   once (no transpose or conversion pass per call: stage 4 spent ~0.36 ms of 4096^3 on them), the
//   fragments are loaded with ldmatrix.x4 (one instruction per 16 x 16 A fragment or pair of B
//   fragments) and fed to the PTX mma.sync directly, and MMA_STAGES - 1 tiles of K are in flight
//   (cp.async) while the warps compute on the oldest. Block tile 128 x 128 x 32, 8 warps of 64 x 32
//   (64 fp32 accumulators a thread). See matmul_mma.cuh.
// Why it should be faster: stage 4 reached 0.64x cuBLAS fp16 at 4096^3 with a 3-stage pipeline but
//   paid its operand pass; without it, and with twice the accumulator work per fragment load, the
//   predicted rate is ~50-60% of cuBLASLt bf16: the unswizzled tiles make every ldmatrix a 4-way
//   bank conflict (stage 6 removes them).
// Launch: linear_bf16 (K % 8 == 0) or linear_bf16_unaligned: grid (ceil(N/128), ceil(M/128)),
//   block 256, dynamic shared memory MMA_STAGES * 16 KiB.
// Constraints: M, N, K >= 1; M*K, N*K, M*N < 2^31; M <= 65535 * 128 (grid y).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation; ~1e-3 expected).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; M <= 65535 * 128
#include "matmul_mma.cuh"

MMA_ENTRIES
