// ladder_hopper.cuh: Hopper's (sm_90) building blocks shared by every family's TMA and wgmma
// stages: the tensor map passed by value, mbarriers, the TMA's 2-D tile load and 1-D bulk copy,
// named barriers, cluster barriers and peers' shared memory, shared-memory matrix descriptors of
// 128-byte swizzled tiles, and the warpgroup MMA's fence, commit and wait, and the one wgmma shape
// two families share (m64n128k16 on bf16).
// The other wgmma instructions (one shape each) live with the kernels that use them. wgmma needs
// sm_90a.
#pragma once
#include <cuda_bf16.h>

// Thread-block clusters (sm_90; a build for an older architecture traps, and the host refuses to
// launch a stage that needs them there). cluster_sync_all: every thread of every block of the
// cluster arrives and waits, and the cluster's shared-memory writes before it are visible to its
// reads after (ptxas makes the release a fence at GPU scope, MEMBAR.ALL.GPU, as it does
// fence.acq_rel.cluster). cluster_sync_relaxed: the same without ordering memory, only that every thread got here
// (e.g. no peer still reads this block's shared memory before it exits). cluster_peer: the same
// shared variable in the cluster's block `rank`, as a generic address that plain loads read.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_sync_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}
template <typename P>
__device__ __forceinline__ P* cluster_peer(P* p, unsigned rank) {
    unsigned long long a;
    asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(a) : "l"(p), "r"(rank));
    return reinterpret_cast<P*>(a);
}
#else
__device__ __forceinline__ void cluster_sync_all() { __trap(); }
__device__ __forceinline__ void cluster_sync_relaxed() { __trap(); }
template <typename P>
__device__ __forceinline__ P* cluster_peer(P* p, unsigned) {
    __trap();
    return p;
}
#endif

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

// The asm statement of one wgmma.m64n128 with both operands K-major in shared memory, described by
// descriptors a and b, into the 64 fp32 accumulators d (added to unless `accumulate` is 0):
// SHAPE_TYPES the instruction's shape and types (".m64n128k16.f32.bf16.bf16"), IMM its immediates
// after the predicate (the scales of A and B, then bf16's transpose flags).
#define WGMMA_M64N128_SS(SHAPE_TYPES, IMM, d, a, b, accumulate)                                   \
    asm volatile(                                                                                 \
        "{\n"                                                                                     \
        ".reg .pred p;\n"                                                                         \
        "setp.ne.b32 p, %66, 0;\n"                                                                \
        "wgmma.mma_async.sync.aligned" SHAPE_TYPES " "                                            \
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, " \
        "%64, %65, p, " IMM ";\n"                                                                 \
        "}\n"                                                                                     \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
        : "l"(a), "l"(b), "r"(accumulate))

// One wgmma.m64n128k16 (bf16 in, fp32 accumulate into d), both operands K-major in shared memory
// described by descriptors; `accumulate` 0 overwrites d (a first k-step). The one wgmma shape two
// families use: linear-bf16's tiles and the bf16 prefill's S = Q.K^T.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], unsigned long long a, unsigned long long b,
                                                 int accumulate = 1) {
    WGMMA_M64N128_SS(".m64n128k16.f32.bf16.bf16", "1, 1, 0, 0", d, a, b, accumulate);
}
