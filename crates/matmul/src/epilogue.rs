//! The linear layer with the epilogue that follows it in GPT-2 (the report's Fused Kernels
//! section): `epi = 1`: `out = GELU(inp · Wᵀ + bias)` (tanh form, after the MLP up-projection);
//! `epi = 2`: `out = inp · Wᵀ + bias + residual` (after the attention and MLP down projections).
//! The stages keep the GEMM fixed (linear stage 4, or cuBLASLt) and move the epilogue: three
//! kernels, two, one.

use common::check::Verification;
use common::cudarc::driver::CudaSlice;
use common::data::{rotation_copies, uniform, Rotated};
use common::{require, Bound, Error, Gpu, Op, Precision, Problem, Requirements, Result, Shape, Variant, Workload};

use crate::gemm::{self, check_dims, check_len, elementwise, Arg, Dims, Ptrs, Workspace};
use crate::linear::{inputs, verify_rows, M3_DEFINES};
use crate::lt::{LtEpilogue, LtOperands};
use crate::reference::{gelu_tanh, linear_rows, sampled_rows};
use crate::FAMILY;

const OP: &str = "linear-epilogue";

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

fn stages() -> Vec<(Variant, Plan)> {
    let k = |stage, name, file, summary| {
        // The GEMM's switches are all on (no toggles): the stages differ in the epilogue only.
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Fp16, summary)
            .with_defines(&M3_DEFINES)
            .with_requirements(Requirements::SM80)
    };
    let lib = |stage, name, library, p, summary| Variant::library(FAMILY, OP, stage, name, library, p, summary);
    vec![
        (
            k(
                0,
                "unfused",
                "linear-epilogue/00_unfused.cu",
                "WMMA-M3 GEMM, then a bias kernel, then a GELU/residual kernel",
            ),
            Plan::Unfused,
        ),
        (
            k(
                1,
                "fused-after",
                "linear-epilogue/01_fused_after.cu",
                "WMMA-M3 GEMM, then one bias+GELU / bias+residual kernel",
            ),
            Plan::FusedAfter,
        ),
        (
            k(
                2,
                "fused-in-gemm",
                "linear-epilogue/02_fused_in_gemm.cu",
                "the WMMA-M3 GEMM applies bias and GELU/residual in its store",
            ),
            Plan::FusedInGemm,
        ),
        (
            lib(
                90,
                "cublaslt-tf32",
                "cublasLtMatmul TF32, BIAS / GELU_BIAS epilogue",
                Precision::Tf32,
                "cuBLASLt TF32 with its epilogue; residual as C with beta = 1",
            ),
            Plan::Lt(LtOperands::Tf32),
        ),
        (
            lib(
                91,
                "cublaslt-fp16",
                "fp16 convert + cublasLtMatmul fp16->fp32, BIAS / GELU_BIAS epilogue",
                Precision::Fp16,
                "cuBLASLt fp16 operands (conversion timed), fp32 out, its epilogue; residual as C",
            ),
            Plan::Lt(LtOperands::Fp16),
        ),
    ]
}

fn plan(v: &Variant) -> Result<Plan> {
    stages().into_iter().find(|(s, _)| s.stage == v.stage).map(|(_, p)| p).ok_or_else(|| Error::Unknown {
        what: "linear-epilogue stage",
        name: format!("{}-{}", v.stage, v.name),
        known: stages().iter().map(|(s, _)| format!("{}-{}", s.stage, s.name)).collect::<Vec<_>>().join(", "),
    })
}

/// The buffers of one call: `out` M·N, `inp` M·K, `weight` N·K, `bias` N, `residual` M·N (needed
/// for, and only for, [`Epilogue::BiasResidual`]).
pub struct EpilogueArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub inp: &'a CudaSlice<f32>,
    pub weight: &'a CudaSlice<f32>,
    pub bias: &'a CudaSlice<f32>,
    pub residual: Option<&'a CudaSlice<f32>>,
    pub epilogue: Epilogue,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

pub fn check_shape(v: &Variant, m: usize, n: usize, k: usize) -> Result<()> {
    check_dims(Dims { m, n, k })?;
    plan(v).map(|_| ())
}

/// Launches stage `v` after checking the sizes and every buffer length.
pub fn forward(gpu: &Gpu, v: &Variant, a: EpilogueArgs, ws: &mut Workspace) -> Result<()> {
    let d = Dims { m: a.m, n: a.n, k: a.k };
    check_shape(v, d.m, d.n, d.k)?;
    check_len("inp", a.inp.len(), d.m * d.k)?;
    check_len("weight", a.weight.len(), d.n * d.k)?;
    check_len("out", a.out.len(), d.m * d.n)?;
    check_len("bias", a.bias.len(), d.n)?;
    match (a.epilogue, a.residual) {
        (Epilogue::BiasResidual, Some(r)) => check_len("residual", r.len(), d.m * d.n)?,
        (Epilogue::BiasResidual, None) => return Err(Error::constraint("residual given for epi = 2", "none")),
        (Epilogue::BiasGelu, r) => require(r.is_none(), "no residual for epi = 1", || "a residual".into())?,
    }
    gpu.supports(v)?;
    let p = Ptrs {
        out: gpu.ptr(a.out),
        inp: gpu.ptr(a.inp),
        w: gpu.ptr(a.weight),
        bias: gpu.ptr(a.bias),
        residual: a.residual.map_or(0, |r| gpu.ptr(r)),
    };
    let gelu = a.epilogue == Epilogue::BiasGelu;
    let mn = d.m * d.n;
    let (rows, cols) = (Arg::I(d.m as i32), Arg::I(d.n as i32));
    let no_epi = Ptrs { bias: 0, residual: 0, ..p };
    match plan(v)? {
        Plan::Unfused => {
            gemm::wmma_m3(gpu, v, d, no_epi, ws, "linear_wmma_m3")?;
            gemm::launch(gpu, v, "mm_bias_add", elementwise(mn), &[Arg::P(p.out), Arg::P(p.bias), rows, cols])?;
            if gelu {
                gemm::launch(gpu, v, "mm_gelu", elementwise(mn), &[Arg::P(p.out), Arg::I(mn as i32)])
            } else {
                let args = [Arg::P(p.out), Arg::P(p.residual), Arg::I(mn as i32)];
                gemm::launch(gpu, v, "mm_residual_add", elementwise(mn), &args)
            }
        }
        Plan::FusedAfter => {
            gemm::wmma_m3(gpu, v, d, no_epi, ws, "linear_wmma_m3")?;
            if gelu {
                gemm::launch(gpu, v, "mm_bias_gelu", elementwise(mn), &[Arg::P(p.out), Arg::P(p.bias), rows, cols])
            } else {
                let args = [Arg::P(p.out), Arg::P(p.bias), Arg::P(p.residual), rows, cols];
                gemm::launch(gpu, v, "mm_bias_residual", elementwise(mn), &args)
            }
        }
        Plan::FusedInGemm => {
            let entry = if gelu { "linear_wmma_m3_gelu" } else { "linear_wmma_m3_residual" };
            gemm::wmma_m3(gpu, v, d, p, ws, entry)
        }
        Plan::Lt(ops) => {
            let epi = if gelu { LtEpilogue::GeluBias } else { LtEpilogue::Bias };
            gemm::cublaslt(gpu, ops, epi, d, p, ws)
        }
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

pub struct LinearEpilogue;

impl Op for LinearEpilogue {
    fn family(&self) -> &'static str {
        FAMILY
    }
    fn name(&self) -> &'static str {
        OP
    }
    fn description(&self) -> &'static str {
        "linear layer + epilogue: epi=1 GELU(x W^T + b) (tanh), epi=2 x W^T + b + residual; fp32 in/out"
    }
    fn sources(&self) -> &'static [common::KernelSource] {
        crate::sources()
    }
    fn variants(&self) -> Vec<Variant> {
        stages().into_iter().map(|(v, _)| v).collect()
    }
    fn shape_keys(&self) -> &'static [&'static str] {
        &["M", "N", "K", "epi"]
    }
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2 124M at B·T = 4096: MLP up + GELU; attention projection + residual; MLP down + residual.
        [(3072, 768, 1), (768, 768, 2), (768, 3072, 2)]
            .iter()
            .map(|&(n, k, e)| Shape::new(&[("M", 4096), ("N", n), ("K", k), ("epi", e)]))
            .collect()
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        let max = i32::MAX as i64;
        Epilogue::from_key(shape.req("epi")?)?;
        check_shape(v, shape.dim("M", max)?, shape.dim("N", max)?, shape.dim("K", max)?)
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let max = i32::MAX as i64;
        let d = Dims { m: shape.dim("M", max)?, n: shape.dim("N", max)?, k: shape.dim("K", max)? };
        check_dims(d)?;
        let epilogue = Epilogue::from_key(shape.req("epi")?)?;
        let (x, w, b) = inputs(d, seed);
        let residual = (epilogue == Epilogue::BiasResidual).then(|| uniform(d.m * d.n, -1.0, 1.0, seed ^ 3));
        let rows = sampled_rows(d.m, d.n, d.k);
        let reference = reference_rows(&x, &w, &b, residual.as_deref(), epilogue, d.n, d.k, &rows);
        let res_elems = if residual.is_some() { d.m * d.n } else { 0 };
        let bytes_per_copy = (4 * (d.m * d.k + d.n * d.k + d.m * d.n + res_elems)) as u64;
        let copies = rotation_copies(gpu, bytes_per_copy);
        Ok(Box::new(EpilogueProblem {
            d,
            epilogue,
            inp: Rotated::upload(gpu, &x, copies)?,
            w: Rotated::upload(gpu, &w, copies)?,
            bias: gpu.upload(&b)?,
            residual: residual.map(|r| Rotated::upload(gpu, &r, copies)).transpose()?,
            out: Rotated::outputs(gpu, d.m * d.n, copies)?,
            rows,
            reference,
            copies,
            ws: Workspace::new(),
        }))
    }
}

struct EpilogueProblem {
    d: Dims,
    epilogue: Epilogue,
    inp: Rotated<f32>,
    w: Rotated<f32>,
    bias: CudaSlice<f32>,
    residual: Option<Rotated<f32>>,
    out: Rotated<f32>,
    rows: Vec<usize>,
    reference: Vec<f64>,
    copies: usize,
    ws: Workspace,
}

impl Problem for EpilogueProblem {
    fn workload(&self) -> Workload {
        let (m, n, k) = (self.d.m as u64, self.d.n as u64, self.d.k as u64);
        let (res, epi_flops) = match self.epilogue {
            Epilogue::BiasGelu => (0, 8 * m * n),
            Epilogue::BiasResidual => (m * n, 2 * m * n),
        };
        Workload {
            bytes: 4 * (m * k + n * k + m * n + n + res),
            flops: 2 * m * n * k + epi_flops,
            bound: Bound::Compute(Precision::Fp16),
        }
    }
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)
    }
    fn launch(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<()> {
        let d = self.d;
        let args = EpilogueArgs {
            out: self.out.get_mut(copy),
            inp: self.inp.get(copy),
            weight: self.w.get(copy),
            bias: &self.bias,
            residual: self.residual.as_ref().map(|r| r.get(copy)),
            epilogue: self.epilogue,
            m: d.m,
            n: d.n,
            k: d.k,
        };
        forward(gpu, v, args, &mut self.ws)
    }
    fn verify(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<Verification> {
        let out = gpu.download(self.out.get(copy))?;
        Ok(verify_rows(v, &out, &self.reference, &self.rows, self.d))
    }
}
