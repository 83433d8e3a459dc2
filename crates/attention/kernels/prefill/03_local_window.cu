// Attention prefill, stage 3: local-window (Longformer-style local causal attention).
// Changed from previous: a different function and one fused kernel. Token t1 attends only to the W
//   most recent positions, itself included: keys max(0, t1-W+1)..t1. One block per (token, head,
//   batch) computes that strip of scores (q.k, scaled) into shared memory, its softmax with two
//   shared-memory tree reductions (max, then sum), and the strip times V, writing out[B,T,C]
//   directly from qkv: no permute, no T x T scratch, one launch.
// Why it should be faster: the grid has T*NH*B blocks (parallel over the sequence as well as batch
//   and heads), the score strip never leaves shared memory, and the work per token is W*HS instead
//   of t1*HS. The report measured 106x over its baseline at W = 128 (its profiled grid is
//   (64, 12, 4): T = 64, where the window covers the whole sequence), crediting fusion and
//   parallelism as much as the window. Ours differs in the last product: instead of one tree
//   reduction per output column (HS reductions of log2(W) barriers each), each thread sums a slice
//   of the window for one column (coalesced reads of v rows) and one barrier combines the slices.
// Launch: grid (T, NH, B); block P = next power of two >= W clamped to [32, 1024]; thread j < W owns
//   strip position j. Dynamic shared memory (2P + HS) floats: strip weights, reduction buffer, q row.
// Constraints: 1 <= W <= 1024; HS in {32, 64, 128}; NH, B <= 65535 (grid y, z); B*T*3C < 2^31.
// Tolerance: fp32 against the windowed f64 reference, rel L2 <= 1e-5. (Against full causal
//   attention the error is large whenever W < T: it is shown as a note, not checked.)
// Limits: B * T * 3C < 2^31; HS in {32, 64, 128}; NH <= 65535 and B <= 65535; 1 <= W <= 1024
#include "ladder.cuh"
#include "attention_tree.cuh"

extern "C" __global__ void attention_local(float* out, const float* qkv, int B, int T, int NH, int HS, int W,
                                           float scale) {
    extern __shared__ float smem[];
    const int P = blockDim.x;
    float* weights = smem;
    float* partial = smem + P;
    float* qrow = smem + 2 * P;
    const int tid = threadIdx.x;
    const int t1 = blockIdx.x;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    const int C = NH * HS;
    const size_t C3 = 3 * (size_t)C;
    const float* base = qkv + (size_t)b * T * C3 + (size_t)h * HS;  // q of (b, token 0, head h)

    for (int i = tid; i < HS; i += P) qrow[i] = base[t1 * C3 + i];
    __syncthreads();

    const int len = min(W, t1 + 1);
    const int start = t1 + 1 - len;
    float s = -INFINITY;
    if (tid < len) {
        const float* krow = base + (start + tid) * C3 + C;
        float dot = 0.0f;
        for (int i = 0; i < HS; i++) dot += qrow[i] * krow[i];
        s = dot * scale;
    }
    const float m = tree_max(partial, s);
    const float e = tid < len ? expf(s - m) : 0.0f;
    const float sum = tree_sum(partial, e);
    weights[tid] = e / sum;
    __syncthreads();

    const float* vbase = base + 2 * C;
    float* o = out + ((size_t)b * T + t1) * C + (size_t)h * HS;
    if (P >= HS) {
        // P / HS groups of HS threads; group g sums strip positions g, g + groups, ... for column c.
        const int groups = P / HS;
        const int g = tid / HS;
        const int c = tid % HS;
        float acc = 0.0f;
        for (int j = g; j < len; j += groups) acc += weights[j] * vbase[(start + j) * C3 + c];
        partial[tid] = acc;
        __syncthreads();
        if (tid < HS) {
            float total = 0.0f;
            for (int gg = 0; gg < groups; gg++) total += partial[gg * HS + tid];
            o[tid] = total;
        }
    } else {
        for (int c = tid; c < HS; c += P) {
            float acc = 0.0f;
            for (int j = 0; j < len; j++) acc += weights[j] * vbase[(start + j) * C3 + c];
            o[c] = acc;
        }
    }
}
