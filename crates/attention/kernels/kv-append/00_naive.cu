// KV append, stage 0: naive (one thread per element).
// What it does: the step between a model's fused QKV projection (fp32 rows [q | k | v] of C each,
//   llm.c's layout) and decode attention (a bf16 cache): row r's q goes to q_out[r] as bf16, and
//   its k and v to cache cell (seq[r], pos[r]) of the contiguous [B, Tmax, H, D] caches as bf16.
//   One thread per (row, channel); seq and pos are device arrays, so a captured decode step can
//   change them without re-capture. kv_append_paged_bf16 writes the same rows into a paged cache
//   (vLLM's layout, see attention_paged.cuh): the cell's block is looked up in the block table.
//   kv_out_f32 widens decode attention's bf16 output back to fp32. The _in16 entries read bf16 QKV
//   rows (a bf16 model's QKV GEMM output) and copy their bf16 values unchanged.
// Why it is the baseline: scalar 4-byte reads and 2-byte writes; the floor is 12 bytes read (6 from
//   bf16 rows) and 6 written per (row, channel).
// Launch: kv_append_bf16 and kv_append_paged_bf16 (and their _in16 forms): grid ceil(R*C/256),
//   block 256; kv_out_f32: grid ceil(N/256), block 256.
// Constraints: rows' (seq, pos) checked on the host to lie in [0, B) x [0, Tmax); C = H*D;
//   B * Tmax * C < 2^31; paged: D % 8 == 0, Tmax <= max_blocks * BS, table entries checked to lie
//   in the pool when the cache was made. Tolerance: bf16 (1e-2; each value rounded once).
//   Built with LADDER_DEPENDENT (a link of the decode step's dependent chain, ladder_dependent.cuh)
//   every entry first waits for the previous kernel, then lets the next one launch.
// Limits: B * Tmax * C < 2^31; R * 3C < 2^31; D % 8 == 0 and D divides C; bs in {0, 16, 32}
#include "ladder.cuh"
#include "ladder_convert.cuh"
#include "ladder_dependent.cuh"

__device__ __forceinline__ __nv_bfloat16 to_bf16(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ __nv_bfloat16 to_bf16(__nv_bfloat16 x) { return x; }

template <typename In>
__device__ __forceinline__ void append_contiguous(__nv_bfloat16* q_out, __nv_bfloat16* k_cache,
                                                  __nv_bfloat16* v_cache, const In* qkv, const int* seq,
                                                  const int* pos, int R, int C, int Tmax) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= R * C) return;
    const int r = idx / C, c = idx % C;
    const In* row = qkv + (size_t)r * 3 * C;
    q_out[idx] = to_bf16(row[c]);
    const size_t cell = ((size_t)seq[r] * Tmax + pos[r]) * C + c;
    k_cache[cell] = to_bf16(row[C + c]);
    v_cache[cell] = to_bf16(row[2 * C + c]);
}

template <typename In>
__device__ __forceinline__ void append_paged(__nv_bfloat16* q_out, __nv_bfloat16* k_pool, __nv_bfloat16* v_pool,
                                             const In* qkv, const int* seq, const int* pos, const int* tables,
                                             int R, int C, int D, int BS, int max_blocks) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= R * C) return;
    const int r = idx / C, c = idx % C;
    const int h = c / D, e = c % D, H = C / D, p = pos[r];
    const In* row = qkv + (size_t)r * 3 * C;
    q_out[idx] = to_bf16(row[c]);
    const size_t block = tables[(size_t)seq[r] * max_blocks + p / BS], slot = p % BS;
    // K [num_blocks, H, D/8, BS, 8]: a token's 8 consecutive elements are one 16-byte piece.
    const size_t head = (block * H + h) * (size_t)D * BS;
    k_pool[head + ((size_t)(e / 8) * BS + slot) * 8 + e % 8] = to_bf16(row[C + c]);
    // V [num_blocks, H, D, BS].
    v_pool[head + (size_t)e * BS + slot] = to_bf16(row[2 * C + c]);
}

#define KV_APPEND_ENTRIES(SUFFIX, IN)                                                                          \
    extern "C" __global__ void kv_append_bf16##SUFFIX(__nv_bfloat16* q_out, __nv_bfloat16* k_cache,           \
                                                      __nv_bfloat16* v_cache, const IN* qkv, const int* seq,  \
                                                      const int* pos, int R, int C, int Tmax) {               \
        LADDER_CHAIN_BLOCK();                                                                                 \
        ladder_wait_prerequisites();                                                                          \
        ladder_launch_dependents();                                                                           \
        append_contiguous(q_out, k_cache, v_cache, qkv, seq, pos, R, C, Tmax);                                \
    }                                                                                                         \
    extern "C" __global__ void kv_append_paged_bf16##SUFFIX(                                                  \
        __nv_bfloat16* q_out, __nv_bfloat16* k_pool, __nv_bfloat16* v_pool, const IN* qkv, const int* seq,    \
        const int* pos, const int* tables, int R, int C, int D, int BS, int max_blocks) {                     \
        LADDER_CHAIN_BLOCK();                                                                                 \
        ladder_wait_prerequisites();                                                                          \
        ladder_launch_dependents();                                                                           \
        append_paged(q_out, k_pool, v_pool, qkv, seq, pos, tables, R, C, D, BS, max_blocks);                  \
    }

KV_APPEND_ENTRIES(, float)
KV_APPEND_ENTRIES(_in16, __nv_bfloat16)

extern "C" __global__ void kv_out_f32(float* out, const __nv_bfloat16* in, int n) {
    LADDER_CHAIN_BLOCK();
    ladder_wait_prerequisites();
    ladder_launch_dependents();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __bfloat162float(in[i]);
}
