// Decode GEMV on e4m3 weights, stage 3: streamed-rows (stage 2 on a persistent grid, inp in registers,
// the next row in flight).
// Changed from stage 2: the grid is at most the blocks that are resident at once (the entry's
//   occupancy, from the host); each
//   warp takes rows n, n + S, n + 2S, ... of W (S: the grid's warps) and requests row n + S's pieces
//   before it converts and multiplies row n's. A lane's pieces are the same columns of K in every row,
//   so its 16 P elements of the inp row are loaded once (into registers, while the first row's pieces
//   are in flight) and serve every row the warp takes. M > 1 runs the whole stream once per row of inp.
// Why it should be faster: at the LM head (50257 rows, 12,565 blocks of 4 warps) stages 0-2 sit at
//   41-45% of DRAM bandwidth with long-scoreboard stalls (Nsight Compute): a block lives for one trip
//   to DRAM and is replaced, and from a warp's last byte arriving to the next block's first request
//   (conversion, dependent inp loads, reduction, store, retirement, launch) none of its bytes are in
//   flight; bf16 W in the same structure reaches 79% because each trip carries twice the bytes. A
//   persistent warp with its next row requested before the current one is used, and nothing but
//   registers between a row's arrival and its dot product, keeps its bytes in flight: predicted the
//   LM head from ~29 us toward the copy's ~17.5 us; the block linears (one row a warp: fewer rows
//   than warps) as stage 2, less the inp trip behind W's (~0.3 us).
// Measured (H100): LM head 20.64 us (1.43x stage 0, DRAM 43% -> 61%, 84% of the copy); QKV 5.95,
//   MLP up 6.02, proj 5.18: the short linears as before.
// Refuted on the way (H100, notes): inp staged in shared memory instead of registers, per block
//   (QKV 6.56 us, LM head 36.4 us) and with the persistent grid (LM head 28.8 us, DRAM 45%): each
//   lane's 64 bytes of inp per piece read 4-way bank-conflicted, short-scoreboard stalls 8.8-10.4.
// Launch: gemv_fp8_p{1,2,4} (fp32 inp) and gemv_fp8_bf16_p{..} (bf16 inp) (P pieces of 16 codes a
//   lane: the row in one pass): grid min(ceil(N / 4), SMs * resident blocks an SM), block 128.
// Constraints: stage 2's, and K <= 2048 (a row in one pass of P <= 4 pieces a lane: inp's 16 P
//   floats a lane stay in registers; at P = 8 ptxas spills).
// Tolerance: 1e-2 preset against the f64 product on the dequantized weights (fp32 products and sums).
// Recipe: the streamed-rows kernel (matmul_gemv_fp8_streamed.cuh), a warp a row (SplitRows<1>).
// Limits: M <= 64; N * K < 2^31; K % 16 == 0; K <= 2048
#include "matmul_gemv_fp8_streamed.cuh"

GEMV_FP8_STREAMED_ENTRIES(1, )
