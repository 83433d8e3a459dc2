// Decode attention, stage 6: tensor-core (the group's query heads as the rows of MMA tiles).
// Changed from stage 5: block (split, KV head, sequence) still serves all G = HQ/HKV query heads
//   of one KV head, but the products run on the tensor cores (WMMA 16x16x16 bf16/fp16, HMMA on
//   sm_80+): the G queries are the rows of a 16-row A tile (rows >= G zero). Per pass of 64
//   tokens the block copies the K and V tiles [64, D] to shared memory with 16-byte loads (rows past
//   the split zero-filled, never read from the cache), each of the 4 warps computes S = Q.K^T for
//   16 tokens, an online softmax over the pass updates each head's running max and sum and writes
//   P as bf16/fp16, and each warp computes P.V for its D/4 output columns; the fp32 output lives in
//   shared memory and is rescaled by exp(m_old - m_new) per pass. Splits and the combine are
//   stage 2's.
// Why it should be faster: stage 5 spends 8 multiply-adds per loaded element per head on the FMA
//   pipe and 128 registers holding q and O for 8 heads; here a pass is 2*(D/16) + 4 MMAs per warp
//   and the registers are the fragments. The block keeps a whole 32 KiB K/V pass in flight, so a few
//   blocks per SM cover the memory latency: the bytes (each K/V row once per group) become the limit.
// Launch: decode_tc_{bf16,f16}_d{64,128}: grid (splits, HKV, B), block TC_THREADS (128), dynamic
//   shared memory (16*D + 2*TC_PASS*D)*2 + 16*TC_PASS*(4+2) + 2*16*D*4 + 3*16*4 bytes (58.6 KiB at
//   D = 128; computed by the Rust plan from the same tunables);
//   decode_combine_{bf16,f16} (stage 2's).
// Constraints: D in {64, 128}; HQ/HKV <= 16 (one A tile); 1 <= splits <= 256. P is rounded to the
//   cache type before P.V. Tolerance: rel L2 <= 1e-2.
// Limits: D in {64, 128}; HQ % HKV == 0; B <= 65535; B * HQ * Tmax < 2^31; splits <= 256; HQ / HKV <= 16
#include <mma.h>
#include "attention_decode.cuh"

#if !defined(TC_PASS) || !defined(TC_THREADS)
#error "TC_PASS (tokens per pass) and TC_THREADS (threads per block) are tunables: the stage list sets them"
#endif
// Each warp takes 16 tokens of a pass, and the softmax gives each of the 16 rows 8 threads of 8
// columns: the pass is 64 tokens for 4 warps.
static_assert(TC_PASS == 64 && TC_THREADS == 128, "this kernel needs TC_PASS = 64 and TC_THREADS = 128");

template <typename T, int D>
__device__ __forceinline__ void tensor_core_decode(float* o_part, float* m_part, float* l_part, const T* q,
                                                   const T* k, const T* v, const int* seq_lens, const float* slopes,
                                                   int Tmax, int G, float scale) {
    using namespace nvcuda;
    constexpr int COLS = D / 4;  // output columns per warp
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
    extern __shared__ __align__(16) unsigned char smem[];
    T* qs = reinterpret_cast<T*>(smem);                       // [16][D]
    T* ks = qs + 16 * D;                                      // [TC_PASS][D]
    T* vs = ks + TC_PASS * D;                                 // [TC_PASS][D]
    float* ss = reinterpret_cast<float*>(vs + TC_PASS * D);  // [16][TC_PASS] scores
    T* ps = reinterpret_cast<T*>(ss + 16 * TC_PASS);         // [16][TC_PASS] probabilities
    float* os = reinterpret_cast<float*>(ps + 16 * TC_PASS);  // [16][D] running output
    float* ts = os + 16 * D;                                  // [16][D] this pass's P.V
    float* ms = ts + 16 * D;                                  // [16] running max
    float* ls = ms + 16;                                      // [16] running sum
    float* as = ls + 16;                                      // [16] rescale of this pass

    const int split = blockIdx.x, splits = gridDim.x, kvh = blockIdx.y, HKV = gridDim.y, b = blockIdx.z;
    const int HQ = HKV * G, hq0 = kvh * G, len = seq_lens[b];
    const int chunk = (len + splits - 1) / splits;
    const int t_begin = min(split * chunk, len), t_end = min(t_begin + chunk, len);
    const int tid = threadIdx.x, warp = tid >> 5;
    const size_t stride = (size_t)HKV * D;
    const T* kbase = k + ((size_t)b * Tmax * HKV + kvh) * D;
    const T* vbase = v + ((size_t)b * Tmax * HKV + kvh) * D;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

    // Q tile: the G heads' rows, zero rows below; output and statistics start empty.
    for (int i = tid; i < 16 * CHUNKS; i += TC_THREADS) {
        const int r = i / CHUNKS, c = i % CHUNKS;
        reinterpret_cast<uint4*>(qs)[i] =
            r < G ? *reinterpret_cast<const uint4*>(q + ((size_t)b * HQ + hq0 + r) * D + c * 8) : zero;
    }
    for (int i = tid; i < 16 * D; i += TC_THREADS) os[i] = 0.0f;
    if (tid < 16) {
        ms[tid] = -INFINITY;
        ls[tid] = 0.0f;
    }

    for (int p0 = t_begin; p0 < t_end; p0 += TC_PASS) {
        __syncthreads();  // the previous pass is done with ks, vs, ps
        for (int i = tid; i < TC_PASS * CHUNKS; i += TC_THREADS) {
            const int r = i / CHUNKS, c = i % CHUNKS, t = p0 + r;
            const bool in = t < t_end;
            reinterpret_cast<uint4*>(ks)[i] = in ? *reinterpret_cast<const uint4*>(kbase + (size_t)t * stride + c * 8) : zero;
            reinterpret_cast<uint4*>(vs)[i] = in ? *reinterpret_cast<const uint4*>(vbase + (size_t)t * stride + c * 8) : zero;
        }
        __syncthreads();
        {  // S[:, 16w .. 16w+15] = Q . K_w^T
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bk;
                wmma::load_matrix_sync(a, qs + kk * 16, D);
                wmma::load_matrix_sync(bk, ks + (size_t)warp * 16 * D + kk * 16, D);
                wmma::mma_sync(acc, a, bk, acc);
            }
            wmma::store_matrix_sync(ss + warp * 16, acc, TC_PASS, wmma::mem_row_major);
        }
        __syncthreads();
        {  // online softmax: 8 threads per row, 8 columns each
            const int r = tid >> 3, c0 = (tid & 7) * 8;
            float s[8], mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int t = p0 + c0 + j;
                s[j] = (r < G && t < t_end) ? ss[r * TC_PASS + c0 + j] * scale + decode_alibi(slopes, hq0 + r, t, len)
                                            : -INFINITY;
                mx = fmaxf(mx, s[j]);
            }
#pragma unroll
            for (int off = 4; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_old = ms[r];
            const float m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float p = s[j] == -INFINITY ? 0.0f : __expf(s[j] - m_new);
                ps[r * TC_PASS + c0 + j] = from_float<T>(p);
                sum += p;
            }
#pragma unroll
            for (int off = 4; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            __syncwarp();
            if ((tid & 7) == 0) {
                const float alpha = m_new == -INFINITY ? 1.0f : __expf(m_old - m_new);
                as[r] = alpha;
                ms[r] = m_new;
                ls[r] = ls[r] * alpha + sum;
            }
        }
        __syncthreads();
        // T[:, cols of warp w] = P . V
#pragma unroll
        for (int n = 0; n < COLS / 16; ++n) {
            const int col = warp * COLS + n * 16;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < TC_PASS / 16; ++kk) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bv;
                wmma::load_matrix_sync(a, ps + kk * 16, TC_PASS);
                wmma::load_matrix_sync(bv, vs + (size_t)kk * 16 * D + col, D);
                wmma::mma_sync(acc, a, bv, acc);
            }
            wmma::store_matrix_sync(ts + col, acc, D, wmma::mem_row_major);
        }
        __syncthreads();
        for (int i = tid; i < 16 * D; i += TC_THREADS) os[i] = os[i] * as[i / D] + ts[i];
    }
    __syncthreads();
    for (int i = tid; i < G * D; i += TC_THREADS) {
        const int h = i / D, d = i % D;
        const size_t part = ((size_t)b * HQ + hq0 + h) * splits + split;
        o_part[part * D + d] = os[h * D + d];
        if (d == 0) {
            m_part[part] = ms[h];
            l_part[part] = ls[h];
        }
    }
}

#define TC_ENTRY(SUFFIX, T, D)                                                                                    \
    extern "C" __global__ void __launch_bounds__(TC_THREADS)                                                     \
        decode_tc_##SUFFIX##_d##D(float* o_part, float* m_part, float* l_part, const T* q, const T* k,          \
                                  const T* v, const int* seq_lens, const float* slopes, int Tmax, int G,         \
                                  float scale) {                                                                 \
        tensor_core_decode<T, D>(o_part, m_part, l_part, q, k, v, seq_lens, slopes, Tmax, G, scale);             \
    }
TC_ENTRY(bf16, __nv_bfloat16, 64)
TC_ENTRY(bf16, __nv_bfloat16, 128)
TC_ENTRY(f16, __half, 64)
TC_ENTRY(f16, __half, 128)

DECODE_COMBINE_ENTRIES
