//! How a family plugs in: a [`Family`] lists its [`Op`]s; an op lists its stages, its default
//! shapes and checks a stage against a shape; a [`Problem`] holds one shape's inputs, reference and
//! outputs and launches a stage on them. The runner, the CLI, the tests and the benches all go
//! through these, so a new stage is a `.cu` file and a line in its op's stage list.

use serde::Serialize;

use crate::check::Verification;
use crate::error::Result;
use crate::gpu::Gpu;
use crate::module::KernelSource;
use crate::shape::Shape;
use crate::variant::{Precision, Variant};

/// Which ceiling bounds an op: memory bandwidth, or the matrix rate at a precision.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Bound {
    Memory,
    Compute(Precision),
}

/// The least work one run must do: each input read once, each output written once, and the
/// arithmetic the op defines (not what a stage happens to do).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Workload {
    pub bytes: u64,
    pub flops: u64,
    pub bound: Bound,
}

pub trait Family: Sync {
    fn name(&self) -> &'static str;
    fn description(&self) -> &'static str;
    /// Every `.cu`/`.cuh` file under the crate's `kernels/`.
    fn sources(&self) -> &'static [KernelSource];
    fn ops(&self) -> Vec<&'static dyn Op>;
}

pub trait Op: Sync {
    fn family(&self) -> &'static str;
    fn name(&self) -> &'static str;
    fn description(&self) -> &'static str;
    /// The family's embedded sources (the same list as [`Family::sources`]).
    fn sources(&self) -> &'static [KernelSource];
    /// The op's stages in ladder order: the one list the CLI, tests, benches and docs read.
    fn variants(&self) -> Vec<Variant>;
    /// Extra variants shown with `--leave-one-out` (all-on minus each toggle); empty by default.
    fn leave_one_out(&self) -> Vec<Variant> {
        Vec::new()
    }
    /// The shape keys, in display order.
    fn shape_keys(&self) -> &'static [&'static str];
    fn default_shapes(&self) -> Vec<Shape>;
    /// Fails with a typed constraint error when `variant` cannot run `shape` (sizes, limits,
    /// alignment). Checked before anything is allocated or launched.
    fn validate(&self, variant: &Variant, shape: &Shape) -> Result<()>;
    /// Draws inputs from `seed`, computes the f64 reference and allocates outputs. Input sizes the
    /// op cannot handle at all are rejected here with a typed error.
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>>;
}

pub trait Problem {
    fn workload(&self) -> Workload;
    /// How many copies of inputs/outputs timing rotates through.
    fn copies(&self) -> usize;
    /// NaN-fills every output of every copy.
    fn poison(&mut self, gpu: &Gpu) -> Result<()>;
    /// Launches `variant` (all of its kernels) on copy `copy`, asynchronously.
    fn launch(&mut self, gpu: &Gpu, variant: &Variant, copy: usize) -> Result<()>;
    /// Reads back copy `copy`'s outputs and compares them with the reference.
    fn verify(&mut self, gpu: &Gpu, variant: &Variant, copy: usize) -> Result<Verification>;
}
