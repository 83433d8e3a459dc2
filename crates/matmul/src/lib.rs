//! The matmul family: GPT-2's linear layer `out[M,N] = inp[M,K] · W[N,K]ᵀ + bias[N]` (llm.c's
//! layout) as the reference report's ladder — naive, shared-memory tiling, register tiling, WMMA
//! with one warp per block (milestone 2), WMMA with many warps per block (milestone 3) — beside
//! cuBLAS at fp32, TF32 and fp16; and the same GEMM with its bias+GELU / bias+residual epilogue
//! unfused, fused after the GEMM, fused into the GEMM, and through cuBLASLt's epilogues; and the decode
//! GEMV (M = 1..64) on bf16 weights; and the tensor-core ladder past the report on bf16 operands
//! (`linear-bf16`: mma.sync stages beside cuBLASLt bf16); and FP8: the quantizer (`quantize-fp8`), the
//! decode GEMV on e4m3 weights (`gemv-fp8`) and the linear layer on e4m3 tensor cores (`linear-fp8`).

pub mod epilogue;
pub mod fp8;
pub mod gemm;
pub mod gemv;
pub mod gemv_fp8;
pub mod linear;
pub mod linear_bf16;
pub mod linear_fp8;
pub mod quantize_fp8;
pub mod reference;

common::declare_family! {
    pub struct Matmul {
        name: "matmul",
        description: "linear layer GEMM: naive -> tiled -> WMMA fp16 (report M2, M3) beside cuBLAS, bf16 mma.sync beside cuBLASLt, fused epilogues, decode GEMV",
        imports: [],
        ops: [
            &linear::Linear,
            &linear_bf16::LinearBf16,
            &linear_fp8::LinearFp8,
            &epilogue::LinearEpilogue,
            &gemv::Gemv,
            &gemv_fp8::GemvFp8,
            &quantize_fp8::QuantizeFp8,
        ],
    }
}
