//! LayerNorm forward over the last dimension: `out = (x - mean) * rstd * w + b`, rows = B·T, also
//! writing `mean` and `rstd` per row. Shape keys `rows`, `C` and `out` (the output's bits: 32, the
//! default, or 16: bf16 for a bf16 GEMM to read, stage 7; stages 0-6 store fp32).

use common::check::{checked_rows, gather_rows, Verification};
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, ActMut, ActType, Arg, Bound, Define, Gpu, Launch, LaunchShape, Limit, Op, Precision,
    Prepared as Current, Problem, ResourceUse, Result, RotatedAct, Shape, Variant, Workload,
};
use rayon::prelude::*;

use crate::{FAMILY, SOURCES};

const OP: &str = "layernorm";

common::declare_op! {
    pub struct LayerNorm {
        name: OP,
        description: "LayerNorm forward over C (fp32 math and stats; fp32 or bf16 out), rows = B*T; writes out, mean, rstd",
        shape_keys: ["rows", "C", "out"],
        stages: stages,
    }
}

/// Threads per block of the thread-per-row stages.
const ROW_THREADS: u32 = 256;

/// How a stage maps rows onto the grid (the kernel's side of it lives in the stage's header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// One thread per row, [`ROW_THREADS`] per block; `constant`: weight and bias come from
    /// `__constant__` arrays of `LN_CONST_MAX_C` floats, bound at prepare.
    ThreadPerRow { constant: bool },
    /// One block per row, a thread per element up to 1024, shared-memory tree reductions.
    BlockPerRow,
    /// One warp per row, `LN_WARPS` rows per block.
    WarpPerRow,
    /// One warp per row with the row in registers: entry `layernorm_forward_<N>`.
    WarpPerRowInRegisters,
}

/// The float4-per-lane counts stage 6 is instantiated for (its `LN_ENTRY` list).
const REGISTER_CHUNKS: [usize; 10] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32];

const ELEMS: &str = "rows * C < 2^31";
const CONSTANT_C: &str = "C <= LN_CONST_MAX_C";
const REGISTER_C: &str = "C <= 4096";

fn stages() -> Vec<Variant> {
    let k = |stage, name, file, plan: Plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Fp32, summary).with_plan(plan)
    };
    let row = Plan::ThreadPerRow { constant: false };
    vec![
        k(0, "naive", "layernorm/00_naive.cu", row, "one thread per row; mean, variance, output in three loops over C"),
        k(1, "unrolled", "layernorm/01_unrolled.cu", row, "#pragma unroll 8 on the three C loops")
            .with_tunables(&[("LN_UNROLL", 8)]),
        k(2, "restrict", "layernorm/02_restrict.cu", row, "__restrict__ on every pointer")
            .with_tunables(&[("LN_UNROLL", 8)]),
        k(
            3,
            "constant-memory",
            "layernorm/03_constant_memory.cu",
            Plan::ThreadPerRow { constant: true },
            "weight and bias in __constant__ memory",
        )
        .with_tunables(&[("LN_UNROLL", 8), ("LN_CONST_MAX_C", 7936)]),
        k(
            4,
            "block-reduction",
            "layernorm/04_block_reduction.cu",
            Plan::BlockPerRow,
            "one block per row, coalesced, shared-memory tree sums",
        )
        // The block is C rounded up to a warp, at most LN_BLOCK threads; the report swept 4..1024.
        .with_tunables(&[("LN_BLOCK", 1024)])
        .with_sweep("LN_BLOCK", &[4, 8, 16, 32, 64, 128, 256, 512, 1024]),
        k(
            5,
            "warp-shuffle",
            "layernorm/05_warp_shuffle.cu",
            Plan::WarpPerRow,
            "one warp per row, __shfl_xor_sync sums, no shared memory",
        )
        .with_tunables(&[("LN_WARPS", 8)]),
        k(
            6,
            "single-pass-vectorized",
            "layernorm/06_single_pass_vectorized.cu",
            Plan::WarpPerRowInRegisters,
            "row read once into registers with 16-byte loads, stats from registers, 16-byte streaming stores",
        )
        .with_tunables(&[("LN_WARPS", 4)]),
        Variant::kernel(
            FAMILY,
            OP,
            7,
            "bf16-out",
            "layernorm/06_single_pass_vectorized.cu",
            Precision::Bf16,
            "stage 6 storing bf16 (8-byte stores): 6 bytes an element instead of 8, for a bf16 GEMM",
        )
        .with_plan(Plan::WarpPerRowInRegisters)
        .with_defines(vec![Define::on(OUT_BF16)])
        .with_tunables(&[("LN_WARPS", 4)]),
    ]
}

/// Stage 7's switch of stage 6's file: the output stored as bf16.
const OUT_BF16: &str = "LN_OUT_BF16";
const STORES: &str = "out = 16 for a stage storing bf16 (7), out = 32 for the others (0-6)";

/// The output type stage `v` stores.
fn stores(v: &Variant) -> ActType {
    if v.define(OUT_BF16).is_some() {
        ActType::Bf16
    } else {
        ActType::F32
    }
}

/// The sizes of one LayerNorm call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerNormDims {
    pub rows: usize,
    pub c: usize,
    /// The output's element type.
    pub out: ActType,
}

/// Shape constraints of `v` at `d`: what its header's `Limits:` line documents.
pub fn check_shape(v: &Variant, d: LayerNormDims) -> Result<()> {
    let LayerNormDims { rows, c, out } = d;
    require(out == stores(v), STORES, || format!("out = {} for stage {}", 8 * out.bytes(), v.stage))?;
    require(rows >= 1, "rows >= 1", || format!("rows = {rows}"))?;
    require(c >= 1, "C >= 1", || format!("C = {c}"))?;
    require(rows.checked_mul(c).is_some_and(|n| n < 1 << 31), ELEMS, || format!("rows = {rows}, C = {c}"))?;
    match v.plan::<Plan>()? {
        Plan::ThreadPerRow { constant: true } => {
            let max = v.tunable("LN_CONST_MAX_C")? as usize;
            require(c <= max, CONSTANT_C, || format!("C = {c}, LN_CONST_MAX_C = {max}"))
        }
        // 32 float4 per lane = 128 registers: the one-warp register budget.
        Plan::WarpPerRowInRegisters => require(c <= 4096, REGISTER_C, || format!("C = {c}")),
        _ => Ok(()),
    }
}

/// A LayerNorm stage prepared for one size.
pub struct Prepared {
    launch: Launch,
    d: LayerNormDims,
    /// Stage 3 reads weight and bias from its `__constant__` arrays instead of its arguments.
    constant: bool,
}

/// The buffers of one call; `out` of the prepared type.
pub struct LayerNormArgs<'a> {
    pub out: ActMut<'a>,
    pub mean: &'a mut CudaSlice<f32>,
    pub rstd: &'a mut CudaSlice<f32>,
    pub inp: &'a CudaSlice<f32>,
    /// Read by every stage except the constant-memory one, which reads what
    /// [`Prepared::bind_constant_weights`] bound.
    pub weight: &'a CudaSlice<f32>,
    pub bias: &'a CudaSlice<f32>,
    pub eps: f32,
}

/// Prepares stage `v` for `d` after checking the shape against the stage's limits.
pub fn prepare(gpu: &Gpu, v: &Variant, d: LayerNormDims) -> Result<Prepared> {
    check_shape(v, d)?;
    let plan = v.plan::<Plan>()?;
    let rows = d.rows as u32;
    let (entry, shape) = match plan {
        Plan::ThreadPerRow { .. } => {
            ("layernorm_forward".to_string(), LaunchShape::linear(rows.div_ceil(ROW_THREADS), ROW_THREADS))
        }
        Plan::BlockPerRow => {
            let block = (d.c.div_ceil(32) * 32).min(v.tunable("LN_BLOCK")? as usize) as u32;
            ("layernorm_forward".to_string(), LaunchShape::linear(rows, block).with_shared(block * 4))
        }
        Plan::WarpPerRow => {
            let warps = v.tunable("LN_WARPS")?;
            ("layernorm_forward".to_string(), LaunchShape::linear(rows.div_ceil(warps), 32 * warps))
        }
        Plan::WarpPerRowInRegisters => {
            let warps = v.tunable("LN_WARPS")?;
            let n = REGISTER_CHUNKS.iter().find(|&&n| n * 128 >= d.c).copied().unwrap_or(32);
            (format!("layernorm_forward_{n}"), LaunchShape::linear(rows.div_ceil(warps), 32 * warps))
        }
    };
    let launch = gpu.prepare_launch(&SOURCES, v, &entry, shape)?;
    Ok(Prepared { launch, d, constant: plan == Plan::ThreadPerRow { constant: true } })
}

impl Prepared {
    /// Whether this stage reads weight and bias from constant memory (bind them once first).
    pub fn reads_constant_weights(&self) -> bool {
        self.constant
    }

    /// Copies weight and bias into the constant-memory stage's `__constant__` arrays, which it
    /// reads instead of the `weight`/`bias` arguments (bound once, like model parameters).
    pub fn bind_constant_weights(&self, gpu: &Gpu, v: &Variant, weight: &[f32], bias: &[f32]) -> Result<()> {
        require(self.constant, "a constant-memory stage", || v.id())?;
        require_len("weight", weight.len(), self.d.c)?;
        require_len("bias", bias.len(), self.d.c)?;
        gpu.write_symbol(&SOURCES, v, "ln_weight", weight)?;
        gpu.write_symbol(&SOURCES, v, "ln_bias", bias)
    }

    /// Enqueues the stage on `stream` after checking every buffer length and `eps`.
    pub fn enqueue(&self, stream: &CudaStream, a: LayerNormArgs) -> Result<()> {
        let LayerNormDims { rows, c, out } = self.d;
        require(a.out.ty() == out, "out of the prepared type", || format!("{:?} for {out:?}", a.out.ty()))?;
        require(a.eps.is_finite() && a.eps > 0.0, "eps > 0 and finite", || format!("eps = {}", a.eps))?;
        for (name, len, want) in [
            ("inp", a.inp.len(), rows * c),
            ("out", a.out.len(), rows * c),
            ("weight", a.weight.len(), c),
            ("bias", a.bias.len(), c),
            ("mean", a.mean.len(), rows),
            ("rstd", a.rstd.len(), rows),
        ] {
            require_len(name, len, want)?;
        }
        let (out, mean, rstd, inp) = (Arg::Ptr(a.out.ptr()), Arg::buf(a.mean), Arg::buf(a.rstd), Arg::buf(a.inp));
        let (w, b) = (Arg::buf(a.weight), Arg::buf(a.bias));
        let (rows, c, eps) = (Arg::int(rows), Arg::int(c), Arg::F32(a.eps));
        // SAFETY: the entries take (out, mean, rstd, inp, [weight, bias,] rows, C, eps); lengths were
        // checked above and rows * C < 2^31 at prepare.
        unsafe {
            if self.constant {
                self.launch.enqueue(stream, &[out, mean, rstd, inp, rows, c, eps])
            } else {
                self.launch.enqueue(stream, &[out, mean, rstd, inp, w, b, rows, c, eps])
            }
        }
    }
}

common::single_launch_stage!(Prepared);

/// f64 reference: (out, mean, rstd).
pub fn reference(x: &[f32], w: &[f32], b: &[f32], rows: usize, c: usize, eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; rows * c];
    let stats: Vec<(f64, f64)> = out
        .par_chunks_mut(c)
        .zip(x.par_chunks(c))
        .map(|(o, xr)| {
            let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
            let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / c as f64;
            let rstd = 1.0 / (var + eps).sqrt();
            for i in 0..c {
                o[i] = (xr[i] as f64 - mean) * rstd * w[i] as f64 + b[i] as f64;
            }
            (mean, rstd)
        })
        .collect();
    let (mean, rstd) = stats.into_iter().unzip();
    (out, mean, rstd)
}

const EPS: f32 = 1e-5;

fn shape(rows: i64, c: i64) -> Shape {
    Shape::new(&[("rows", rows), ("C", c)])
}

/// [`shape`] storing bf16 (`out` = 16).
fn shape_bf16_out(rows: i64, c: i64) -> Shape {
    Shape::new(&[("rows", rows), ("C", c), ("out", 16)])
}

fn dims(shape: &Shape) -> Result<LayerNormDims> {
    Ok(LayerNormDims {
        rows: shape.dim("rows", i32::MAX as i64)?,
        c: shape.dim("C", i32::MAX as i64)?,
        out: ActType::from_key(shape, "out")?,
    })
}

impl Op for LayerNorm {
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2's B·T = 4096 rows and a wide model's, storing fp32 (stages 0-6) and bf16 (stage 7).
        vec![shape(4096, 768), shape(32768, 4096), shape_bf16_out(4096, 768), shape_bf16_out(32768, 4096)]
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        check_shape(v, dims(shape)?)
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        // Each limit at the output type the stage stores.
        let shape = |rows, c| if stores(v) == ActType::Bf16 { shape_bf16_out(rows, c) } else { shape(rows, c) };
        let mut limits = vec![Limit { constraint: ELEMS, past: shape(1 << 20, 2048), inside: None }];
        match v.plan::<Plan>() {
            Ok(Plan::ThreadPerRow { constant: true }) => {
                let max = v.tunable("LN_CONST_MAX_C").unwrap_or(0) as i64;
                limits.push(Limit { constraint: CONSTANT_C, past: shape(3, max + 1), inside: Some(shape(3, max)) });
            }
            Ok(Plan::WarpPerRowInRegisters) => {
                limits.push(Limit { constraint: REGISTER_C, past: shape(3, 4097), inside: Some(shape(3, 4096)) })
            }
            _ => {}
        }
        limits
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let d = dims(shape)?;
        let LayerNormDims { rows, c, out } = d;
        require(rows.checked_mul(c).is_some_and(|n| n < 1 << 31), ELEMS, || format!("rows = {rows}, C = {c}"))?;
        // Inputs with a non-zero mean and spread, so mean subtraction matters.
        let x = uniform(rows * c, -2.0, 3.0, seed);
        let w = uniform(c, 0.5, 1.5, seed ^ 1);
        let b = uniform(c, -0.5, 0.5, seed ^ 2);
        let checked = checked_rows(rows, c, seed ^ 4);
        let reference = reference(&gather_rows(&x, c, &checked), &w, &b, checked.len(), c, EPS as f64);
        let bytes_per_copy = ((rows * c + 2 * rows) * 4 + rows * c * out.bytes()) as u64;
        let copies = rotation_copies(gpu, bytes_per_copy);
        Ok(Box::new(LayerNormProblem {
            d,
            x: Rotated::upload(gpu, &x, copies)?,
            w_dev: gpu.upload(&w)?,
            b_dev: gpu.upload(&b)?,
            w,
            b,
            out: RotatedAct::outputs(gpu, out, rows * c, copies)?,
            mean: Rotated::outputs(gpu, rows, copies)?,
            rstd: Rotated::outputs(gpu, rows, copies)?,
            checked,
            reference,
            copies,
            prepared: Current::default(),
        }))
    }
}

struct LayerNormProblem {
    d: LayerNormDims,
    x: Rotated<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
    w_dev: CudaSlice<f32>,
    b_dev: CudaSlice<f32>,
    out: RotatedAct,
    mean: Rotated<f32>,
    rstd: Rotated<f32>,
    /// The rows compared with the reference ([`checked_rows`]), and their reference.
    checked: Vec<usize>,
    reference: (Vec<f64>, Vec<f64>, Vec<f64>),
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for LayerNormProblem {
    fn workload(&self) -> Workload {
        let (r, c, out) = (self.d.rows as u64, self.d.c as u64, self.d.out.bytes() as u64);
        // x read once, out written once, w/b read once, mean/rstd written; ~8 flops per element.
        Workload { bytes: 4 * (r * c + 2 * c + 2 * r) + out * r * c, flops: 8 * r * c, bound: Bound::Memory }
    }
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)?;
        self.mean.poison(gpu)?;
        self.rstd.poison(gpu)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        let p = prepare(gpu, v, self.d)?;
        if p.reads_constant_weights() {
            p.bind_constant_weights(gpu, v, &self.w, &self.b)?;
        }
        Ok(self.prepared.set(v, p))
    }
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        p.enqueue(
            stream,
            LayerNormArgs {
                out: self.out.get_mut(copy),
                mean: self.mean.get_mut(copy),
                rstd: self.rstd.get_mut(copy),
                inp: self.x.get(copy),
                weight: &self.w_dev,
                bias: &self.b_dev,
                eps: EPS,
            },
        )
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        let (rows, c, checked) = (self.d.rows, self.d.c, &self.checked[..]);
        let (mean, rstd) = (self.mean.get(copy), self.rstd.get(copy));
        let ver = Verification::new(v.tolerance());
        self.out
            .add_device_rows(ver, gpu, "out", copy, (rows, c), checked, &self.reference.0)?
            .add_device_rows(gpu, "mean", &mean.as_view(), (rows, 1), checked, &self.reference.1)?
            .add_device_rows(gpu, "rstd", &rstd.as_view(), (rows, 1), checked, &self.reference.2)
    }
}
