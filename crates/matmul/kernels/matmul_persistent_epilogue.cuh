// matmul_persistent_epilogue.cuh: the persistent GEMM's epilogue (how a consumer writes its tile),
// with the layer's tail applied in the store: `epilogue` 1 (EPI_GELU) is GELU of the biased product,
// 2 (EPI_RESIDUAL) adds `residual`. Five parts, each building on the one before:
//   EpiChecked   stages 9-11: per group of 8 columns, the bias and residual loads follow the
//                previous group's stores, every element bounds-checked;
//   EpiPrefetch  a chunk of 8 groups' bias and residual loads issued before its stores (switch
//                EPI_PREFETCH);
//   EpiLean      one entry per tail; tiles wholly inside the output stored without checks; GELU on
//                tanh.approx; the first part that may write bf16 (OUT_BF16, set per call) (EPI_LEAN);
//   EpiBiasSmem  each consumer copies its tile's bias into shared memory (cp.async) while its MMAs
//                run, and its store reads it there (EPI_BIAS_SMEM);
//   EpiStaged    an interior tile's accumulators pass through a shared staging buffer per warp, 32
//                columns at a time, so the tail's loads and the stores are row-contiguous float4s:
//                each warp instruction covers four whole 128-byte lines, not 32 bytes of 8
//                (EPI_STAGED).
// A part has one signature:
//   switches, smem_bytes         how many of the four switches above it is; its shared memory;
//   setup(smem, at, c, warp, tid, bias) -> EpiSmem
//                                a consumer's shared-memory state, before its first tile;
//   copy_bias(s, bias, tn, N, c, tid), bias_landed(bias, c)
//                                the tile's bias copy, issued before the MMAs and awaited after;
//   store<TAIL>(e, s, d, m0, n0, r0)
//                                64 rows and WS_BN columns from (r0, n0) of the tile at row m0, out
//                                of `d`: a consumer's accumulators of one wgmma row block.
#pragma once
#include "matmul_persistent_tile.cuh"
#include "matmul_tail.cuh"

#define EPI_GELU 1
#define EPI_RESIDUAL 2
#define EPI_GROUPS 8                  // EpiPrefetch's column groups of 8 per batch of loads
#define EPI_STAGING_BYTES (16 * 128)  // an EpiStaged warp's buffer: 16 rows x 32 fp32 columns

// The output's element type, set per call: with OUT_BF16, `out`, `bias` and `residual` as bf16 bit
// patterns (the Rust side's `u16`), converted with ladder_convert.cuh's pair helpers (one
// cvt.rn.bf16x2.f32 a pair; the low half first in memory).
#ifdef OUT_BF16
typedef unsigned short out_t;
__device__ __forceinline__ void store_out1(out_t* p, float x) { *p = (out_t)(pack_bf16x2(x, 0.0f) & 0xffffu); }
__device__ __forceinline__ void store_out2(out_t* p, float x, float y) {
    *reinterpret_cast<unsigned*>(p) = pack_bf16x2(x, y);
}
__device__ __forceinline__ void store_out4(out_t* p, float4 v) {
    *reinterpret_cast<uint2*>(p) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
}
__device__ __forceinline__ float load_out1(const out_t* p) { return __uint_as_float((unsigned)*p << 16); }
__device__ __forceinline__ float2 load_out2(const out_t* p) { return unpack_bf16x2(*reinterpret_cast<const unsigned*>(p)); }
__device__ __forceinline__ float4 load_out4(const out_t* p) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const float2 lo = unpack_bf16x2(u.x), hi = unpack_bf16x2(u.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}
#else
typedef float out_t;
__device__ __forceinline__ void store_out1(out_t* p, float x) { *p = x; }
__device__ __forceinline__ void store_out2(out_t* p, float x, float y) { *reinterpret_cast<float2*>(p) = make_float2(x, y); }
__device__ __forceinline__ void store_out4(out_t* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ float load_out1(const out_t* p) { return *p; }
__device__ __forceinline__ float2 load_out2(const out_t* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float4 load_out4(const out_t* p) { return *reinterpret_cast<const float4*>(p); }
#endif
#define OUT_IS_BF16 (sizeof(out_t) == 2)

// Elements col and col + 1 of a bias or residual row at `p` (zero past N, and a null `p` reads as
// zeros), as one load when `aligned` (col is even; the row starts aligned to a pair) and both are
// inside.
__device__ __forceinline__ float2 load_pair(const out_t* p, int col, int N, bool aligned) {
    if (p == nullptr || col >= N) return make_float2(0.0f, 0.0f);
    if (col + 1 < N && aligned) return load_out2(p + col);
    return make_float2(load_out1(p + col), col + 1 < N ? load_out1(p + col + 1) : 0.0f);
}

// `bytes` (0-16; the rest of the 16 zero-filled) from global `src`, 16-byte aligned, to shared
// `dst`, asynchronously (a cp.async group).
__device__ __forceinline__ void cp_async_bytes(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

// The staged stores' read phase: 16-byte piece q of row lr + 4 i (lr < 4) of a warp's staging
// buffer, 16 rows of 128 bytes in the 128-byte swizzle (piece p of row r at p ^ (r % 8), so row
// lr + 4 i's swizzle is lr, or lr ^ 4 for odd i). 8 lanes read a row and an instruction 4 rows,
// without bank conflicts.
__device__ __forceinline__ uint4 staged_read(unsigned staging, int lr, int q, int i) {
    const unsigned at = staging + (lr + 4 * i) * 128 + ((q ^ lr ^ (4 * (i & 1))) * 16);
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(at)
                 : "memory");
    return v;
}

// What every store reads, a consumer thread's: the call's arguments and its place in the wgmma
// layout (warp of the warpgroup, row g and column pair t of the warp's 8 x 8 pieces, lane).
struct EpiArgs {
    out_t* out;
    const out_t* bias;
    const out_t* residual;
    int M, N, epilogue;
    int warp, g, t, lane;
    bool pairs;  // N is even: every row starts aligned to a pair
};

// A consumer's shared memory in the epilogue: its bias copy (at `bias_copy`, read through `bias_s`)
// and its warp's staging buffer.
struct EpiSmem {
    unsigned bias_copy;
    const out_t* bias_s;
    unsigned staging;
};

// ---- The stores, one a path; each part below is a choice among them ----

// EpiChecked's: each group's bias and residual loads after the previous group's stores (which the
// compiler must assume may alias them): one load latency per group.
template <bool TAIL>
__device__ __forceinline__ void store_each_group(const EpiArgs& e, const float (&d)[WS_BN / 2], int n0, int r0) {
#pragma unroll
    for (int j = 0; j < WS_BN / 8; ++j) {
        const int col = n0 + 8 * j + 2 * e.t;
        if (col >= e.N) continue;
        const float b0 = e.bias != nullptr ? e.bias[col] : 0.0f;
        const float b1 = e.bias != nullptr && col + 1 < e.N ? e.bias[col + 1] : 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = r0 + 16 * e.warp + e.g + 8 * h;
            if (row >= e.M) continue;
            float* o = e.out + (size_t)row * e.N + col;
            float x = d[4 * j + 2 * h] + b0, y = d[4 * j + 2 * h + 1] + b1;
            if constexpr (TAIL) {
                if (e.epilogue == EPI_GELU) {
                    x = mm_gelu_tanh(x);
                    y = mm_gelu_tanh(y);
                } else if (e.epilogue == EPI_RESIDUAL) {
                    const float* r = e.residual + (size_t)row * e.N + col;
                    x += r[0];
                    if (col + 1 < e.N) y += r[1];
                }
            }
            if (e.pairs) {
                *reinterpret_cast<float2*>(o) = make_float2(x, y);
            } else {
                o[0] = x;
                if (col + 1 < e.N) o[1] = y;
            }
        }
    }
}

// EpiPrefetch's, and every later part's at the edge tiles: the tile's columns in chunks of
// EPI_GROUPS groups of 8, every bias and residual pair of a chunk loaded before the chunk's first
// store, so their latencies overlap; every element bounds-checked. The bias from global memory, or
// with FROM_COPY from the consumer's copy `bias_s` (zero past N).
template <bool TAIL, class Epi, bool FROM_COPY>
__device__ __forceinline__ void store_prefetched(const EpiArgs& e, const float (&d)[WS_BN / 2], int n0, int r0,
                                                 const out_t* bias_s) {
    const bool add_residual = TAIL && e.epilogue == EPI_RESIDUAL;
#pragma unroll
    for (int j0 = 0; j0 < WS_BN / 8; j0 += EPI_GROUPS) {
        float2 bv[EPI_GROUPS], rv[EPI_GROUPS][2];
#pragma unroll
        for (int jj = 0; jj < EPI_GROUPS; ++jj) {
            const int col = n0 + 8 * (j0 + jj) + 2 * e.t;
            if constexpr (FROM_COPY) {
                bv[jj] = e.bias != nullptr ? load_out2(bias_s + col - n0) : make_float2(0.0f, 0.0f);
            } else {
                bv[jj] = load_pair(e.bias, col, e.N, true);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = r0 + 16 * e.warp + e.g + 8 * h;
                rv[jj][h] = add_residual && row < e.M ? load_pair(e.residual + (size_t)row * e.N, col, e.N, e.pairs)
                                                      : make_float2(0.0f, 0.0f);
            }
        }
#pragma unroll
        for (int jj = 0; jj < EPI_GROUPS; ++jj) {
            const int j = j0 + jj;
            const int col = n0 + 8 * j + 2 * e.t;
            if (col >= e.N) continue;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = r0 + 16 * e.warp + e.g + 8 * h;
                if (row >= e.M) continue;
                out_t* o = e.out + (size_t)row * e.N + col;
                float x = d[4 * j + 2 * h] + bv[jj].x, y = d[4 * j + 2 * h + 1] + bv[jj].y;
                if constexpr (TAIL) {
                    if (e.epilogue == EPI_GELU) {
                        x = Epi::gelu(x);
                        y = Epi::gelu(y);
                    }
                }
                x += rv[jj][h].x;
                y += rv[jj][h].y;
                if (e.pairs) {
                    store_out2(o, x, y);
                } else {
                    store_out1(o, x);
                    if (col + 1 < e.N) store_out1(o + 1, y);
                }
            }
        }
    }
}

// EpiLean's and EpiBiasSmem's for a tile wholly inside the output: no bounds check, no branch and
// no per-element address: two row offsets per thread, the column an immediate. `bias_t` is the
// tile's bias at this thread's first column (global, or the consumer's copy). `epilogue` is a
// constant in each of the lean entries, so only its own tail is compiled in.
template <bool TAIL, class Epi>
__device__ __forceinline__ void store_unchecked(const EpiArgs& e, const float (&d)[WS_BN / 2], int n0, int r0,
                                                const out_t* bias_t) {
    const bool add_residual = TAIL && e.epilogue == EPI_RESIDUAL;
    const size_t row0 = (size_t)(r0 + 16 * e.warp + e.g) * e.N + n0 + 2 * e.t;
    const size_t rows[2] = {row0, row0 + (size_t)8 * e.N};
    const bool has_bias = e.bias != nullptr;
#pragma unroll
    for (int j0 = 0; j0 < WS_BN / 8; j0 += EPI_GROUPS) {
        float2 bv[EPI_GROUPS], rv[EPI_GROUPS][2];
#pragma unroll
        for (int jj = 0; jj < EPI_GROUPS; ++jj) {
            const int col = 8 * (j0 + jj);
            bv[jj] = has_bias ? load_out2(bias_t + col) : make_float2(0.0f, 0.0f);
#pragma unroll
            for (int h = 0; h < 2; ++h)
                rv[jj][h] = add_residual ? load_out2(e.residual + rows[h] + col) : make_float2(0.0f, 0.0f);
        }
#pragma unroll
        for (int jj = 0; jj < EPI_GROUPS; ++jj) {
            const int j = j0 + jj;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float x = d[4 * j + 2 * h] + bv[jj].x, y = d[4 * j + 2 * h + 1] + bv[jj].y;
                if (TAIL && e.epilogue == EPI_GELU) {
                    x = Epi::gelu(x);
                    y = Epi::gelu(y);
                }
                x += rv[jj][h].x;
                y += rv[jj][h].y;
                store_out2(e.out + rows[h] + 8 * j, x, y);
            }
        }
    }
}

// EpiStaged's for an interior tile with a bf16 output and no residual: per 64 columns, each lane
// applies the bias (its bf16 pairs from the copy) and GELU to its accumulators in the wgmma layout,
// rounds each pair to bf16 once and writes it (4 bytes; 16-byte piece p of row r at p ^ (r % 8): the
// 32 lanes hit 32 banks) into its warp's staging buffer, 16 rows of 128 bytes; then each lane reads
// back 16 bytes, 8 columns of one row (8 lanes a row, 4 rows an instruction), and stores them: whole
// 128-byte lines, half the store instructions of store_staged_rows. Rows of 8 bf16 a lane, 16-byte
// aligned when N % 8 == 0.
template <bool TAIL, class Epi>
__device__ __forceinline__ void store_staged_packed(const EpiArgs& e, const EpiSmem& s, const float (&d)[WS_BN / 2],
                                                    int n0, int r0) {
    if constexpr (OUT_IS_BF16 && WS_BN % 64 == 0) {
        const int lr = e.lane >> 3, q = e.lane & 7;  // read phase: rows lr + 4 i, 16-byte piece q
        const int at0 = (r0 + 16 * e.warp + lr) * e.N + n0 + 8 * q;
#pragma unroll
        for (int j0 = 0; j0 < WS_BN / 8; j0 += 8) {
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
                const float2 bv = load_out2(s.bias_s + 8 * (j0 + jj) + 2 * e.t);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float x = d[4 * (j0 + jj) + 2 * h] + bv.x, y = d[4 * (j0 + jj) + 2 * h + 1] + bv.y;
                    if (TAIL && e.epilogue == EPI_GELU) {
                        x = Epi::gelu(x);
                        y = Epi::gelu(y);
                    }
                    const unsigned at = s.staging + (e.g + 8 * h) * 128 + ((jj ^ e.g) * 16) + 4 * e.t;
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(pack_bf16x2(x, y)) : "memory");
                }
            }
            __syncwarp();
#pragma unroll
            for (int i = 0; i < 4; ++i)
                *reinterpret_cast<uint4*>(e.out + at0 + i * 4 * e.N + 8 * j0) = staged_read(s.staging, lr, q, i);
            __syncwarp();  // every lane has read the buffer before the next columns' writes
        }
    }
}

// EpiStaged's for every other interior tile: per 32 columns, the warp writes its 16 rows of
// accumulators into its staging buffer in the wgmma layout (8-byte pieces; 16-byte piece p of row
// r at p ^ (r % 8), so a write takes the two wavefronts 256 bytes need), then reads them back a
// row-contiguous float4 per lane (8 lanes a 128-byte row, 4 rows an instruction, conflict-free),
// adds the bias (one broadcast float4) and the tail, and stores whole lines. The residual's float4s
// are loaded first, so their latency runs under the staging. With OUT_BF16 a lane's 4 values are 8
// bytes: an instruction covers the same 4 rows' whole 32-byte sectors, half of each line.
template <bool TAIL, class Epi>
__device__ __forceinline__ void store_staged_rows(const EpiArgs& e, const EpiSmem& s, const float (&d)[WS_BN / 2],
                                                  int n0, int r0) {
    const bool add_residual = TAIL && e.epilogue == EPI_RESIDUAL;
    const int lr = e.lane >> 3, q = e.lane & 7;  // read phase: rows lr + 4 i, 16-byte piece q
    // Element (lr + 4 i, 8 j0 + 4 q) of the warp's rows is at at0 + i * 4 * N + 8 j0: 32-bit
    // offsets (M * N < 2^31), not pointers, since four rows' pointers for the output and the
    // residual cost 16 registers the 192-wide ping-pong consumer does not have.
    const int at0 = (r0 + 16 * e.warp + lr) * e.N + n0 + 4 * q;
#pragma unroll
    for (int j0 = 0; j0 < WS_BN / 8; j0 += 4) {
        float4 rv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            rv[i] = add_residual ? load_out4(e.residual + at0 + i * 4 * e.N + 8 * j0)
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        // Rows g and g + 8 (the same swizzle, g < 8), columns 8 jj + 2 t: 16-byte piece
        // 2 jj + t / 2, at (2 jj + t / 2) ^ g = 2 jj ^ (t / 2 ^ g).
        const unsigned row_g = s.staging + e.g * 128 + (e.t & 1) * 8;
        const int swizzle = (e.t >> 1) ^ e.g;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const unsigned at = row_g + 1024 * h + ((2 * jj) ^ swizzle) * 16;
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(d[4 * (j0 + jj) + 2 * h]),
                             "f"(d[4 * (j0 + jj) + 2 * h + 1])
                             : "memory");
            }
        __syncwarp();
        const float4 bv = load_out4(s.bias_s + 8 * j0 + 4 * q);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 u = staged_read(s.staging, lr, q, i);
            float4 v = make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z),
                                   __uint_as_float(u.w));
            v.x += bv.x;
            v.y += bv.y;
            v.z += bv.z;
            v.w += bv.w;
            if (TAIL && e.epilogue == EPI_GELU) {
                v.x = Epi::gelu(v.x);
                v.y = Epi::gelu(v.y);
                v.z = Epi::gelu(v.z);
                v.w = Epi::gelu(v.w);
            }
            v.x += rv[i].x;
            v.y += rv[i].y;
            v.z += rv[i].z;
            v.w += rv[i].w;
            store_out4(e.out + at0 + i * 4 * e.N + 8 * j0, v);
        }
        __syncwarp();  // every lane has read the buffer before the next columns' writes
    }
}

// ---- The parts ----

// The parts without a bias copy: nothing to set up, copy or wait for.
struct EpiNoCopy {
    enum : unsigned { smem_bytes = 0 };
    __device__ __forceinline__ static EpiSmem setup(const unsigned char*, unsigned, int, int, int, const out_t*) {
        return EpiSmem{};
    }
    __device__ __forceinline__ static void copy_bias(const EpiSmem&, const out_t*, int, int, int, int) {}
    __device__ __forceinline__ static void bias_landed(const out_t*, int) {}
};

struct EpiChecked : EpiNoCopy {
    enum { switches = 0 };
    template <bool TAIL>
    __device__ __forceinline__ static void store(const EpiArgs& e, const EpiSmem&, const float (&d)[WS_BN / 2],
                                                 int, int n0, int r0) {
        store_each_group<TAIL>(e, d, n0, r0);
    }
};

struct EpiPrefetch : EpiNoCopy {
    enum { switches = 1 };
    __device__ __forceinline__ static float gelu(float x) { return mm_gelu_tanh(x); }
    template <bool TAIL>
    __device__ __forceinline__ static void store(const EpiArgs& e, const EpiSmem&, const float (&d)[WS_BN / 2],
                                                 int, int n0, int r0) {
        store_prefetched<TAIL, EpiPrefetch, false>(e, d, n0, r0, nullptr);
    }
};

struct EpiLean : EpiNoCopy {
    enum { switches = 2 };
    // The SFU's tanh form (matmul_tail.cuh).
    __device__ __forceinline__ static float gelu(float x) { return mm_gelu_tanh_approx(x); }
    template <bool TAIL>
    __device__ __forceinline__ static void store(const EpiArgs& e, const EpiSmem&, const float (&d)[WS_BN / 2],
                                                 int m0, int n0, int r0) {
        // A tile wholly inside the output: every tile but the last row and column of a ragged shape.
        if (m0 + WS_BM <= e.M && n0 + WS_BN <= e.N && e.pairs) {
            store_unchecked<TAIL, EpiLean>(e, d, n0, r0, e.bias + n0 + 2 * e.t);
        } else {
            store_prefetched<TAIL, EpiLean, false>(e, d, n0, r0, nullptr);
        }
    }
};

struct EpiBiasSmem {
    enum { switches = 3 };
    enum : unsigned { smem_bytes = 2 * WS_BN * 4 };  // each consumer's copy of its tile's WS_BN bias values
    __device__ __forceinline__ static float gelu(float x) { return mm_gelu_tanh_approx(x); }
    // This consumer's copy of the tile's bias, read by its store from shared memory.
    __device__ __forceinline__ static EpiSmem setup(const unsigned char* smem, unsigned at, int c, int, int,
                                                    const out_t*) {
        const unsigned bias_copy = at + c * WS_BN * 4;
        return EpiSmem{bias_copy, reinterpret_cast<const out_t*>(smem + (bias_copy - smem_u32(smem))), 0};
    }
    // The tile's bias copied while the MMAs run, once every warp of this consumer is done reading
    // the previous tile's; zero-filled past N. The source is 16-byte aligned (the host checks the
    // bias pointer; tile columns start at multiples of 128).
    __device__ __forceinline__ static void copy_bias(const EpiSmem& s, const out_t* bias, int tn, int N, int c,
                                                     int tid) {
        if (bias != nullptr) {
            named_barrier(1 + c, 128);
            constexpr int per16 = 16 / sizeof(out_t);  // elements a 16-byte copy moves
            for (int q = tid & 127; q < WS_BN / per16; q += 128) {
                const int col = tn * WS_BN + per16 * q;
                const int bytes = max(0, min(16, (int)sizeof(out_t) * (N - col)));
                cp_async_bytes(s.bias_copy + 16 * q, bias + min(col, N - 1) / per16 * per16, bytes);
            }
            cp_async_commit();
        }
    }
    __device__ __forceinline__ static void bias_landed(const out_t* bias, int c) {
        if (bias != nullptr) {
            cp_async_wait<0>();
            named_barrier(1 + c, 128);  // every thread's part of the copy has landed
        }
    }
    template <bool TAIL>
    __device__ __forceinline__ static void store(const EpiArgs& e, const EpiSmem& s, const float (&d)[WS_BN / 2],
                                                 int m0, int n0, int r0) {
        if (m0 + WS_BM <= e.M && n0 + WS_BN <= e.N && e.pairs) {
            store_unchecked<TAIL, EpiBiasSmem>(e, d, n0, r0, s.bias_s + 2 * e.t);
        } else {
            store_prefetched<TAIL, EpiBiasSmem, true>(e, d, n0, r0, s.bias_s);
        }
    }
};

struct EpiStaged : EpiBiasSmem {
    enum { switches = 4 };
    enum : unsigned { smem_bytes = EpiBiasSmem::smem_bytes + 2 * 4 * EPI_STAGING_BYTES };
    __device__ __forceinline__ static EpiSmem setup(const unsigned char* smem, unsigned at, int c, int warp, int tid,
                                                    const out_t* bias) {
        EpiSmem s = EpiBiasSmem::setup(smem, at, c, warp, tid, bias);
        // This warp's staging buffer, after the bias copies (a shared-window address: 32-bit, so the
        // store's few loop-invariant addresses cost one register each).
        s.staging = at + EpiBiasSmem::smem_bytes + (4 * c + warp) * EPI_STAGING_BYTES;
        // Its store reads the bias copy unconditionally (a branch on the bias costs the 192-wide
        // ping-pong consumer registers it would spill): without a bias the copy is zeros, written
        // once.
        if (bias == nullptr) {
            for (int q = tid & 127; q < WS_BN; q += 128)
                asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(s.bias_copy + 4 * q), "f"(0.0f) : "memory");
            named_barrier(1 + c, 128);
        }
        return s;
    }
    template <bool TAIL>
    __device__ __forceinline__ static void store(const EpiArgs& e, const EpiSmem& s, const float (&d)[WS_BN / 2],
                                                 int m0, int n0, int r0) {
        // A bf16 output without the residual tail is packed before it is staged. The float4 stores
        // need every row 16-byte aligned (8-byte with OUT_BF16), the packed store's 16-byte pieces
        // 16-byte aligned. (`epilogue` is each entry's constant.)
        const bool packed = OUT_IS_BF16 && WS_BN % 64 == 0 && !(TAIL && e.epilogue == EPI_RESIDUAL);
        if (m0 + WS_BM <= e.M && n0 + WS_BN <= e.N && (e.N & (packed ? 7 : 3)) == 0) {
            if (packed) {
                store_staged_packed<TAIL, EpiStaged>(e, s, d, n0, r0);
            } else {
                store_staged_rows<TAIL, EpiStaged>(e, s, d, n0, r0);
            }
        } else {
            store_prefetched<TAIL, EpiStaged, true>(e, d, n0, r0, s.bias_s);
        }
    }
};
