// matmul_wgmma_persistent.cuh: the persistent warp-specialized GEMM of linear-bf16 stages 9-40
// (each stage's header says what it adds). A grid of one block per SM walks the output tiles in
// groups of WS_GROUP_M row panels (a tunable; in stage 37 a define the host fits to the shape);
// warpgroup 0 issues every TMA load (the smem ring and its phases continue across tiles), the
// consumer warpgroups (WS_BM / 64 of them, 64 rows each; two of 128 rows at WS_BM 256; two of
// WS_BN / 2 columns in stage 35) issue wgmma.m64nWS_BNk16 (m64n(WS_BN/2)k16 in stage 35) and
// store. The tile is WS_BM x WS_BN: WS_BM is 128, 192 in stage 16, 256 in stage 32, 64 in stage 34;
// WS_BN is 128, 192 or 256: 256 has the most reuse per loaded byte; 192 divides GPT-2's 768 into 4
// columns, so N = 768 at M = 4096 is 128 tiles (one wave on 132 SMs) instead of 96 at 256. With
// TAIL (stages 10-40), the store applies the layer's tail: `epilogue` 1 is GELU of the biased
// product, 2 adds `residual`; stage 9 instantiates it without. Switches of the later stages:
//   EPI_PREFETCH (12, 14-40): a chunk's bias and residual loads batched before its stores;
//   EPI_TMA_STORE (13): results into EPI_SLOTS shared slots of 64 x 64 fp32, stored by the TMA
//     (`map_out`) while the consumer goes on;
//   WS_MULTICAST (14, 20, 23, 24): clusters of 2 along M walk pairs of vertically adjacent tiles,
//     which share their W tile; each block loads its own A tile and half of the W tile, multicast
//     into both, and a ring stage is refilled only once the consumers of both blocks have released
//     it (with WS_PINGPONG the two blocks' walks are the same, so the same consumer of each reads
//     it);
//   EPI_LEAN (15-40): tiles wholly inside the output stored without checks, GELU on tanh.approx;
//   WS_PINGPONG (17, 19, 22, 23, 26, 28, 31, 34, 37): each consumer takes every other tile of the
//     walk whole (two 64-row accumulator sets; one on stage 34's 64-row tiles), the two taking
//     turns on the tensor cores, one's store under the other's MMAs;
//   EPI_BIAS_SMEM (18-40): each consumer copies its tile's bias into shared memory (cp.async)
//     while the MMAs run, and its store reads it there;
//   EPI_STAGED (21-40): an interior tile's accumulators pass through a shared staging buffer per
//     warp, 32 columns at a time, so that the tail's loads and the stores are row-contiguous
//     float4s: each warp instruction covers four whole 128-byte lines instead of 32 bytes of 8;
//   WS_PDL (25-40): programmatic dependent launch. Every block lets the next grid in the stream
//     launch as soon as it starts, and waits for the previous grid (its completion and the
//     visibility of its writes) after the prologue and before its first global access, so the
//     launch and the prologue of one GEMM run under the tail of the one before. Rust launches these
//     stages with the programmatic-serialization attribute;
//   WS_WEIGHTS_EARLY (27-40): with WS_PDL, the producer issues the W tiles of the block's first
//     WG_STAGES K steps before it waits for the previous grid (the weights are no grid's output:
//     the caller's contract), so their fetch from DRAM also runs under that grid's tail; the
//     consumers wait for the previous grid on their own;
//   WS_PDL_LAST_TILE (30-40): with WS_PDL, a block lets the next grid launch only when its
//     producer starts the block's last tile, not as the block starts: the next grid is then
//     pending only for the run's last tile round, not for all of it;
//   WS_STREAM_K (33): the schedule's last `sk.tiles` tiles are shared out by K steps: their steps,
//     numbered tile by tile, are cut into gridDim.x contiguous ranges (one per block, lengths
//     differing by at most one), run after the block's data-parallel tiles. A tile cut between
//     blocks is finished by the block holding its first K step (the end of that block's range);
//     every other block that holds a part of it writes its accumulators to its slot of
//     `sk.partials` and raises its flag, which the finishing block waits for, adds in block order
//     and lowers again for the next launch;
//   OUT_BF16 (15-40, set by the host for `out = 16`): `out`, `bias` and `residual` are bf16 (raw
//     bits; a 16-bit output takes a bias of its own type in cuBLASLt too), the tail computed in
//     fp32 and rounded to nearest even once, as it is stored; the lean store paths only (stages
//     9-14 and the TMA store write fp32);
//   WS_COLSPLIT (35): the two consumers split the 128 x WS_BN tile's columns instead of its rows:
//     each holds both 64-row sets of its WS_BN / 2 columns (wgmma.m64n(WS_BN/2)k16) and reads every
//     ring stage whole, as the row split does, so the loads are unchanged. Consumer 1 starts its
//     first tile once consumer 0 has run WS_LAG K steps of it (the `lead` mbarrier), so consumer 0
//     finishes each tile WS_LAG steps earlier and its half of the store runs under consumer 1's last
//     MMAs, and consumer 1's under consumer 0's next tile;
//   EPI_TMA_LAST (39): the block's last tile (the only one at the N = 768 shapes), with a bias or
//     GELU tail, is stored by the TMA from the ring, which no load uses any more once its MMAs are
//     done: each consumer writes its 64 x WS_BN results (tail applied) into boxes of 64 rows x 128
//     bytes in the 128-byte swizzle and one thread issues a box store per 128 bytes of columns,
//     instead of its warps staging and storing ~100 float4s a thread. Used where the host passes
//     an output map (`out`'s rows a multiple of 16 bytes); otherwise, and with the residual tail,
//     the staged store;
//   WS_EARLY (40, a tunable): with WS_WEIGHTS_EARLY, the producer loads the W tiles of only the
//     first WS_EARLY K steps before the wait (not the ring's depth), so that the first A tile is
//     not queued behind the other W tiles where nothing is left to wait for;
//   WS_TMAP_PREFETCH (38): thread 0 prefetches both tensor maps (prefetch.tensormap) as the block
//     starts, before the barriers are initialized, so the first TMA load of each operand does not
//     also wait for its descriptor's fetch;
//   WS_L2_PREFETCH (36): once the ring's first loads are issued, the producer fetches into L2 (TMA
//     prefetches) the operands of the K steps after them, up to step WS_L2_WINDOW of the block's
//     walk; each box once over the grid: block (tm, tn) takes the A boxes of the K steps with
//     kt % tiles_n == tn and the W boxes of those with kt % tiles_m == tm (the W boxes before the
//     wait for the previous grid). The ring paces each SM's DRAM requests to its MMAs; the window
//     asks DRAM for them at once, without adding to any one SM's TMA work more than a few boxes.
// Timeline: 0 block start; 1 barriers ready; 2 producer past the previous grid; 3 producer's last load issued; 4 consumer 0's first stage landed; 5 consumer 0's last MMAs done; 6 consumer 0's last store issued; 7 consumer 1's first stage landed; 8 consumer 1's last MMAs done; 9 consumer 1's last store issued; 10 consumer 2's first stage landed; 11 consumer 2's last MMAs done; 12 consumer 2's last store issued; 13 consumer 0's last TMA store written; 14 consumer 1's last TMA store written
// (`ladder timeline`: stamps written by thread 0 of the block, of the producer and of each consumer
// warpgroup, in builds with LADDER_TIMELINE only; "last" is the block's last tile.)
#pragma once
#include "matmul_wgmma.cuh"
#include "ladder_timeline.cuh"

#ifndef WG_STAGES
#error "WG_STAGES is a tunable: the stage list sets it"
#endif

#ifndef WS_BN
#error "WS_BN is a tunable: the stage list sets it"
#endif
#if WS_BN != 128 && WS_BN != 192 && WS_BN != 256
#error "WS_BN must be 128, 192 or 256 (a wgmma N this file instantiates)"
#endif

// The tile's rows: 128 (two consumer warpgroups of 64 rows) in stages 9-15; stage 16's stage list
// sets 192 (three consumers of 64 rows), stage 32's 256 (two consumers of 128 rows, each holding
// two 64-row accumulator sets), stage 34's 64 (two ping-pong consumers, each on tiles of its own).
#ifndef WS_BM
#define WS_BM 128
#endif
#if WS_BM != 64 && WS_BM != 128 && WS_BM != 192 && WS_BM != 256
#error "WS_BM must be 64, 128, 192 or 256 (consumer warpgroups of 64 rows, or two of 128 at 256)"
#endif
#if WS_BM == 256
#define WS_CONSUMERS 2
#if WS_BN == 256 || defined(WS_PINGPONG) || defined(WS_MULTICAST) || defined(EPI_TMA_STORE)
#error "WS_BM 256: two cooperative consumers of two 64 x WS_BN sets each, WS_BN <= 192, storing from registers"
#endif
#elif WS_BM == 64
#define WS_CONSUMERS 2
#if !defined(WS_PINGPONG) || defined(WS_MULTICAST)
#error "WS_BM 64: two ping-pong consumers taking turns on 64-row tiles, without clusters"
#endif
#else
#define WS_CONSUMERS (WS_BM / 64)
#endif
#define WS_THREADS (128 * (1 + WS_CONSUMERS))
// setmaxnreg: the producer warpgroup drops to 40 registers and the consumers take what is left of
// the 64K (2 consumers: 232; 3 consumers: 152, since 128 x 40 + 384 x 152 <= 65536).
#if WS_CONSUMERS == 3
#define WS_CONSUMER_REGS "152"
#else
#define WS_CONSUMER_REGS "232"
#endif
#define WS_BK 64
#define WS_A_BYTES (WS_BM * WS_BK * 2)
#define WS_B_BYTES (WS_BN * WS_BK * 2)
#define WS_STAGE_BYTES (WS_A_BYTES + WS_B_BYTES)
#ifndef WS_GROUP_M
#error "WS_GROUP_M is a tunable (stage 37: a define the host fits to the shape): the stage list sets it"
#endif
#if WS_GROUP_M < 1
#error "WS_GROUP_M >= 1: the walk takes at least one row panel at a time"
#endif

#ifdef WS_PINGPONG
#if WS_CONSUMERS != 2 || defined(EPI_TMA_STORE)
#error "WS_PINGPONG takes two consumers of 128-row tiles, storing from registers"
#endif
#if WS_BN == 256 && WS_BM != 64
#error "WS_BN <= 192 with WS_PINGPONG on 128-row tiles: a consumer holds two 64 x WS_BN accumulator sets"
#endif
#define WS_SETS (WS_BM / 64)  // 64-row accumulator sets per consumer: it takes the whole tile
#define WS_STAGE_USERS 1  // consumers that read each ring stage
#elif defined(WS_COLSPLIT)
#define WS_SETS 2  // both 64-row halves of the tile, over the consumer's half of the columns
#define WS_STAGE_USERS WS_CONSUMERS
#else
#define WS_SETS (WS_BM / 64 / WS_CONSUMERS)  // 2 at WS_BM 256: a consumer's 128 rows
#define WS_STAGE_USERS WS_CONSUMERS
#endif

// The columns of a consumer's accumulator sets: the tile's, or half of them with WS_COLSPLIT.
#ifdef WS_COLSPLIT
#if WS_BM != 128 || defined(WS_PINGPONG) || defined(WS_MULTICAST) || defined(EPI_TMA_STORE) || defined(WS_STREAM_K) || !defined(EPI_STAGED)
#error "WS_COLSPLIT: 128-row tiles of two cooperative consumers, stored from registers through the staging buffers"
#endif
#ifndef WS_LAG
#error "WS_LAG is a tunable: the stage list sets it"
#endif
#if WS_LAG < 0 || WS_LAG > WG_STAGES
#error "WS_LAG <= WG_STAGES: consumer 0 runs its lead on the stages the producer fills before any is released"
#endif
#define WS_CN (WS_BN / 2)
#else
#define WS_CN WS_BN
#endif

#ifdef WS_MULTICAST
#define WS_CTAS 2  // blocks per cluster, stacked along M
#else
#define WS_CTAS 1
#endif
#if WS_GROUP_M % WS_CTAS != 0
#error "WS_GROUP_M must be a multiple of the blocks per cluster (the schedule groups pairs of tile rows)"
#endif

// The (row, column) of tile `tile` in grouped order: `group` rows of tiles at a time, walked
// column by column.
__device__ __forceinline__ void tile_coords(int tile, int tiles_m, int tiles_n, int& tm, int& tn, int group) {
    const int per_group = group * tiles_n;
    const int first = (tile / per_group) * group;
    const int rows = min(tiles_m - first, group);
    const int in_group = tile % per_group;
    tm = first + in_group % rows;
    tn = in_group / rows;
}

// The schedule: entry i is WS_CTAS tiles stacked along M (one per block of a cluster), entries in
// grouped order; block `rank` of the cluster takes the entry's tile row WS_CTAS * row + rank (past
// the last tile row when tiles_m is odd: it then loads zeros and stores nothing).
__device__ __forceinline__ void schedule_tile(int i, int tiles_m, int tiles_n, unsigned rank, int& tm, int& tn) {
    tile_coords(i, (tiles_m + WS_CTAS - 1) / WS_CTAS, tiles_n, tm, tn, WS_GROUP_M / WS_CTAS);
    tm = WS_CTAS * tm + (int)rank;
}

// GELU, tanh form (GPT-2's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

// Stage 15's GELU: the same formula on the SFU's tanh.approx.f32 (max relative error ~2^-11, far
// inside the bf16 tolerance) instead of tanhf's ~20-instruction sequence.
__device__ __forceinline__ float gelu_tanh_approx(float x) {
    float th;
    asm("tanh.approx.f32 %0, %1;" : "=f"(th) : "f"(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    return 0.5f * x * (1.0f + th);
}

#ifdef EPI_LEAN
#define epi_gelu gelu_tanh_approx
#else
#define epi_gelu gelu_tanh
#endif

#define EPI_GELU 1
#define EPI_RESIDUAL 2

// Stages 15-32, 34-38 and 40: an entry whose tail is the constant `tail` (0, EPI_GELU or EPI_RESIDUAL).
#define LEAN_ENTRY(name, tail)                                                                               \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1)                                              \
        name(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, out_t* out,        \
             const out_t* bias, const out_t* residual, int M, int N, int K) {                                \
        persistent_gemm<true>(map_a, map_b, out, bias, residual, M, N, K, tail);                             \
    }

// Stage 33: an entry whose tail is the constant `tail`, with the stream-K arguments.
#define STREAM_K_ENTRY(name, tail)                                                                           \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1)                                              \
        name(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, out_t* out,        \
             const out_t* bias, const out_t* residual, int M, int N, int K, float* sk_partials,              \
             unsigned* sk_flags, int sk_tiles) {                                                             \
        persistent_gemm<true>(map_a, map_b, out, bias, residual, M, N, K, tail, nullptr,                     \
                              StreamK{sk_partials, sk_flags, sk_tiles});                                     \
    }

// Stage 39: an entry whose tail is the constant `tail`, with `out`'s tensor map (valid when
// `out_map` is nonzero) for the block's last tile.
#define TMA_LAST_ENTRY(name, tail)                                                                           \
    extern "C" __global__ void __launch_bounds__(WS_THREADS, 1)                                              \
        name(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, out_t* out,        \
             const out_t* bias, const out_t* residual, int M, int N, int K,                                  \
             const __grid_constant__ TmaMap map_out, int out_map) {                                          \
        persistent_gemm<true>(map_a, map_b, out, bias, residual, M, N, K, tail, &map_out,                    \
                              StreamK{nullptr, nullptr, 0}, out_map != 0);                                   \
    }

#define EPI_CHUNK 8  // stage 12's and 13's column groups per batch of loads
// The register stores' batch: EPI_CHUNK groups, or 4 where a consumer's WS_CN / 8 groups are not a
// multiple of EPI_CHUNK (stage 35 at 192 wide: 12 groups of 8 columns).
#if (WS_CN / 8) % EPI_CHUNK == 0
#define EPI_GROUPS EPI_CHUNK
#else
#define EPI_GROUPS 4
#endif

#ifdef EPI_TMA_STORE
#ifndef EPI_SLOTS
#error "EPI_SLOTS is a tunable: the stage list sets it"
#endif
// Stage 13's output slot: 64 rows x 64 columns fp32 (EPI_CHUNK groups of 8 columns), two TMA boxes
// of 32 columns (128-byte rows, the swizzle's span), each 8 KiB.
#define EPI_COLS (8 * EPI_CHUNK)
#define EPI_BOX_BYTES (64 * 32 * 4)
#define EPI_SLOT_BYTES (64 * EPI_COLS * 4)
#define WS_EPI_BYTES (WS_CONSUMERS * EPI_SLOTS * EPI_SLOT_BYTES)
#else
#define WS_EPI_BYTES 0
#endif

#if defined(EPI_LEAN) && !defined(EPI_PREFETCH)
#error "EPI_LEAN trims EPI_PREFETCH's store"
#endif

#ifdef EPI_BIAS_SMEM
#if defined(EPI_TMA_STORE) || !defined(EPI_LEAN)
#error "EPI_BIAS_SMEM builds on EPI_LEAN's store and takes the named barriers EPI_TMA_STORE uses"
#endif
// Stage 18: each consumer's copy of its tile's WS_BN bias values.
#define WS_BIAS_BYTES (WS_CONSUMERS * WS_BN * 4)
#else
#define WS_BIAS_BYTES 0
#endif

#ifdef WS_STREAM_K
#if WS_BM != 128 || defined(WS_PINGPONG) || defined(WS_MULTICAST) || defined(EPI_TMA_STORE) || !defined(EPI_BIAS_SMEM)
#error "WS_STREAM_K: 128-row tiles of two cooperative consumers, stored from registers, the bias copied"
#endif
#endif

#if defined(WS_PDL_LAST_TILE) && !defined(WS_PDL)
#error "WS_PDL_LAST_TILE moves WS_PDL's trigger"
#endif
#if defined(WS_WEIGHTS_EARLY) && (!defined(WS_PDL) || defined(WS_MULTICAST))
#error "WS_WEIGHTS_EARLY splits WS_PDL's wait by role, for blocks that load their whole W tile"
#endif
// The W tiles loaded before the wait for the previous grid: the ring's depth (stages 27-39), or
// stage 40's tunable WS_EARLY.
#ifdef WS_EARLY
#if !defined(WS_WEIGHTS_EARLY) || defined(WS_STREAM_K) || WS_EARLY < 1 || WS_EARLY > WG_STAGES
#error "WS_EARLY: 1 to WG_STAGES W tiles of whole-tile walks before the wait (WS_WEIGHTS_EARLY)"
#endif
#define WS_EARLY_TILES WS_EARLY
#else
#define WS_EARLY_TILES WG_STAGES
#endif

#ifdef WS_L2_PREFETCH
#if !defined(WS_WEIGHTS_EARLY) || defined(WS_STREAM_K)
#error "WS_L2_PREFETCH: the W boxes before the wait (WS_WEIGHTS_EARLY), over a walk of whole tiles"
#endif
#ifndef WS_L2_WINDOW
#error "WS_L2_WINDOW is a tunable: the stage list sets it"
#endif
#if WS_L2_WINDOW <= WG_STAGES
#error "WS_L2_WINDOW > WG_STAGES: the ring's own loads already cover the first WG_STAGES steps"
#endif
#endif

#ifdef EPI_TMA_LAST
#if WS_BM != 128 || WS_CONSUMERS != 2 || defined(WS_PINGPONG) || defined(WS_MULTICAST) || defined(WS_STREAM_K) || defined(WS_COLSPLIT) || defined(EPI_TMA_STORE) || !defined(EPI_STAGED)
#error "EPI_TMA_LAST: two cooperative consumers of 64 rows on whole tiles, the staged store elsewhere"
#endif
// Stage 39: a box of the output map is 64 rows of 128 bytes (32 fp32 or 64 bf16 columns), 8 KiB;
// a consumer's 64 x WS_BN results take WS_BN / EPI_BOX_COLS of them, both consumers' at most
// 2 x 64 x 256 x 4 B = 128 KiB, inside the ring (WG_STAGES >= 3 stages of at least 32 KiB, checked
// below) from its start.
#define EPI_BOX_COLS (128 / (int)sizeof(out_t))
#define EPI_LAST_BOX_BYTES (64 * 128)
#define EPI_LAST_BYTES (2 * 64 * WS_BN * (int)sizeof(out_t))
// Hardware barrier of both consumers (__syncthreads takes 0, each consumer its own 1 + c).
#define WS_CONSUMERS_BARRIER 4
#endif

#ifdef EPI_STAGED
#ifndef EPI_BIAS_SMEM
#error "EPI_STAGED reads the bias from EPI_BIAS_SMEM's copy"
#endif
// Stages 21-40: each consumer warp's staging buffer, 16 rows x 32 fp32 columns (128-byte rows).
#define EPI_STAGING_BYTES (16 * 128)
#undef WS_EPI_BYTES
#define WS_EPI_BYTES (WS_CONSUMERS * 4 * EPI_STAGING_BYTES)
#endif

// Stage 18: `bytes` (0-16; the rest of the 16 zero-filled) from global `src`, 16-byte aligned, to
// shared `dst`, asynchronously (a cp.async group).
__device__ __forceinline__ void cp_async_bytes(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

#ifdef OUT_BF16
#ifndef EPI_LEAN
#error "OUT_BF16: the lean store paths only (stages 15-40)"
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

// Stage 33's stream-K arguments: per block and consumer, a slot of 64 x WS_BN partial sums and a
// flag (zero between launches); the number of tiles at the end of the schedule shared out by K steps.
struct StreamK {
    float* partials;
    unsigned* flags;
    int tiles;
};

// One item of a block's work: schedule entry `entry`, K steps [kb, ke).
struct Work {
    int entry, kb, ke;
};

#ifdef WS_STREAM_K
// Stage 33: a block's work in order (see WS_STREAM_K above). The producer and the consumers each
// walk a copy, so they agree on every item.
struct WorkList {
    int dp, ktiles, next_dp, stride, pos, end, total, grid;
    // The first stream-K step of block b: ranges of total / grid steps, the first total % grid of
    // them one longer.
    __device__ int range_begin(int b) const {
        return b * (total / grid) + min(b, total % grid);
    }
    // The block whose range holds stream-K step p.
    __device__ int owner(int p) const {
        const int base = total / grid, longer = total % grid, split = longer * (base + 1);
        return p < split ? p / (base + 1) : longer + (p - split) / base;  // base > 0 when p >= split
    }
    __device__ WorkList(int entries, int sk_tiles, int ktiles_, int block, int grid_) {
        dp = entries - sk_tiles;
        ktiles = ktiles_;
        next_dp = block;
        stride = grid_;
        grid = grid_;
        total = sk_tiles * ktiles;
        pos = range_begin(block);
        end = range_begin(block + 1);
    }
    __device__ bool next(Work& w) {
        if (next_dp < dp) {
            w = Work{next_dp, 0, ktiles};
            next_dp += stride;
            return true;
        }
        if (pos >= end) return false;
        const int t = pos / ktiles;
        w.entry = dp + t;
        w.kb = pos - t * ktiles;
        w.ke = min(ktiles, w.kb + (end - pos));
        pos += w.ke - w.kb;
        return true;
    }
    // Whether the item next() returned last was the block's last.
    __device__ bool done() const {
        return next_dp >= dp && pos >= end;
    }
};
#endif

// One K step of 16 for a consumer's 64 x WS_CN accumulators.
__device__ __forceinline__ void wgmma_tile(float (&d)[WS_CN / 2], unsigned long long a, unsigned long long b) {
#if WS_CN == 256
    wgmma_m64n256k16(d, a, b);
#elif WS_CN == 192
    wgmma_m64n192k16(d, a, b);
#elif WS_CN == 128
    wgmma_m64n128k16(d, a, b);
#elif WS_CN == 96
    wgmma_m64n96k16(d, a, b);
#else
    wgmma_m64n64k16(d, a, b);
#endif
}

template <bool TAIL>
__device__ __forceinline__ void persistent_gemm(const TmaMap& map_a, const TmaMap& map_b, out_t* out,
                                                const out_t* bias, const out_t* residual, int M, int N, int K,
                                                int epilogue, const TmaMap* map_out = nullptr,
                                                const StreamK sk = StreamK{nullptr, nullptr, 0}, bool out_map = false) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned base = (smem_u32(smem_raw) + 1023) & ~1023u;  // the 128-byte swizzle's alignment
    auto a_tile = [&](int s) { return base + (unsigned)s * WS_STAGE_BYTES; };
    auto b_tile = [&](int s) { return base + (unsigned)s * WS_STAGE_BYTES + WS_A_BYTES; };
    const unsigned bars = base + WG_STAGES * WS_STAGE_BYTES + WS_EPI_BYTES + WS_BIAS_BYTES;
    auto full = [&](int s) { return bars + 8u * s; };
    auto empty = [&](int s) { return bars + 8u * (WG_STAGES + s); };
#ifdef WS_PINGPONG
    // Stage 17: consumer w's turn on the tensor cores ends (it has issued a tile's MMAs).
    auto order = [&](int w) { return bars + 8u * (2 * WG_STAGES + w); };
#endif
#ifdef WS_COLSPLIT
    // Stage 35: consumer 0 has run its lead of WS_LAG K steps (one phase, once a launch).
    const unsigned lead = bars + 8u * (2 * WG_STAGES);
#endif

    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    if (tid == 0) ladder_stamp(0);
#ifdef WS_TMAP_PREFETCH
    // Stage 38: both tensor maps on their way to the TMA unit before the barriers are set up.
    if (tid == 0) {
        tma_prefetch_descriptor(&map_a);
        tma_prefetch_descriptor(&map_b);
    }
#endif
    const int tiles_m = (M + WS_BM - 1) / WS_BM, tiles_n = (N + WS_BN - 1) / WS_BN;
    const int entries = (tiles_m + WS_CTAS - 1) / WS_CTAS * tiles_n;  // the schedule's length
    const int ktiles = (K + WS_BK - 1) / WS_BK;
#ifdef WS_MULTICAST
    const unsigned rank = cluster_rank();
#else
    const unsigned rank = 0;
#endif
    // The block's first schedule entry and its stride: one walk per cluster.
    const int first = blockIdx.x / WS_CTAS, stride = gridDim.x / WS_CTAS;

#if defined(WS_PDL) && !defined(WS_PDL_LAST_TILE)
    // Stages 25-29: the next grid may launch now. Its blocks take an SM only when one of ours has
    // left it (ours fill the shared memory and the registers), and it waits for our completion
    // before it reads or writes global memory, so an early trigger should cost nothing (stages
    // 30-32 test that).
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    if (tid == 0) {
        for (int s = 0; s < WG_STAGES; ++s) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), WS_STAGE_USERS * WS_CTAS);  // one arrival per consumer of the stage
        }
#ifdef WS_PINGPONG
        mbar_init(order(0), 1);
        mbar_init(order(1), 1);
#endif
#ifdef WS_COLSPLIT
        mbar_init(lead, 1);
#endif
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
#ifdef WS_MULTICAST
    cluster_sync();  // the partner's barriers are initialized before anything arrives on them
#else
    __syncthreads();
#endif
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
            // Stages 27-40: the first item's first ring stages (WS_EARLY_TILES of them) get their
            // W tiles (and the whole stage's byte count) now; their A tiles follow the wait, in the loop below.
            int early = 0;
#ifdef WS_STREAM_K
            // Stage 33: the first item may start mid-tile.
            WorkList peek(entries, sk.tiles, ktiles, blockIdx.x, gridDim.x);
            Work w0;
            if (peek.next(w0)) {
                int tm, tn;
                schedule_tile(w0.entry, tiles_m, tiles_n, rank, tm, tn);
                early = w0.ke - w0.kb < WG_STAGES ? w0.ke - w0.kb : WG_STAGES;
                for (int j = 0; j < early; ++j) {
                    mbar_expect_tx(full(j), WS_STAGE_BYTES);
                    tma_load(b_tile(j), &map_b, full(j), (w0.kb + j) * WS_BK, tn * WS_BN);
                }
            }
#else
            if (first < entries) {
                int tm, tn;
                schedule_tile(first, tiles_m, tiles_n, rank, tm, tn);
                early = ktiles < WS_EARLY_TILES ? ktiles : WS_EARLY_TILES;
                for (int kt = 0; kt < early; ++kt) {
                    mbar_expect_tx(full(kt), WS_STAGE_BYTES);
                    tma_load(b_tile(kt), &map_b, full(kt), kt * WS_BK, tn * WS_BN);
                }
            }
#endif
#ifdef WS_L2_PREFETCH
            // Stage 36: the boxes of step n of the block's walk (K step kt = n % ktiles of its
            // (n / ktiles)-th tile) that this block fetches into L2 for the grid: A's if
            // kt % tiles_n == tn, W's if kt % tiles_m == tm; nothing past the walk's end.
            auto l2_prefetch = [&](int n, bool a, bool b) {
                const int i = first + (n / ktiles) * stride;
                if (i >= entries) return;
                int tm, tn;
                schedule_tile(i, tiles_m, tiles_n, rank, tm, tn);
                const int kt = n % ktiles;
                if (a && kt % tiles_n == tn) tma_prefetch_l2(&map_a, kt * WS_BK, tm * WS_BM);
                if (b && kt % tiles_m == tm) tma_prefetch_l2(&map_b, kt * WS_BK, tn * WS_BN);
            };
            // The weights' window now, under the previous grid's tail, after the first W loads.
            for (int n = WG_STAGES; n < WS_L2_WINDOW; ++n) l2_prefetch(n, false, true);
#endif
            // Only this thread of the producer warpgroup touches global memory (through the TMA).
            asm volatile("griddepcontrol.wait;\n" ::: "memory");
#else
            const int early = 0;
#endif
            ladder_stamp(2);
#ifdef WS_STREAM_K
            WorkList work(entries, sk.tiles, ktiles, blockIdx.x, gridDim.x);
            for (Work w; work.next(w);) {
                const bool last = work.done();
#else
            for (int i = first; i < entries; i += stride) {
                const Work w{i, 0, ktiles};
                const bool last = i + stride >= entries;
#endif
#ifdef WS_PDL_LAST_TILE
                // Stages 30-40: the block's last item; the first invocation in a block is the one
                // that counts, and this thread is the only one to make it.
                if (last) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
                int tm, tn;
                schedule_tile(w.entry, tiles_m, tiles_n, rank, tm, tn);
                for (int kt = w.kb; kt < w.ke; ++kt, ++it) {
                    const int s = it % WG_STAGES;
                    if (it >= WG_STAGES) mbar_wait(empty(s), ((it / WG_STAGES) - 1) & 1);
                    if (it >= early) mbar_expect_tx(full(s), WS_STAGE_BYTES);
                    tma_load(a_tile(s), &map_a, full(s), kt * WS_BK, tm * WS_BM);
#ifdef WS_MULTICAST
                    // This block's half of the shared W tile, into both blocks (the partner's full
                    // barrier expects it, as this one expects the partner's half).
                    const int half = WS_BN / 2;
                    tma_load_multicast(b_tile(s) + rank * half * 128, &map_b, full(s), kt * WS_BK,
                                       tn * WS_BN + (int)rank * half, 0x3);
#else
                    if (it >= early) tma_load(b_tile(s), &map_b, full(s), kt * WS_BK, tn * WS_BN);
#endif
#ifdef WS_L2_PREFETCH
                    // `inp`'s window (maybe the previous grid's output: after the wait), queued
                    // behind the ring's first loads.
                    if (it == WG_STAGES - 1)
                        for (int n = WG_STAGES; n < WS_L2_WINDOW; ++n) l2_prefetch(n, true, false);
#endif
                }
            }
            ladder_stamp(3);
        }
#ifdef WS_MULTICAST
        // Matched by the consumers' at their end. The warp reconverges first: lanes parked in the
        // cluster barrier while lane 0 still issues loads would share the warp's issue slots with
        // its polling.
        __syncwarp();
        cluster_sync();
#endif
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 " WS_CONSUMER_REGS ";\n");
#ifdef WS_WEIGHTS_EARLY
    // Stages 27-40: the consumers wait for the previous grid here (the producer did on its own).
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
    // A consumer's release of a ring stage: to its own block, or with clusters to both (either
    // block's producer may refill the stage in both).
    auto release = [&](unsigned bar) {
#ifdef WS_MULTICAST
        mbar_arrive_cluster(bar, 0);
        mbar_arrive_cluster(bar, 1);
#else
        mbar_arrive(bar);
#endif
    };
    const int c = wg - 1;
#if defined(WS_PINGPONG) || defined(WS_COLSPLIT)
    const int first_row = 0;  // consumer c takes every other tile whole, or all its rows
#else
    const int first_row = 64 * WS_SETS * c;  // consumer c takes rows 64 c .. 64 c + 63 (128 c .. at WS_BM 256)
#endif
#ifdef WS_COLSPLIT
    const int first_col = WS_CN * c;  // consumer c takes columns WS_CN c .. WS_CN c + WS_CN - 1
#else
    const int first_col = 0;
#endif
    const int warp = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
#ifndef EPI_TMA_STORE
    const bool pairs = (N & 1) == 0;
#endif
#ifdef EPI_TMA_STORE
    int chunk = 0;  // this consumer's chunks so far: the slot ring's position
#endif
#ifdef EPI_BIAS_SMEM
    // Stage 18: this consumer's copy of the tile's bias, read by its store from shared memory.
    const unsigned bias_copy = base + WG_STAGES * WS_STAGE_BYTES + c * WS_BN * 4;
    // Its store reads the consumer's columns of the copy.
    const out_t* bias_s = reinterpret_cast<const out_t*>(smem_raw + (bias_copy - smem_u32(smem_raw))) + first_col;
#endif
#ifdef EPI_STAGED
    // Stages 21-40: this warp's staging buffer, after the bias copies (a shared-window address:
    // 32-bit, so the store's few loop-invariant addresses cost one register each).
    const unsigned staging = base + WG_STAGES * WS_STAGE_BYTES + WS_BIAS_BYTES + (4 * c + warp) * EPI_STAGING_BYTES;
    // Their store reads the bias copy unconditionally (a branch on the bias costs the 192-wide
    // ping-pong consumer registers it would spill): without a bias the copy is zeros, written once.
    if (bias == nullptr) {
        for (int q = tid & 127; q < WS_BN; q += 128)
            asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(bias_copy + 4 * q), "f"(0.0f) : "memory");
        named_barrier(1 + c, 128);
    }
#endif
    // The store of 64 rows and WS_CN columns from (r0, n0) of the tile at row m0, out of `d`: a
    // consumer's accumulators of one wgmma row block.
    auto store = [&](const float(&d)[WS_CN / 2], int m0, int n0, int r0) {
#if defined(EPI_TMA_STORE)
        // Stage 13: per chunk of EPI_COLS columns, the bias and residual pairs loaded first (stage
        // 12), then the results written into the next of this consumer's slots in the TMA's
        // 128-byte swizzle (16-byte piece p of row r at p ^ (r % 8): a warp's float2 writes take
        // the two wavefronts 256 bytes need), and one thread hands the slot to the TMA. The slot is
        // reused EPI_SLOTS chunks later, once the TMA has read it; the global writes go on while
        // the consumer computes its next tile. The TMA clips the box at M and N.
        const bool add_residual = epilogue == EPI_RESIDUAL;
        const bool issuer = (tid & 127) == 0;
#pragma unroll
        for (int q = 0; q < WS_CN / EPI_COLS; ++q) {
            const int col0 = n0 + q * EPI_COLS;
            if (col0 >= N || r0 >= M) break;  // the same for the whole warpgroup
            float2 bv[EPI_CHUNK], rv[EPI_CHUNK][2];
#pragma unroll
            for (int jj = 0; jj < EPI_CHUNK; ++jj) {
                const int col = col0 + 8 * jj + 2 * t;
                bv[jj] = load_pair(bias, col, N, true);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = r0 + 16 * warp + g + 8 * h;
                    rv[jj][h] = add_residual && row < M ? load_pair(residual + (size_t)row * N, col, N, true)
                                                        : make_float2(0.0f, 0.0f);
                }
            }
            const unsigned slot =
                base + WG_STAGES * WS_STAGE_BYTES + (c * EPI_SLOTS + chunk % EPI_SLOTS) * EPI_SLOT_BYTES;
            if (issuer) bulk_wait_read<EPI_SLOTS - 1>();  // the slot's previous chunk has been read
            named_barrier(1 + c, 128);
#pragma unroll
            for (int jj = 0; jj < EPI_CHUNK; ++jj) {
                const int j = EPI_CHUNK * q + jj;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = 16 * warp + g + 8 * h;
                    float x = d[4 * j + 2 * h] + bv[jj].x, y = d[4 * j + 2 * h + 1] + bv[jj].y;
                    if (epilogue == EPI_GELU) {
                        x = gelu_tanh(x);
                        y = gelu_tanh(y);
                    }
                    x += rv[jj][h].x;
                    y += rv[jj][h].y;
                    const unsigned piece = (2 * (jj % 4) + (t >> 1)) ^ (r & 7);
                    const unsigned at = slot + (jj / 4) * EPI_BOX_BYTES + r * 128 + piece * 16 + (t & 1) * 8;
                    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(x), "f"(y) : "memory");
                }
            }
            fence_proxy_async_shared();
            named_barrier(1 + c, 128);
            if (issuer) {
                tma_store(map_out, slot, col0, r0);
                if (col0 + 32 < N) tma_store(map_out, slot + EPI_BOX_BYTES, col0 + 32, r0);
                bulk_commit();
            }
            ++chunk;
        }
#elif defined(EPI_PREFETCH)
        const bool add_residual = TAIL && epilogue == EPI_RESIDUAL;
#ifdef EPI_LEAN
        // Stage 15: a tile wholly inside the output (every tile but the last row and column of a
        // ragged shape) stores with no bounds check, no branch and no per-element address: two
        // row offsets per thread, the column an immediate. `epilogue` is a constant in each of
        // stage 15's entries, so only its own tail is compiled in.
#ifdef EPI_STAGED
#if defined(OUT_BF16) && WS_CN % 64 == 0
        // A bf16 output without the residual tail is packed before it is staged (below): rows of
        // 8 bf16 a lane, 16-byte aligned when N % 8 == 0. (`epilogue` is each entry's constant.)
        const bool packed = !add_residual;
#else
        const bool packed = false;
#endif
        // Stages 21-40's float4 stores need every row 16-byte aligned (8-byte with OUT_BF16), the
        // packed bf16 store's 16-byte pieces 16-byte aligned.
        const bool interior = m0 + WS_BM <= M && n0 + WS_CN <= N && (N & (packed ? 7 : 3)) == 0;
#else
        const bool interior = m0 + WS_BM <= M && n0 + WS_CN <= N && pairs;
#endif
        if (interior) {
#ifdef EPI_STAGED
#if defined(OUT_BF16) && WS_CN % 64 == 0
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
            for (int j0 = 0; j0 < WS_CN / 8; j0 += 8) {
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
            // Stages 21-40: per 32 columns, the warp writes its 16 rows of accumulators into
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
            for (int j0 = 0; j0 < WS_CN / 8; j0 += 4) {
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
            for (int j0 = 0; j0 < WS_CN / 8; j0 += EPI_GROUPS) {
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
            // Stage 12: the tile's columns in chunks of EPI_GROUPS groups of 8, every bias and residual
            // pair of a chunk loaded before the chunk's first store, so their latencies overlap.
#pragma unroll
            for (int j0 = 0; j0 < WS_CN / 8; j0 += EPI_GROUPS) {
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
        // Stages 9-11: each group's bias and residual loads after the previous group's stores
        // (which the compiler must assume may alias them): one load latency per group.
#pragma unroll
        for (int j = 0; j < WS_CN / 8; ++j) {
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
                        x = gelu_tanh(x);
                        y = gelu_tanh(y);
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
#ifdef WS_STREAM_K
    WorkList work(entries, sk.tiles, ktiles, blockIdx.x, gridDim.x);
    for (Work w; work.next(w);) {
        const bool stores = w.kb == 0;  // else this item's sums go to the block's slot
#else
    for (int i = first; i < entries; i += stride) {
        const Work w{i, 0, ktiles};
        const bool stores = true;
#endif
#ifdef WS_PINGPONG
        // Stage 17: the other consumer's tile. Its K steps still take their turn in the ring.
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
        schedule_tile(w.entry, tiles_m, tiles_n, rank, tm, tn);
#ifdef EPI_BIAS_SMEM
        // Stage 18: the tile's bias copied while the MMAs run, once every warp of this consumer is
        // done reading the previous tile's; zero-filled past N. The source is 16-byte aligned
        // (the host checks the bias pointer; tile columns start at multiples of 128).
        if (bias != nullptr && stores) {
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
        float d[WS_SETS][WS_CN / 2];
#pragma unroll
        for (int h = 0; h < WS_SETS; ++h)
#pragma unroll
            for (int i = 0; i < WS_CN / 2; ++i) d[h][i] = 0.0f;
#ifdef WS_COLSPLIT
        // Stage 35: consumer 1 begins once consumer 0 has run its lead; from then on the two stay
        // about that far apart (they do the same work in the same order).
        if (WS_LAG > 0 && c == 1 && it == 0) mbar_wait(lead, 0);
#endif
        for (int kt = w.kb; kt < w.ke; ++kt, ++it) {
            const int s = it % WG_STAGES;
            mbar_wait(full(s), (it / WG_STAGES) & 1);
#ifdef LADDER_TIMELINE
            if ((tid & 127) == 0 && !landed) ladder_stamp(4 + 3 * c);
            landed = true;
#endif
            // The B tile's rows are 128 bytes: a consumer's columns start first_col rows in, a
            // multiple of the swizzle's 8-row period.
            const unsigned a = a_tile(s) + first_row * 128, b = b_tile(s) + first_col * 128;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < WS_BK / 16; ++kk)
#pragma unroll
                for (int h = 0; h < WS_SETS; ++h)
                    wgmma_tile(d[h], wgmma_desc(a + h * 64 * 128 + 32 * kk), wgmma_desc(b + 32 * kk));
            wgmma_commit();
            // The previous step's group is done: its stage can be refilled.
            wgmma_wait_one();
            if (kt > w.kb && (tid & 127) == 0) release(empty((it - 1) % WG_STAGES));
#ifdef WS_COLSPLIT
            // The block's first tile only (it counts the block's steps): consumer 0's WS_LAG-th
            // step, or the tile's last if it has fewer.
            if (WS_LAG > 0 && c == 0 && it == min(WS_LAG, ktiles) - 1 && (tid & 127) == 0) mbar_arrive(lead);
#endif
        }
#ifdef WS_PINGPONG
        if ((tid & 127) == 0) mbar_arrive(order(c));  // the other consumer's turn on the tensor cores
#endif
        wgmma_wait_all();
        if ((tid & 127) == 0) release(empty((it - 1) % WG_STAGES));  // the tile's last stage
        if ((tid & 127) == 0) ladder_stamp(5 + 3 * c);
#ifdef WS_STREAM_K
        if (w.ke - w.kb < ktiles) {
            // Stage 33: a tile cut between blocks. A consumer's slot holds its 64 x WS_BN sums as
            // float4 groups, thread-minor (each warp instruction writes 512 contiguous bytes);
            // L2 only (.cg), since another SM reads it.
            const int lt = tid & 127;
            auto slot = [&](int block) {
                return reinterpret_cast<float4*>(sk.partials) + (size_t)(block * WS_CONSUMERS + c) * (WS_BN / 8) * 128;
            };
            unsigned* flag_of = sk.flags + c;
            if (!stores) {
                float4* p = slot(blockIdx.x);
#pragma unroll
                for (int j = 0; j < WS_BN / 2; j += 4)
                    __stcg(p + (j / 4) * 128 + lt, make_float4(d[0][j], d[0][j + 1], d[0][j + 2], d[0][j + 3]));
                named_barrier(1 + c, 128);  // the consumer's every store issued before the flag
                if (lt == 0) {
                    __threadfence();
                    asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(flag_of + blockIdx.x * WS_CONSUMERS)
                                 : "memory");
                }
                continue;
            }
            // This block holds the tile's first K steps: the blocks after it up to the one holding
            // its last step hold the rest, and wrote their sums at the start of their ranges.
            const int first_step = (w.entry - work.dp) * ktiles;
            const int holder = work.owner(first_step + ktiles - 1);
            for (int b = blockIdx.x + 1; b <= holder; ++b) {
                if (lt == 0) {
                    unsigned* f = flag_of + b * WS_CONSUMERS;
                    unsigned raised = 0;
                    do {
                        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(raised) : "l"(f) : "memory");
                    } while (raised == 0);
                    *f = 0;  // read once per launch: lowered for the next
                }
                named_barrier(1 + c, 128);
                const float4* p = slot(b);
#pragma unroll
                for (int j = 0; j < WS_BN / 2; j += 4) {
                    const float4 v = __ldcg(p + (j / 4) * 128 + lt);
                    d[0][j] += v.x;
                    d[0][j + 1] += v.y;
                    d[0][j + 2] += v.z;
                    d[0][j + 3] += v.w;
                }
            }
        }
#endif

        const int m0 = tm * WS_BM, n0 = tn * WS_BN;
#ifdef EPI_BIAS_SMEM
        if (bias != nullptr && stores) {
            cp_async_wait<0>();
            named_barrier(1 + c, 128);  // every thread's part of the copy has landed
        }
#endif
#ifdef EPI_TMA_LAST
        if (out_map && epilogue != EPI_RESIDUAL && i + stride >= entries) {
            static_assert(EPI_LAST_BYTES <= WG_STAGES * WS_STAGE_BYTES, "the last tile's boxes fit in the ring");
            // Stage 39: the block's last tile through the ring. Both consumers' MMAs are done
            // before either overwrites a stage the other may still be reading.
            named_barrier(WS_CONSUMERS_BARRIER, 256);
            const unsigned boxes = base + (unsigned)c * (EPI_LAST_BYTES / 2);
            const int r0 = m0 + first_row;
#pragma unroll
            for (int j = 0; j < WS_BN / 8; ++j) {
                const float2 bv = load_out2(bias_s + 8 * j + 2 * t);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = 16 * warp + g + 8 * h;
                    float x = d[0][4 * j + 2 * h] + bv.x, y = d[0][4 * j + 2 * h + 1] + bv.y;
                    if (epilogue == EPI_GELU) {
                        x = epi_gelu(x);
                        y = epi_gelu(y);
                    }
                    // Column 8 j + 2 t sits in box (8 j + 2 t) / EPI_BOX_COLS, at byte b of its row;
                    // 16-byte piece p of row r is at p ^ (r % 8) (the map's 128-byte swizzle).
#ifdef OUT_BF16
                    const unsigned at = boxes + (j / 8) * EPI_LAST_BOX_BYTES + r * 128 + (((j % 8) ^ (r & 7)) * 16) + 4 * t;
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(pack_bf16x2(x, y)) : "memory");
#else
                    const unsigned piece = (2 * (j % 4) + (t >> 1)) ^ (r & 7);
                    const unsigned at = boxes + (j / 4) * EPI_LAST_BOX_BYTES + r * 128 + piece * 16 + (t & 1) * 8;
                    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(x), "f"(y) : "memory");
#endif
                }
            }
            fence_proxy_async_shared();
            named_barrier(1 + c, 128);
            if ((tid & 127) == 0) {
                if (r0 < M) {
#pragma unroll
                    for (int b = 0; b < WS_BN / EPI_BOX_COLS; ++b)
                        if (n0 + b * EPI_BOX_COLS < N)
                            tma_store(map_out, boxes + b * EPI_LAST_BOX_BYTES, n0 + b * EPI_BOX_COLS, r0);
                    bulk_commit();
                }
                ladder_stamp(6 + 3 * c);
                bulk_wait_all();  // the boxes stay valid until the TMA has written them
                ladder_stamp(13 + c);
            }
            break;  // the block's last tile
        }
#endif
#pragma unroll
        for (int h = 0; h < WS_SETS; ++h) store(d[h], m0, n0 + first_col, m0 + first_row + 64 * h);
        if ((tid & 127) == 0) ladder_stamp(6 + 3 * c);
    }
#ifdef EPI_TMA_STORE
    if ((tid & 127) == 0) bulk_wait_all();  // the slots stay valid until the TMA is done with them
#endif
#ifdef WS_MULTICAST
    cluster_sync();  // no block leaves while its partner may still arrive on its barriers
#endif
}
