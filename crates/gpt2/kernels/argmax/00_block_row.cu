// Greedy sampling on the device, stage 0: block-row (a block of 256 threads per row of logits).
// ids[b] = the index of the largest of logits[b * ld + 0..V), the lowest index among equals (as the
//   host sampler's argmax); NaN never wins (every comparison with it is false). Rows are ld >= V
//   apart (the model's logits are padded to a multiple of 64 columns; the padding is never read).
// Why it is here: a decode step that samples greedily then downloads B ints instead of B x V floats
//   (6.4 MB at B = 32, V = 50257: a third of a fast step over PCIe) and the graph can keep the token.
// Each thread scans the row with stride 256 (coalesced), keeping its (max, index); a warp merges its
//   lanes' pairs by shuffles, then warp 0 merges the 8 warps' pairs from shared memory (block_argmax).
// Launch: argmax_rows: grid B, block 256. Constraints: B, V >= 1; ld >= V; B * ld < 2^31.
// Tolerance: exact (token ids).
// Limits: B * ld < 2^31; ld >= V
#include "ladder.cuh"
#include "gpt2_argmax.cuh"

extern "C" __global__ void argmax_rows(int* ids, const float* logits, int B, int V, int ld) {
    const float* row = logits + (size_t)blockIdx.x * ld;
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float x = row[j];
        if (x > v) {  // j only grows within a thread: strictly larger keeps the first of equals
            v = x;
            i = j;
        }
    }
    block_argmax(v, i);
    // A row of -inf and NaN only: index 0, as the host's argmax gives.
    if (threadIdx.x == 0) ids[blockIdx.x] = i == 0x7fffffff ? 0 : i;
}
