//! The attention family: causal multi-head self-attention as GPT-2 runs it, each op a ladder of
//! stages. `prefill` is the whole-sequence forward pass, from the reference report's five-kernel
//! baseline through reductions, a fused local window and FlashAttention-2 in fp32. The CPU
//! references live in [`reference`] so later ops (decode) can share them.

use common::{Family, Op, Sources};

pub mod prefill;
pub mod reference;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

pub const FAMILY: &str = "attention";

/// Every `.cu`/`.cuh` file of this crate, embedded at build time.
pub static SOURCES: Sources = Sources { family: FAMILY, files: embedded::KERNEL_SOURCES, imports: &[] };

pub struct Attention;

impl Family for Attention {
    fn name(&self) -> &'static str {
        FAMILY
    }
    fn description(&self) -> &'static str {
        "causal self-attention (fp32): five-kernel baseline -> reductions -> local window -> FlashAttention-2"
    }
    fn sources(&self) -> &'static Sources {
        &SOURCES
    }
    fn ops(&self) -> Vec<&'static dyn Op> {
        vec![&prefill::Prefill]
    }
}
