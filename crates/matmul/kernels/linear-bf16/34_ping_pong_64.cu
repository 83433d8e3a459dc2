// linear-bf16, stage 34: ping-pong-64 (stage 31's consumers taking turns, on 64-row tiles).
// Changed from stage 31: the tile is 64 x WS_BN (`WS_BM` 64, a stage-list define) instead of
//   128 x WS_BN, so each consumer holds one 64-row accumulator set, not two; the host picks the
//   width per shape with the wave model of 64-row tiles (256, 192 or 128; 192 at GPT-2's N = 768
//   and 2304), and the residual entry keeps that width (one set leaves it the registers that two
//   sets at 192 took: stage 31's residual entry spills 824 bytes there and runs 128 wide).
// Why it should be faster: at the N = 768 shapes a stage 31 block has one 128 x 192 tile, so one
//   consumer idles and nothing hides the store: the SM runs the fill, 12 (or 48) K steps and a
//   96 KiB store in sequence. Cut into two 64-row tiles per SM, the consumers take one each: the
//   first's store (48 KiB, and with the residual tail 48 KiB of residual loads) runs under the
//   second's MMAs, so half the store is hidden; the tensor work is the same (one warpgroup's
//   m64nNk16 keeps the tensor cores busy, as in every ping-pong stage). The price: each 64-row
//   tile loads its whole W panel, so an SM loads 1.6x the bytes from L2 at N = 768 (786 against
//   491 KiB at K = 768), and a ring stage carries 32 KiB (24 of them W) per 64 x 192 x 64 step
//   instead of 40 per 128 x 192 x 64. Predicted: the residual tails (0.87-1.00x of cuBLASLt) gain
//   most, 5-10%; the attention projection and MLP down 3-6% if L2 keeps up, a loss if it does not;
//   QKV, MLP up and the square shapes equal to stage 31 or a few % slower (the bytes per flop).
// Contract: as stage 28 (`weight` is not the previous kernel's output).
// Launch: linear_bf16_ping_pong_64[_gelu|_residual]: grid min(tiles, SMs), block 384, 64 x WS_BN
//   tiles (WS_BN picked per shape), dynamic shared memory WG_STAGES * (64 + WS_BN) * 128 B +
//   2 * WS_BN * 4 B + 16 KiB of staging + 1 KiB + barriers; the programmatic-serialization
//   attribute.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define WS_PINGPONG 1
#define EPI_BIAS_SMEM 1
#define EPI_STAGED 1
#define WS_PDL 1
#define WS_WEIGHTS_EARLY 1
#define WS_PDL_LAST_TILE 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_ping_pong_64, 0)
LEAN_ENTRY(linear_bf16_ping_pong_64_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_ping_pong_64_residual, EPI_RESIDUAL)
