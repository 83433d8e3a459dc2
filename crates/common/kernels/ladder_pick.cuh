// ladder_pick.cuh: a greedy pick (value, index) as one 64-bit word whose unsigned order is the
// argmax's order: the larger value wins, the lower index among equal values (the host sampler's
// rule). Many producers can then merge their picks with one atomicMax each, in any order, and the
// result is the argmax of everything they offered, independent of timing.
//   high 32 bits: the value's bits mapped to an unsigned order (sign flipped for >= 0, all bits
//                 flipped for < 0), -0 taken as +0 first so that the two are equal as in a compare;
//   low 32 bits:  ~index, so that the lower index is the larger word.
// Where the words live: kPickSlots words a row, each on its own 128-byte line, producer block k
// merging into slot k % kPickSlots, so that no address takes every producer's atomic (the decode
// step's LM head has 3144 blocks). The reader merges a row's slots (a warp a row).
// Only values above -inf are offered (NaN and -inf never win a compare either), so every offered
// word is above 0, and a word left at 0 means no candidate: index 0, as the host's rule for a row of
// -inf and NaN only.
#pragma once
#include "ladder.cuh"

constexpr int kPickSlots = 32;
constexpr int kPickStride = 16;  // u64 words: one line
__device__ __forceinline__ size_t pick_slot(int row, int slot) {
    return ((size_t)row * kPickSlots + slot) * kPickStride;
}

__device__ __forceinline__ bool pick_candidate(float v) { return v > -INFINITY; }

__device__ __forceinline__ unsigned long long pick_word(float v, int index) {
    const unsigned u = __float_as_uint(v + 0.0f);  // -0 + 0 = +0
    const unsigned key = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)key << 32) | (0xFFFFFFFFu - (unsigned)index);
}

__device__ __forceinline__ int pick_index(unsigned long long word) {
    return word == 0 ? 0 : (int)(0xFFFFFFFFu - (unsigned)(word & 0xFFFFFFFFull));
}

// The largest word of the LANES consecutive lanes holding this lane's (every lane of the warp takes
// part; a lane with nothing to offer passes 0).
template <int LANES>
__device__ __forceinline__ unsigned long long pick_max(unsigned long long word) {
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, word, o);
        word = other > word ? other : word;
    }
    return word;
}
