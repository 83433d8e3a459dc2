// Attention prefill, stage 0: baseline (the report's five kernels).
// Changed from previous: - (baseline).
// What it does: permute qkv[B,T,3C] into q, k, v [B,NH,T,HS]; preatt[b,h,t1,t2] = q[t1].k[t2] for
//   t2 <= t1 (raw dot products); softmax over each causal row of preatt, scaled by 1/sqrt(HS), into
//   att (zeros above the diagonal); y[b,h,t1,:] = sum_{t2<=t1} att[t1,t2] * v[t2,:]; unpermute y
//   into out[B,T,C].
// Why it is slow: preatt and compute_att give one thread a whole (batch, head) pair, so only B*NH
//   threads (48 at the GPT-2 shape) do all of the ~6.4 GFLOP, each walking T*T/2*HS products in
//   sequence with every operand a global load (no reuse through shared memory). The grid is a single
//   32x32 block when NH, B <= 32: one SM busy, and at B=4, NH=12 only 4 of its 32 warps have work,
//   12 lanes each. The T x T scratch
//   (preatt, att: 2 x 201 MB at the default shape) adds ~800 MB of traffic on top.
// Launch: permute/unpermute: one thread per element of B*T*C, block 256. preatt, compute_att: grid
//   (ceil(NH/32), ceil(B/32)), block (32, 32), thread (x, y) = (head, batch). softmax: one thread
//   per row of B*NH*T, block 256.
// Constraints: HS in {32, 64, 128} (op-wide); B*T*3C < 2^31 and B*NH*T*T < 2^31 (int indices).
// Tolerance: fp32 sums of at most T and HS terms, rel L2 <= 1e-5.
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
            for (int t2 = 0; t2 <= t1; t2++) acc += arow[t2] * vh[t2 * HS + i];
            yh[t1 * HS + i] = acc;
        }
    }
}
