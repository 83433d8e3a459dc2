//! How a family plugs in: a [`Family`] lists its [`Op`]s; an op lists its stages (each carrying its
//! plan), its default shapes and its documented limits, and checks a stage against a shape; a
//! [`Problem`] holds one shape's inputs, reference and outputs, prepares a stage for them once and
//! enqueues it any number of times. The runner, the CLI, the tests and the benches all go through
//! these, so a new stage is a `.cu` file and an entry in its op's stage list.

use cudarc::driver::CudaStream;
use serde::{Deserialize, Serialize};

use crate::check::Verification;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::launch::ResourceUse;
use crate::module::Sources;
use crate::shape::Shape;
use crate::variant::{Generator, LeaveOneOut, Precision, Variant};

/// Which ceiling bounds an op: memory bandwidth, or the matrix rate at a precision.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Bound {
    /// Device memory traffic, read against the device-to-device copy bandwidth.
    Memory,
    Compute(Precision),
    /// Host-to-device traffic (a cache in host memory), read against the pinned copy bandwidth.
    HostLink,
}

/// The least work one run must do: each input read once, each output written once, and the
/// arithmetic the op defines (not what a stage happens to do).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub bytes: u64,
    pub flops: u64,
    pub bound: Bound,
}

/// A limit a stage's header documents on its `Limits:` line, with shapes that probe it.
#[derive(Clone, Debug)]
pub struct Limit {
    /// The constraint exactly as the header's `Limits:` line and the typed error state it.
    pub constraint: &'static str,
    /// A shape just past the limit: the stage must refuse it with this constraint.
    pub past: Shape,
    /// A shape just inside it, small enough to verify on the GPU; `None` when reaching the limit
    /// needs more memory than a test should take (the 2^31-element index limits).
    pub inside: Option<Shape>,
}

pub trait Family: Sync {
    fn name(&self) -> &'static str;
    fn description(&self) -> &'static str;
    fn sources(&self) -> &'static Sources;
    fn ops(&self) -> Vec<&'static dyn Op>;
}

/// Declares a family at the root of its crate: `FAMILY` (its name), `SOURCES` (every `.cu`/`.cuh`
/// file of the crate, embedded by its build script, importing the sources listed in `imports`: other
/// families' headers its kernels include) and the unit struct implementing [`Family`], its ops in
/// `ladder list`'s order. [`declare_op!`] reads `FAMILY` and `SOURCES` from there.
#[macro_export]
macro_rules! declare_family {
    (
        pub struct $family:ident {
            name: $name:expr,
            description: $description:expr,
            imports: [$($import:expr),* $(,)?],
            ops: [$($op:expr),* $(,)?] $(,)?
        }
    ) => {
        mod embedded {
            include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
        }

        pub const FAMILY: &str = $name;

        /// Every `.cu`/`.cuh` file of this crate, embedded at build time.
        pub static SOURCES: $crate::Sources =
            $crate::Sources { family: FAMILY, files: embedded::KERNEL_SOURCES, imports: &[$($import),*] };

        pub struct $family;

        impl $crate::Family for $family {
            fn name(&self) -> &'static str {
                FAMILY
            }
            fn description(&self) -> &'static str {
                $description
            }
            fn sources(&self) -> &'static $crate::Sources {
                &SOURCES
            }
            fn ops(&self) -> Vec<&'static dyn $crate::Op> {
                vec![$($op),*]
            }
        }
    };
}

/// What an op is: its family and name, one line for `ladder list`, the family's sources, the keys
/// of its shapes (in display order) and its stage list. Each op declares one with [`declare_op!`].
#[derive(Debug)]
pub struct OpInfo {
    pub family: &'static str,
    pub name: &'static str,
    pub description: &'static str,
    pub sources: &'static Sources,
    pub shape_keys: &'static [&'static str],
    /// The stage list: each stage declared once, with its plan.
    pub stages: fn() -> Vec<Variant>,
}

/// An op's [`OpInfo`]: what [`declare_op!`] implements, apart from the op's behaviour ([`Op`]).
pub trait Declared {
    fn info(&self) -> &'static OpInfo;
}

/// Declares an op of the crate's family (the crate root's `FAMILY` and `SOURCES`, as
/// [`declare_family!`] defines them): the unit struct and its [`OpInfo`]. The struct's `impl Op`
/// gives the rest.
#[macro_export]
// `crate` is meant: the op's family is the crate that calls the macro.
#[allow(clippy::crate_in_macro_def)]
macro_rules! declare_op {
    (
        pub struct $op:ident {
            name: $name:expr,
            description: $description:expr,
            shape_keys: [$($key:expr),* $(,)?],
            stages: $stages:expr $(,)?
        }
    ) => {
        pub struct $op;

        impl $crate::Declared for $op {
            fn info(&self) -> &'static $crate::OpInfo {
                static INFO: $crate::OpInfo = $crate::OpInfo {
                    family: crate::FAMILY,
                    name: $name,
                    description: $description,
                    sources: &crate::SOURCES,
                    shape_keys: &[$($key),*],
                    stages: $stages,
                };
                &INFO
            }
        }
    };
}

pub trait Op: Declared + Sync {
    fn family(&self) -> &'static str {
        self.info().family
    }
    fn name(&self) -> &'static str {
        self.info().name
    }
    fn description(&self) -> &'static str {
        self.info().description
    }
    /// The family's embedded sources (the same as [`Family::sources`]).
    fn sources(&self) -> &'static Sources {
        self.info().sources
    }
    /// The shape keys, in display order.
    fn shape_keys(&self) -> &'static [&'static str] {
        self.info().shape_keys
    }
    /// The op's stages in ladder order, each with its plan: the one list the CLI, tests, benches and
    /// docs read.
    fn variants(&self) -> Vec<Variant> {
        (self.info().stages)()
    }
    /// Extra rows shown with `--leave-one-out`: every stage with toggles, all-on minus each one.
    fn leave_one_out(&self) -> Vec<Variant> {
        self.variants().iter().flat_map(|v| LeaveOneOut.derive(v)).collect()
    }
    fn default_shapes(&self) -> Vec<Shape>;
    /// Fails with a typed constraint error when `variant` cannot run `shape` (sizes, limits,
    /// alignment). Checked before anything is allocated or launched; `prepare` checks the same.
    fn validate(&self, variant: &Variant, shape: &Shape) -> Result<()>;
    /// The variants `variant` is compiled as at `shape` on `gpu` (what its `prepare` asks
    /// [`Gpu::module`] for): itself, unless the host sets defines per shape (linear-bf16's tile
    /// width). [`preload`] compiles them ahead of time, all at once; a stage whose decisions fail
    /// here is named as it is, and its `prepare` reports the failure in its row.
    fn compiled_variants(&self, gpu: &Gpu, variant: &Variant, shape: &Shape) -> Vec<Variant> {
        let _ = (gpu, shape);
        vec![variant.clone()]
    }
    /// Modules `variant` compiles at `shape` beyond [`Op::compiled_variants`], each with the sources
    /// it is in: a composed stage that runs other ladders' stages with switches the host turns on
    /// (`gpt2/decode-step`'s dependent chain). [`preload`] compiles them with the rest, all at once,
    /// instead of the stage compiling them one after another when it is prepared.
    fn extra_builds(&self, variant: &Variant, shape: &Shape) -> Vec<(&'static Sources, Variant)> {
        let _ = (variant, shape);
        Vec::new()
    }
    /// Every limit `variant`'s header documents, with shapes just past and just inside it.
    fn limits(&self, variant: &Variant) -> Vec<Limit>;
    /// Draws inputs from `seed`, computes the f64 reference and allocates outputs. Shapes that no
    /// stage can take are rejected here with a typed error.
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>>;
}

pub trait Problem {
    fn workload(&self) -> Workload;
    /// How many copies of inputs/outputs timing rotates through.
    fn copies(&self) -> usize;
    /// NaN-fills every output of every copy (and the prepared stage's scratch, if it has any).
    fn poison(&mut self, gpu: &Gpu) -> Result<()>;
    /// Prepares `variant` for this problem's shape (modules, functions, launch checks, workspace,
    /// bound constants) and makes it the stage that [`Problem::enqueue`] runs. Returns the resources
    /// of its kernels at their launch configurations.
    fn prepare(&mut self, gpu: &Gpu, variant: &Variant) -> Result<Vec<ResourceUse>>;
    /// Enqueues the prepared stage on copy `copy` on `stream`: arguments and launches only.
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()>;
    /// Reads back copy `copy`'s outputs and compares them with the reference.
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification>;
}

/// Inside `impl Problem for …`, the three methods most ops write the same way: `copies` from a
/// `copies` field, `poison` of the listed output fields (each a [`crate::data::Rotated`] or anything
/// with a `poison(&Gpu)`), in order, and `prepare` through the op's own `prepare(gpu, variant,
/// self.d)` into a `prepared` field ([`Prepared`]).
#[macro_export]
macro_rules! problem_plumbing {
    ($($output:ident),+) => {
        fn copies(&self) -> usize {
            self.copies
        }
        fn poison(&mut self, gpu: &$crate::Gpu) -> $crate::Result<()> {
            $(self.$output.poison(gpu)?;)+
            Ok(())
        }
        fn prepare(&mut self, gpu: &$crate::Gpu, v: &$crate::Variant) -> $crate::Result<Vec<$crate::ResourceUse>> {
            Ok(self.prepared.set(v, prepare(gpu, v, self.d)?))
        }
    };
}

/// An op's prepared stage: it reports the resources of its kernels at their launch configurations.
pub trait PreparedStage {
    fn resources(&self) -> Vec<ResourceUse>;
}

/// [`PreparedStage`] for a prepared stage that is one kernel launch, its `launch` field.
#[macro_export]
macro_rules! single_launch_stage {
    ($prepared:ty) => {
        impl $crate::PreparedStage for $prepared {
            fn resources(&self) -> Vec<$crate::ResourceUse> {
                vec![self.launch.resources().clone()]
            }
        }
    };
}

/// The stage a problem has prepared: the variant and the op's prepared form of it.
pub struct Prepared<P> {
    current: Option<(Variant, P)>,
}

impl<P> Default for Prepared<P> {
    fn default() -> Self {
        Prepared { current: None }
    }
}

impl<P: PreparedStage> Prepared<P> {
    /// Makes `prepared` the current stage and returns its resources (what `Problem::prepare` returns).
    pub fn set(&mut self, variant: &Variant, prepared: P) -> Vec<ResourceUse> {
        self.current.insert((variant.clone(), prepared)).1.resources()
    }

    /// The prepared stage, or a typed error when nothing was prepared.
    pub fn get(&self) -> Result<(&Variant, &P)> {
        self.current.as_ref().map(|(v, p)| (v, p)).ok_or(Error::NotPrepared)
    }

    pub fn get_mut(&mut self) -> Result<(&Variant, &mut P)> {
        self.current.as_mut().map(|(v, p)| (&*v, p)).ok_or(Error::NotPrepared)
    }
}

/// The variants of `op` that take one of `shapes`, as each is compiled there
/// ([`Op::compiled_variants`]): the modules a run of them needs.
pub fn compiled_for(gpu: &Gpu, op: &dyn Op, shapes: &[Shape], variants: &[Variant]) -> Vec<Variant> {
    shapes
        .iter()
        .flat_map(|s| {
            variants.iter().filter(|v| op.validate(v, s).is_ok()).flat_map(move |v| op.compiled_variants(gpu, v, s))
        })
        .collect()
}

/// Every module a run of the `variants` of `op` at `shapes` compiles, with its sources: each
/// stage's [`compiled_for`] in the op's sources and its [`Op::extra_builds`].
pub fn builds_for(gpu: &Gpu, op: &dyn Op, shapes: &[Shape], variants: &[Variant]) -> Vec<(&'static Sources, Variant)> {
    let own = compiled_for(gpu, op, shapes, variants).into_iter().map(|v| (op.sources(), v));
    let extra = shapes
        .iter()
        .flat_map(|s| variants.iter().filter(|v| op.validate(v, s).is_ok()).flat_map(move |v| op.extra_builds(v, s)));
    own.chain(extra).collect()
}

/// Compiles and loads, all at once on every core, the modules of the `variants` of `op` that take
/// `shapes` ([`builds_for`]): what a run or a test does before its first stage, so that no stage
/// waits for its own compilation. A no-op for modules loaded already. Returns how many were loaded.
pub fn preload(gpu: &Gpu, op: &dyn Op, shapes: &[Shape], variants: &[Variant]) -> usize {
    gpu.load_builds(&builds_for(gpu, op, shapes, variants))
}
