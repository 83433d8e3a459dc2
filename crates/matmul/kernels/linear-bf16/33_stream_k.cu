// linear-bf16, stage 33: stream-k (stage 30 with the last wave's tiles shared out by K steps).
// Changed from stage 30: the schedule's last `sk_tiles` tiles are not handed out whole. Their K
//   steps, numbered tile by tile, are cut into one contiguous range per block (`WS_STREAM_K`), run
//   after the block's whole tiles; a tile cut between blocks is summed by the block holding its
//   first K step, from the others' partial sums (a slot and a flag per block and consumer, in a
//   workspace the host allocates once). The host picks the width (256 or 192) and `sk_tiles` with
//   the wave model extended to K steps (`stream_k_fit`): whole waves stay data-parallel; the
//   remainder, if the K steps it saves outweigh `SK_FIXUP` steps' worth of partial sums.
// Why it should be faster: a partial last wave leaves SMs idle for a whole tile's K loop. At
//   4096^3 the 512 tiles of 128 x 256 are 3.88 waves on 132 SMs: 4 tile rounds (256 K steps) per
//   SM where 248.2 would do; 116 tiles over 132 blocks are 56.2 steps each, so a block runs 249
//   steps and one fixup: 2-3% predicted there, 1-1.5% at 8192^3 (256 wide, 15.5 waves, against
//   stage 30's 192 wide at 20.85), nothing at the GPT-2 shapes (the model keeps them data-parallel:
//   one fixup costs more than the fraction of a round it saves).
// Contract: as stage 27 (`weight` is not the previous kernel's output); the workspace belongs to
//   the prepared call: two calls of one prepared stage must not run at once.
// Launch: linear_bf16_stream_k[_gelu|_residual]: grid = the SMs when sk_tiles > 0, else
//   min(tiles, SMs); block 384; WS_BN 256 or 192 per shape; dynamic shared memory as stage 30;
//   the programmatic-serialization attribute; extra arguments (sk_partials: SMs x 2 x 64 x WS_BN
//   fp32, sk_flags: SMs x 2 u32 zeroed once, sk_tiles).
// Constraints: sm_90a; K % 8 == 0; M, N, K >= 1; M*K, N*K, M*N < 2^31; the GELU and residual tails
//   need a bias; the bias 16-byte aligned (cp.async's 16-byte copies).
// Tolerance: bf16 preset (operands bf16, fp32 accumulation and tail; a cut tile's sums are added in
//   block order, so results are deterministic run to run).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; K % 8 == 0
#define EPI_PREFETCH 1
#define EPI_LEAN 1
#define EPI_BIAS_SMEM 1
#define EPI_STAGED 1
#define WS_PDL 1
#define WS_WEIGHTS_EARLY 1
#define WS_PDL_LAST_TILE 1
#define WS_STREAM_K 1
#include "matmul_wgmma_persistent.cuh"

STREAM_K_ENTRY(linear_bf16_stream_k, 0)
STREAM_K_ENTRY(linear_bf16_stream_k_gelu, EPI_GELU)
STREAM_K_ENTRY(linear_bf16_stream_k_residual, EPI_RESIDUAL)
