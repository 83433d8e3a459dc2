// Greedy sampling on the device, stage 1: split-row (each row over ARGMAX_SPLITS blocks, one launch).
// Changed from stage 0: a row is cut into ARGMAX_SPLITS contiguous pieces, one block each, so B = 1
//   fills 32 SMs instead of one; each block writes its (max, index) to a workspace, and the row's last
//   block to finish (a __threadfence and an atomic ticket) merges the pieces in order and resets the
//   ticket, so a captured graph replays with no reset.
// Why it should be faster: stage 0 at B = 1 is one block walking 50257 floats, ~200 dependent loads
//   per thread (37 us measured); here each thread has ~7, predicted ~4-6 us, launch included.
// Launch: argmax_rows (and argmax_rows_advance, below): grid (ARGMAX_SPLITS, B), block 256; workspace
//   8 bytes per (row, split) and a zeroed ticket per row. Constraints: B, V >= 1; ld >= V (row stride); B * ld < 2^31; B <= 65535.
//   Built with LADDER_DEPENDENT (the last link of the decode step's dependent chain,
//   ladder_dependent.cuh) the kernel waits for the LM head before anything else.
// ARGMAX_FROM_PICKS (a host switch, the decode step's last link at `decode-step` 15) adds
//   argmax_picks (and argmax_picks_advance): the LM head before it merged each row's pick into
//   64-bit words (gemv's GEMV_PICKS, ladder_pick.cuh: kPickSlots a row), so a warp a row reads them,
//   resets them for the next launch, takes their maximum by shuffles and writes the id (and
//   advances the inputs) as the merging lane does. Launch: grid B, block 32. Why: the chain's last link becomes one L2 read instead of a scan of
//   the logits, a fence, a ticket and a merge (~5-6 us of the decode step at B = 1).
// Tolerance: exact (token ids).
// Limits: B * ld < 2^31; ld >= V; B <= 65535
#include "ladder.cuh"
#include "gpt2_argmax.cuh"
#include "ladder_dependent.cuh"
#include "ladder_pick.cuh"

#ifndef ARGMAX_SPLITS
#define ARGMAX_SPLITS 32
#endif
static_assert(ARGMAX_SPLITS >= 1 && ARGMAX_SPLITS <= 32, "one warp merges the pieces");

// What the merging lane does after it writes a row's id: nothing (every launch of this stage), or,
// with ARGMAX_ADVANCE (a host switch of the model's greedy loop on the device), the
// step's inputs for the next step advanced on the device: the pick recorded at picks[b][pos], the
// next token, its position and cache cell one further, the attended length one longer. The host
// bounds the steps so that pos + 1 < Tmax; past it the inputs stay (no cell out of range).
struct KeepInputs {
    __device__ __forceinline__ void operator()(int, int) const {}
};
struct AdvanceInputs {
    int* picks;
    int* tokens;
    int* pos;
    int* cell_pos;
    int* lens;
    int Tmax;
    __device__ __forceinline__ void operator()(int b, int id) const {
        const int p = pos[b];
        picks[(size_t)b * Tmax + p] = id;
        tokens[b] = id;
        if (p + 1 < Tmax) {
            pos[b] = p + 1;
            cell_pos[b] = p + 1;
            lens[b] = p + 2;
        }
    }
};

template <typename Then>
__device__ __forceinline__ void argmax_split(int* ids, float* part_v, int* part_i, unsigned* tickets,
                                             const float* logits, int V, int ld, const Then& then) {
    LADDER_CHAIN_BLOCK();
    __shared__ bool last;
    ladder_wait_prerequisites();
    ladder_launch_dependents();
    const int b = blockIdx.y, s = blockIdx.x;
    const int chunk = (V + ARGMAX_SPLITS - 1) / ARGMAX_SPLITS;
    const int lo = s * chunk, hi = min(V, lo + chunk);
    const float* row = logits + (size_t)b * ld;
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        const float x = row[j];
        if (x > v) {
            v = x;
            i = j;
        }
    }
    block_argmax(v, i);
    if (threadIdx.x == 0) {
        part_v[b * ARGMAX_SPLITS + s] = v;
        part_i[b * ARGMAX_SPLITS + s] = i;
        __threadfence();  // the piece is visible before the ticket says so
        ladder_chain_mark(0);
        last = atomicAdd(&tickets[b], 1u) == ARGMAX_SPLITS - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x >= 32) return;
    __threadfence();
    const int lane = threadIdx.x;
    v = lane < ARGMAX_SPLITS ? __ldcg(&part_v[b * ARGMAX_SPLITS + lane]) : -INFINITY;
    i = lane < ARGMAX_SPLITS ? __ldcg(&part_i[b * ARGMAX_SPLITS + lane]) : 0x7fffffff;
    warp_argmax(v, i);
    if (lane == 0) {
        const int id = i == 0x7fffffff ? 0 : i;  // a row of -inf and NaN only: index 0, as on the host
        ids[b] = id;
        tickets[b] = 0;  // ready for the next launch (graph replays included)
        then(b, id);
    }
}

extern "C" __global__ void argmax_rows(int* ids, float* part_v, int* part_i, unsigned* tickets, const float* logits,
                                       int B, int V, int ld) {
    argmax_split(ids, part_v, part_i, tickets, logits, V, ld, KeepInputs{});
}

#ifdef ARGMAX_ADVANCE
extern "C" __global__ void argmax_rows_advance(int* ids, float* part_v, int* part_i, unsigned* tickets,
                                               const float* logits, int B, int V, int ld, int* picks, int* tokens,
                                               int* pos, int* cell_pos, int* lens, int Tmax) {
    argmax_split(ids, part_v, part_i, tickets, logits, V, ld, AdvanceInputs{picks, tokens, pos, cell_pos, lens, Tmax});
}
#endif

#ifdef ARGMAX_FROM_PICKS
// Row b's id from its pick words (block b, lane s reading slot s), the words reset to 0 (every
// launch of the LM head before it finds them so; graph replays included).
static_assert(kPickSlots == 32, "a warp reads a row's slots");
template <typename Then>
__device__ __forceinline__ void argmax_from_words(int* ids, unsigned long long* words, const Then& then) {
    LADDER_CHAIN_BLOCK();
    ladder_wait_prerequisites();
    ladder_launch_dependents();
    const int b = blockIdx.x, lane = threadIdx.x;
    unsigned long long* word = words + pick_slot(b, lane);
    const unsigned long long best = pick_max<32>(__ldcg(word));
    *word = 0;
    if (lane != 0) return;
    const int id = pick_index(best);
    ids[b] = id;
    ladder_chain_mark(0);
    then(b, id);
}

extern "C" __global__ void argmax_picks(int* ids, unsigned long long* words) {
    argmax_from_words(ids, words, KeepInputs{});
}

#ifdef ARGMAX_ADVANCE
extern "C" __global__ void argmax_picks_advance(int* ids, unsigned long long* words, int* picks, int* tokens,
                                                int* pos, int* cell_pos, int* lens, int Tmax) {
    argmax_from_words(ids, words, AdvanceInputs{picks, tokens, pos, cell_pos, lens, Tmax});
}
#endif
#endif
