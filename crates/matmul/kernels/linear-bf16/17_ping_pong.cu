// linear-bf16, stage 17: ping-pong (stage 15 with each consumer warpgroup on a tile of its own).
// Changed from stage 15: the two consumer warpgroups no longer split each 128-row tile; consumer c
//   takes every other tile of the block's walk whole (two m64 accumulator sets: 128 x WS_BN), and
//   the two take turns on the tensor cores: a consumer starts a tile's MMAs once the other has
//   issued the previous tile's (an mbarrier a consumer), then stores while the other computes.
//   The producer is unchanged: it fills the ring in the walk's order, each stage read by one
//   consumer (the empty barriers expect one arrival).
// Why it should be faster: with fp32 output, a K = 768 tile stores as many bytes as it loads from
//   DRAM (MLP up: 50 MB out against 11 MB in), and in stages 9-16 both consumers store at once
//   while the tensor cores idle; here one consumer's store (and its tail) runs under the other's
//   MMAs, so a block alternates compute and store phases no more. Predicted (first built at
//   WS_BN = 128): the multi-tile K = 768 shapes (QKV, MLP up, the GELU tail, the LM heads) 10-25%
//   faster than stage 15; the N = 768 shapes slower (192 tiles of 128 x 128, two turns on 60 SMs,
//   where stage 15 runs one 128 x 192 tile on each of 128), 4096^3 and 8192^3 within a few %.
// Launch: linear_bf16_ping_pong[_gelu|_residual]: grid min(tiles, SMs), block 384, WS_BN a tunable
//   (192 declared, 192 accumulators a consumer thread; the _residual entry spills at 192, so the
//   host runs it at 128), dynamic shared memory WG_STAGES * (128 + WS_BN) * 128 B + 1 KiB +
//   barriers; `residual` is read only by the _residual entry.
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias.
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define WS_PINGPONG 1
#include "matmul_wgmma_persistent.cuh"

LEAN_ENTRY(linear_bf16_ping_pong, 0)
LEAN_ENTRY(linear_bf16_ping_pong_gelu, EPI_GELU)
LEAN_ENTRY(linear_bf16_ping_pong_residual, EPI_RESIDUAL)
