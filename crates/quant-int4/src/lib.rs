//! The quant-int4 family: decode-phase GQA attention over an INT4 KV cache (row-wise or
//! group-wise scales), after "An efficient decoding Grouped-Query Attention with low-precision KV
//! cache": the formats and their quantizer, the BF16 and INT4 split-K baselines and the report's
//! ten optimizations as switches of one kernel.

use common::{Family, Op, Sources};

pub mod decode;
pub mod format;
pub mod quantize;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

pub const FAMILY: &str = "quant-int4";

/// Every `.cu`/`.cuh` file of this crate, embedded at build time, and attention's headers (the split
/// kernel writes attention's split layout and uses its combine).
pub static SOURCES: Sources =
    Sources { family: FAMILY, files: embedded::KERNEL_SOURCES, imports: &[&attention::SOURCES] };

pub struct QuantInt4;

impl Family for QuantInt4 {
    fn name(&self) -> &'static str {
        FAMILY
    }
    fn description(&self) -> &'static str {
        "INT4 KV-cache decode GQA: quantizer, BF16/INT4 split-K baselines, the ten-optimization ladder"
    }
    fn sources(&self) -> &'static Sources {
        &SOURCES
    }
    fn ops(&self) -> Vec<&'static dyn Op> {
        vec![&decode::Decode, &quantize::Quantize]
    }
}
