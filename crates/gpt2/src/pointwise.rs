//! GPT-2's two pointwise ops, each a small ladder: `gelu` (`out = GELU(inp)`, the tanh form) and
//! `residual` (`out = a + b`), fp32 over N elements. They are what the model runs between GEMMs when
//! its plan does not fuse them into a GEMM epilogue (`matmul/linear-epilogue`).
//!
//! Shape key: `N`.

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, Gpu, Launch, LaunchShape, Limit, Op, Precision, Prepared as Current, Problem,
    ResourceUse, Result, Shape, Variant, Workload,
};

use crate::{FAMILY, SOURCES};

common::declare_op! {
    pub struct Gelu {
        name: "gelu",
        description: "GELU, tanh form (fp32): out[i] = 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))",
        shape_keys: ["N"],
        stages: gelu_stages,
    }
}

common::declare_op! {
    pub struct Residual {
        name: "residual",
        description: "residual add (fp32): out[i] = a[i] + b[i]",
        shape_keys: ["N"],
        stages: residual_stages,
    }
}

/// The block sizes the report swept for its residual and GELU kernels (4 to 1024 threads).
pub const REPORT_BLOCK_SIZES: [u32; 9] = [4, 8, 16, 32, 64, 128, 256, 512, 1024];
const ELEMS: &str = "N < 2^31";

/// Which pointwise op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gelu,
    Residual,
}

/// How a stage spreads the elements over threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// One element per thread.
    Scalar,
    /// Four elements per thread by 16-byte accesses, the N % 4 tail one per thread.
    Vector4,
}

impl Kind {
    fn entry(self) -> &'static str {
        match self {
            Kind::Gelu => "gelu_forward",
            Kind::Residual => "residual_forward",
        }
    }

    /// Inputs read per element.
    fn inputs(self) -> usize {
        match self {
            Kind::Gelu => 1,
            Kind::Residual => 2,
        }
    }
}

/// GPT-2's GELU in f64: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// The two stages of a pointwise op: scalar, then float4 (its `00_naive.cu` and `01_vectorized.cu`),
/// each with its block size as a tunable swept over [`REPORT_BLOCK_SIZES`].
fn pointwise_stages(op: &'static str, files: [&'static str; 2]) -> Vec<Variant> {
    let k = |stage, name, file, plan: Plan, summary| {
        Variant::kernel(FAMILY, op, stage, name, file, Precision::Fp32, summary)
            .with_plan(plan)
            .with_tunables(&[("PW_THREADS", 256)])
            .with_sweep("PW_THREADS", &REPORT_BLOCK_SIZES)
    };
    vec![
        k(0, "naive", files[0], Plan::Scalar, "one thread per element"),
        k(1, "vectorized", files[1], Plan::Vector4, "float4 loads and stores, four elements per thread"),
    ]
}

fn gelu_stages() -> Vec<Variant> {
    pointwise_stages("gelu", ["gelu/00_naive.cu", "gelu/01_vectorized.cu"])
}

fn residual_stages() -> Vec<Variant> {
    pointwise_stages("residual", ["residual/00_naive.cu", "residual/01_vectorized.cu"])
}

pub fn check_shape(n: usize) -> Result<()> {
    require(n >= 1, "N >= 1", || format!("N = {n}"))?;
    require(n < 1 << 31, ELEMS, || format!("N = {n}"))
}

/// A pointwise stage prepared for N elements.
pub struct Prepared {
    launch: Launch,
    kind: Kind,
    n: usize,
}

pub fn prepare(gpu: &Gpu, v: &Variant, kind: Kind, n: usize) -> Result<Prepared> {
    check_shape(n)?;
    let threads = match v.plan::<Plan>()? {
        Plan::Scalar => n,
        Plan::Vector4 => n / 4 + n % 4,
    } as u32;
    let block = v.tunable("PW_THREADS")?;
    let shape = LaunchShape::linear(threads.div_ceil(block), block);
    Ok(Prepared { launch: gpu.prepare_launch(&SOURCES, v, kind.entry(), shape)?, kind, n })
}

impl Prepared {
    /// `out = GELU(a)` (`b` must be `None`), or `out = a + b`. `out` may be the same buffer as `a`
    /// only through [`Prepared::enqueue_in_place`].
    pub fn enqueue(
        &self,
        stream: &CudaStream,
        out: &mut CudaSlice<f32>,
        a: &CudaSlice<f32>,
        b: Option<&CudaSlice<f32>>,
    ) -> Result<()> {
        require_len("out", out.len(), self.n)?;
        self.launch_with(stream, Arg::buf(out), a, b)
    }

    /// The residual in place: `x = x + b` (the model's residual stream).
    pub fn enqueue_in_place(&self, stream: &CudaStream, x: &mut CudaSlice<f32>, b: &CudaSlice<f32>) -> Result<()> {
        require(self.kind == Kind::Residual, "in place: the residual op", || format!("{:?}", self.kind))?;
        require_len("x", x.len(), self.n)?;
        require_len("b", b.len(), self.n)?;
        let p = Arg::Ptr(common::device_ptr(x));
        // SAFETY: residual_forward(out, a, b, n) reads a[i] and b[i] before writing out[i] in the same
        // thread, so out == a is safe; every buffer holds n elements (checked above).
        unsafe { self.launch.enqueue(stream, &[p, p, Arg::buf(b), Arg::int(self.n)]) }
    }

    fn launch_with(&self, stream: &CudaStream, out: Arg, a: &CudaSlice<f32>, b: Option<&CudaSlice<f32>>) -> Result<()> {
        require_len("a", a.len(), self.n)?;
        let n = Arg::int(self.n);
        // SAFETY: the arguments follow the kernel signatures; every buffer holds n elements.
        match (self.kind, b) {
            (Kind::Gelu, None) => unsafe { self.launch.enqueue(stream, &[out, Arg::buf(a), n]) },
            (Kind::Residual, Some(b)) => {
                require_len("b", b.len(), self.n)?;
                unsafe { self.launch.enqueue(stream, &[out, Arg::buf(a), Arg::buf(b), n]) }
            }
            (kind, _) => Err(common::Error::constraint(
                format!("{} input(s) for {kind:?}", kind.inputs()),
                "a different number of inputs",
            )),
        }
    }
}

common::single_launch_stage!(Prepared);

fn shape(n: i64) -> Shape {
    Shape::new(&[("N", n)])
}

/// The op behind each of the two unit structs.
trait Pointwise {
    const KIND: Kind;
}
impl Pointwise for Gelu {
    const KIND: Kind = Kind::Gelu;
}
impl Pointwise for Residual {
    const KIND: Kind = Kind::Residual;
}

fn problem(gpu: &Gpu, kind: Kind, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
    let n = s.dim("N", i32::MAX as i64)?;
    check_shape(n)?;
    let a = uniform(n, -4.0, 4.0, seed ^ 1);
    let b = uniform(n, -4.0, 4.0, seed ^ 2);
    let reference: Vec<f64> = match kind {
        Kind::Gelu => a.iter().map(|&x| gelu(x as f64)).collect(),
        Kind::Residual => a.iter().zip(&b).map(|(&x, &y)| x as f64 + y as f64).collect(),
    };
    let copies = rotation_copies(gpu, (4 * n * (kind.inputs() + 1)) as u64);
    Ok(Box::new(PointwiseProblem {
        kind,
        n,
        a: Rotated::upload(gpu, &a, copies)?,
        b: Rotated::upload(gpu, &b, copies)?,
        out: Rotated::outputs(gpu, n, copies)?,
        reference,
        copies,
        prepared: Current::default(),
    }))
}

macro_rules! pointwise_op {
    ($ty:ty) => {
        impl Op for $ty {
            fn default_shapes(&self) -> Vec<Shape> {
                // GPT-2 124M at B = 4, T = 1024: the MLP's 4C activations, and the C-wide stream.
                match <$ty as Pointwise>::KIND {
                    Kind::Gelu => vec![shape(4 * 1024 * 3072)],
                    Kind::Residual => vec![shape(4 * 1024 * 768)],
                }
            }
            fn validate(&self, _v: &Variant, s: &Shape) -> Result<()> {
                check_shape(s.dim("N", i64::MAX)?)
            }
            fn limits(&self, _v: &Variant) -> Vec<Limit> {
                vec![Limit { constraint: ELEMS, past: shape(1 << 31), inside: None }]
            }
            fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
                problem(gpu, <$ty as Pointwise>::KIND, s, seed)
            }
        }
    };
}
pointwise_op!(Gelu);
pointwise_op!(Residual);

struct PointwiseProblem {
    kind: Kind,
    n: usize,
    a: Rotated<f32>,
    b: Rotated<f32>,
    out: Rotated<f32>,
    reference: Vec<f64>,
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for PointwiseProblem {
    fn workload(&self) -> Workload {
        let n = self.n as u64;
        let flops = match self.kind {
            Kind::Gelu => 20 * n,
            Kind::Residual => n,
        };
        Workload { bytes: 4 * n * (self.kind.inputs() as u64 + 1), flops, bound: Bound::Memory }
    }
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        Ok(self.prepared.set(v, prepare(gpu, v, self.kind, self.n)?))
    }
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let b = (self.kind == Kind::Residual).then(|| self.b.get(copy));
        p.enqueue(stream, self.out.get_mut(copy), self.a.get(copy), b)
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        Ok(Verification::new(v.tolerance()).add("out", &gpu.download(self.out.get(copy))?, &self.reference))
    }
}
