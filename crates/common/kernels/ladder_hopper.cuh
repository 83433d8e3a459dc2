// ladder_hopper.cuh: Hopper's (sm_90) building blocks shared by every family's TMA and wgmma
// stages: the tensor map passed by value, mbarriers, the TMA's 2-D tile load and 1-D bulk copy,
// named barriers, shared-memory matrix descriptors of 128-byte swizzled tiles, and the warpgroup
// MMA's fence, commit and wait. The wgmma instructions themselves (one shape each) live with the
// kernels that use them. wgmma needs sm_90a.
#pragma once
#include <cuda_bf16.h>

// CUtensorMap (128 bytes, 64-byte aligned) as the kernel sees it: opaque, passed by value.
struct __align__(64) TmaMap {
    unsigned long long v[16];
};

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned phase) {
    unsigned ok;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(ok)
        : "r"(bar), "r"(phase)
        : "memory");
    return ok != 0;
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// mbar_arrive by the threads where `pred` holds, as a predicated instruction rather than a branch:
// inside a warpgroup's open wgmma pipeline a branch makes ptxas wait for the wgmma first (C7517).
__device__ __forceinline__ void mbar_arrive_if(unsigned bar, bool pred) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %1, 0;\n"
        "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n"
        "}\n" ::"r"(bar),
        "r"((int)pred)
        : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned phase) {
    while (!mbar_try_wait(bar, phase)) {
    }
}

// A 2-D box of the tensor map at (x = column along K, y = row) into shared memory, completing on bar.
__device__ __forceinline__ void tma_load(unsigned dst, const TmaMap* map, unsigned bar, int x, int y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(dst),
        "l"(map), "r"(x), "r"(y), "r"(bar)
        : "memory");
}

// The TMA's 2-D tile store, issued by the threads where `pred` holds (predicated, so no branch
// opens inside a wgmma pipeline): the box of the tensor map at (x = column, y = row) from shared
// memory at src, as one bulk group of its own; the parts of the box past the tensor are not written.
// The shared memory must have been written before a fence_proxy_async by every writer.
__device__ __forceinline__ void tma_store_if(const TmaMap* map, unsigned src, int x, int y, bool pred) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %4, 0;\n"
        "@p cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
        "@p cp.async.bulk.commit_group;\n"
        "}\n" ::"l"(map),
        "r"(x), "r"(y), "r"(src), "r"((int)pred)
        : "memory");
}
// Waits until this thread's bulk groups have read their shared memory (it may be written again).
__device__ __forceinline__ void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Waits until this thread's bulk groups are complete (their writes done).
__device__ __forceinline__ void tma_store_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Makes this thread's shared memory writes visible to the async proxy (a TMA store reading them).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// `bytes` (a multiple of 16) of global memory at src into shared memory at dst, completing on bar:
// the 1-D bulk copy, which needs no tensor map (src and dst 16-byte aligned).
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// A barrier of `threads` threads on hardware barrier `id` (0 is __syncthreads').
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Shared-memory matrix descriptor of a K-major tile in the 128-byte swizzle: start address, the
// leading offset (unused for swizzled K-major tiles), the stride between 8-row groups (1024 bytes),
// and the swizzle mode (1 = 128 bytes).
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_wait_one() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }


// Shared-memory matrix descriptor of an MN-major tile in the 128-byte swizzle (wgmma's B operand
// with its transpose flag set: N contiguous, as V[keys][D] is for O += P.V): atoms of 8 K-rows of
// 64 elements (1024 bytes), `lbo` the byte stride between 64-element blocks along N, 1024 the
// stride between 8-row groups along K.
__device__ __forceinline__ unsigned long long wgmma_desc_mn(unsigned addr, unsigned lbo) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16) |
           ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

// Arrives at hardware barrier `id` without waiting: with `threads` counting both sides, it lets the
// threads that bar.sync on `id` go once the rest have arrived (a turn handed to another group).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
