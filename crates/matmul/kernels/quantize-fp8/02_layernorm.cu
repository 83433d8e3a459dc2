// matmul/quantize-fp8, stage 2: layernorm. Stage 1, plus an entry that takes the LayerNorm before
// the linear into the quantizer (`ln` = 1): the fp32 residual stream in, LayerNorm(x) = (x - mean)
// * rstd * gamma + beta computed in registers (norm/layernorm stage 7's math: a warp a row, the row
// read once with 16-byte loads, two-pass mean and variance from registers), and its e4m3 codes and
// 1 x 128 row scales out, without the bf16 LayerNorm output between them. A lane's 4 consecutive
// floats of chunk k make chunk k exactly row group k (32 lanes x 4 = 128 channels), so a group's
// max is one warp max and a lane's 4 codes one 4-byte store.
// Why it should be faster: the fp8 plan's LayerNorm (7) stores bf16 (4 + 2 bytes an element) and
//   stage 1 reads it back and writes the codes (2 + 1): 9 bytes an element in two kernels. Fused: 4 +
//   1 in one. At 4096 x 768 the two kernels take ~10.9 + 8.3 us; predicted ~8 us, a layer saving ~22
//   us over its two LayerNorms (and the LM head's one more).
// Launch: ln = 0 as stage 1; ln = 1: grid ceil(M / 8) x 256 threads, warp w of block b takes row
//   8b + w; entry quantize_rows_layernorm_fp8_<N> holds N float4 a lane (N * 128 channels), the host
//   picks the smallest N with N * 128 >= K.
// Constraints: stage 1's (K % 8 == 0); with ln = 1, blocks = 0 and K <= 4096 (32 float4 a lane: 128
//   registers, the one-warp budget).
// Tolerance: ln = 0 exact (codes and scales bit for bit); ln = 1 1e-3 on the dequantized values
//   against the CPU quantizer on the f64 LayerNorm (a code differs where the fp32 LayerNorm and the
//   f64 one fall on the two sides of a rounding midpoint: ~1e-6 of the elements, a step each).
// Limits: M * K < 2^31; K % 8 == 0; K <= 4096 at ln = 1
#include "ladder_vec.cuh"
#include "matmul_fp8_quantize.cuh"

QF8_VECTOR_ENTRIES

template <int N>
__device__ __forceinline__ void quantize_rows_layernorm(unsigned char* __restrict__ codes,
                                                        float* __restrict__ scales, const float* __restrict__ x,
                                                        const float* __restrict__ gamma,
                                                        const float* __restrict__ beta, int M, int K, float eps) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (row >= M) return;  // whole warps only
    const float* __restrict__ xr = x + (size_t)row * K;
    float v[4 * N];
    load_f4_chunks_stream<N>(v, xr, lane, 32, K);
    const float m = warp_mean(v, K);
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < N; k++) {
        const bool in = (k * 32 + lane) * 4 < K;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float d = in ? v[4 * k + j] - m : 0.0f;
            sq += d * d;
        }
    }
    const float r = rsqrtf(warp_sum(sq) / K + eps);
    const int G = (K + QF8_GROUP - 1) / QF8_GROUP;
#pragma unroll
    for (int k = 0; k < N; k++) {
        if (k >= G) break;  // the same for the whole warp
        const int i = (k * 32 + lane) * 4;
        const bool mine = i < K;
        float y[4] = {0.f, 0.f, 0.f, 0.f};
        if (mine) {
            const float4 w = load_f4(gamma + i), b = load_f4(beta + i);
            y[0] = (v[4 * k] - m) * r * w.x + b.x;
            y[1] = (v[4 * k + 1] - m) * r * w.y + b.y;
            y[2] = (v[4 * k + 2] - m) * r * w.z + b.z;
            y[3] = (v[4 * k + 3] - m) * r * w.w + b.w;
        }
        float amax = QF8_AMAX_FLOOR;
#pragma unroll
        for (int j = 0; j < 4; j++) amax = fmaxf(amax, qf8_mag(y[j]));
        amax = warp_max(amax);
        const float mul = __fdiv_rn(QF8_MAX, amax);
        if (mine) {
            *reinterpret_cast<unsigned*>(codes + (size_t)row * K + i) =
                qf8_pair(y[0], y[1], mul) | qf8_pair(y[2], y[3], mul) << 16;
        }
        if (lane == 0) scales[(size_t)row * G + k] = __fdiv_rn(amax, QF8_MAX);
    }
}

#define QF8_LN_ENTRY(N)                                                                             \
    extern "C" __global__ void __launch_bounds__(256) quantize_rows_layernorm_fp8_##N(             \
        unsigned char* __restrict__ codes, float* __restrict__ scales, const float* __restrict__ x, \
        const float* __restrict__ gamma, const float* __restrict__ beta, int M, int K, float eps) { \
        quantize_rows_layernorm<N>(codes, scales, x, gamma, beta, M, K, eps);                       \
    }

QF8_LN_ENTRY(1)
QF8_LN_ENTRY(2)
QF8_LN_ENTRY(3)
QF8_LN_ENTRY(4)
QF8_LN_ENTRY(6)
QF8_LN_ENTRY(8)
QF8_LN_ENTRY(12)
QF8_LN_ENTRY(16)
QF8_LN_ENTRY(24)
QF8_LN_ENTRY(32)
