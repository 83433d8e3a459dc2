// matmul/quantize-fp8, stage 1: vectors. Stage 0 with 16-byte accesses: a lane reads 8 bf16 in one
// load and writes their 8 codes in one 8-byte store; half a warp covers a row group (16 lanes x 8 =
// 128 channels, two groups a warp, the max over 16 lanes), and a weight block is 16 lanes a row, 16
// rows a pass of 256 threads.
// Why it should be faster: stage 0 issues four 2-byte loads and four 1-byte stores a lane per group
//   (64-byte requests a warp instruction); here one 16-byte load and one 8-byte store (512 and 256
//   bytes a warp instruction): 8x fewer memory instructions for the same bytes. Predicted: rows at
//   K = 3072 from 54% to ~80% of the copy rate, the latency-bound blocks ~2-3x.
// Measured (H100): rows 1.11x / 1.19x stage 0 (8.4 us at 4096 x 768, 19.6 us at 4096 x 3072: 65% of
//   the copy rate, short of the prediction), weight blocks 3.4-3.8x (9.9-11.6 us).
// Launch: rows: grid ceil(M * G / 16) x 256 threads, half-warp h of block b takes group 16b + h;
//   blocks: as stage 0 (grid ceil(M / 128) * G x 256 threads).
// Constraints: stage 0's, and K % 8 == 0 (16-byte rows; a partial last group is a multiple of 8).
// Tolerance: exact (codes and scales bit for bit).
// Limits: M * K < 2^31; K % 8 == 0
#include "matmul_fp8_quantize.cuh"

QF8_VECTOR_ENTRIES
