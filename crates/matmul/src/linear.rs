//! The linear layer `out[M,N] = inp[M,K] · W[N,K]ᵀ (+ bias[N])`, fp32 in and out: the report's
//! ladder from the naive kernel to WMMA milestone 3, beside cuBLAS.

use common::blas::GemmPrecision;
use common::check::{Element, SampledRows, Verification};
use common::cudarc::driver::{CudaSlice, CudaStream, CudaView};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, Define, Error, Gpu, Launch, LaunchShape, Limit, Op, Precision,
    Prepared as Current, PreparedStage, Problem, Requirements, ResourceUse, Result, Shape, Variant, Workload,
};

use crate::gemm::{check_dims, check_gemm, gemm_limits, Cublas, Dims, Gemm, Ptrs, Wmma, M3_TUNABLES};
use crate::reference::{linear_rows, sampled_rows};
use crate::{FAMILY, SOURCES};

const OP: &str = "linear";

common::declare_op! {
    pub struct Linear {
        name: OP,
        description: "out[M,N] = inp[M,K] . W[N,K]^T + bias[N] (llm.c layout, fp32 in/out); bias=0 drops the bias",
        shape_keys: ["M", "N", "K", "bias"],
        stages: stages,
    }
}

/// The cumulative switches of stage 4 (leave-one-out removes each in turn).
pub(crate) const M3_TOGGLES: &[&str] = &["LAUNCH_BOUNDS", "DOUBLE_BUFFER", "FUSED_PREP", "BLOCK_TILE"];
pub(crate) static M3_DEFINES: [Define; 4] =
    [Define::on("LAUNCH_BOUNDS"), Define::on("DOUBLE_BUFFER"), Define::on("FUSED_PREP"), Define::on("BLOCK_TILE")];

fn stages() -> Vec<Variant> {
    let k = |stage, name, file, p, g: Gemm, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, p, summary).with_plan(g)
    };
    let lib = |stage, name, library, p, summary| {
        Variant::library(FAMILY, OP, stage, name, library, p, summary)
            .with_plan(Gemm::Cublas(gemm_precision(p)))
            // The helper kernels' block (bias add, fp16 conversions): the report swept its "prepare
            // out" and conversion kernels over 4..1024 threads.
            .with_tunables(&[("AUX_THREADS", 256)])
            .with_sweep("AUX_THREADS", &[4, 8, 16, 32, 64, 128, 256, 512, 1024])
    };
    vec![
        k(0, "naive", "linear/00_naive.cu", Precision::Fp32, Gemm::Naive, "one thread per output, loop over K from global memory"),
        k(1, "smem-tiled", "linear/01_smem_tiled.cu", Precision::Fp32, Gemm::SmemTiled, "32x32 shared-memory tiles of inp and W")
            .with_tunables(&[("MM_TILE", 32)]),
        k(
            2,
            "register-tiled",
            "linear/02_register_tiled.cu",
            Precision::Fp32,
            Gemm::RegisterTiled,
            "128x128 block tile, 8x8 register tile per thread, 16-byte loads",
        )
        .with_tunables(&[("MM_RT_TILE", 128)]),
        k(
            3,
            "wmma-m2",
            "linear/03_wmma_m2.cu",
            Precision::Fp16,
            Gemm::WmmaM2,
            "fp16 WMMA, one warp per 16x16 tile; separate transpose and convert kernels, padding to 16",
        )
        .with_requirements(Requirements::SM80),
        k(
            4,
            "wmma-m3",
            "linear/04_wmma_m3.cu",
            Precision::Fp16,
            Gemm::WmmaM3,
            "128x128 block tile of 8 warps (4 along N), 4x2 WMMA tiles per warp, cp.async 3-stage smem pipeline, launch bounds, fused transpose+convert",
        )
        .with_defines(&M3_DEFINES[..])
        .with_tunables(&M3_TUNABLES)
        .with_toggles(M3_TOGGLES)
        .with_requirements(Requirements::SM80),
        lib(90, "cublas-fp32", "cublasGemmEx fp32 + bias kernel", Precision::Fp32, "cuBLAS fp32 (FFMA), bias added by a kernel"),
        lib(91, "cublas-tf32", "cublasGemmEx TF32 + bias kernel", Precision::Tf32, "cuBLAS TF32 tensor cores, bias added by a kernel"),
        lib(
            92,
            "cublas-fp16",
            "fp16 convert + cublasGemmEx fp16 + fp32/bias kernel",
            Precision::Fp16,
            "cuBLAS fp16 tensor cores; operand conversion and fp16->fp32+bias pass timed",
        ),
    ]
}

/// The cuBLAS precision of a library row of this precision.
fn gemm_precision(p: Precision) -> GemmPrecision {
    match p {
        Precision::Fp32 => GemmPrecision::Fp32,
        Precision::Tf32 => GemmPrecision::Tf32,
        _ => GemmPrecision::Fp16,
    }
}

/// The sizes of one linear call, and whether it adds a bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearDims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub bias: bool,
}

impl LinearDims {
    fn gemm(self) -> Dims {
        Dims { m: self.m, n: self.n, k: self.k }
    }
}

/// Shape constraints of `v` at `d`: what its header's `Limits:` line documents.
pub fn check_shape(v: &Variant, d: LinearDims) -> Result<()> {
    check_gemm(v, v.plan::<Gemm>()?, d.gemm())
}

/// How a prepared stage runs.
enum Stage {
    /// One kernel on the fp32 operands: (out, inp, w, bias, M, N, K).
    Direct(Launch),
    Wmma(Wmma),
    Cublas(Cublas),
}

/// A linear stage prepared for one size: its kernels, scratch buffers and library handles.
pub struct Prepared {
    stage: Stage,
    d: LinearDims,
}

/// The buffers of one linear call (row-major): `out` M·N, `inp` M·K, `weight` N·K, `bias` N
/// (present exactly when the stage was prepared with `bias`).
pub struct LinearArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub inp: &'a CudaSlice<f32>,
    pub weight: &'a CudaSlice<f32>,
    pub bias: Option<&'a CudaSlice<f32>>,
}

/// Prepares stage `v` for `d`: checks the shape, compiles and configures its kernels, allocates its
/// scratch and creates its library handle.
pub fn prepare(gpu: &Gpu, v: &Variant, d: LinearDims) -> Result<Prepared> {
    gpu.supports(v)?;
    check_shape(v, d)?;
    let g = v.plan::<Gemm>()?;
    let dims = d.gemm();
    let direct = |entry: &str, tile: u32, block: (u32, u32, u32)| -> Result<Stage> {
        let grid = ((d.n as u32).div_ceil(tile), (d.m as u32).div_ceil(tile), 1);
        Ok(Stage::Direct(gpu.prepare_launch(&SOURCES, v, entry, LaunchShape::new(grid, block))?))
    };
    let stage = match g {
        Gemm::Naive => direct("linear_naive", 16, (16, 16, 1))?,
        Gemm::SmemTiled => {
            let tile = v.tunable("MM_TILE")?;
            direct("linear_smem_tiled", tile, (tile, tile, 1))?
        }
        Gemm::RegisterTiled => {
            let tile = v.tunable("MM_RT_TILE")?;
            direct("linear_register_tiled", tile, (2 * tile, 1, 1))?
        }
        Gemm::WmmaM2 => Stage::Wmma(Wmma::prepare(gpu, v, dims, false, "linear_wmma_m2")?),
        Gemm::WmmaM3 => Stage::Wmma(Wmma::prepare(gpu, v, dims, true, "linear_wmma_m3")?),
        Gemm::Cublas(p) => Stage::Cublas(Cublas::prepare(gpu, p, dims, v.tunable("AUX_THREADS")?)?),
    };
    Ok(Prepared { stage, d })
}

impl Prepared {
    /// Enqueues the stage on `stream` after checking every buffer length.
    pub fn enqueue(&self, stream: &CudaStream, a: LinearArgs) -> Result<()> {
        let d = self.d;
        require_len("inp", a.inp.len(), d.m * d.k)?;
        require_len("weight", a.weight.len(), d.n * d.k)?;
        require_len("out", a.out.len(), d.m * d.n)?;
        match a.bias {
            Some(b) if d.bias => require_len("bias", b.len(), d.n)?,
            None if !d.bias => {}
            _ => {
                return Err(Error::constraint(format!("a bias exactly when prepared with bias = {}", d.bias), "other"))
            }
        }
        let p = Ptrs {
            out: common::device_ptr(a.out),
            inp: common::device_ptr(a.inp),
            w: common::device_ptr(a.weight),
            bias: a.bias.map_or(0, common::device_ptr),
            residual: 0,
        };
        let (m, n, k) = (Arg::int(d.m), Arg::int(d.n), Arg::int(d.k));
        // SAFETY: every buffer's length was checked against the prepared sizes, which satisfy the
        // stage's limits; the direct kernels take (out, inp, w, bias, M, N, K).
        unsafe {
            match &self.stage {
                Stage::Direct(l) => {
                    l.enqueue(stream, &[Arg::Ptr(p.out), Arg::Ptr(p.inp), Arg::Ptr(p.w), Arg::Ptr(p.bias), m, n, k])
                }
                Stage::Wmma(w) => w.enqueue(stream, p),
                Stage::Cublas(c) => c.enqueue(stream, p),
            }
        }
    }
}

impl PreparedStage for Prepared {
    fn resources(&self) -> Vec<ResourceUse> {
        let launches = match &self.stage {
            Stage::Direct(l) => vec![l],
            Stage::Wmma(w) => w.launches(),
            Stage::Cublas(c) => c.launches(),
        };
        launches.into_iter().map(|l| l.resources().clone()).collect()
    }
}

/// Inputs of one problem: inp uniform(−1, 1), W uniform(−1, 1)/√K (outputs of order 1, far from
/// fp16 overflow), bias uniform(−0.5, 0.5).
pub(crate) fn inputs(d: Dims, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let s = 1.0 / (d.k as f32).sqrt();
    (uniform(d.m * d.k, -1.0, 1.0, seed), uniform(d.n * d.k, -s, s, seed ^ 1), uniform(d.n, -0.5, 0.5, seed ^ 2))
}

/// Checks `out` (all M·N values, on the device) against `sample`: its rows are copied back and
/// compared, relative to a tail's magnitudes where it has them ([`crate::reference::magnitude_rows`]);
/// when they are only a sample, every other value must still be finite (written, not the NaN
/// poison), which the device counts.
pub(crate) fn verify_sample<T: Element>(
    gpu: &Gpu,
    v: &Variant,
    out: &CudaView<T>,
    sample: &SampledRows,
    d: Dims,
) -> Result<Verification> {
    Verification::new(v.tolerance()).add_sampled(gpu, "out", out, (d.m, d.n), sample)
}

fn shape(m: i64, n: i64, k: i64, bias: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("bias", bias)])
}

fn dims(shape: &Shape) -> Result<LinearDims> {
    let max = i32::MAX as i64;
    let b = shape.req("bias")?;
    require(b == 0 || b == 1, "bias is 0 or 1", || format!("bias = {b}"))?;
    Ok(LinearDims { m: shape.dim("M", max)?, n: shape.dim("N", max)?, k: shape.dim("K", max)?, bias: b == 1 })
}

impl Op for Linear {
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2 124M at B·T = 4096: QKV, attention projection, MLP up, MLP down, LM head; and 4096³.
        [(2304, 768), (768, 768), (3072, 768), (768, 3072), (50257, 768), (4096, 4096)]
            .iter()
            .map(|&(n, k)| shape(4096, n, k, 1))
            .collect()
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        check_shape(v, dims(shape)?)
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        v.plan::<Gemm>().map(|g| gemm_limits(v, g, |m, n, k| shape(m, n, k, 1))).unwrap_or_default()
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let ld = dims(shape)?;
        let d = ld.gemm();
        check_dims(d)?;
        let (x, w, b) = inputs(d, seed);
        let rows = sampled_rows(d.m, d.n, d.k, seed ^ 4);
        let reference = linear_rows(&x, &w, ld.bias.then_some(&b[..]), d.n, d.k, &rows);
        let bytes_per_copy = (4 * (d.m * d.k + d.n * d.k + d.m * d.n)) as u64;
        let copies = rotation_copies(gpu, bytes_per_copy);
        Ok(Box::new(LinearProblem {
            d: ld,
            inp: Rotated::upload(gpu, &x, copies)?,
            w: Rotated::upload(gpu, &w, copies)?,
            bias: if ld.bias { Some(gpu.upload(&b)?) } else { None },
            out: Rotated::outputs(gpu, d.m * d.n, copies)?,
            sample: SampledRows { rows, reference, magnitude: None },
            copies,
            prepared: Current::default(),
        }))
    }
}

struct LinearProblem {
    d: LinearDims,
    inp: Rotated<f32>,
    w: Rotated<f32>,
    bias: Option<CudaSlice<f32>>,
    out: Rotated<f32>,
    sample: SampledRows,
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for LinearProblem {
    fn workload(&self) -> Workload {
        let (m, n, k) = (self.d.m as u64, self.d.n as u64, self.d.k as u64);
        let nb = if self.d.bias { n } else { 0 };
        // Bound by the fp16 tensor-core rate: the fastest precision any row of this ladder uses.
        Workload {
            bytes: 4 * (m * k + n * k + m * n + nb),
            flops: 2 * m * n * k + if self.d.bias { m * n } else { 0 },
            bound: Bound::Compute(Precision::Fp16),
        }
    }
    common::problem_plumbing!(out);
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let args = LinearArgs {
            out: self.out.get_mut(copy),
            inp: self.inp.get(copy),
            weight: self.w.get(copy),
            bias: self.bias.as_ref(),
        };
        p.enqueue(stream, args)
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        verify_sample(gpu, v, &self.out.get(copy).as_view(), &self.sample, self.d.gemm())
    }
}
