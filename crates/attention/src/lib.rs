//! The attention family: causal multi-head self-attention as GPT-2 runs it, each op a ladder of
//! stages. `prefill` is the whole-sequence forward pass, from the reference report's five-kernel
//! baseline through reductions, a fused local window and FlashAttention-2 in fp32; `prefill-bf16`
//! the same pass on the bf16 layout the model uses, from mma.sync toward the Hopper techniques. `decode` is one
//! query token per sequence against a KV cache, contiguous or paged: from three naive kernels
//! through decoding attention, Flash-Decoding and vLLM's paged kernels to GQA packing and tensor
//! cores. `decode-offload` is one decode step over a cache held in host memory (pageable, pinned,
//! chunked over streams, read in place). The decode machinery (sequence lengths, ALiBi, the f64
//! reference) is what `quant-int4` builds on.

pub mod decode;
pub mod kv_append;
pub mod offload;
pub mod prefill;
pub mod prefill_bf16;
pub mod reference;

common::declare_family! {
    pub struct Attention {
        name: "attention",
        description: "causal prefill (fp32, five kernels -> FlashAttention-2; bf16, mma.sync -> cp.async -> wgmma/TMA -> Hopper scheduling) and decode over contiguous and paged \
             bf16/fp16 KV caches (naive -> decoding attention -> Flash-Decoding -> vLLM paged v1/v2 -> GQA packing -> tensor cores), and decode over a host-resident cache (pageable -> \
             pinned -> streams -> mapped)",
        imports: [],
        ops: [
            &prefill::Prefill,
            &prefill_bf16::PrefillBf16,
            &decode::Decode,
            &offload::DecodeOffload,
            &kv_append::KvAppend,
        ],
    }
}
