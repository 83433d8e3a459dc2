//! LayerNorm forward over the last dimension: `out = (x - mean) * rstd * w + b`, rows = B·T, also
//! writing `mean` and `rstd` per row.

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, PushKernelArg};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, Bound, Define, DriverContext, Error, Gpu, LaunchShape, Op, Precision, Problem, Result, Shape, Variant,
    Workload,
};
use rayon::prelude::*;

use crate::FAMILY;

const OP: &str = "layernorm";

/// How a stage maps rows onto the grid (the kernel's side of it lives in the stage's header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// One thread per row, 256 per block; `constant`: weight and bias come from `__constant__`.
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
/// Floats of weight (and of bias) that fit stage 3's `__constant__` arrays.
pub const CONSTANT_MAX_C: usize = 7936;

static UNROLL: [Define; 1] = [Define::new("LN_UNROLL", "8")];
static WARPS8: [Define; 1] = [Define::new("LN_WARPS", "8")];
static WARPS4: [Define; 1] = [Define::new("LN_WARPS", "4")];

fn stages() -> Vec<(Variant, Plan)> {
    let k = |stage, name, file, summary| Variant::kernel(FAMILY, OP, stage, name, file, Precision::Fp32, summary);
    vec![
        (
            k(0, "naive", "layernorm/00_naive.cu", "one thread per row; mean, variance, output in three loops over C"),
            Plan::ThreadPerRow { constant: false },
        ),
        (
            k(1, "unrolled", "layernorm/01_unrolled.cu", "#pragma unroll 8 on the three C loops").with_defines(&UNROLL),
            Plan::ThreadPerRow { constant: false },
        ),
        (
            k(2, "restrict", "layernorm/02_restrict.cu", "__restrict__ on every pointer").with_defines(&UNROLL),
            Plan::ThreadPerRow { constant: false },
        ),
        (
            k(3, "constant-memory", "layernorm/03_constant_memory.cu", "weight and bias in __constant__ memory")
                .with_defines(&UNROLL),
            Plan::ThreadPerRow { constant: true },
        ),
        (
            k(
                4,
                "block-reduction",
                "layernorm/04_block_reduction.cu",
                "one block per row, coalesced, shared-memory tree sums",
            ),
            Plan::BlockPerRow,
        ),
        (
            k(
                5,
                "warp-shuffle",
                "layernorm/05_warp_shuffle.cu",
                "one warp per row, __shfl_xor_sync sums, no shared memory",
            )
            .with_defines(&WARPS8),
            Plan::WarpPerRow,
        ),
        (
            k(
                6,
                "single-pass-vectorized",
                "layernorm/06_single_pass_vectorized.cu",
                "row read once into registers with 16-byte loads, stats from registers, 16-byte streaming stores",
            )
            .with_defines(&WARPS4),
            Plan::WarpPerRowInRegisters,
        ),
    ]
}

fn plan(v: &Variant) -> Result<Plan> {
    stages().into_iter().find(|(s, _)| s.name == v.name && s.stage == v.stage).map(|(_, p)| p).ok_or_else(|| {
        Error::Unknown {
            what: "layernorm stage",
            name: v.name.to_string(),
            known: stages().iter().map(|(s, _)| s.name.to_string()).collect::<Vec<_>>().join(", "),
        }
    })
}

/// Rows per block of the warp-per-row stages, from the define that the kernel is compiled with.
fn warps_per_block(v: &Variant) -> Result<u32> {
    v.define("LN_WARPS").and_then(|w| w.parse().ok()).ok_or_else(|| Error::constraint("stage defines LN_WARPS", v.id()))
}

/// The buffers of one LayerNorm call.
pub struct LayerNormArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub mean: &'a mut CudaSlice<f32>,
    pub rstd: &'a mut CudaSlice<f32>,
    pub inp: &'a CudaSlice<f32>,
    pub weight: &'a CudaSlice<f32>,
    pub bias: &'a CudaSlice<f32>,
    pub rows: usize,
    pub c: usize,
    pub eps: f32,
}

/// Shape constraints of `v` at `rows` × `c`.
pub fn check_shape(v: &Variant, rows: usize, c: usize) -> Result<()> {
    require(rows >= 1, "rows >= 1", || format!("rows = {rows}"))?;
    require(c >= 1, "C >= 1", || format!("C = {c}"))?;
    require(rows.saturating_mul(c) < i32::MAX as usize, "rows * C < 2^31", || format!("rows * C = {}", rows * c))?;
    match plan(v)? {
        Plan::ThreadPerRow { constant: true } => {
            require(c <= CONSTANT_MAX_C, "C <= 7936 (weight and bias in 64 KB of constant memory)", || {
                format!("C = {c}")
            })
        }
        Plan::WarpPerRowInRegisters => {
            require(c <= 4096, "C <= 4096 (one warp holds the row in 128 registers per lane)", || format!("C = {c}"))
        }
        _ => Ok(()),
    }
}

/// Copies weight and bias into stage 3's `__constant__` arrays; the stage reads them from there
/// instead of from the `weight`/`bias` buffers (they are bound once, like model parameters).
pub fn bind_constant_weights(gpu: &Gpu, v: &Variant, weight: &[f32], bias: &[f32]) -> Result<()> {
    require(weight.len() == bias.len(), "len(weight) == len(bias)", || format!("{} vs {}", weight.len(), bias.len()))?;
    require(weight.len() <= CONSTANT_MAX_C, "C <= 7936 (constant memory)", || format!("C = {}", weight.len()))?;
    gpu.write_symbol(crate::sources(), v, "ln_weight", weight)?;
    gpu.write_symbol(crate::sources(), v, "ln_bias", bias)
}

/// Launches stage `v` of LayerNorm after checking the shape, the buffer lengths and `eps`.
pub fn forward(gpu: &Gpu, v: &Variant, a: LayerNormArgs) -> Result<()> {
    let (rows, c) = (a.rows, a.c);
    check_shape(v, rows, c)?;
    require(a.eps.is_finite() && a.eps > 0.0, "eps > 0 and finite", || format!("eps = {}", a.eps))?;
    for (name, len, want) in [
        ("inp", a.inp.len(), rows * c),
        ("out", a.out.len(), rows * c),
        ("weight", a.weight.len(), c),
        ("bias", a.bias.len(), c),
        ("mean", a.mean.len(), rows),
        ("rstd", a.rstd.len(), rows),
    ] {
        require(len == want, &format!("len({name}) == {want}"), || format!("len({name}) = {len}"))?;
    }
    let plan = plan(v)?;
    let rows_u = rows as u32;
    let (entry, shape) = match plan {
        Plan::ThreadPerRow { .. } => ("layernorm_forward".to_string(), LaunchShape::linear(rows_u.div_ceil(256), 256)),
        Plan::BlockPerRow => {
            let block = (c.div_ceil(32) * 32).min(1024) as u32;
            ("layernorm_forward".to_string(), LaunchShape::linear(rows_u, block).with_shared(block * 4))
        }
        Plan::WarpPerRow | Plan::WarpPerRowInRegisters => {
            let warps = warps_per_block(v)?;
            let entry = if plan == Plan::WarpPerRow {
                "layernorm_forward".to_string()
            } else {
                let n = REGISTER_CHUNKS.iter().find(|&&n| n * 128 >= c).copied().unwrap_or(32);
                format!("layernorm_forward_{n}")
            };
            (entry, LaunchShape::linear(rows_u.div_ceil(warps), 32 * warps))
        }
    };
    let kernel = gpu.kernel(crate::sources(), v, &entry)?;
    let cfg = kernel.config(gpu, shape)?;
    let (rows_i, c_i) = (rows as i32, c as i32);
    let mut b = gpu.stream().launch_builder(kernel.function());
    b.arg(a.out).arg(a.mean).arg(a.rstd).arg(a.inp);
    if plan != (Plan::ThreadPerRow { constant: true }) {
        b.arg(a.weight).arg(a.bias);
    }
    b.arg(&rows_i).arg(&c_i).arg(&a.eps);
    // SAFETY: the argument list matches the stage's kernel signature; lengths were checked above.
    unsafe { b.launch(cfg) }.map(|_| ()).ctx("launch layernorm_forward")
}

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

pub struct LayerNorm;

const EPS: f32 = 1e-5;

impl Op for LayerNorm {
    fn family(&self) -> &'static str {
        FAMILY
    }
    fn name(&self) -> &'static str {
        OP
    }
    fn description(&self) -> &'static str {
        "LayerNorm forward over C (fp32), rows = B*T; writes out, mean, rstd"
    }
    fn sources(&self) -> &'static [common::KernelSource] {
        crate::sources()
    }
    fn variants(&self) -> Vec<Variant> {
        stages().into_iter().map(|(v, _)| v).collect()
    }
    fn shape_keys(&self) -> &'static [&'static str] {
        &["rows", "C"]
    }
    fn default_shapes(&self) -> Vec<Shape> {
        vec![Shape::new(&[("rows", 4096), ("C", 768)]), Shape::new(&[("rows", 32768), ("C", 4096)])]
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        check_shape(v, shape.dim("rows", i32::MAX as i64)?, shape.dim("C", i32::MAX as i64)?)
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let rows = shape.dim("rows", i32::MAX as i64)?;
        let c = shape.dim("C", i32::MAX as i64)?;
        require(rows.saturating_mul(c) < i32::MAX as usize, "rows * C < 2^31", || format!("rows * C = {}", rows * c))?;
        // Inputs with a non-zero mean and spread, so mean subtraction matters.
        let x = uniform(rows * c, -2.0, 3.0, seed);
        let w = uniform(c, 0.5, 1.5, seed ^ 1);
        let b = uniform(c, -0.5, 0.5, seed ^ 2);
        let reference = reference(&x, &w, &b, rows, c, EPS as f64);
        let bytes_per_copy = ((2 * rows * c + 2 * rows) * 4) as u64;
        let copies = rotation_copies(gpu, bytes_per_copy);
        Ok(Box::new(LayerNormProblem {
            rows,
            c,
            x: Rotated::upload(gpu, &x, copies)?,
            w_dev: gpu.upload(&w)?,
            b_dev: gpu.upload(&b)?,
            w,
            b,
            bound_constant: Vec::new(),
            out: Rotated::outputs(gpu, rows * c, copies)?,
            mean: Rotated::outputs(gpu, rows, copies)?,
            rstd: Rotated::outputs(gpu, rows, copies)?,
            reference,
            copies,
        }))
    }
}

struct LayerNormProblem {
    rows: usize,
    c: usize,
    x: Rotated<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
    w_dev: CudaSlice<f32>,
    b_dev: CudaSlice<f32>,
    /// Variants whose `__constant__` weights hold this problem's w and b.
    bound_constant: Vec<String>,
    out: Rotated<f32>,
    mean: Rotated<f32>,
    rstd: Rotated<f32>,
    reference: (Vec<f64>, Vec<f64>, Vec<f64>),
    copies: usize,
}

impl Problem for LayerNormProblem {
    fn workload(&self) -> Workload {
        let (r, c) = (self.rows as u64, self.c as u64);
        // x read once, out written once, w/b read once, mean/rstd written; ~8 flops per element.
        Workload { bytes: 4 * (2 * r * c + 2 * c + 2 * r), flops: 8 * r * c, bound: Bound::Memory }
    }
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)?;
        self.mean.poison(gpu)?;
        self.rstd.poison(gpu)
    }
    fn launch(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<()> {
        if plan(v)? == (Plan::ThreadPerRow { constant: true }) && !self.bound_constant.contains(&v.id()) {
            bind_constant_weights(gpu, v, &self.w, &self.b)?;
            self.bound_constant.push(v.id());
        }
        forward(
            gpu,
            v,
            LayerNormArgs {
                out: self.out.get_mut(copy),
                mean: self.mean.get_mut(copy),
                rstd: self.rstd.get_mut(copy),
                inp: self.x.get(copy),
                weight: &self.w_dev,
                bias: &self.b_dev,
                rows: self.rows,
                c: self.c,
                eps: EPS,
            },
        )
    }
    fn verify(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<Verification> {
        Ok(Verification::new(v.tolerance())
            .add("out", &gpu.download(self.out.get(copy))?, &self.reference.0)
            .add("mean", &gpu.download(self.mean.get(copy))?, &self.reference.1)
            .add("rstd", &gpu.download(self.rstd.get(copy))?, &self.reference.2))
    }
}
