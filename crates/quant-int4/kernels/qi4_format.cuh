// qi4_format.cuh: the INT4 KV-cache row format shared by the quantizer and the decode kernels.
//
// A cached row holds D values (one token, one KV head) quantized asymmetrically in G groups
// (G = 1: row-wise, G = 4: group-wise) of D/G consecutive values:
//   bytes [0, 4G)          G pairs of fp16 (scale, shift), group 0 first; in each 4-byte pair the
//                          scale is the low half (bytes 0-1) and the shift the high half.
//   bytes [4G, 4G + D/2)   the D values as 4-bit codes q in 0..15, eight per little-endian 32-bit
//                          word; word w holds values 8w .. 8w+7.
// Value = q * scale + shift. Row bytes: 68 (D=128, G=1), 80 (D=128, G=4), 36 / 48 for D=64.
//
// Nibble order inside a word (chosen for dequantization): value 2k sits at bits 4k..4k+3 and value
// 2k+1 at bits 16+4k..16+4k+3, k = 0..3. Then `(w >> 4k) & 0x000F000F` puts the pair (2k, 2k+1)
// in the low bits of the two 16-bit halves, and OR-ing 0x4300 into each half gives the bf16 pair
// (128 + q0, 128 + q1) exactly (bf16 has 7 mantissa bits; 2^7 + q, q < 16, is representable):
// one shift, one AND-OR and one packed unpack per two values, no integer-to-float conversion.
//
// Quantization of one group (x = the bf16 values as fp32):
//   shift = fp16 rounded DOWN of min(x); scale = fp16 rounded UP of (max(x) - shift) / 15
//   q = clamp(rint((x - shift) / scale), 0, 15)   (q = 0 when scale == 0)
// Directed rounding keeps every x inside [shift, shift + 15 scale], so |x - dequant(q)| <= scale/2
// up to fp32 rounding. All steps are IEEE-exact single operations (no contraction), so the CPU
// quantizer in src/format.rs produces identical bytes.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "ladder_convert.cuh"

// Bit position of value k (0..7) inside its 32-bit word.
__device__ __forceinline__ int qi4_nibble_shift(int k) { return (k & 1) ? 16 + 4 * (k >> 1) : 4 * (k >> 1); }

// Pair k (values 2k, 2k + 1) of code word `w` as the bf16 pair (128 + q0, 128 + q1): exact, one
// shift and one AND-OR (the nibble order above).
__device__ __forceinline__ unsigned qi4_code_pair(unsigned w, int k) {
    return ((w >> (4 * k)) & 0x000F000Fu) | 0x43004300u;
}

// The 8 values of word `w` with (scale s, shift z) as four bf16x2 registers, values in order.
__device__ __forceinline__ void qi4_dequant_word(unsigned w, float s, float z, unsigned* dst) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 f = unpack_bf16x2(qi4_code_pair(w, k));  // (128 + q0, 128 + q1), exact
        dst[k] = pack_bf16x2(fmaf(f.x - 128.0f, s, z), fmaf(f.y - 128.0f, s, z));
    }
}
