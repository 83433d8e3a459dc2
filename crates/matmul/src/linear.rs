//! The linear layer `out[M,N] = inp[M,K] · W[N,K]ᵀ (+ bias[N])`, fp32 in and out: the report's
//! ladder from the naive kernel to WMMA milestone 3, beside cuBLAS.

use std::borrow::Cow;

use common::blas::GemmPrecision;
use common::check::{ErrorStats, Verification};
use common::cudarc::driver::CudaSlice;
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, Bound, Define, Error, Gpu, Op, Precision, Problem, Requirements, Result, Shape, Variant, Workload,
};

use crate::gemm::{self, check_dims, check_len, Dims, Gemm, Ptrs, Workspace};
use crate::reference::{linear_rows, sampled_rows};
use crate::FAMILY;

const OP: &str = "linear";

/// The cumulative switches of stage 4 (leave-one-out removes each in turn).
pub(crate) const M3_TOGGLES: &[&str] = &["LAUNCH_BOUNDS", "DOUBLE_BUFFER", "FUSED_PREP", "BLOCK_TILE"];
pub(crate) static M3_DEFINES: [Define; 4] =
    [Define::on("LAUNCH_BOUNDS"), Define::on("DOUBLE_BUFFER"), Define::on("FUSED_PREP"), Define::on("BLOCK_TILE")];

fn stages() -> Vec<(Variant, Gemm)> {
    let k = |stage, name, file, p, summary| Variant::kernel(FAMILY, OP, stage, name, file, p, summary);
    let lib = |stage, name, library, p, summary| Variant::library(FAMILY, OP, stage, name, library, p, summary);
    let mut m3 = k(
        4,
        "wmma-m3",
        "linear/04_wmma_m3.cu",
        Precision::Fp16,
        "128x128 block tile of 8 warps (4 along N), 4x2 WMMA tiles per warp, cp.async 3-stage smem pipeline, launch bounds, fused transpose+convert",
    )
    .with_defines(&M3_DEFINES)
    .with_requirements(Requirements::SM80);
    m3.toggles = Cow::Borrowed(M3_TOGGLES);
    vec![
        (
            k(
                0,
                "naive",
                "linear/00_naive.cu",
                Precision::Fp32,
                "one thread per output, loop over K from global memory",
            ),
            Gemm::Naive,
        ),
        (
            k(1, "smem-tiled", "linear/01_smem_tiled.cu", Precision::Fp32, "32x32 shared-memory tiles of inp and W"),
            Gemm::SmemTiled,
        ),
        (
            k(
                2,
                "register-tiled",
                "linear/02_register_tiled.cu",
                Precision::Fp32,
                "128x128 block tile, 8x8 register tile per thread, 16-byte loads",
            ),
            Gemm::RegisterTiled,
        ),
        (
            k(
                3,
                "wmma-m2",
                "linear/03_wmma_m2.cu",
                Precision::Fp16,
                "fp16 WMMA, one warp per 16x16 tile; separate transpose and convert kernels, padding to 16",
            )
            .with_requirements(Requirements::SM80),
            Gemm::WmmaM2,
        ),
        (m3, Gemm::WmmaM3),
        (
            lib(
                90,
                "cublas-fp32",
                "cublasGemmEx fp32 + bias kernel",
                Precision::Fp32,
                "cuBLAS fp32 (FFMA), bias added by a kernel",
            ),
            Gemm::Cublas(GemmPrecision::Fp32),
        ),
        (
            lib(
                91,
                "cublas-tf32",
                "cublasGemmEx TF32 + bias kernel",
                Precision::Tf32,
                "cuBLAS TF32 tensor cores, bias added by a kernel",
            ),
            Gemm::Cublas(GemmPrecision::Tf32),
        ),
        (
            lib(
                92,
                "cublas-fp16",
                "fp16 convert + cublasGemmEx fp16 + fp32/bias kernel",
                Precision::Fp16,
                "cuBLAS fp16 tensor cores; operand conversion and fp16->fp32+bias pass timed",
            ),
            Gemm::Cublas(GemmPrecision::Fp16),
        ),
    ]
}

fn plan(v: &Variant) -> Result<Gemm> {
    stages().into_iter().find(|(s, _)| s.stage == v.stage).map(|(_, g)| g).ok_or_else(|| Error::Unknown {
        what: "linear stage",
        name: format!("{}-{}", v.stage, v.name),
        known: stages().iter().map(|(s, _)| format!("{}-{}", s.stage, s.name)).collect::<Vec<_>>().join(", "),
    })
}

/// The buffers of one linear call (row-major): `out` M·N, `inp` M·K, `weight` N·K, `bias` N.
pub struct LinearArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub inp: &'a CudaSlice<f32>,
    pub weight: &'a CudaSlice<f32>,
    pub bias: Option<&'a CudaSlice<f32>>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// Shape constraints of `v` at M × N × K (the same for every stage: all handle ragged sizes).
pub fn check_shape(v: &Variant, m: usize, n: usize, k: usize) -> Result<()> {
    check_dims(Dims { m, n, k })?;
    plan(v).map(|_| ())
}

/// Launches stage `v` of the linear layer after checking the sizes and every buffer length.
/// `ws` holds the scratch buffers and library handles; keep it across calls.
pub fn forward(gpu: &Gpu, v: &Variant, a: LinearArgs, ws: &mut Workspace) -> Result<()> {
    let d = Dims { m: a.m, n: a.n, k: a.k };
    check_shape(v, d.m, d.n, d.k)?;
    check_len("inp", a.inp.len(), d.m * d.k)?;
    check_len("weight", a.weight.len(), d.n * d.k)?;
    check_len("out", a.out.len(), d.m * d.n)?;
    if let Some(b) = a.bias {
        check_len("bias", b.len(), d.n)?;
    }
    gpu.supports(v)?;
    let p = Ptrs {
        out: gpu.ptr(a.out),
        inp: gpu.ptr(a.inp),
        w: gpu.ptr(a.weight),
        bias: a.bias.map_or(0, |b| gpu.ptr(b)),
        residual: 0,
    };
    gemm::run(gpu, v, plan(v)?, d, p, ws)
}

/// Inputs of one problem: inp uniform(−1, 1), W uniform(−1, 1)/√K (outputs of order 1, far from
/// fp16 overflow), bias uniform(−0.5, 0.5).
pub(crate) fn inputs(d: Dims, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let s = 1.0 / (d.k as f32).sqrt();
    (uniform(d.m * d.k, -1.0, 1.0, seed), uniform(d.n * d.k, -s, s, seed ^ 1), uniform(d.n, -0.5, 0.5, seed ^ 2))
}

/// Checks `out` (all M·N values) against `reference` on `rows`: every value of those rows is
/// compared; when only a sample of rows has a reference, every other value must still be finite
/// (written, not the NaN poison).
pub(crate) fn verify_rows(v: &Variant, out: &[f32], reference: &[f64], rows: &[usize], d: Dims) -> Verification {
    let n = d.n;
    if rows.len() == d.m {
        return Verification::new(v.tolerance()).add("out", out, reference);
    }
    let sampled: Vec<f32> = rows.iter().flat_map(|&r| out[r * n..(r + 1) * n].iter().copied()).collect();
    let mut ver =
        Verification::new(v.tolerance()).add(&format!("out ({} sampled rows)", rows.len()), &sampled, reference);
    let first_bad = out.iter().position(|x| !x.is_finite());
    ver.outputs.push(ErrorStats {
        output: "out (all rows, written and finite)".into(),
        rel_l2: 0.0,
        max_abs: 0.0,
        non_finite: out.iter().filter(|x| !x.is_finite()).count() + out.len().abs_diff(d.m * n),
        first_non_finite: first_bad,
        count: d.m * n,
    });
    ver
}

pub struct Linear;

impl Op for Linear {
    fn family(&self) -> &'static str {
        FAMILY
    }
    fn name(&self) -> &'static str {
        OP
    }
    fn description(&self) -> &'static str {
        "out[M,N] = inp[M,K] . W[N,K]^T + bias[N] (llm.c layout, fp32 in/out); bias=0 drops the bias"
    }
    fn sources(&self) -> &'static [common::KernelSource] {
        crate::sources()
    }
    fn variants(&self) -> Vec<Variant> {
        stages().into_iter().map(|(v, _)| v).collect()
    }
    fn leave_one_out(&self) -> Vec<Variant> {
        stages().into_iter().flat_map(|(v, _)| v.leave_one_out()).collect()
    }
    fn shape_keys(&self) -> &'static [&'static str] {
        &["M", "N", "K", "bias"]
    }
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2 124M at B·T = 4096: QKV, attention projection, MLP up, MLP down, LM head; and 4096³.
        [(2304, 768), (768, 768), (3072, 768), (768, 3072), (50257, 768), (4096, 4096)]
            .iter()
            .map(|&(n, k)| Shape::new(&[("M", 4096), ("N", n), ("K", k), ("bias", 1)]))
            .collect()
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        let max = i32::MAX as i64;
        bias_flag(shape)?;
        check_shape(v, shape.dim("M", max)?, shape.dim("N", max)?, shape.dim("K", max)?)
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let max = i32::MAX as i64;
        let d = Dims { m: shape.dim("M", max)?, n: shape.dim("N", max)?, k: shape.dim("K", max)? };
        check_dims(d)?;
        let has_bias = bias_flag(shape)?;
        let (x, w, b) = inputs(d, seed);
        let rows = sampled_rows(d.m, d.n, d.k);
        let reference = linear_rows(&x, &w, has_bias.then_some(&b[..]), d.n, d.k, &rows);
        let bytes_per_copy = (4 * (d.m * d.k + d.n * d.k + d.m * d.n)) as u64;
        let copies = rotation_copies(gpu, bytes_per_copy);
        Ok(Box::new(LinearProblem {
            d,
            inp: Rotated::upload(gpu, &x, copies)?,
            w: Rotated::upload(gpu, &w, copies)?,
            bias: if has_bias { Some(gpu.upload(&b)?) } else { None },
            out: Rotated::outputs(gpu, d.m * d.n, copies)?,
            rows,
            reference,
            copies,
            ws: Workspace::new(),
        }))
    }
}

/// The `bias` shape key: 0 or 1.
fn bias_flag(shape: &Shape) -> Result<bool> {
    let b = shape.req("bias")?;
    require(b == 0 || b == 1, "bias is 0 or 1", || format!("bias = {b}"))?;
    Ok(b == 1)
}

struct LinearProblem {
    d: Dims,
    inp: Rotated<f32>,
    w: Rotated<f32>,
    bias: Option<CudaSlice<f32>>,
    out: Rotated<f32>,
    rows: Vec<usize>,
    reference: Vec<f64>,
    copies: usize,
    ws: Workspace,
}

impl Problem for LinearProblem {
    fn workload(&self) -> Workload {
        let (m, n, k) = (self.d.m as u64, self.d.n as u64, self.d.k as u64);
        let nb = if self.bias.is_some() { n } else { 0 };
        // Bound by the fp16 tensor-core rate: the fastest precision any row of this ladder uses.
        Workload {
            bytes: 4 * (m * k + n * k + m * n + nb),
            flops: 2 * m * n * k + if self.bias.is_some() { m * n } else { 0 },
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
        let args = LinearArgs {
            out: self.out.get_mut(copy),
            inp: self.inp.get(copy),
            weight: self.w.get(copy),
            bias: self.bias.as_ref(),
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
