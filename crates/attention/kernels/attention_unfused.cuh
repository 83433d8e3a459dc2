// attention_unfused.cuh: the layout kernels of the unfused prefill stages (00-02).
// permute splits qkv[B, T, 3C] (llm.c layout: q in columns 0..C, k in C..2C, v in 2C..3C; head h
// owns columns h*HS..(h+1)*HS of each) into q, k, v of shape [B, NH, T, HS], so the per-head
// kernels read contiguous T x HS matrices; unpermute writes y[B, NH, T, HS] back as out[B, T, C].
// One thread per element, consecutive threads on consecutive hs: both sides of each copy are
// coalesced in runs of HS floats. Constraint: B*T*3C < 2^31 (checked on the host).
#pragma once

extern "C" __global__ void attention_permute(float* q, float* k, float* v, const float* qkv, int B, int T,
                                             int NH, int HS) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    int total = B * NH * T * HS;
    if (idx >= total) return;
    int hs = idx % HS;
    int t = (idx / HS) % T;
    int nh = (idx / (HS * T)) % NH;
    int b = idx / (HS * T * NH);
    int C = NH * HS;
    size_t src = ((size_t)b * T + t) * 3 * C + (size_t)nh * HS + hs;
    q[idx] = qkv[src];
    k[idx] = qkv[src + C];
    v[idx] = qkv[src + 2 * C];
}

extern "C" __global__ void attention_unpermute(float* out, const float* y, int B, int T, int NH, int HS) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    int total = B * NH * T * HS;
    if (idx >= total) return;
    int hs = idx % HS;
    int t = (idx / HS) % T;
    int nh = (idx / (HS * T)) % NH;
    int b = idx / (HS * T * NH);
    out[((size_t)b * T + t) * (NH * HS) + (size_t)nh * HS + hs] = y[idx];
}
