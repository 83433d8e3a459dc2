//! The gpt2 family: GPT-2's remaining per-token kernels (the encoder first) and, as later issues add
//! it, the full model composed from the fastest stage of every family, with a KV cache and
//! generation.

use common::{Family, Op, Sources};

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

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

pub const FAMILY: &str = "gpt2";

/// Every `.cu`/`.cuh` file of this crate, embedded at build time.
pub static SOURCES: Sources = Sources { family: FAMILY, files: embedded::KERNEL_SOURCES, imports: &[] };

pub struct Gpt2;

impl Family for Gpt2 {
    fn name(&self) -> &'static str {
        FAMILY
    }
    fn description(&self) -> &'static str {
        "GPT-2's own kernels (encoder, GELU, residual add, greedy and top-k/top-p sampling) and the composed model"
    }
    fn sources(&self) -> &'static Sources {
        &SOURCES
    }
    fn ops(&self) -> Vec<&'static dyn Op> {
        vec![
            &encoder::Encoder,
            &pointwise::Gelu,
            &pointwise::Residual,
            &argmax::Argmax,
            &sample::Sample,
            &decode_step::DecodeStep,
        ]
    }
}
