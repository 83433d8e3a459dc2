//! The linear layer with the epilogue that follows it in GPT-2 (the report's Fused Kernels
//! section): `epi = 1`: `out = GELU(inp · Wᵀ + bias)` (tanh form, after the MLP up-projection);
//! `epi = 2`: `out = inp · Wᵀ + bias + residual` (after the attention and MLP down projections).
//! The stages keep the GEMM fixed (linear stage 4, or cuBLASLt) and move the epilogue: three
//! kernels, two, one.

use common::check::{SampledRows, Verification};
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, Error, Gpu, Launch, Limit, Op, Precision, Prepared as Current, PreparedStage,
    Problem, Requirements, ResourceUse, Result, Shape, Variant, Workload,
};

use crate::gemm::{check_dims, check_gemm, elementwise, gemm_limits, CublasLt, Dims, Gemm, Ptrs, Wmma, M3_TUNABLES};
use crate::linear::{inputs, verify_sample, M3_DEFINES};
use crate::reference::{gelu_tanh, linear_rows, magnitude_rows, sampled_rows};
use crate::{FAMILY, SOURCES};
use common::lt::{LtEpilogue, LtOperands};

const OP: &str = "linear-epilogue";

common::declare_op! {
    pub struct LinearEpilogue {
        name: OP,
        description: "linear layer + epilogue: epi=1 GELU(x W^T + b) (tanh), epi=2 x W^T + b + residual; fp32 in/out",
        shape_keys: ["M", "N", "K", "epi"],
        stages: stages,
    }
}

/// What follows the GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    /// `GELU(x + bias)`, tanh form (`epi = 1`).
    BiasGelu,
    /// `x + bias + residual` (`epi = 2`).
    BiasResidual,
}

impl Epilogue {
    pub fn from_key(epi: i64) -> Result<Epilogue> {
        match epi {
            1 => Ok(Epilogue::BiasGelu),
            2 => Ok(Epilogue::BiasResidual),
            _ => Err(Error::constraint("epi is 1 (bias+GELU) or 2 (bias+residual)", format!("epi = {epi}"))),
        }
    }
}

/// How a stage arranges GEMM and epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// WMMA GEMM, bias kernel, GELU or residual kernel.
    Unfused,
    /// WMMA GEMM, one bias+GELU or bias+residual kernel.
    FusedAfter,
    /// The WMMA GEMM's store applies the epilogue.
    FusedInGemm,
    /// cuBLASLt's BIAS / GELU_BIAS epilogue (a residual enters as C with β = 1).
    Lt(LtOperands),
}

fn stages() -> Vec<Variant> {
    let k = |stage, name, file, plan: Plan, summary| {
        // The GEMM's switches are all on (no toggles): the stages differ in the epilogue only.
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Fp16, summary)
            .with_plan(plan)
            .with_defines(&M3_DEFINES[..])
            .with_tunables(&M3_TUNABLES)
            .with_requirements(Requirements::SM80)
    };
    let lib = |stage, name, library, p, ops, summary| {
        Variant::library(FAMILY, OP, stage, name, library, p, summary).with_plan(Plan::Lt(ops))
    };
    vec![
        k(
            0,
            "unfused",
            "linear-epilogue/00_unfused.cu",
            Plan::Unfused,
            "WMMA-M3 GEMM, then a bias kernel, then a GELU/residual kernel",
        ),
        k(
            1,
            "fused-after",
            "linear-epilogue/01_fused_after.cu",
            Plan::FusedAfter,
            "WMMA-M3 GEMM, then one bias+GELU / bias+residual kernel",
        ),
        k(
            2,
            "fused-in-gemm",
            "linear-epilogue/02_fused_in_gemm.cu",
            Plan::FusedInGemm,
            "the WMMA-M3 GEMM applies bias and GELU/residual in its store",
        ),
        lib(
            90,
            "cublaslt-tf32",
            "cublasLtMatmul TF32, BIAS / GELU_BIAS epilogue",
            Precision::Tf32,
            LtOperands::Tf32,
            "cuBLASLt TF32 with its epilogue; residual as C with beta = 1",
        ),
        lib(
            91,
            "cublaslt-fp16",
            "fp16 convert + cublasLtMatmul fp16->fp32, BIAS / GELU_BIAS epilogue",
            Precision::Fp16,
            LtOperands::Fp16,
            "cuBLASLt fp16 operands (conversion timed), fp32 out, its epilogue; residual as C",
        ),
    ]
}

/// The sizes of one call and its epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpilogueDims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub epilogue: Epilogue,
}

impl EpilogueDims {
    fn gemm(self) -> Dims {
        Dims { m: self.m, n: self.n, k: self.k }
    }
}

/// The GEMM plan of a stage: the kernel stages run linear stage 4's WMMA kernel.
fn gemm_plan(plan: Plan) -> Gemm {
    match plan {
        Plan::Lt(_) => Gemm::Cublas(common::blas::GemmPrecision::Fp16),
        _ => Gemm::WmmaM3,
    }
}

/// Shape constraints of `v` at `d`: what its header's `Limits:` line documents.
pub fn check_shape(v: &Variant, d: EpilogueDims) -> Result<()> {
    check_gemm(v, gemm_plan(v.plan::<Plan>()?), d.gemm())
}

/// An element-wise kernel that runs after the GEMM, by its argument list.
#[derive(Clone, Copy)]
enum After {
    /// `mm_bias_add`, `mm_bias_gelu`: (out, bias, rows, cols).
    Bias,
    /// `mm_gelu`: (out, n).
    Gelu,
    /// `mm_residual_add`: (out, residual, n).
    Residual,
    /// `mm_bias_residual`: (out, bias, residual, rows, cols).
    BiasResidual,
}

/// How a prepared stage runs.
enum Stage {
    /// The WMMA GEMM, then these element-wise kernels in order.
    Wmma {
        gemm: Wmma,
        after: Vec<(Launch, After)>,
    },
    Lt(CublasLt),
}

/// An epilogue stage prepared for one size and epilogue.
pub struct Prepared {
    stage: Stage,
    d: EpilogueDims,
}

/// The buffers of one call: `out` M·N, `inp` M·K, `weight` N·K, `bias` N, `residual` M·N (needed
/// for, and only for, [`Epilogue::BiasResidual`]).
pub struct EpilogueArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub inp: &'a CudaSlice<f32>,
    pub weight: &'a CudaSlice<f32>,
    pub bias: &'a CudaSlice<f32>,
    pub residual: Option<&'a CudaSlice<f32>>,
}

/// Prepares stage `v` for `d`.
pub fn prepare(gpu: &Gpu, v: &Variant, d: EpilogueDims) -> Result<Prepared> {
    gpu.supports(v)?;
    check_shape(v, d)?;
    let gelu = d.epilogue == Epilogue::BiasGelu;
    let mn = elementwise(d.m * d.n);
    let launch = |entry: &str, args: After| Ok((gpu.prepare_launch(&SOURCES, v, entry, mn)?, args));
    let stage = match v.plan::<Plan>()? {
        Plan::Unfused => Stage::Wmma {
            gemm: Wmma::prepare(gpu, v, d.gemm(), true, "linear_wmma_m3")?,
            after: vec![
                launch("mm_bias_add", After::Bias)?,
                if gelu { launch("mm_gelu", After::Gelu)? } else { launch("mm_residual_add", After::Residual)? },
            ],
        },
        Plan::FusedAfter => Stage::Wmma {
            gemm: Wmma::prepare(gpu, v, d.gemm(), true, "linear_wmma_m3")?,
            after: vec![if gelu {
                launch("mm_bias_gelu", After::Bias)?
            } else {
                launch("mm_bias_residual", After::BiasResidual)?
            }],
        },
        Plan::FusedInGemm => {
            let entry = if gelu { "linear_wmma_m3_gelu" } else { "linear_wmma_m3_residual" };
            Stage::Wmma { gemm: Wmma::prepare(gpu, v, d.gemm(), true, entry)?, after: Vec::new() }
        }
        Plan::Lt(ops) => {
            let epi = if gelu { LtEpilogue::GeluBias } else { LtEpilogue::Bias };
            Stage::Lt(CublasLt::prepare(gpu, ops, epi, d.gemm())?)
        }
    };
    Ok(Prepared { stage, d })
}

impl Prepared {
    /// Enqueues the stage on `stream` after checking every buffer length.
    pub fn enqueue(&self, stream: &CudaStream, a: EpilogueArgs) -> Result<()> {
        let d = self.d;
        require_len("inp", a.inp.len(), d.m * d.k)?;
        require_len("weight", a.weight.len(), d.n * d.k)?;
        require_len("out", a.out.len(), d.m * d.n)?;
        require_len("bias", a.bias.len(), d.n)?;
        match (d.epilogue, a.residual) {
            (Epilogue::BiasResidual, Some(r)) => require_len("residual", r.len(), d.m * d.n)?,
            (Epilogue::BiasResidual, None) => return Err(Error::constraint("residual given for epi = 2", "none")),
            (Epilogue::BiasGelu, r) => require(r.is_none(), "no residual for epi = 1", || "a residual".into())?,
        }
        let p = Ptrs {
            out: common::device_ptr(a.out),
            inp: common::device_ptr(a.inp),
            w: common::device_ptr(a.weight),
            bias: common::device_ptr(a.bias),
            residual: a.residual.map_or(0, common::device_ptr),
        };
        let (rows, cols, mn) = (Arg::int(d.m), Arg::int(d.n), Arg::int(d.m * d.n));
        let (out, bias, residual) = (Arg::Ptr(p.out), Arg::Ptr(p.bias), Arg::Ptr(p.residual));
        // SAFETY: every buffer's length was checked against the prepared sizes, which satisfy the
        // stage's limits; each element-wise entry's arguments are listed in its signature's order.
        unsafe {
            match &self.stage {
                Stage::Wmma { gemm, after } => {
                    let in_gemm = after.is_empty();
                    // The unfused stages run the plain GEMM (no bias) and apply the epilogue after it.
                    gemm.enqueue(stream, if in_gemm { p } else { Ptrs { bias: 0, residual: 0, ..p } })?;
                    for (l, args) in after {
                        match args {
                            After::Bias => l.enqueue(stream, &[out, bias, rows, cols])?,
                            After::Gelu => l.enqueue(stream, &[out, mn])?,
                            After::Residual => l.enqueue(stream, &[out, residual, mn])?,
                            After::BiasResidual => l.enqueue(stream, &[out, bias, residual, rows, cols])?,
                        }
                    }
                    Ok(())
                }
                Stage::Lt(lt) => lt.enqueue(stream, p),
            }
        }
    }
}

impl PreparedStage for Prepared {
    fn resources(&self) -> Vec<ResourceUse> {
        let launches = match &self.stage {
            Stage::Wmma { gemm, after } => gemm.launches().into_iter().chain(after.iter().map(|(l, _)| l)).collect(),
            Stage::Lt(lt) => lt.launches(),
        };
        launches.into_iter().map(|l| l.resources().clone()).collect()
    }
}

/// f64 reference of the given rows: the linear reference with GELU applied, or the residual added.
#[allow(clippy::too_many_arguments)]
pub fn reference_rows(
    inp: &[f32],
    w: &[f32],
    bias: &[f32],
    residual: Option<&[f32]>,
    epilogue: Epilogue,
    n: usize,
    k: usize,
    rows: &[usize],
) -> Vec<f64> {
    let mut r = linear_rows(inp, w, Some(bias), n, k, rows);
    for (i, &row) in rows.iter().enumerate() {
        let o = &mut r[i * n..(i + 1) * n];
        match epilogue {
            Epilogue::BiasGelu => o.iter_mut().for_each(|x| *x = gelu_tanh(*x)),
            Epilogue::BiasResidual => {
                let res = &residual.expect("a residual for epi = 2")[row * n..(row + 1) * n];
                o.iter_mut().zip(res).for_each(|(x, r)| *x += *r as f64);
            }
        }
    }
    r
}

fn shape(m: i64, n: i64, k: i64, epi: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("epi", epi)])
}

fn dims(shape: &Shape) -> Result<EpilogueDims> {
    let max = i32::MAX as i64;
    Ok(EpilogueDims {
        m: shape.dim("M", max)?,
        n: shape.dim("N", max)?,
        k: shape.dim("K", max)?,
        epilogue: Epilogue::from_key(shape.req("epi")?)?,
    })
}

impl Op for LinearEpilogue {
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2 124M at B·T = 4096: MLP up + GELU; attention projection + residual; MLP down + residual.
        [(3072, 768, 1), (768, 768, 2), (768, 3072, 2)].iter().map(|&(n, k, e)| shape(4096, n, k, e)).collect()
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        check_shape(v, dims(shape)?)
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        v.plan::<Plan>().map(|p| gemm_limits(v, gemm_plan(p), |m, n, k| shape(m, n, k, 2))).unwrap_or_default()
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let ed = dims(shape)?;
        let d = ed.gemm();
        check_dims(d)?;
        let epilogue = ed.epilogue;
        let (x, w, b) = inputs(d, seed);
        let residual = (epilogue == Epilogue::BiasResidual).then(|| uniform(d.m * d.n, -1.0, 1.0, seed ^ 3));
        let rows = sampled_rows(d.m, d.n, d.k, seed ^ 4);
        let reference = reference_rows(&x, &w, &b, residual.as_deref(), epilogue, d.n, d.k, &rows);
        let magnitude = magnitude_rows(&x, &w, Some(&b), residual.as_deref(), d.n, d.k, &rows);
        let res_elems = if residual.is_some() { d.m * d.n } else { 0 };
        let bytes_per_copy = (4 * (d.m * d.k + d.n * d.k + d.m * d.n + res_elems)) as u64;
        let copies = rotation_copies(gpu, bytes_per_copy);
        Ok(Box::new(EpilogueProblem {
            d: ed,
            inp: Rotated::upload(gpu, &x, copies)?,
            w: Rotated::upload(gpu, &w, copies)?,
            bias: gpu.upload(&b)?,
            residual: residual.map(|r| Rotated::upload(gpu, &r, copies)).transpose()?,
            out: Rotated::outputs(gpu, d.m * d.n, copies)?,
            sample: SampledRows { rows, reference, magnitude: Some(magnitude) },
            copies,
            prepared: Current::default(),
        }))
    }
}

struct EpilogueProblem {
    d: EpilogueDims,
    inp: Rotated<f32>,
    w: Rotated<f32>,
    bias: CudaSlice<f32>,
    residual: Option<Rotated<f32>>,
    out: Rotated<f32>,
    /// With the scale of each reference element's error ([`magnitude_rows`]).
    sample: SampledRows,
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for EpilogueProblem {
    fn workload(&self) -> Workload {
        let (m, n, k) = (self.d.m as u64, self.d.n as u64, self.d.k as u64);
        let (res, epi_flops) = match self.d.epilogue {
            Epilogue::BiasGelu => (0, 8 * m * n),
            Epilogue::BiasResidual => (m * n, 2 * m * n),
        };
        Workload {
            bytes: 4 * (m * k + n * k + m * n + n + res),
            flops: 2 * m * n * k + epi_flops,
            bound: Bound::Compute(Precision::Fp16),
        }
    }
    common::problem_plumbing!(out);
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let args = EpilogueArgs {
            out: self.out.get_mut(copy),
            inp: self.inp.get(copy),
            weight: self.w.get(copy),
            bias: &self.bias,
            residual: self.residual.as_ref().map(|r| r.get(copy)),
        };
        p.enqueue(stream, args)
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        let out = self.out.get(copy).as_view();
        verify_sample(gpu, v, &out, &self.sample, self.d.gemm())
    }
}
