//! Row softmax as attention uses it: rows = B·NH·T of length T, scaled by `inv_temperature`, with an
//! optional causal mask (row r sits at position r % T and sees columns 0..=r % T; the rest are 0).

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, PushKernelArg};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, Bound, Define, DriverContext, Error, Gpu, LaunchShape, Op, Precision, Problem, Result, Shape, Variant,
    Workload,
};
use rayon::prelude::*;

use crate::FAMILY;

const OP: &str = "softmax";

/// The attention scale 1/sqrt(64) of GPT-2's head size, used by the problems.
pub const INV_TEMPERATURE: f32 = 0.125;

/// How a stage maps rows onto the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// One thread per row, 256 per block.
    ThreadPerRow,
    /// One block per row, a thread per element up to 1024, shared-memory tree reductions.
    BlockPerRow,
    /// One warp per row, `SM_WARPS` rows per block.
    WarpPerRow,
    /// One block of `SM_THREADS` per row with the row in registers: entry `softmax_forward_<N>`.
    BlockPerRowInRegisters,
}

/// The float4-per-thread counts stage 4 is instantiated for (its `SM_ENTRY` list).
const REGISTER_CHUNKS: [usize; 4] = [1, 2, 4, 8];

static WARPS8: [Define; 1] = [Define::new("SM_WARPS", "8")];
static WARPS4: [Define; 1] = [Define::new("SM_WARPS", "4")];
static THREADS256: [Define; 1] = [Define::new("SM_THREADS", "256")];

fn stages() -> Vec<(Variant, Plan)> {
    let k = |stage, name, file, summary| Variant::kernel(FAMILY, OP, stage, name, file, Precision::Fp32, summary);
    vec![
        (
            k(0, "naive", "softmax/00_naive.cu", "one thread per row; max, sum, normalise in three loops"),
            Plan::ThreadPerRow,
        ),
        (
            k(
                1,
                "block-reduction",
                "softmax/01_block_reduction.cu",
                "one block per row, shared-memory tree max and sum",
            ),
            Plan::BlockPerRow,
        ),
        (
            k(2, "warp-shuffle", "softmax/02_warp_shuffle.cu", "one warp per row, shuffle max and sum")
                .with_defines(&WARPS8),
            Plan::WarpPerRow,
        ),
        (
            k(3, "online", "softmax/03_online.cu", "max and sum in one online pass, 16-byte loads and stores")
                .with_defines(&WARPS4),
            Plan::WarpPerRow,
        ),
        (
            k(
                4,
                "register-resident",
                "softmax/04_register_resident.cu",
                "block per row holds the row in registers: one read, one write per element",
            )
            .with_defines(&THREADS256),
            Plan::BlockPerRowInRegisters,
        ),
    ]
}

fn plan(v: &Variant) -> Result<Plan> {
    stages().into_iter().find(|(s, _)| s.name == v.name && s.stage == v.stage).map(|(_, p)| p).ok_or_else(|| {
        Error::Unknown {
            what: "softmax stage",
            name: v.name.to_string(),
            known: stages().iter().map(|(s, _)| s.name.to_string()).collect::<Vec<_>>().join(", "),
        }
    })
}

fn define_u32(v: &Variant, name: &str) -> Result<u32> {
    v.define(name)
        .and_then(|w| w.parse().ok())
        .ok_or_else(|| Error::constraint(format!("stage defines {name}"), v.id()))
}

pub struct SoftmaxArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub inp: &'a CudaSlice<f32>,
    pub rows: usize,
    pub t: usize,
    pub inv_temperature: f32,
    pub causal: bool,
}

pub fn check_shape(v: &Variant, rows: usize, t: usize, causal: bool) -> Result<()> {
    require(rows >= 1, "rows >= 1", || format!("rows = {rows}"))?;
    require(t >= 1, "T >= 1", || format!("T = {t}"))?;
    require(rows.saturating_mul(t) < i32::MAX as usize, "rows * T < 2^31", || format!("rows * T = {}", rows * t))?;
    require(!causal || rows.is_multiple_of(t), "causal rows come in blocks of T (rows % T == 0)", || {
        format!("rows = {rows}, T = {t}")
    })?;
    plan(v).map(|_| ())
}

pub fn forward(gpu: &Gpu, v: &Variant, a: SoftmaxArgs) -> Result<()> {
    let (rows, t) = (a.rows, a.t);
    check_shape(v, rows, t, a.causal)?;
    require(a.inv_temperature.is_finite() && a.inv_temperature > 0.0, "inv_temperature > 0 and finite", || {
        format!("inv_temperature = {}", a.inv_temperature)
    })?;
    require(a.inp.len() == rows * t, &format!("len(inp) == {}", rows * t), || format!("len(inp) = {}", a.inp.len()))?;
    require(a.out.len() == rows * t, &format!("len(out) == {}", rows * t), || format!("len(out) = {}", a.out.len()))?;
    let rows_u = rows as u32;
    let (entry, shape) = match plan(v)? {
        Plan::ThreadPerRow => ("softmax_forward".to_string(), LaunchShape::linear(rows_u.div_ceil(256), 256)),
        Plan::BlockPerRow => {
            let block = (t.div_ceil(32) * 32).min(1024) as u32;
            ("softmax_forward".to_string(), LaunchShape::linear(rows_u, block).with_shared(block * 4))
        }
        Plan::WarpPerRow => {
            let warps = define_u32(v, "SM_WARPS")?;
            ("softmax_forward".to_string(), LaunchShape::linear(rows_u.div_ceil(warps), 32 * warps))
        }
        Plan::BlockPerRowInRegisters => {
            let threads = define_u32(v, "SM_THREADS")?;
            let n = REGISTER_CHUNKS.iter().find(|&&n| n * 4 * threads as usize >= t).copied().unwrap_or(8);
            (format!("softmax_forward_{n}"), LaunchShape::linear(rows_u, threads))
        }
    };
    let kernel = gpu.kernel(crate::sources(), v, &entry)?;
    let cfg = kernel.config(gpu, shape)?;
    let (rows_i, t_i, causal_i) = (rows as i32, t as i32, a.causal as i32);
    let mut b = gpu.stream().launch_builder(kernel.function());
    b.arg(a.out).arg(a.inp).arg(&rows_i).arg(&t_i).arg(&a.inv_temperature).arg(&causal_i);
    // SAFETY: the argument list matches the kernel signature; lengths were checked above.
    unsafe { b.launch(cfg) }.map(|_| ()).ctx("launch softmax_forward")
}

/// f64 reference.
pub fn reference(x: &[f32], rows: usize, t: usize, inv_temperature: f64, causal: bool) -> Vec<f64> {
    let mut out = vec![0.0; rows * t];
    out.par_chunks_mut(t).zip(x.par_chunks(t)).enumerate().for_each(|(r, (o, xr))| {
        let len = if causal { r % t + 1 } else { t };
        let max = xr[..len].iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let mut sum = 0.0;
        for j in 0..len {
            o[j] = (inv_temperature * (xr[j] as f64 - max)).exp();
            sum += o[j];
        }
        for v in &mut o[..len] {
            *v /= sum;
        }
    });
    out
}

pub struct Softmax;

impl Op for Softmax {
    fn family(&self) -> &'static str {
        FAMILY
    }
    fn name(&self) -> &'static str {
        OP
    }
    fn description(&self) -> &'static str {
        "row softmax (fp32) scaled by inv_temperature, optional causal mask (causal=1)"
    }
    fn sources(&self) -> &'static [common::KernelSource] {
        crate::sources()
    }
    fn variants(&self) -> Vec<Variant> {
        stages().into_iter().map(|(v, _)| v).collect()
    }
    fn shape_keys(&self) -> &'static [&'static str] {
        &["rows", "T", "causal", "magnitude"]
    }
    fn default_shapes(&self) -> Vec<Shape> {
        vec![
            // The attention shape: B=4, NH=12, T=1024, causal.
            Shape::new(&[("rows", 4 * 12 * 1024), ("T", 1024), ("causal", 1)]),
            Shape::new(&[("rows", 32768), ("T", 4096), ("causal", 0)]),
        ]
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        let causal = shape.get("causal").unwrap_or(0) != 0;
        check_shape(v, shape.dim("rows", i32::MAX as i64)?, shape.dim("T", i32::MAX as i64)?, causal)
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let rows = shape.dim("rows", i32::MAX as i64)?;
        let t = shape.dim("T", i32::MAX as i64)?;
        let causal = shape.get("causal").unwrap_or(0) != 0;
        require(rows.saturating_mul(t) < i32::MAX as usize, "rows * T < 2^31", || format!("rows * T = {}", rows * t))?;
        require(!causal || rows.is_multiple_of(t), "causal rows come in blocks of T (rows % T == 0)", || {
            format!("rows = {rows}, T = {t}")
        })?;
        let magnitude = shape.get("magnitude").unwrap_or(8) as f32;
        let x = uniform(rows * t, -magnitude, magnitude, seed);
        let reference = reference(&x, rows, t, INV_TEMPERATURE as f64, causal);
        let copies = rotation_copies(gpu, (2 * rows * t * 4) as u64);
        Ok(Box::new(SoftmaxProblem {
            rows,
            t,
            causal,
            x: Rotated::upload(gpu, &x, copies)?,
            out: Rotated::outputs(gpu, rows * t, copies)?,
            reference,
            copies,
        }))
    }
}

struct SoftmaxProblem {
    rows: usize,
    t: usize,
    causal: bool,
    x: Rotated<f32>,
    out: Rotated<f32>,
    reference: Vec<f64>,
    copies: usize,
}

impl Problem for SoftmaxProblem {
    fn workload(&self) -> Workload {
        let (rows, t) = (self.rows as u64, self.t as u64);
        let n = rows * t;
        // Every output element written once (the masked part as zeros); the input read once, and
        // under the causal mask only its lower triangle: rows/T blocks of T(T+1)/2 elements.
        let read = if self.causal { rows / t * (t * (t + 1) / 2) } else { n };
        // ~5 flops per element read (scale, subtract, exp, add, multiply).
        Workload { bytes: 4 * (read + n), flops: 5 * read, bound: Bound::Memory }
    }
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)
    }
    fn launch(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<()> {
        forward(
            gpu,
            v,
            SoftmaxArgs {
                out: self.out.get_mut(copy),
                inp: self.x.get(copy),
                rows: self.rows,
                t: self.t,
                inv_temperature: INV_TEMPERATURE,
                causal: self.causal,
            },
        )
    }
    fn verify(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<Verification> {
        Ok(Verification::new(v.tolerance()).add("out", &gpu.download(self.out.get(copy))?, &self.reference))
    }
}
