//! common's own kernels as stages (the harness's empty kernel, the timing gate, the device-side
//! count of non-finite elements) and the embedded sources that hold them and the shared headers.

use crate::module::Sources;
use crate::variant::{Precision, Variant};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

/// common's own kernels (the harness's empty kernel) and shared headers.
pub static SOURCES: Sources = Sources { family: "common", files: embedded::KERNEL_SOURCES, imports: &[] };

/// The empty kernel, as a stage.
pub fn noop() -> Variant {
    Variant::kernel("common", "harness", 0, "noop", "harness/00_noop.cu", Precision::Fp32, "the empty kernel")
}

/// The gate kernel (`timing::Gate`), as a stage.
pub fn gate() -> Variant {
    Variant::kernel("common", "harness", 1, "gate", "harness/01_gate.cu", Precision::Fp32, "spin until the host opens")
}

/// The device-side count of NaN/±Inf elements (`check::device_non_finite`), as a stage.
pub fn non_finite() -> Variant {
    Variant::kernel("common", "harness", 2, "non-finite", "harness/02_non_finite.cu", Precision::Fp32, "count NaN/Inf")
}
