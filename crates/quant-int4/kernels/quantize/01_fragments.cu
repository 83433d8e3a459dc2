// quantize, stages 1-2: the quantizer writing the fragment layout (K: stage 1, V: stage 2 with
// QZ_ROLE_V) that the fragment-direct decode stages read (decode/22_fragments.cu, src/format.rs).
// Changed from stage 0: where the codes go. Each row is quantized exactly as stage 0 does (the same
// directed-rounding parameters and codes, byte for byte the CPU quantizer); then the 16 rows of a
// chunk are rearranged so that a decode lane's loads are its mma fragments. V's words pair two
// consecutive tokens, so a warp owns a whole chunk: it quantizes the chunk's 16 rows one by one into
// shared memory (one byte a code), then each lane assembles its output words from the layout's
// inverse map.
// Why this shape: the input rows are read as in stage 0 (coalesced, 2D bytes a row); the output
// chunk (16 x row bytes, contiguous) is written in 32-bit words by consecutive lanes. A one-off
// conversion: not laddered further.
// Launch: grid (ceil(chunks / QZ_WARPS), HKV, B) with chunks = ceil(Tmax / 16), block 32 * QZ_WARPS,
//   static shared QZ_WARPS * 16 * 128 bytes.
// Constraints: D in {64, 128}, G in {1, 4}; input [B, Tmax, HKV, D] bf16; output
//   B * HKV * ceil(Tmax / 16) * 16 * (4G + D/2) bytes, the tokens past Tmax in the last chunk zero.
//   Must match the CPU layout (format::to_fragments of format::quantize) byte for byte.
// Limits: D in {64, 128}; groups in {1 (row-wise), 4 (group-wise)}
#include "qi4_format.cuh"

#ifndef QZ_WARPS
#error "QZ_WARPS (warps = chunks per block) is a tunable: the stage list sets it"
#endif
#ifndef QZ_ROLE_V
#define QZ_ROLE_V 0
#endif

constexpr int QZ_CHUNK = 16;

// Row `x` quantized: lane 0..G-1 returns its group's (scale, shift) pair in `pair`, and every lane
// writes its D/32 codes, one byte each, to codes[lane * D/32 ..].
template <int D, int G>
__device__ __forceinline__ void quantize_codes(const __nv_bfloat16* __restrict__ x_row, unsigned char* codes,
                                               unsigned& pair, int lane) {
    constexpr int E = D / 32;    // values per lane
    constexpr int LPG = 32 / G;  // lanes per group
    float x[E];
#pragma unroll
    for (int i = 0; i < E; ++i) x[i] = __bfloat162float(x_row[lane * E + i]);
    int q[E];
    const Qi4Scales sc = qi4_quantize_group<E, LPG>(x, q);
#pragma unroll
    for (int i = 0; i < E; ++i) codes[lane * E + i] = (unsigned char)q[i];
    // The pair of group j comes from its first lane, j * LPG.
    const unsigned mine = sc.pair();
    pair = __shfl_sync(0xffffffffu, mine, (lane % G) * LPG);
}

// Code word `wi` (32-bit index into the chunk's codes) assembled from the chunk's codes [16][D]:
// the inverse of format::fragment_code_position.
template <int D>
__device__ __forceinline__ unsigned fragment_word(const unsigned char (*codes)[128], int wi) {
    unsigned w = 0;
#if QZ_ROLE_V
    // word i of lane L at (i / 4) * 512 + 16 L + 4 (i % 4) bytes: dims 16i + g (+8) x tokens 2c, 2c+1 (+8)
    const int L = (wi % 128) / 4, i = 4 * (wi / 128) + wi % 4;
    const int g = L >> 2, c = L & 3;
#pragma unroll
    for (int p = 0; p < 4; ++p)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int dim = 16 * i + g + 8 * (p & 1), t = 2 * c + e + 8 * (p >> 1);
            w |= (unsigned)codes[t][dim] << (4 * p + 16 * e);
        }
#else
    // word j of lane L's token g + 8 half at half * 4D + L * D/8 + 4j bytes: k-steps 2j, 2j + 1
    constexpr int KW = D / 32;
    const int half = wi / D, rem = wi % D, L = rem / KW, j = rem % KW;
    const int g = L >> 2, c = L & 3, t = g + 8 * half;
#pragma unroll
    for (int p = 0; p < 4; ++p)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int dim = 16 * (2 * j + (p >> 1)) + 2 * c + 8 * (p & 1) + e;
            w |= (unsigned)codes[t][dim] << (4 * p + 16 * e);
        }
#endif
    return w;
}

template <int D, int G>
__device__ __forceinline__ void quantize_chunk(unsigned char* __restrict__ chunk, const __nv_bfloat16* __restrict__ x,
                                               int tmax, int hkv, int ch, unsigned char (*codes)[128], int lane) {
    constexpr int ROW_BYTES = 4 * G + D / 2;
    unsigned* params = reinterpret_cast<unsigned*>(chunk);
#pragma unroll 1
    for (int t = 0; t < QZ_CHUNK; ++t) {
        const int tok = ch * QZ_CHUNK + t;
        unsigned pair = 0;  // past Tmax: zero parameters and codes
        if (tok < tmax) {
            quantize_codes<D, G>(x + (size_t)tok * hkv * D, codes[t], pair, lane);
        } else {
            for (int i = lane; i < D; i += 32) codes[t][i] = 0;
        }
        // token t's G pairs in slot 2 (t % 8) + t / 8
        if (lane < G) params[G * (2 * (t % 8) + t / 8) + lane] = pair;
    }
    __syncwarp();
    unsigned* words = reinterpret_cast<unsigned*>(chunk + QZ_CHUNK * 4 * G);
    for (int wi = lane; wi < QZ_CHUNK * D / 8; wi += 32) words[wi] = fragment_word<D>(codes, wi);
    static_assert(QZ_CHUNK * ROW_BYTES == QZ_CHUNK * 4 * G + QZ_CHUNK * D / 2, "a chunk is 16 rows' bytes");
}

// out: [B][HKV][chunks][chunk]; inp: [B, Tmax, HKV, D].
extern "C" __global__ void __launch_bounds__(32 * QZ_WARPS)
quantize_int4_fragments(unsigned char* __restrict__ out, const __nv_bfloat16* __restrict__ inp, int tmax, int D,
                        int G) {
    __shared__ unsigned char s_codes[QZ_WARPS][QZ_CHUNK][128];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int chunks = (tmax + QZ_CHUNK - 1) / QZ_CHUNK;
    const int ch = blockIdx.x * QZ_WARPS + warp;
    if (ch >= chunks) return;  // whole warps leave together: the shuffles stay full-warp
    const int kvh = blockIdx.y, b = blockIdx.z, hkv = gridDim.y;
    const size_t chunk_bytes = (size_t)QZ_CHUNK * (4 * G + D / 2);
    unsigned char* chunk = out + (((size_t)b * hkv + kvh) * chunks + ch) * chunk_bytes;
    const __nv_bfloat16* x = inp + ((size_t)b * tmax * hkv + kvh) * D;
    if (D == 128) {
        if (G == 1) quantize_chunk<128, 1>(chunk, x, tmax, hkv, ch, s_codes[warp], lane);
        else quantize_chunk<128, 4>(chunk, x, tmax, hkv, ch, s_codes[warp], lane);
    } else {
        if (G == 1) quantize_chunk<64, 1>(chunk, x, tmax, hkv, ch, s_codes[warp], lane);
        else quantize_chunk<64, 4>(chunk, x, tmax, hkv, ch, s_codes[warp], lane);
    }
}
