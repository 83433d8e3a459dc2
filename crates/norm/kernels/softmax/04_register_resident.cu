// Softmax forward, stage 4: register-resident row (past the report, toward the copy bandwidth).
// Changed from stage 3: one block of SM_THREADS threads per row loads the row ONCE into registers
//   (16-byte streaming loads, N float4 per thread), takes max and sum from the registers with
//   shuffle + shared-memory block reductions, and writes with 16-byte streaming stores. Causal rows
//   load only their first p+1 columns and store zeros past them.
// Why it should be faster: exactly one read and one write of each element (8 bytes/element, 6 when
//   causal), which is what a copy moves; no second pass that may miss L2.
// Launch: grid rows, block SM_THREADS (256); entry softmax_forward_<N> holds N float4 per thread,
//   the host picks the smallest N with N*4*SM_THREADS >= T.
// Constraints: T <= 32 * SM_THREADS, 8192 at the declared 256 threads (8 float4 = 32 registers per
//   thread); checked in Rust before launch. T % 4 != 0 takes a scalar path in
//   the same kernel. Tolerance: fp32, 1e-5.
// Limits: rows * T < 2^31; rows % T == 0 when causal; T <= 32 * SM_THREADS
#include "ladder_reduce.cuh"
#include "ladder_vec.cuh"

#ifndef SM_THREADS
#error "SM_THREADS (threads per block) is a tunable: the stage list sets it"
#endif

template <int N>
__device__ __forceinline__ void softmax_row(float* __restrict__ out, const float* __restrict__ inp,
                                            int T, float st, int causal) {
    __shared__ float scratch[32];
    const int row = blockIdx.x;
    const float* __restrict__ x = inp + (size_t)row * T;
    float* __restrict__ o = out + (size_t)row * T;
    const int len = causal ? (row % T) + 1 : T;
    const bool vec = (T & 3) == 0;
    // Slot s holds element idx(s): vector path 4 consecutive floats per chunk, scalar path strided.
    auto idx = [&](int s) {
        return vec ? ((s >> 2) * SM_THREADS + threadIdx.x) * 4 + (s & 3) : s * SM_THREADS + threadIdx.x;
    };
    float v[4 * N];
    if (vec) {
        load_f4_chunks_stream<N>(v, x, threadIdx.x, SM_THREADS, len);
    } else {
#pragma unroll
        for (int s = 0; s < 4 * N; s++) v[s] = idx(s) < len ? __ldcs(x + idx(s)) : 0.0f;
    }
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < 4 * N; s++)
        if (idx(s) < len) m = fmaxf(m, st * v[s]);
    m = block_max(m, scratch);
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < 4 * N; s++) {
        v[s] = idx(s) < len ? __expf(st * v[s] - m) : 0.0f;
        sum += v[s];
    }
    const float norm = 1.0f / block_sum(sum, scratch);
    if (vec) {
#pragma unroll
        for (int k = 0; k < N; k++) {
            int i = (k * SM_THREADS + threadIdx.x) * 4;
            if (i < T)
                store_f4_stream(o + i, make_float4(v[4 * k] * norm, v[4 * k + 1] * norm, v[4 * k + 2] * norm,
                                                   v[4 * k + 3] * norm));
        }
    } else {
#pragma unroll
        for (int s = 0; s < 4 * N; s++)
            if (idx(s) < T) __stcs(o + idx(s), v[s] * norm);
    }
}

#define SM_ENTRY(N)                                                                                 \
    extern "C" __global__ void __launch_bounds__(SM_THREADS) softmax_forward_##N(                   \
        float* __restrict__ out, const float* __restrict__ inp, int rows, int T, float st,          \
        int causal) {                                                                               \
        softmax_row<N>(out, inp, T, st, causal);                                                    \
    }

SM_ENTRY(1)
SM_ENTRY(2)
SM_ENTRY(4)
SM_ENTRY(8)
