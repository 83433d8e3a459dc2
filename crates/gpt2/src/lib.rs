//! The gpt2 family: GPT-2's remaining per-token kernels (the encoder first) and, as later issues add
//! it, the full model composed from the fastest stage of every family, with a KV cache and
//! generation.

pub mod argmax;
pub mod cache;
pub mod check;
pub mod config;
pub mod decode_step;
pub mod encoder;
pub mod fastest;
pub mod generate;
pub mod graph;
pub mod megakernel;
pub mod model;
pub mod plan;
pub mod pointwise;
pub mod reference;
pub mod sample;
pub mod sampling;
pub mod table;
pub mod weights;

common::declare_family! {
    pub struct Gpt2 {
        name: "gpt2",
        description: "GPT-2's own kernels (encoder, GELU, residual add, greedy and top-k/top-p sampling) and the composed model",
        imports: [],
        ops: [
            &encoder::Encoder,
            &pointwise::Gelu,
            &pointwise::Residual,
            &argmax::Argmax,
            &sample::Sample,
            &decode_step::DecodeStep,
        ],
    }
}
