//! The gpt2 family: GPT-2's remaining per-token kernels (the encoder first) and, as later issues add
//! it, the full model composed from the fastest stage of every family, with a KV cache and
//! generation.

use common::{Family, KernelSource, Op};

pub mod encoder;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

pub const FAMILY: &str = "gpt2";

pub fn sources() -> &'static [KernelSource] {
    embedded::KERNEL_SOURCES
}

pub struct Gpt2;

impl Family for Gpt2 {
    fn name(&self) -> &'static str {
        FAMILY
    }
    fn description(&self) -> &'static str {
        "GPT-2's own kernels (encoder) and the composed model"
    }
    fn sources(&self) -> &'static [KernelSource] {
        sources()
    }
    fn ops(&self) -> Vec<&'static dyn Op> {
        vec![&encoder::Encoder]
    }
}
