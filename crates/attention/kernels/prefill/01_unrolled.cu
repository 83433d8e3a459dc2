// Attention prefill, stage 1: unrolled.
// Changed from previous: `#pragma unroll 8` on the innermost loops of preatt (over HS) and
//   compute_att (over t2); everything else, launch shapes included, is stage 0.
// Why it should be faster: the loops are latency bound (one thread per (batch, head), each product
//   waits on two global loads). Unrolled by 8, the compiler can issue eight iterations' loads before
//   the first multiply-add needs its operands, overlapping their latency; the accumulation chain
//   itself is unchanged, so the result is bit-identical to stage 0. The report measured compute_att
//   284.9 -> 198.7 ms and little change in preatt; parallelism is still B*NH threads, so the stage
//   stays three orders of magnitude from the floor.
// Measured (H100, 2026-11-22): 0.58x of stage 0 at T = 1024 and 256, 0.68x at T = 64, against the
//   prediction. The compiled code shows NVRTC already unrolls stage 0's loops by 16 on its own; the
//   pragma caps that at 8, so fewer loads are in flight, not more (docs/notes/attention.md).
// Launch: as stage 0. Constraints: as stage 0. Tolerance: fp32, rel L2 <= 1e-5.
// Limits: B * T * 3C < 2^31; HS in {32, 64, 128}; B * NH * T * T < 2^31
#include "ladder.cuh"
#include "attention_unfused.cuh"

// The (batch, head) slice this thread owns, or false when the thread is outside B x NH.
__device__ __forceinline__ bool head_of_thread(int B, int NH, size_t* bh) {
    int nh = blockIdx.x * blockDim.x + threadIdx.x;
    int b = blockIdx.y * blockDim.y + threadIdx.y;
    if (nh >= NH || b >= B) return false;
    *bh = (size_t)b * NH + nh;
    return true;
}

extern "C" __global__ void __launch_bounds__(1024)
    attention_preatt(float* preatt, const float* q, const float* k, int B, int T, int NH, int HS) {
    size_t bh;
    if (!head_of_thread(B, NH, &bh)) return;
    const float* qh = q + bh * T * HS;
    const float* kh = k + bh * T * HS;
    float* ph = preatt + bh * T * T;
    for (int t1 = 0; t1 < T; t1++) {
        for (int t2 = 0; t2 <= t1; t2++) {
            float acc = 0.0f;
#pragma unroll 8
            for (int i = 0; i < HS; i++) acc += qh[t1 * HS + i] * kh[t2 * HS + i];
            ph[(size_t)t1 * T + t2] = acc;
        }
    }
}

// Row r = (b*NH + h)*T + t1 of preatt; columns 0..t1 are its causal part.
extern "C" __global__ void attention_softmax(float* att, const float* preatt, int B, int T, int NH, float scale) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= B * NH * T) return;
    const float* x = preatt + (size_t)row * T;
    float* a = att + (size_t)row * T;
    int len = row % T + 1;
    float maxval = -INFINITY;
    for (int j = 0; j < len; j++) maxval = fmaxf(maxval, x[j]);
    float sum = 0.0f;
    for (int j = 0; j < len; j++) sum += expf(scale * (x[j] - maxval));
    float norm = 1.0f / sum;
    for (int j = 0; j < len; j++) a[j] = expf(scale * (x[j] - maxval)) * norm;
    for (int j = len; j < T; j++) a[j] = 0.0f;
}

extern "C" __global__ void __launch_bounds__(1024)
    attention_compute_att(float* y, const float* att, const float* v, int B, int T, int NH, int HS) {
    size_t bh;
    if (!head_of_thread(B, NH, &bh)) return;
    const float* ah = att + bh * T * T;
    const float* vh = v + bh * T * HS;
    float* yh = y + bh * T * HS;
    for (int t1 = 0; t1 < T; t1++) {
        const float* arow = ah + (size_t)t1 * T;
        for (int i = 0; i < HS; i++) {
            float acc = 0.0f;
#pragma unroll 8
            for (int t2 = 0; t2 <= t1; t2++) acc += arow[t2] * vh[t2 * HS + i];
            yh[t1 * HS + i] = acc;
        }
    }
}
