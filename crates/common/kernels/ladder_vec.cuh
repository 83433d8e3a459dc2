// ladder_vec.cuh: 16-byte vector access. A float4 load is one 128-bit transaction per thread,
// so a warp moves 512 contiguous bytes per instruction. Callers must check 16-byte alignment of
// the base pointer and of the row stride (C % 4 == 0 for fp32) before taking the vector path.
#pragma once

__device__ __forceinline__ float4 load_f4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// Streaming load: read-once data, do not keep it in L1 (ld.global.cs).
__device__ __forceinline__ float4 load_f4_stream(const float* p) {
    return __ldcs(reinterpret_cast<const float4*>(p));
}

// A thread's N float4 chunks of a row x, read streaming into v: chunk k is floats 4 (k stride +
// first) .. + 3 (first: the thread's place among the `stride` threads sharing the row); a chunk that
// starts at or past len is zeros, one that starts before it is read whole (the row's storage holds
// whole chunks).
template <int N>
__device__ __forceinline__ void load_f4_chunks_stream(float (&v)[4 * N], const float* x, int first, int stride,
                                                      int len) {
#pragma unroll
    for (int k = 0; k < N; k++) {
        const int i = (k * stride + first) * 4;
        const float4 f = i < len ? load_f4_stream(x + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        v[4 * k] = f.x;
        v[4 * k + 1] = f.y;
        v[4 * k + 2] = f.z;
        v[4 * k + 3] = f.w;
    }
}

__device__ __forceinline__ void store_f4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// Streaming store (st.global.cs): written once, not read again by this kernel.
__device__ __forceinline__ void store_f4_stream(float* p, float4 v) { __stcs(reinterpret_cast<float4*>(p), v); }

__device__ __forceinline__ float f4_get(const float4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ bool is_aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}
