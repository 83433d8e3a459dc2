//! The ablation model: one [`Variant`] per stage of an op.

use std::borrow::Cow;

use serde::Serialize;

/// The arithmetic a stage computes in; it picks the tolerance preset and the GEMM ceiling that
/// bounds a compute-bound stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Precision {
    Fp32,
    Tf32,
    Fp16,
    Bf16,
    /// INT4 storage dequantised to bf16 for the matrix products, fp32 accumulation.
    Int4Bf16,
}

impl Precision {
    /// Relative-L2 tolerance preset against the f64 reference.
    pub fn tolerance(self) -> f64 {
        match self {
            Precision::Fp32 => 1e-5,
            Precision::Tf32 => 1e-3,
            Precision::Fp16 | Precision::Bf16 | Precision::Int4Bf16 => 1e-2,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Int4Bf16 => "int4/bf16",
        }
    }
}

/// A per-variant tolerance that replaces the preset, with the reason it must.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tolerance {
    pub rel_l2: f64,
    pub reason: &'static str,
}

/// A preprocessor define handed to NVRTC as `-DNAME=VALUE`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Define {
    pub name: Cow<'static, str>,
    pub value: Cow<'static, str>,
}

impl Define {
    pub const fn new(name: &'static str, value: &'static str) -> Define {
        Define { name: Cow::Borrowed(name), value: Cow::Borrowed(value) }
    }

    /// An optimization switch: `-DNAME=1`.
    pub const fn on(name: &'static str) -> Define {
        Define::new(name, "1")
    }
}

/// Where a stage's code comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Source {
    /// A `.cu` file under the crate's `kernels/`, e.g. `layernorm/00_naive.cu`.
    Kernel(&'static str),
    /// A vendor library call (cuBLAS, cuBLASLt), named for the table.
    Library(&'static str),
}

/// What a stage needs from the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Requirements {
    /// Minimum compute capability.
    pub min_cc: (u32, u32),
    /// Compile for `sm_XYa` (Hopper-only instructions such as wgmma); the device must be exactly XY.
    pub arch_specific: bool,
}

impl Requirements {
    pub const ANY: Requirements = Requirements { min_cc: (7, 0), arch_specific: false };
    pub const SM80: Requirements = Requirements { min_cc: (8, 0), arch_specific: false };
    pub const SM90A: Requirements = Requirements { min_cc: (9, 0), arch_specific: true };
}

/// One stage of an op's ladder.
#[derive(Clone, Debug, Serialize)]
pub struct Variant {
    pub family: &'static str,
    pub op: &'static str,
    pub stage: u32,
    /// Short name, unique within the op (`naive`, `warp-shuffle`, `+1..5`).
    pub name: Cow<'static, str>,
    /// One line: what changed versus the previous stage.
    pub summary: Cow<'static, str>,
    pub precision: Precision,
    pub source: Source,
    pub defines: Cow<'static, [Define]>,
    /// Defines that are cumulative optimization switches of one kernel: the leave-one-out table
    /// removes each in turn from this variant.
    pub toggles: Cow<'static, [&'static str]>,
    pub requires: Requirements,
    pub tolerance: Option<Tolerance>,
}

impl Variant {
    /// A stage with its own `.cu` file and no defines.
    pub const fn kernel(
        family: &'static str,
        op: &'static str,
        stage: u32,
        name: &'static str,
        source: &'static str,
        precision: Precision,
        summary: &'static str,
    ) -> Variant {
        Variant {
            family,
            op,
            stage,
            name: Cow::Borrowed(name),
            summary: Cow::Borrowed(summary),
            precision,
            source: Source::Kernel(source),
            defines: Cow::Borrowed(&[]),
            toggles: Cow::Borrowed(&[]),
            requires: Requirements::ANY,
            tolerance: None,
        }
    }

    /// A vendor-library baseline row.
    pub const fn library(
        family: &'static str,
        op: &'static str,
        stage: u32,
        name: &'static str,
        library: &'static str,
        precision: Precision,
        summary: &'static str,
    ) -> Variant {
        let mut v = Variant::kernel(family, op, stage, name, "", precision, summary);
        v.source = Source::Library(library);
        v
    }

    pub fn with_defines(mut self, defines: &'static [Define]) -> Variant {
        self.defines = Cow::Borrowed(defines);
        self
    }

    pub fn with_requirements(mut self, requires: Requirements) -> Variant {
        self.requires = requires;
        self
    }

    pub fn with_tolerance(mut self, rel_l2: f64, reason: &'static str) -> Variant {
        self.tolerance = Some(Tolerance { rel_l2, reason });
        self
    }

    /// `family/op/NN-name`, used in errors and cache keys.
    pub fn id(&self) -> String {
        format!("{}/{}/{:02}-{}", self.family, self.op, self.stage, self.name)
    }

    pub fn tolerance(&self) -> f64 {
        self.tolerance.map(|t| t.rel_l2).unwrap_or_else(|| self.precision.tolerance())
    }

    pub fn define(&self, name: &str) -> Option<&str> {
        self.defines.iter().find(|d| d.name == name).map(|d| d.value.as_ref())
    }

    /// All-on minus one: one variant per toggle, each with that toggle's define removed.
    pub fn leave_one_out(&self) -> Vec<Variant> {
        self.toggles
            .iter()
            .map(|t| {
                let mut v = self.clone();
                v.defines = Cow::Owned(self.defines.iter().filter(|d| d.name != *t).cloned().collect());
                v.toggles = Cow::Owned(self.toggles.iter().filter(|x| *x != t).copied().collect());
                v.name = Cow::Owned(format!("all-{t}"));
                v.summary = Cow::Owned(format!("every optimization of {} except {t}", self.name));
                v
            })
            .collect()
    }
}
