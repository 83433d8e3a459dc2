// matmul_wgmma_persistent.cuh: the persistent warp-specialized GEMM of linear-bf16 stages 9-16.
// A grid of one block per SM walks the 128 x WS_BN output tiles; warpgroup 0 (the producer) issues
// every TMA load into a ring of WG_STAGES shared-memory stages whose phases continue across tiles;
// the two consumer warpgroups issue wgmma.m64nWS_BNk16 and store. WS_BN is 128, 192 or 256: 256 has
// the most reuse per loaded byte; 192 divides GPT-2's 768 into 4 columns, so N = 768 at M = 4096 is
// 128 tiles (one wave on 132 SMs) instead of 96 at 256. With TAIL (stages 10-16) the store applies
// the layer's tail: `epilogue` 1 is GELU of the biased product, 2 adds `residual`.
//
// What a stage compiles in is a set of switches, given by the stage list as -D defines (the host
// reads the same list to size and launch the kernel). They fall on four axes, each readable alone:
//
// Epilogue store (how a consumer writes its tile), each switch building on the one before:
//   (none)          stages 9-11: per group of 8 columns, the bias and residual loads follow the
//                   previous group's stores, every element bounds-checked;
//   EPI_PREFETCH    a chunk of 8 groups' bias and residual loads issued before its stores;
//   EPI_LEAN        one entry per tail; tiles wholly inside the output stored without checks; GELU
//                   on tanh.approx; the only store that may write bf16 (OUT_BF16, set per call);
//   EPI_BIAS_SMEM   each consumer copies its tile's bias into shared memory (cp.async) while its
//                   MMAs run, and its store reads it there;
//   EPI_STAGED      an interior tile's accumulators pass through a shared staging buffer per warp,
//                   32 columns at a time, so the tail's loads and the stores are row-contiguous
//                   float4s: each warp instruction covers four whole 128-byte lines, not 32 bytes of 8.
// Launch (how a GEMM overlaps the kernel before it in the stream):
//   WS_PDL          programmatic dependent launch: the next grid may launch as this one starts;
//                   every thread waits for the previous grid (its completion and the visibility of
//                   its writes) after the prologue, before its first global access, so the launch
//                   and the prologue run under that grid's tail. Rust launches it with the
//                   programmatic-serialization attribute;
//   WS_WEIGHTS_EARLY (on WS_PDL) the producer issues the W tiles of the block's first WG_STAGES K
//                   steps before it waits (weights are no grid's output: the caller's contract), so
//                   their DRAM fetch also runs under that grid's tail; the consumers wait on their own;
//   WS_PDL_LAST_TILE (on WS_PDL) the next grid may launch only once the producer starts the
//                   block's last tile: it is pending for the last tile round only, not the whole run.
// Consumer schedule (who computes which tile):
//   (none)          cooperative: the two consumers split every tile's rows, 64 each;
//   WS_PINGPONG     each consumer takes every other tile of the walk whole (two 64-row accumulator
//                   sets), the two taking turns on the tensor cores: one's store runs under the
//                   other's MMAs. WS_BN <= 192 (two sets of 64 x 256 do not fit in the registers).
// Tile order (which tile a block takes next):
//   WS_GROUP_M      the walk takes WS_GROUP_M row panels at a time, column by column, so a W tile is
//                   reused by the group's row panels while it is in L2. A tunable (8 declared), or,
//                   with the host switch WS_GROUP_FIT (stage 16), a define the host fits per shape
//                   to the L2 (`group_fit`); the kernel reads only WS_GROUP_M.
//
// Shared memory, from its 1024-byte aligned start (Rust's `persistent_shared_bytes` is the same sum):
//   WG_STAGES ring stages of (128 + WS_BN) x 64 bf16 | EPI_BIAS_SMEM: 2 x WS_BN bias values |
//   EPI_STAGED: 8 warps' 2 KiB staging buffers | 2 x WG_STAGES mbarriers | WS_PINGPONG: 2 more.
// Timeline: 0 block start; 1 barriers ready; 2 producer past the previous grid; 3 producer's last load issued; 4 consumer 0's first stage landed; 5 consumer 0's last MMAs done; 6 consumer 0's last store issued; 7 consumer 1's first stage landed; 8 consumer 1's last MMAs done; 9 consumer 1's last store issued
// (`ladder timeline`: stamps written by thread 0 of the block, of the producer and of each consumer
// warpgroup, in builds with LADDER_TIMELINE only; "last" is the block's last tile.)
#pragma once
#include "matmul_wgmma.cuh"
#include "matmul_tail.cuh"
#include "ladder_timeline.cuh"

#ifndef WG_STAGES
#error "WG_STAGES is a tunable: the stage list sets it"
#endif

#ifndef WS_BN
#error "WS_BN is a tunable or a define the host fits: the stage list sets it"
#endif
#if WS_BN != 128 && WS_BN != 192 && WS_BN != 256
#error "WS_BN must be 128, 192 or 256 (a wgmma N this file instantiates)"
#endif
#ifndef WS_GROUP_M
#error "WS_GROUP_M is a tunable (stage 16: a define the host fits to the shape): the stage list sets it"
#endif
#if WS_GROUP_M < 1
#error "WS_GROUP_M >= 1: the walk takes at least one row panel at a time"
#endif

#define WS_BM 128  // the tile's rows: two consumer warpgroups of 64
#define WS_BK 64   // the K step: a 128-byte row of bf16, the swizzle's span
#define WS_THREADS 384  // the producer warpgroup and two consumers
// setmaxnreg: the producer warpgroup drops to 40 registers and the consumers take what is left of
// the 64K (128 x 40 + 256 x 232 <= 65536).
#define WS_CONSUMER_REGS "232"
#define WS_A_BYTES (WS_BM * WS_BK * 2)
#define WS_B_BYTES (WS_BN * WS_BK * 2)
#define WS_STAGE_BYTES (WS_A_BYTES + WS_B_BYTES)

// ---- Consumer schedule ----
#ifdef WS_PINGPONG
#if WS_BN == 256
#error "WS_BN <= 192 with WS_PINGPONG: a consumer holds two 64 x WS_BN accumulator sets"
#endif
#define WS_SETS 2         // 64-row accumulator sets per consumer: it takes the whole tile
#define WS_STAGE_USERS 1  // consumers that read each ring stage
#else
#define WS_SETS 1
#define WS_STAGE_USERS 2
#endif

// ---- Epilogue store ----
#if defined(EPI_LEAN) && !defined(EPI_PREFETCH)
#error "EPI_LEAN trims EPI_PREFETCH's store"
#endif
#if defined(EPI_BIAS_SMEM) && !defined(EPI_LEAN)
#error "EPI_BIAS_SMEM builds on EPI_LEAN's store"
#endif
#if defined(EPI_STAGED) && !defined(EPI_BIAS_SMEM)
#error "EPI_STAGED reads the bias from EPI_BIAS_SMEM's copy"
#endif
#define EPI_GROUPS 8  // EPI_PREFETCH's column groups of 8 per batch of loads
#ifdef EPI_BIAS_SMEM
#define WS_BIAS_BYTES (2 * WS_BN * 4)  // each consumer's copy of its tile's WS_BN bias values
#else
#define WS_BIAS_BYTES 0
#endif
#ifdef EPI_STAGED
#define EPI_STAGING_BYTES (16 * 128)  // a consumer warp's buffer: 16 rows x 32 fp32 columns
#define WS_EPI_BYTES (2 * 4 * EPI_STAGING_BYTES)
#else
#define WS_EPI_BYTES 0
#endif

// ---- Launch ----
#if defined(WS_WEIGHTS_EARLY) && !defined(WS_PDL)
#error "WS_WEIGHTS_EARLY splits WS_PDL's wait by role"
#endif
#if defined(WS_PDL_LAST_TILE) && !defined(WS_PDL)
#error "WS_PDL_LAST_TILE moves WS_PDL's trigger"
#endif

// ---- Tile order ----
// The (row, column) of tile `tile` in grouped order: WS_GROUP_M rows of tiles at a time, walked
// column by column.
__device__ __forceinline__ void tile_coords(int tile, int tiles_m, int tiles_n, int& tm, int& tn) {
    const int per_group = WS_GROUP_M * tiles_n;
    const int first = (tile / per_group) * WS_GROUP_M;
    const int rows = min(tiles_m - first, WS_GROUP_M);
    const int in_group = tile % per_group;
    tm = first + in_group % rows;
    tn = in_group / rows;
}

// EPI_LEAN's GELU is the SFU's tanh form (matmul_tail.cuh).
#ifdef EPI_LEAN
#define epi_gelu mm_gelu_tanh_approx
#else
#define epi_gelu mm_gelu_tanh
#endif

#define EPI_GELU 1
#define EPI_RESIDUAL 2

// Stages 12-16: an entry whose tail is the constant `tail` (0, EPI_GELU or EPI_RESIDUAL).
#define LEAN_ENTRY(name, tail)                                                                               \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1)                                              \
        name(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, out_t* out,        \
             const out_t* bias, const out_t* residual, int M, int N, int K) {                                \
        persistent_gemm<true>(map_a, map_b, out, bias, residual, M, N, K, tail);                             \
    }

// EPI_BIAS_SMEM: `bytes` (0-16; the rest of the 16 zero-filled) from global `src`, 16-byte aligned,
// to shared `dst`, asynchronously (a cp.async group).
__device__ __forceinline__ void cp_async_bytes(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
#ifdef OUT_BF16
#ifndef EPI_LEAN
#error "OUT_BF16: the lean store paths only (stages 12-16)"
#endif
// `out` and `residual` as bf16 bit patterns (the Rust side's `u16`), converted with
// ladder_convert.cuh's pair helpers (one cvt.rn.bf16x2.f32 a pair; the low half first in memory).
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

// Elements col and col + 1 of a bias or residual row at `p` (zero past N, and a null `p` reads as
// zeros), as one load when `aligned` (col is even; the row starts aligned to a pair) and both are
// inside.
__device__ __forceinline__ float2 load_pair(const out_t* p, int col, int N, bool aligned) {
    if (p == nullptr || col >= N) return make_float2(0.0f, 0.0f);
    if (col + 1 < N && aligned) return load_out2(p + col);
    return make_float2(load_out1(p + col), col + 1 < N ? load_out1(p + col + 1) : 0.0f);
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

// One K step of 16 for a consumer's 64 x WS_BN accumulators.
__device__ __forceinline__ void wgmma_tile(float (&d)[WS_BN / 2], unsigned long long a, unsigned long long b) {
#if WS_BN == 256
    wgmma_m64n256k16(d, a, b);
#elif WS_BN == 192
    wgmma_m64n192k16(d, a, b);
#else
    wgmma_m64n128k16(d, a, b);
#endif
}

template <bool TAIL>
__device__ __forceinline__ void persistent_gemm(const TmaMap& map_a, const TmaMap& map_b, out_t* out,
                                                const out_t* bias, const out_t* residual, int M, int N, int K,
                                                int epilogue) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned base = (smem_u32(smem_raw) + 1023) & ~1023u;  // the 128-byte swizzle's alignment
    auto a_tile = [&](int s) { return base + (unsigned)s * WS_STAGE_BYTES; };
    auto b_tile = [&](int s) { return base + (unsigned)s * WS_STAGE_BYTES + WS_A_BYTES; };
    const unsigned bars = base + WG_STAGES * WS_STAGE_BYTES + WS_BIAS_BYTES + WS_EPI_BYTES;
    auto full = [&](int s) { return bars + 8u * s; };
    auto empty = [&](int s) { return bars + 8u * (WG_STAGES + s); };
#ifdef WS_PINGPONG
    // Consumer w's turn on the tensor cores ends (it has issued a tile's MMAs).
    auto order = [&](int w) { return bars + 8u * (2 * WG_STAGES + w); };
#endif

    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    if (tid == 0) ladder_stamp(0);
    const int tiles_m = (M + WS_BM - 1) / WS_BM, tiles_n = (N + WS_BN - 1) / WS_BN;
    const int tiles = tiles_m * tiles_n;
    const int ktiles = (K + WS_BK - 1) / WS_BK;
    // The block's first tile of the walk, and its stride.
    const int first = blockIdx.x, stride = gridDim.x;

#if defined(WS_PDL) && !defined(WS_PDL_LAST_TILE)
    // The next grid may launch now. Its blocks take an SM only when one of ours has left it (ours
    // fill the shared memory and the registers), and it waits for our completion before it reads or
    // writes global memory, so an early trigger should cost nothing (WS_PDL_LAST_TILE tests that).
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    if (tid == 0) {
        for (int s = 0; s < WG_STAGES; ++s) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), WS_STAGE_USERS);  // one arrival per consumer of the stage
        }
#ifdef WS_PINGPONG
        mbar_init(order(0), 1);
        mbar_init(order(1), 1);
#endif
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (tid == 0) ladder_stamp(1);
#if defined(WS_PDL) && !defined(WS_WEIGHTS_EARLY)
    // Everything above touched only shared memory and the kernel's parameters. Every thread waits
    // for the previous grid, whose output may be this one's `inp`, `bias` or `residual`, and whose
    // inputs may be this one's `out`.
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif

    if (wg == 0) {
        // Producer: one thread issues every load of every tile this block owns; `it` counts K steps
        // across tiles, so the ring's stages and phases carry over from one tile to the next.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) {
            int it = 0;
#ifdef WS_WEIGHTS_EARLY
            // The first tile's first ring stages get their W tiles (and the whole stage's byte
            // count) now; their A tiles follow the wait, in the loop below.
            int early = 0;
            if (first < tiles) {
                int tm, tn;
                tile_coords(first, tiles_m, tiles_n, tm, tn);
                early = ktiles < WG_STAGES ? ktiles : WG_STAGES;
                for (int kt = 0; kt < early; ++kt) {
                    mbar_expect_tx(full(kt), WS_STAGE_BYTES);
                    tma_load(b_tile(kt), &map_b, full(kt), kt * WS_BK, tn * WS_BN);
                }
            }
            // Only this thread of the producer warpgroup touches global memory (through the TMA).
            asm volatile("griddepcontrol.wait;\n" ::: "memory");
#else
            const int early = 0;
#endif
            ladder_stamp(2);
            for (int i = first; i < tiles; i += stride) {
#ifdef WS_PDL_LAST_TILE
                // The block's last tile; the first invocation in a block is the one that counts,
                // and this thread is the only one to make it.
                if (i + stride >= tiles) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
                int tm, tn;
                tile_coords(i, tiles_m, tiles_n, tm, tn);
                for (int kt = 0; kt < ktiles; ++kt, ++it) {
                    const int s = it % WG_STAGES;
                    if (it >= WG_STAGES) mbar_wait(empty(s), ((it / WG_STAGES) - 1) & 1);
                    if (it >= early) mbar_expect_tx(full(s), WS_STAGE_BYTES);
                    tma_load(a_tile(s), &map_a, full(s), kt * WS_BK, tm * WS_BM);
                    if (it >= early) tma_load(b_tile(s), &map_b, full(s), kt * WS_BK, tn * WS_BN);
                }
            }
            ladder_stamp(3);
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 " WS_CONSUMER_REGS ";\n");
#ifdef WS_WEIGHTS_EARLY
    // The consumers wait for the previous grid here (the producer did on its own).
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
    const int c = wg - 1;
#ifdef WS_PINGPONG
    const int first_row = 0;  // consumer c takes every other tile whole
#else
    const int first_row = 64 * c;  // consumer c takes rows 64 c .. 64 c + 63
#endif
    const int warp = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
    const bool pairs = (N & 1) == 0;
#ifdef EPI_BIAS_SMEM
    // This consumer's copy of the tile's bias, read by its store from shared memory.
    const unsigned bias_copy = base + WG_STAGES * WS_STAGE_BYTES + c * WS_BN * 4;
    const out_t* bias_s = reinterpret_cast<const out_t*>(smem_raw + (bias_copy - smem_u32(smem_raw)));
#endif
#ifdef EPI_STAGED
    // This warp's staging buffer, after the bias copies (a shared-window address: 32-bit, so the
    // store's few loop-invariant addresses cost one register each).
    const unsigned staging = base + WG_STAGES * WS_STAGE_BYTES + WS_BIAS_BYTES + (4 * c + warp) * EPI_STAGING_BYTES;
    // Its store reads the bias copy unconditionally (a branch on the bias costs the 192-wide
    // ping-pong consumer registers it would spill): without a bias the copy is zeros, written once.
    if (bias == nullptr) {
        for (int q = tid & 127; q < WS_BN; q += 128)
            asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(bias_copy + 4 * q), "f"(0.0f) : "memory");
        named_barrier(1 + c, 128);
    }
#endif
    // The store of 64 rows and WS_BN columns from (r0, n0) of the tile at row m0, out of `d`: a
    // consumer's accumulators of one wgmma row block.
    auto store = [&](const float(&d)[WS_BN / 2], int m0, int n0, int r0) {
#ifdef EPI_PREFETCH
        const bool add_residual = TAIL && epilogue == EPI_RESIDUAL;
#ifdef EPI_LEAN
        // EPI_LEAN: a tile wholly inside the output (every tile but the last row and column of a
        // ragged shape) stores with no bounds check, no branch and no per-element address: two
        // row offsets per thread, the column an immediate. `epilogue` is a constant in each of
        // the lean entries, so only its own tail is compiled in.
#ifdef EPI_STAGED
#if defined(OUT_BF16) && WS_BN % 64 == 0
        // A bf16 output without the residual tail is packed before it is staged (below): rows of
        // 8 bf16 a lane, 16-byte aligned when N % 8 == 0. (`epilogue` is each entry's constant.)
        const bool packed = !add_residual;
#else
        const bool packed = false;
#endif
        // EPI_STAGED's float4 stores need every row 16-byte aligned (8-byte with OUT_BF16), the
        // packed bf16 store's 16-byte pieces 16-byte aligned.
        const bool interior = m0 + WS_BM <= M && n0 + WS_BN <= N && (N & (packed ? 7 : 3)) == 0;
#else
        const bool interior = m0 + WS_BM <= M && n0 + WS_BN <= N && pairs;
#endif
        if (interior) {
#ifdef EPI_STAGED
#if defined(OUT_BF16) && WS_BN % 64 == 0
          if (packed) {
            // A bf16 output: per 64 columns, each lane applies the bias (its bf16 pairs from the
            // copy) and GELU to its accumulators in the wgmma layout, rounds each pair to bf16 once
            // and writes it (4 bytes; 16-byte piece p of row r at p ^ (r % 8): the 32 lanes hit 32
            // banks) into its warp's staging buffer, 16 rows of 128 bytes; then each lane reads back
            // 16 bytes, 8 columns of one row (8 lanes a row, 4 rows an instruction), and stores
            // them: whole 128-byte lines, half the store instructions of the 8-byte path below.
            const int lr = lane >> 3, q = lane & 7;  // read phase: rows lr + 4 i, 16-byte piece q
            const int at0 = (r0 + 16 * warp + lr) * N + n0 + 8 * q;
#pragma unroll
            for (int j0 = 0; j0 < WS_BN / 8; j0 += 8) {
#pragma unroll
                for (int jj = 0; jj < 8; ++jj) {
                    const float2 bv = load_out2(bias_s + 8 * (j0 + jj) + 2 * t);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float x = d[4 * (j0 + jj) + 2 * h] + bv.x, y = d[4 * (j0 + jj) + 2 * h + 1] + bv.y;
                        if (TAIL && epilogue == EPI_GELU) {
                            x = epi_gelu(x);
                            y = epi_gelu(y);
                        }
                        const unsigned at = staging + (g + 8 * h) * 128 + ((jj ^ g) * 16) + 4 * t;
                        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(pack_bf16x2(x, y)) : "memory");
                    }
                }
                __syncwarp();
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    *reinterpret_cast<uint4*>(out + at0 + i * 4 * N + 8 * j0) = staged_read(staging, lr, q, i);
                __syncwarp();  // every lane has read the buffer before the next columns' writes
            }
          } else
#endif
          {
            // EPI_STAGED: per 32 columns, the warp writes its 16 rows of accumulators into
            // its staging buffer in the wgmma layout (8-byte pieces; 16-byte piece p of row r at
            // p ^ (r % 8), so a write takes the two wavefronts 256 bytes need), then reads them
            // back a row-contiguous float4 per lane (8 lanes a 128-byte row, 4 rows an
            // instruction, conflict-free), adds the bias (one broadcast float4) and the tail, and
            // stores whole lines. The residual's float4s are loaded first, so their latency runs
            // under the staging. With OUT_BF16 a lane's 4 values are 8 bytes: an instruction
            // covers the same 4 rows' whole 32-byte sectors, half of each line.
            const int lr = lane >> 3, q = lane & 7;  // read phase: rows lr + 4 i, 16-byte piece q
            // Element (lr + 4 i, 8 j0 + 4 q) of the warp's rows is at at0 + i * 4 * N + 8 j0: 32-bit
            // offsets (M * N < 2^31), not pointers, since four rows' pointers for the output and
            // the residual cost 16 registers the 192-wide ping-pong consumer does not have.
            const int at0 = (r0 + 16 * warp + lr) * N + n0 + 4 * q;
#pragma unroll
            for (int j0 = 0; j0 < WS_BN / 8; j0 += 4) {
                float4 rv[4];
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    rv[i] = add_residual ? load_out4(residual + at0 + i * 4 * N + 8 * j0)
                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                // Rows g and g + 8 (the same swizzle, g < 8), columns 8 jj + 2 t: 16-byte piece
                // 2 jj + t / 2, at (2 jj + t / 2) ^ g = 2 jj ^ (t / 2 ^ g).
                const unsigned row_g = staging + g * 128 + (t & 1) * 8;
                const int swizzle = (t >> 1) ^ g;
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
                const float4 bv = load_out4(bias_s + 8 * j0 + 4 * q);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const uint4 u = staged_read(staging, lr, q, i);
                    float4 v = make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z),
                                           __uint_as_float(u.w));
                    v.x += bv.x;
                    v.y += bv.y;
                    v.z += bv.z;
                    v.w += bv.w;
                    if (TAIL && epilogue == EPI_GELU) {
                        v.x = epi_gelu(v.x);
                        v.y = epi_gelu(v.y);
                        v.z = epi_gelu(v.z);
                        v.w = epi_gelu(v.w);
                    }
                    v.x += rv[i].x;
                    v.y += rv[i].y;
                    v.z += rv[i].z;
                    v.w += rv[i].w;
                    store_out4(out + at0 + i * 4 * N + 8 * j0, v);
                }
                __syncwarp();  // every lane has read the buffer before the next columns' writes
            }
          }
#else
            const size_t row0 = (size_t)(r0 + 16 * warp + g) * N + n0 + 2 * t;
            const size_t rows[2] = {row0, row0 + (size_t)8 * N};
#ifdef EPI_BIAS_SMEM
            const out_t* bias_t = bias_s + 2 * t;
#else
            const out_t* bias_t = bias + n0 + 2 * t;
#endif
            const bool has_bias = bias != nullptr;
#pragma unroll
            for (int j0 = 0; j0 < WS_BN / 8; j0 += EPI_GROUPS) {
                float2 bv[EPI_GROUPS], rv[EPI_GROUPS][2];
#pragma unroll
                for (int jj = 0; jj < EPI_GROUPS; ++jj) {
                    const int col = 8 * (j0 + jj);
                    bv[jj] = has_bias ? load_out2(bias_t + col) : make_float2(0.0f, 0.0f);
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        rv[jj][h] = add_residual ? load_out2(residual + rows[h] + col) : make_float2(0.0f, 0.0f);
                }
#pragma unroll
                for (int jj = 0; jj < EPI_GROUPS; ++jj) {
                    const int j = j0 + jj;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float x = d[4 * j + 2 * h] + bv[jj].x, y = d[4 * j + 2 * h + 1] + bv[jj].y;
                        if (TAIL && epilogue == EPI_GELU) {
                            x = epi_gelu(x);
                            y = epi_gelu(y);
                        }
                        x += rv[jj][h].x;
                        y += rv[jj][h].y;
                        store_out2(out + rows[h] + 8 * j, x, y);
                    }
                }
            }
#endif
        } else
#endif
        {
            // EPI_PREFETCH: the tile's columns in chunks of EPI_GROUPS groups of 8, every bias and residual
            // pair of a chunk loaded before the chunk's first store, so their latencies overlap.
#pragma unroll
            for (int j0 = 0; j0 < WS_BN / 8; j0 += EPI_GROUPS) {
                float2 bv[EPI_GROUPS], rv[EPI_GROUPS][2];
#pragma unroll
                for (int jj = 0; jj < EPI_GROUPS; ++jj) {
                    const int col = n0 + 8 * (j0 + jj) + 2 * t;
#ifdef EPI_BIAS_SMEM
                    // The copy is zero past N.
                    bv[jj] = bias != nullptr ? load_out2(bias_s + col - n0) : make_float2(0.0f, 0.0f);
#else
                    bv[jj] = load_pair(bias, col, N, true);
#endif
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int row = r0 + 16 * warp + g + 8 * h;
                        rv[jj][h] = add_residual && row < M ? load_pair(residual + (size_t)row * N, col, N, pairs)
                                                            : make_float2(0.0f, 0.0f);
                    }
                }
#pragma unroll
                for (int jj = 0; jj < EPI_GROUPS; ++jj) {
                    const int j = j0 + jj;
                    const int col = n0 + 8 * j + 2 * t;
                    if (col >= N) continue;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int row = r0 + 16 * warp + g + 8 * h;
                        if (row >= M) continue;
                        out_t* o = out + (size_t)row * N + col;
                        float x = d[4 * j + 2 * h] + bv[jj].x, y = d[4 * j + 2 * h + 1] + bv[jj].y;
                        if constexpr (TAIL) {
                            if (epilogue == EPI_GELU) {
                                x = epi_gelu(x);
                                y = epi_gelu(y);
                            }
                        }
                        x += rv[jj][h].x;
                        y += rv[jj][h].y;
                        if (pairs) {
                            store_out2(o, x, y);
                        } else {
                            store_out1(o, x);
                            if (col + 1 < N) store_out1(o + 1, y);
                        }
                    }
                }
            }
        }
#else
        // Stages 9-11 (no store switch): each group's bias and residual loads after the previous group's stores
        // (which the compiler must assume may alias them): one load latency per group.
#pragma unroll
        for (int j = 0; j < WS_BN / 8; ++j) {
            const int col = n0 + 8 * j + 2 * t;
            if (col >= N) continue;
            const float b0 = bias != nullptr ? bias[col] : 0.0f;
            const float b1 = bias != nullptr && col + 1 < N ? bias[col + 1] : 0.0f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = r0 + 16 * warp + g + 8 * h;
                if (row >= M) continue;
                float* o = out + (size_t)row * N + col;
                float x = d[4 * j + 2 * h] + b0, y = d[4 * j + 2 * h + 1] + b1;
                if constexpr (TAIL) {
                    if (epilogue == EPI_GELU) {
                        x = mm_gelu_tanh(x);
                        y = mm_gelu_tanh(y);
                    } else if (epilogue == EPI_RESIDUAL) {
                        const float* r = residual + (size_t)row * N + col;
                        x += r[0];
                        if (col + 1 < N) y += r[1];
                    }
                }
                if (pairs) {
                    *reinterpret_cast<float2*>(o) = make_float2(x, y);
                } else {
                    o[0] = x;
                    if (col + 1 < N) o[1] = y;
                }
            }
        }
#endif
    };

    int it = 0;
#ifdef LADDER_TIMELINE
    bool landed = false;  // this consumer's first ring stage has landed (stamped once)
#endif
#ifdef WS_PINGPONG
    int walked = 0;  // the block's tiles so far, both consumers': consumer c takes the ones = c mod 2
#endif
    for (int i = first; i < tiles; i += stride) {
#ifdef WS_PINGPONG
        // The other consumer's tile. Its K steps still take their turn in the ring.
        if ((walked++ & 1) != c) {
            it += ktiles;
            continue;
        }
        // The MMAs start once the other consumer has issued the previous tile's: so the tensor
        // cores take the tiles in the walk's order (one consumer's store overlapping the other's
        // MMAs), and every ring stage before this tile's has been waited on, so no full barrier is
        // waited on more than one phase ahead of where it stands.
        if (walked > 1) mbar_wait(order(1 - c), ((walked - 2) >> 1) & 1);
#endif
        int tm, tn;
        tile_coords(i, tiles_m, tiles_n, tm, tn);
#ifdef EPI_BIAS_SMEM
        // The tile's bias copied while the MMAs run, once every warp of this consumer is done
        // reading the previous tile's; zero-filled past N. The source is 16-byte aligned (the host
        // checks the bias pointer; tile columns start at multiples of 128).
        if (bias != nullptr) {
            named_barrier(1 + c, 128);
            constexpr int per16 = 16 / sizeof(out_t);  // elements a 16-byte copy moves
            for (int q = tid & 127; q < WS_BN / per16; q += 128) {
                const int col = tn * WS_BN + per16 * q;
                const int bytes = max(0, min(16, (int)sizeof(out_t) * (N - col)));
                cp_async_bytes(bias_copy + 16 * q, bias + min(col, N - 1) / per16 * per16, bytes);
            }
            cp_async_commit();
        }
#endif
        float d[WS_SETS][WS_BN / 2];
#pragma unroll
        for (int h = 0; h < WS_SETS; ++h)
#pragma unroll
            for (int j = 0; j < WS_BN / 2; ++j) d[h][j] = 0.0f;
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
            const int s = it % WG_STAGES;
            mbar_wait(full(s), (it / WG_STAGES) & 1);
#ifdef LADDER_TIMELINE
            if ((tid & 127) == 0 && !landed) ladder_stamp(4 + 3 * c);
            landed = true;
#endif
            const unsigned a = a_tile(s) + first_row * 128, b = b_tile(s);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < WS_BK / 16; ++kk)
#pragma unroll
                for (int h = 0; h < WS_SETS; ++h)
                    wgmma_tile(d[h], wgmma_desc(a + h * 64 * 128 + 32 * kk), wgmma_desc(b + 32 * kk));
            wgmma_commit();
            // The previous step's group is done: its stage can be refilled.
            wgmma_wait_one();
            if (kt > 0 && (tid & 127) == 0) mbar_arrive(empty((it - 1) % WG_STAGES));
        }
#ifdef WS_PINGPONG
        if ((tid & 127) == 0) mbar_arrive(order(c));  // the other consumer's turn on the tensor cores
#endif
        wgmma_wait_all();
        if ((tid & 127) == 0) mbar_arrive(empty((it - 1) % WG_STAGES));  // the tile's last stage
        if ((tid & 127) == 0) ladder_stamp(5 + 3 * c);

        const int m0 = tm * WS_BM, n0 = tn * WS_BN;
#ifdef EPI_BIAS_SMEM
        if (bias != nullptr) {
            cp_async_wait<0>();
            named_barrier(1 + c, 128);  // every thread's part of the copy has landed
        }
#endif
#pragma unroll
        for (int h = 0; h < WS_SETS; ++h) store(d[h], m0, n0, m0 + first_row + 64 * h);
        if ((tid & 127) == 0) ladder_stamp(6 + 3 * c);
    }
}
