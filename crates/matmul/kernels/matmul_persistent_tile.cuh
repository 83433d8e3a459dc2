// matmul_persistent_tile.cuh: what every part of the persistent GEMM (matmul_wgmma_persistent.cuh,
// linear-bf16 stages 9-16) shares: its tunables, the 128 x WS_BN output tile and the shared-memory
// ring the producer fills and the consumers drain; and ladder_recipe.cuh, how a rung reads its
// stage-list switches.
#pragma once
#include "matmul_wgmma.cuh"
#include "ladder_recipe.cuh"

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

#define WS_BM 128       // the tile's rows: two consumer warpgroups of 64
#define WS_BK 64        // the K step: a 128-byte row of bf16, the swizzle's span
#define WS_THREADS 384  // the producer warpgroup and two consumers
#define WS_A_BYTES (WS_BM * WS_BK * 2)
#define WS_B_BYTES (WS_BN * WS_BK * 2)
#define WS_STAGE_BYTES (WS_A_BYTES + WS_B_BYTES)

// Shared memory from its 1024-byte aligned start (the 128-byte swizzle's alignment; Rust's
// `persistent_shared_bytes` is the same sum): WG_STAGES ring stages of (128 + WS_BN) x 64 bf16, then
// the epilogue's EPI_BYTES (its bias copies and staging buffers), then each stage's full and empty
// mbarriers, then the consumers' turn mbarriers (ping-pong's two).
template <unsigned EPI_BYTES>
struct Ring {
    unsigned base, bars;
    __device__ __forceinline__ explicit Ring(const unsigned char* smem)
        : base((smem_u32(smem) + 1023) & ~1023u), bars(base + WG_STAGES * WS_STAGE_BYTES + EPI_BYTES) {}
    __device__ __forceinline__ unsigned a_tile(int s) const { return base + (unsigned)s * WS_STAGE_BYTES; }
    __device__ __forceinline__ unsigned b_tile(int s) const { return base + (unsigned)s * WS_STAGE_BYTES + WS_A_BYTES; }
    __device__ __forceinline__ unsigned full(int s) const { return bars + 8u * s; }
    __device__ __forceinline__ unsigned empty(int s) const { return bars + 8u * (WG_STAGES + s); }
    // Consumer w's turn on the tensor cores ends (it has issued a tile's MMAs): ping-pong's.
    __device__ __forceinline__ unsigned turn(int w) const { return bars + 8u * (2 * WG_STAGES + w); }
    // The epilogue's EPI_BYTES.
    __device__ __forceinline__ unsigned epilogue() const { return base + WG_STAGES * WS_STAGE_BYTES; }
};

