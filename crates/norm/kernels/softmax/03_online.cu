// Softmax forward, stage 3: online softmax, vectorized.
// Changed from stage 2: the max and the sum of exponentials come from ONE pass: each lane keeps a
//   running (max m, sum s) and rescales s by exp(m_old - m_new) when the max grows; lanes merge
//   their pairs with shuffles. Loads and stores are 16-byte (float4) when rows are 16-byte aligned
//   (T % 4 == 0), streaming stores for the output.
// Why it should be faster: two reads of the row instead of three (online pass + normalise pass) and
//   a quarter of the memory instructions; the second read often hits L2.
// Launch: grid ceil(rows/SM_WARPS), block 32*SM_WARPS (SM_WARPS = 4).
// Constraints: as stage 0; T % 4 != 0 takes a scalar path in the same kernel. Tolerance: fp32, 1e-5.
// Limits: rows * T < 2^31; rows % T == 0 when causal
#include "ladder_reduce.cuh"
#include "norm_softmax.cuh"
#include "ladder_vec.cuh"

#ifndef SM_WARPS
#error "SM_WARPS (warps per block) is a tunable: the stage list sets it"
#endif

// Folds value v (already scaled) into the running (m, s).
__device__ __forceinline__ void online_add(float& m, float& s, float v) {
    if (v > m) {
        s = s * __expf(m - v) + 1.0f;
        m = v;
    } else {
        s += __expf(v - m);
    }
}

extern "C" __global__ void __launch_bounds__(32 * SM_WARPS)
softmax_forward(float* __restrict__ out, const float* __restrict__ inp, int rows, int T,
                float inv_temperature, int causal) {
    // One warp a row (softmax_warp_row): x, o and len are the warp's row.
    softmax_warp_row<SM_WARPS>(out, inp, rows, T, causal, [&](const float* __restrict__ x, float* __restrict__ o,
                                                               int len, int lane) {
        const bool vec = (T & 3) == 0;
        const float st = inv_temperature;
        float m = -INFINITY, s = 0.0f;
        if (vec) {
            for (int i = lane * 4; i < len; i += 128) {
                float4 f = load_f4(x + i);
                online_add(m, s, st * f.x);
                if (i + 1 < len) online_add(m, s, st * f.y);
                if (i + 2 < len) online_add(m, s, st * f.z);
                if (i + 3 < len) online_add(m, s, st * f.w);
            }
        } else {
            for (int i = lane; i < len; i += 32) online_add(m, s, st * x[i]);
        }
        // Merge the lanes' (m, s): the larger max wins, the other sum is rescaled to it.
        float gm = warp_max(m);
        s = (m == -INFINITY) ? 0.0f : s * __expf(m - gm);
        const float norm = 1.0f / warp_sum(s);
        if (vec) {
            for (int i = lane * 4; i < T; i += 128) {
                float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
                if (i < len) {
                    float4 f = load_f4_stream(x + i);
                    y.x = __expf(st * f.x - gm) * norm;
                    y.y = i + 1 < len ? __expf(st * f.y - gm) * norm : 0.0f;
                    y.z = i + 2 < len ? __expf(st * f.z - gm) * norm : 0.0f;
                    y.w = i + 3 < len ? __expf(st * f.w - gm) * norm : 0.0f;
                }
                store_f4_stream(o + i, y);
            }
        } else {
            for (int i = lane; i < T; i += 32) __stcs(o + i, i < len ? __expf(st * x[i] - gm) * norm : 0.0f);
        }
    });
}
