// Attention prefill, stage 2: reduction.
// Changed from previous: preatt and compute_att give every output element its own block, whose
//   threads share the dot product and fold it with a shared-memory tree (attention_tree.cuh);
//   softmax gives every row a block and takes its max and sum with the same trees. permute and
//   unpermute are unchanged.
// Why it should be faster: the work is spread over B*NH*T*T/2 (preatt) and B*NH*T*HS (compute_att)
//   blocks instead of B*NH threads, so every SM is busy and each thread does a handful of
//   multiply-adds; q/k rows (preatt) and att rows (compute_att) are read coalesced by the block.
//   The report measured 87x (preatt) and 89x (compute_att). What remains: log2(block) barriers per
//   output element, blocks of up to 1024 threads of which only t1+1 have a term (compute_att), half
//   of preatt's blocks exit at once (above the diagonal), and the T x T scratch still goes through
//   DRAM twice.
// Launch: preatt: grid (T, T, B*NH), block HS, thread i multiplies q[t1,i] k[t2,i]; blocks with
//   t2 > t1 return. softmax: grid (T, NH, B), block P = next power of two >= T clamped to [32, 1024],
//   strided over the row. compute_att: grid (HS, T, B*NH), block P, thread j sums att[t1,t2] v[t2,hs]
//   over t2 = j, j+P, ... <= t1. Dynamic shared memory: blockDim.x floats.
// Constraints: HS in {32, 64, 128} (a power of two, one thread per term); B*NH <= 65535 (grid z);
//   T <= 65535 (grid y) follows from B*NH*T*T < 2^31; B*T*3C < 2^31.
// Tolerance: fp32, tree order instead of sequential order, rel L2 <= 1e-5.
// Limits: B * T * 3C < 2^31; HS in {32, 64, 128}; B * NH * T * T < 2^31; B * NH <= 65535
#include "ladder.cuh"
#include "attention_tree.cuh"
#include "attention_unfused.cuh"

extern "C" __global__ void attention_preatt(float* preatt, const float* q, const float* k, int B, int T, int NH,
                                            int HS) {
    extern __shared__ float partial[];
    int t2 = blockIdx.x;
    int t1 = blockIdx.y;
    if (t2 > t1) return;  // the whole block leaves together, before any barrier
    size_t bh = blockIdx.z;
    int i = threadIdx.x;
    float prod = q[(bh * T + t1) * HS + i] * k[(bh * T + t2) * HS + i];
    float dot = tree_sum(partial, prod);
    if (i == 0) preatt[(bh * T + t1) * T + t2] = dot;
}

extern "C" __global__ void attention_softmax(float* att, const float* preatt, int B, int T, int NH, float scale) {
    extern __shared__ float partial[];
    int t1 = blockIdx.x;
    size_t row = ((size_t)blockIdx.z * NH + blockIdx.y) * T + t1;
    const float* x = preatt + row * T;
    float* a = att + row * T;
    int len = t1 + 1;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, x[j]);
    m = tree_max(partial, m);
    float s = 0.0f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) s += expf(scale * (x[j] - m));
    s = tree_sum(partial, s);
    float norm = 1.0f / s;
    for (int j = threadIdx.x; j < T; j += blockDim.x) a[j] = j < len ? expf(scale * (x[j] - m)) * norm : 0.0f;
}

extern "C" __global__ void attention_compute_att(float* y, const float* att, const float* v, int B, int T, int NH,
                                                 int HS) {
    extern __shared__ float partial[];
    int hs = blockIdx.x;
    int t1 = blockIdx.y;
    size_t bh = blockIdx.z;
    const float* arow = att + (bh * T + t1) * T;
    const float* vh = v + bh * T * HS;
    float acc = 0.0f;
    for (int t2 = threadIdx.x; t2 <= t1; t2 += blockDim.x) acc += arow[t2] * vh[(size_t)t2 * HS + hs];
    float sum = tree_sum(partial, acc);
    if (threadIdx.x == 0) y[(bh * T + t1) * HS + hs] = sum;
}
