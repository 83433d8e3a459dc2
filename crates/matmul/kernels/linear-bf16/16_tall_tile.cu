// linear-bf16, stage 16: tall-tile (stage 15 on 192 x 128 tiles, three consumer warpgroups).
// Changed from stage 15: the tile is 192 rows (WS_BM = 192, a define of the stage list) by 128
//   columns (WS_BN = 128), computed by three consumer warpgroups of 64 rows each (512 threads; the
//   producer keeps 40 registers, the consumers get 152); the width is fixed, not wave-fitted.
// Why it should be faster: at K = 768 every SM runs a short 12-step K loop, and the one-tile-per-SM
//   shapes pay the launch, the ring's ramp and the store once per SM whatever the tile. 192 x 128
//   is cuBLASLt's tile at these shapes (nvjet ..._192x128_64x5_...), and at M = 4096 it makes
//   exact waves on 132 SMs: 22 x 6 = 132 tiles at N = 768 (stage 15: 128 tiles of 128 x 192),
//   22 x 18 = 396 = 3 x 132 at QKV, 22 x 24 = 528 = 4 x 132 at MLP up; a W byte feeds 192 rows
//   instead of 128. The cost: the last tile row is 4096 - 21 x 192 = 64 rows (a third full), and
//   a 128-wide tile reloads A for every 128 columns. Predicted: the N = 768 shapes 5-10% faster
//   than stage 15, QKV and MLP up within a few %, 4096^3 and 8192^3 slower (narrower tile, 5.3
//   rounds at 4096^3).
// Launch: linear_bf16_tall[_gelu|_residual]: grid min(ceil(M/192) * ceil(N/128), SMs), block 512
//   (4 warpgroups), dynamic shared memory WG_STAGES * (192 + 128) * 128 B + 1 KiB + barriers; two
//   CUtensorMaps by value (A boxes of 192 rows, W boxes of 128 rows); `residual` is read only by
//   the _residual entry.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias.
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_tall, 0)
LEAN_ENTRY(linear_bf16_tall_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_tall_residual, EPI_RESIDUAL)
