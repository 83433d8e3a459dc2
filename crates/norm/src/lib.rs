//! The norm family: LayerNorm forward and the attention softmax, each a ladder of stages from the
//! reference report's naive kernels to the bandwidth limit.

use common::{Family, Op, Sources};

pub mod layernorm;
pub mod softmax;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

pub const FAMILY: &str = "norm";

/// Every `.cu`/`.cuh` file of this crate, embedded at build time.
pub static SOURCES: Sources = Sources { family: FAMILY, files: embedded::KERNEL_SOURCES, imports: &[] };

pub struct Norm;

impl Family for Norm {
    fn name(&self) -> &'static str {
        FAMILY
    }
    fn description(&self) -> &'static str {
        "LayerNorm forward and row softmax (fp32): naive -> reductions -> single-pass vectorized"
    }
    fn sources(&self) -> &'static Sources {
        &SOURCES
    }
    fn ops(&self) -> Vec<&'static dyn Op> {
        vec![&layernorm::LayerNorm, &softmax::Softmax]
    }
}
