// attention_unfused.cuh: the layout kernels of the unfused prefill stages (00-02).
// permute splits qkv[B, T, 3C] (llm.c layout: q in columns 0..C, k in C..2C, v in 2C..3C; head h
// owns columns h*HS..(h+1)*HS of each) into q, k, v of shape [B, NH, T, HS], so the per-head
// kernels read contiguous T x HS matrices; unpermute writes y[B, NH, T, HS] back as out[B, T, C].
// One thread per element, consecutive threads on consecutive hs: both sides of each copy are
// coalesced in runs of HS floats. Constraint: B*T*3C < 2^31 (checked on the host).
#pragma once

// The element of [B, NH, T, HS] that thread idx owns, as its b, nh, t and hs.
struct HeadElement {
    int b, nh, t, hs;
};

__device__ __forceinline__ HeadElement head_element(int idx, int T, int NH, int HS) {
    HeadElement e;
    e.hs = idx % HS;
    e.t = (idx / HS) % T;
    e.nh = (idx / (HS * T)) % NH;
    e.b = idx / (HS * T * NH);
    return e;
}

extern "C" __global__ void attention_permute(float* q, float* k, float* v, const float* qkv, int B, int T,
                                             int NH, int HS) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    int total = B * NH * T * HS;
    if (idx >= total) return;
    const HeadElement e = head_element(idx, T, NH, HS);
    int C = NH * HS;
    size_t src = ((size_t)e.b * T + e.t) * 3 * C + (size_t)e.nh * HS + e.hs;
    q[idx] = qkv[src];
    k[idx] = qkv[src + C];
    v[idx] = qkv[src + 2 * C];
}

extern "C" __global__ void attention_unpermute(float* out, const float* y, int B, int T, int NH, int HS) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    int total = B * NH * T * HS;
    if (idx >= total) return;
    const HeadElement e = head_element(idx, T, NH, HS);
    out[((size_t)e.b * T + e.t) * (NH * HS) + (size_t)e.nh * HS + e.hs] = y[idx];
}
