// linear-bf16, stage 15: ping-pong (stage 14 with the consumers taking turns on whole tiles).
// Changed from stage 14 (consumer part PingPong; switch WS_PINGPONG): each consumer warpgroup takes every other tile of the
//   block's walk whole (two 64 x WS_BN accumulator sets) instead of half of every tile; an mbarrier
//   pair passes the turn on the tensor cores from one to the other once it has issued a tile's
//   MMAs, so one consumer's store runs while the other's MMAs do. Each ring stage has one reader.
//   WS_BN is a tunable (192 declared, 128 swept): two sets of 64 x 256 do not fit in the
//   registers, and the residual entry runs 128 wide (beside two 64 x 192 sets its loads spill).
// Why it should be faster: where a block walks several tiles, the cooperative consumers store
//   together while the tensor cores idle: ~20% of a K = 768 tile's time. Ping-pong hides it behind
//   the other tile's MMAs. Where a block has one tile (N = 768 at M = 4096), there is nothing to
//   overlap and one consumer does all the MMAs: no gain, maybe a loss. Predicted: QKV, MLP up and
//   the LM head 5-15% faster; N = 768 and the residual tails (128 wide: two rounds) slower.
// Measured (H100, 2026-11-25, against stage 14, default table): QKV 1.07x, MLP up 1.13x, the GELU
//   tail 1.09x, the padded LM head 1.12x, 8192^3 0.99x; 4096^3 0.87x (192 wide against 256),
//   N = 768 0.97-0.99x, the residual tails 0.73x and 0.86x. The best stage at the wide-N shapes.
//   Kept; stage 14 stays the end point where a block has one tile.
// Contract: `weight` is not the previous kernel's output.
// Launch: linear_bf16_ping_pong[_gelu|_residual]: as stage 14, 128 x WS_BN tiles, two more
//   mbarriers; ptxas spills 12-24 bytes at 192 wide (the residual entry at 128: none).
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#include "matmul_wgmma_persistent.cuh"

using Recipe = PersistentRecipe<GroupedOrder, DependentLaunch</*weights early*/ true, /*last-tile trigger*/ true>, PingPong, EpiStaged>;

LEAN_ENTRY(linear_bf16_ping_pong, Recipe, 0)
LEAN_ENTRY(linear_bf16_ping_pong_gelu, Recipe, EPI_GELU)
LEAN_ENTRY(linear_bf16_ping_pong_residual, Recipe, EPI_RESIDUAL)
