// qi4_mma.cuh: the one tensor-core instruction the decode kernels use, with its fragment layout.
//
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"). With g = lane >> 2 (groupID) and t = lane & 3
// (threadID_in_group):
//   A (16x16, row-major), four .b32 registers of two bf16 each (low half = first element):
//     a[0] = A[g][2t..2t+1]   a[1] = A[g+8][2t..2t+1]   a[2] = A[g][2t+8..2t+9]   a[3] = A[g+8][2t+8..2t+9]
//   B (16x8, "col": element pairs run along k), two registers:
//     b[0] = B[2t..2t+1][g]   b[1] = B[2t+8..2t+9][g]
//   C/D (16x8 fp32), four registers:
//     c[0..1] = C[g][2t..2t+1]   c[2..3] = C[g+8][2t..2t+1]
// The kernels rely on exactly this layout (max from the accumulator, P written into the A
// fragment, the swizzle), so it is spelled out here rather than hidden behind WMMA.
#pragma once

__device__ __forceinline__ void qi4_mma_16816(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                              unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
