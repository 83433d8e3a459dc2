// LayerNorm forward, stage 6: single pass, vectorized, row in registers (and stage 7: bf16 out).
// Changed from stage 5: the warp loads its row once into registers with 16-byte streaming loads
//   (ld.global.cs.v4: each lane takes 4 consecutive floats, a warp 512 contiguous bytes), computes
//   the mean and then sum((x - mean)^2) from those registers (two-pass numerics, one pass over
//   memory), and writes the output with 16-byte streaming stores. Weight and bias are read as float4.
// Why it should be faster: x is read from HBM once instead of three times (through L1/L2), and a
//   quarter of the load/store instructions; the kernel should run at the copy bandwidth: 8 bytes
//   per element (read + write), 25 MB at rows=4096, C=768 -> ~6 us at 4.2 TB/s plus launch.
// Stage 7 (LN_OUT_BF16): the output is stored as bf16 (round to nearest even; a lane's 4 values one
//   8-byte store), mean and rstd stay fp32: what a bf16 GEMM reads next. 6 bytes an element
//   instead of 8: predicted 1.3x at the copy rate (rows=4096, C=768: 19 MB, ~5 us).
// Launch: grid ceil(rows/LN_WARPS), block 32*LN_WARPS; entry layernorm_forward_<N> holds N float4
//   per lane (N*128 floats per row), the host picks the smallest N with N*128 >= C.
// Constraints: C <= 4096 (32 float4 = 128 registers per lane: the one-warp register budget).
//   C % 4 != 0 rows are not 16-byte aligned: the same kernel takes a scalar path for them.
// Tolerance: fp32, 1e-5 (stage 7: bf16, 1e-2; each output rounded once).
// Limits: rows * C < 2^31; C <= 4096
#include "ladder_convert.cuh"
#include "ladder_reduce.cuh"
#include "ladder_vec.cuh"

#ifdef LN_OUT_BF16
typedef __nv_bfloat16 out_t;
// Four outputs as four bf16 in one 8-byte streaming store (the row offset i is a multiple of 4).
__device__ __forceinline__ void store_out4(out_t* p, float4 y) {
    __stcs(reinterpret_cast<uint2*>(p), make_uint2(pack_bf16x2(y.x, y.y), pack_bf16x2(y.z, y.w)));
}
#else
typedef float out_t;
__device__ __forceinline__ void store_out4(out_t* p, float4 y) { store_f4_stream(p, y); }
#endif

#ifndef LN_WARPS
#error "LN_WARPS (warps per block) is a tunable: the stage list sets it"
#endif

template <int N>
__device__ __forceinline__ void layernorm_row(out_t* __restrict__ out, float* __restrict__ mean,
                                              float* __restrict__ rstd, const float* __restrict__ inp,
                                              const float* __restrict__ weight,
                                              const float* __restrict__ bias, int rows, int C,
                                              float eps) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;  // whole warps only
    const float* __restrict__ x = inp + (size_t)row * C;
    out_t* __restrict__ o = out + (size_t)row * C;
    const bool vec = (C & 3) == 0;
    // Slot s of this lane holds element idx(s): vector path 4 consecutive floats per chunk,
    // scalar path one float every 32.
    auto idx = [&](int s) { return vec ? ((s >> 2) * 32 + lane) * 4 + (s & 3) : s * 32 + lane; };
    float v[4 * N];
    if (vec) {
        load_f4_chunks_stream<N>(v, x, lane, 32, C);
    } else {
#pragma unroll
        for (int s = 0; s < 4 * N; s++) v[s] = idx(s) < C ? __ldcs(x + idx(s)) : 0.0f;
    }
    const float m = warp_mean(v, C);
    float sq = 0.0f;
#pragma unroll
    for (int s = 0; s < 4 * N; s++) {
        float d = idx(s) < C ? v[s] - m : 0.0f;
        sq += d * d;
    }
    const float r = rsqrtf(warp_sum(sq) / C + eps);
    if (vec) {
#pragma unroll
        for (int k = 0; k < N; k++) {
            int i = (k * 32 + lane) * 4;
            if (i < C) {
                float4 w = load_f4(weight + i), b = load_f4(bias + i);
                float4 y;
                y.x = (v[4 * k] - m) * r * w.x + b.x;
                y.y = (v[4 * k + 1] - m) * r * w.y + b.y;
                y.z = (v[4 * k + 2] - m) * r * w.z + b.z;
                y.w = (v[4 * k + 3] - m) * r * w.w + b.w;
                store_out4(o + i, y);
            }
        }
    } else {
#pragma unroll
        for (int s = 0; s < 4 * N; s++) {
            int i = idx(s);
            if (i < C) o[i] = from_float<out_t>((v[s] - m) * r * weight[i] + bias[i]);
        }
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

#define LN_ENTRY(N)                                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * LN_WARPS) layernorm_forward_##N(             \
        out_t* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,                \
        const float* __restrict__ inp, const float* __restrict__ weight,                            \
        const float* __restrict__ bias, int rows, int C, float eps) {                               \
        layernorm_row<N>(out, mean, rstd, inp, weight, bias, rows, C, eps);                         \
    }

LN_ENTRY(1)
LN_ENTRY(2)
LN_ENTRY(3)
LN_ENTRY(4)
LN_ENTRY(6)
LN_ENTRY(8)
LN_ENTRY(12)
LN_ENTRY(16)
LN_ENTRY(24)
LN_ENTRY(32)
