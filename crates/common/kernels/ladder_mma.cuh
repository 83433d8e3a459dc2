// ladder_mma.cuh: the warp-level tensor-core instruction (sm_80+) and the shared-memory movers that
// feed it, with the fragment layouts spelled out because kernels rely on them (a max taken from the
// accumulator, P written straight into an A fragment, a swizzle chosen for ldmatrix).
//
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"). With g = lane >> 2 (groupID) and t = lane & 3
// (threadID_in_group):
//   A (16x16, row-major), four .b32 registers of two elements each (low half = first element):
//     a[0] = A[g][2t..2t+1]   a[1] = A[g+8][2t..2t+1]   a[2] = A[g][2t+8..2t+9]   a[3] = A[g+8][2t+8..2t+9]
//   B (16x8, "col": element pairs run along k), two registers:
//     b[0] = B[2t..2t+1][g]   b[1] = B[2t+8..2t+9][g]
//   C/D (16x8 fp32), four registers:
//     c[0..1] = C[g][2t..2t+1]   c[2..3] = C[g+8][2t..2t+1]
// Two accumulators side by side (columns 0..7 and 8..15) hold, per thread, exactly the elements of
// one A fragment over k = 0..15, so a 16x16 fp32 result packs into the A operand of the next mma
// with no data movement (the FlashAttention-2 trick for P.V).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "ladder_convert.cuh"

template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                          unsigned b0, unsigned b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], unsigned a0, unsigned a1, unsigned a2,
                                                         unsigned a3, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                                  unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two floats as one register of two T (low half = a), rounded to nearest.
template <typename T>
__device__ __forceinline__ unsigned pack2(float a, float b);
template <>
__device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float a, float b) { return pack_bf16x2(a, b); }
template <>
__device__ __forceinline__ unsigned pack2<__half>(float a, float b) { return pack_half2(a, b); }

// Four 8x8 matrices of 16-bit elements from shared memory. Lanes 8i..8i+7 give the addresses of
// the 8 rows (16 bytes each) of matrix i; register i receives matrix i with thread l holding row
// l/4, elements 2(l%4) and 2(l%4)+1. The .trans form delivers the transpose: thread l holds
// elements (2(l%4), l/4) and (2(l%4)+1, l/4) of the matrix as stored.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned smem_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned smem_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
}

// 16 bytes from global to shared memory without passing through registers; with `valid` false the
// destination is zero-filled and the source is not read (it must still be a valid address).
__device__ __forceinline__ void cp_async_16(unsigned smem_addr, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
