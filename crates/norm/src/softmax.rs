//! Row softmax as attention uses it: rows = B·NH·T of length T, scaled by `inv_temperature`, with an
//! optional causal mask (row r sits at position r % T and sees columns 0..=r % T; the rest are 0).

use common::check::{checked_rows, Verification};
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, Gpu, Launch, LaunchShape, Limit, Op, Precision, Prepared as Current, Problem,
    Result, Shape, Variant, Workload,
};
use rayon::prelude::*;

use crate::{FAMILY, SOURCES};

const OP: &str = "softmax";

common::declare_op! {
    pub struct Softmax {
        name: OP,
        description: "row softmax (fp32) scaled by inv_temperature, optional causal mask (causal=1); inputs in \
             [-magnitude, magnitude) (default 8)",
        shape_keys: ["rows", "T", "causal", "magnitude"],
        stages: stages,
    }
}

/// The attention scale 1/sqrt(64) of GPT-2's head size, used by the problems.
pub const INV_TEMPERATURE: f32 = 0.125;

/// Threads per block of the thread-per-row stage.
const ROW_THREADS: u32 = 256;

/// How a stage maps rows onto the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// One thread per row, [`ROW_THREADS`] per block.
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

const ELEMS: &str = "rows * T < 2^31";
const CAUSAL_BLOCKS: &str = "rows % T == 0 when causal";
const REGISTER_T: &str = "T <= 32 * SM_THREADS";

fn stages() -> Vec<Variant> {
    let k = |stage, name, file, plan: Plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Fp32, summary).with_plan(plan)
    };
    vec![
        k(
            0,
            "naive",
            "softmax/00_naive.cu",
            Plan::ThreadPerRow,
            "one thread per row; max, sum, normalise in three loops",
        ),
        k(
            1,
            "block-reduction",
            "softmax/01_block_reduction.cu",
            Plan::BlockPerRow,
            "one block per row, shared-memory tree max and sum",
        ),
        k(2, "warp-shuffle", "softmax/02_warp_shuffle.cu", Plan::WarpPerRow, "one warp per row, shuffle max and sum")
            .with_tunables(&[("SM_WARPS", 8)]),
        k(
            3,
            "online",
            "softmax/03_online.cu",
            Plan::WarpPerRow,
            "max and sum in one online pass, 16-byte loads and stores",
        )
        .with_tunables(&[("SM_WARPS", 4)]),
        k(
            4,
            "register-resident",
            "softmax/04_register_resident.cu",
            Plan::BlockPerRowInRegisters,
            "block per row holds the row in registers: one read, one write per element",
        )
        .with_tunables(&[("SM_THREADS", 256)]),
    ]
}

/// The sizes of one softmax call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftmaxDims {
    pub rows: usize,
    pub t: usize,
    pub causal: bool,
}

/// Shape constraints of `v` at `d`: what its header's `Limits:` line documents.
pub fn check_shape(v: &Variant, d: SoftmaxDims) -> Result<()> {
    let SoftmaxDims { rows, t, causal } = d;
    require(rows >= 1, "rows >= 1", || format!("rows = {rows}"))?;
    require(t >= 1, "T >= 1", || format!("T = {t}"))?;
    require(rows.checked_mul(t).is_some_and(|n| n < 1 << 31), ELEMS, || format!("rows = {rows}, T = {t}"))?;
    require(!causal || rows.is_multiple_of(t), CAUSAL_BLOCKS, || format!("rows = {rows}, T = {t}"))?;
    if v.plan::<Plan>()? == Plan::BlockPerRowInRegisters {
        let threads = v.tunable("SM_THREADS")? as usize;
        require(t <= 32 * threads, REGISTER_T, || format!("T = {t}, SM_THREADS = {threads}"))?;
    }
    Ok(())
}

/// A softmax stage prepared for one size.
pub struct Prepared {
    launch: Launch,
    d: SoftmaxDims,
}

/// The buffers of one call: `out` and `inp` hold rows·T values.
pub struct SoftmaxArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub inp: &'a CudaSlice<f32>,
    pub inv_temperature: f32,
}

/// Prepares stage `v` for `d` after checking the shape against the stage's limits.
pub fn prepare(gpu: &Gpu, v: &Variant, d: SoftmaxDims) -> Result<Prepared> {
    check_shape(v, d)?;
    let rows = d.rows as u32;
    let (entry, shape) = match v.plan::<Plan>()? {
        Plan::ThreadPerRow => ("softmax_forward".into(), LaunchShape::linear(rows.div_ceil(ROW_THREADS), ROW_THREADS)),
        Plan::BlockPerRow => {
            let block = (d.t.div_ceil(32) * 32).min(1024) as u32;
            ("softmax_forward".into(), LaunchShape::linear(rows, block).with_shared(block * 4))
        }
        Plan::WarpPerRow => {
            let warps = v.tunable("SM_WARPS")?;
            ("softmax_forward".into(), LaunchShape::linear(rows.div_ceil(warps), 32 * warps))
        }
        Plan::BlockPerRowInRegisters => {
            let threads = v.tunable("SM_THREADS")?;
            let n = REGISTER_CHUNKS.iter().find(|&&n| n * 4 * threads as usize >= d.t).copied().unwrap_or(8);
            (format!("softmax_forward_{n}"), LaunchShape::linear(rows, threads))
        }
    };
    let launch = gpu.prepare_launch(&SOURCES, v, &entry, shape)?;
    Ok(Prepared { launch, d })
}

impl Prepared {
    /// Enqueues the stage on `stream` after checking the buffer lengths and the temperature.
    pub fn enqueue(&self, stream: &CudaStream, a: SoftmaxArgs) -> Result<()> {
        let SoftmaxDims { rows, t, causal } = self.d;
        require(a.inv_temperature.is_finite() && a.inv_temperature > 0.0, "inv_temperature > 0 and finite", || {
            format!("inv_temperature = {}", a.inv_temperature)
        })?;
        require_len("inp", a.inp.len(), rows * t)?;
        require_len("out", a.out.len(), rows * t)?;
        let args = [
            Arg::buf(a.out),
            Arg::buf(a.inp),
            Arg::int(rows),
            Arg::int(t),
            Arg::F32(a.inv_temperature),
            Arg::I32(causal as i32),
        ];
        // SAFETY: every stage's entry takes (out, inp, rows, T, inv_temperature, causal); the
        // lengths were checked above and rows * T < 2^31 at prepare.
        unsafe { self.launch.enqueue(stream, &args) }
    }
}

common::single_launch_stage!(Prepared);

/// f64 reference of every row.
pub fn reference(x: &[f32], rows: usize, t: usize, inv_temperature: f64, causal: bool) -> Vec<f64> {
    reference_rows(x, t, &(0..rows).collect::<Vec<_>>(), inv_temperature, causal)
}

/// f64 reference of the rows `rows` of `x` (rows of `t`), packed in that order; under the causal
/// mask row r keeps its first r % t + 1 elements.
pub fn reference_rows(x: &[f32], t: usize, rows: &[usize], inv_temperature: f64, causal: bool) -> Vec<f64> {
    let mut out = vec![0.0; rows.len() * t];
    out.par_chunks_mut(t).zip(rows.par_iter()).for_each(|(o, &r)| {
        let xr = &x[r * t..(r + 1) * t];
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

fn shape(rows: i64, t: i64, causal: i64) -> Shape {
    Shape::new(&[("rows", rows), ("T", t), ("causal", causal)])
}

/// The dimensions and input magnitude of a shape.
fn dims(shape: &Shape) -> Result<(SoftmaxDims, f32)> {
    let d = SoftmaxDims {
        rows: shape.dim("rows", i32::MAX as i64)?,
        t: shape.dim("T", i32::MAX as i64)?,
        causal: shape.get("causal").unwrap_or(0) != 0,
    };
    let magnitude = if shape.get("magnitude").is_some() { shape.dim("magnitude", 1 << 20)? } else { 8 };
    Ok((d, magnitude as f32))
}

impl Op for Softmax {
    fn default_shapes(&self) -> Vec<Shape> {
        // The attention shape (B=4, NH=12, T=1024, causal), and a bandwidth shape.
        vec![shape(4 * 12 * 1024, 1024, 1), shape(32768, 4096, 0)]
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        check_shape(v, dims(shape)?.0)
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        let mut limits = vec![
            Limit { constraint: ELEMS, past: shape(1 << 20, 2048, 0), inside: None },
            Limit { constraint: CAUSAL_BLOCKS, past: shape(10, 4, 1), inside: Some(shape(8, 4, 1)) },
        ];
        if v.plan::<Plan>().ok() == Some(Plan::BlockPerRowInRegisters) {
            let max = 32 * v.tunable("SM_THREADS").unwrap_or(0) as i64;
            limits.push(Limit { constraint: REGISTER_T, past: shape(17, max + 1, 0), inside: Some(shape(17, max, 0)) });
        }
        limits
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let (d, magnitude) = dims(shape)?;
        let SoftmaxDims { rows, t, causal } = d;
        require(rows.checked_mul(t).is_some_and(|n| n < 1 << 31), ELEMS, || format!("rows = {rows}, T = {t}"))?;
        require(!causal || rows.is_multiple_of(t), CAUSAL_BLOCKS, || format!("rows = {rows}, T = {t}"))?;
        let x = uniform(rows * t, -magnitude, magnitude, seed);
        let checked = checked_rows(rows, t, seed ^ 4);
        let reference = reference_rows(&x, t, &checked, INV_TEMPERATURE as f64, causal);
        let copies = rotation_copies(gpu, (2 * rows * t * 4) as u64);
        Ok(Box::new(SoftmaxProblem {
            d,
            x: Rotated::upload(gpu, &x, copies)?,
            out: Rotated::outputs(gpu, rows * t, copies)?,
            checked,
            reference,
            copies,
            prepared: Current::default(),
        }))
    }
}

struct SoftmaxProblem {
    d: SoftmaxDims,
    x: Rotated<f32>,
    out: Rotated<f32>,
    /// The rows compared with the reference ([`checked_rows`]), and their reference.
    checked: Vec<usize>,
    reference: Vec<f64>,
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for SoftmaxProblem {
    fn workload(&self) -> Workload {
        let (rows, t) = (self.d.rows as u64, self.d.t as u64);
        let n = rows * t;
        // Every output element written once (the masked part as zeros); the input read once, and
        // under the causal mask only its lower triangle: rows/T blocks of T(T+1)/2 elements.
        let read = if self.d.causal { rows / t * (t * (t + 1) / 2) } else { n };
        // ~5 flops per element read (scale, subtract, exp, add, multiply).
        Workload { bytes: 4 * (read + n), flops: 5 * read, bound: Bound::Memory }
    }
    common::problem_plumbing!(out);
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        p.enqueue(
            stream,
            SoftmaxArgs { out: self.out.get_mut(copy), inp: self.x.get(copy), inv_temperature: INV_TEMPERATURE },
        )
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        let out = self.out.get(copy).as_view();
        Verification::new(v.tolerance()).add_device_rows(
            gpu,
            "out",
            &out,
            (self.d.rows, self.d.t),
            &self.checked,
            &self.reference,
        )
    }
}
