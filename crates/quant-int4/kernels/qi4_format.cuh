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

// One group quantized by the LPG lanes that hold it, E values a lane (x): the group's fp16 scale and
// shift by the directed rounding above (min and max reduced over the group's lanes; +0.0f turns a
// -0 extreme into +0, since min/max may pick either zero, so the bytes stay canonical) and each of
// the lane's values as its code q in 0..15.
struct Qi4Scales {
    __half scale, shift;
    // The 4-byte (scale, shift) pair of the row format: scale in the low half.
    __device__ unsigned pair() const {
        return (unsigned)__half_as_ushort(scale) | ((unsigned)__half_as_ushort(shift) << 16);
    }
};

template <int E, int LPG>
__device__ __forceinline__ Qi4Scales qi4_quantize_group(const float (&x)[E], int (&q)[E]) {
    float mn = x[0], mx = x[0];
#pragma unroll
    for (int i = 1; i < E; ++i) {
        mn = fminf(mn, x[i]);
        mx = fmaxf(mx, x[i]);
    }
#pragma unroll
    for (int off = LPG / 2; off >= 1; off >>= 1) {
        mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, off));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    }
    mn = __fadd_rn(mn, 0.0f);
    mx = __fadd_rn(mx, 0.0f);
    const __half shift_h = __float2half_rd(mn);
    const float shift = __half2float(shift_h);
    const __half scale_h = __float2half_ru(__fdiv_rn(__fsub_rn(mx, shift), 15.0f));
    const float scale = __half2float(scale_h);
#pragma unroll
    for (int i = 0; i < E; ++i) {
        int c = 0;
        if (scale > 0.0f) c = (int)rintf(__fdiv_rn(__fsub_rn(x[i], shift), scale));
        q[i] = min(max(c, 0), 15);
    }
    return Qi4Scales{scale_h, shift_h};
}

// ---- Split-K decode (the decode kernels of decode/) ----

// One block's share of a sequence of `len` tokens in split-K decode: split `split` of `splits`,
// each a multiple of TILE tokens, covers tokens [begin, end) (empty when begin >= end); its heads'
// partial results are rows of o_part / m_part / l_part, head h's at (b*HQ + kvh*nh + h)*splits + split,
// so a split's heads are `splits` rows apart.
struct Qi4Split {
    int begin, end;
    float *o, *m, *l;
};

template <int D, int TILE>
__device__ __forceinline__ Qi4Split qi4_split(int len, int splits, int split, int b, int kvh, int hkv, int nh,
                                              float* o_part, float* m_part, float* l_part) {
    int per = (len + splits - 1) / splits;
    per = (per + TILE - 1) / TILE * TILE;
    Qi4Split s;
    s.begin = split * per;
    s.end = min(len, s.begin + per);
    s.o = o_part + ((size_t)(b * hkv + kvh) * nh * splits + split) * D;
    s.m = m_part + (size_t)(b * hkv + kvh) * nh * splits + split;
    s.l = l_part + (size_t)(b * hkv + kvh) * nh * splits + split;
    return s;
}

// An empty split's partials, written by thread `tid` of a block of THREADS threads: O zero, max -inf, sum 0 for each
// of its nh heads, so the merge gives it no weight.
template <int D, int THREADS>
__device__ __forceinline__ void qi4_empty_split(const Qi4Split& s, int tid, int nh, int splits) {
    for (int i = tid; i < nh * D; i += THREADS) s.o[(i / D) * splits * D + i % D] = 0.0f;
    if (tid < nh) {
        s.m[tid * splits] = -INFINITY;
        s.l[tid * splits] = 0.0f;
    }
}
