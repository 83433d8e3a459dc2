//! Sampling on the device: temperature, top-k and top-p draws from B rows of logits, one uniform
//! draw per row given (the host's seeded stream, so the host and the device pick the same token
//! from the same logits and draw; [`crate::sampling::draw`] is the reference). A sampled decode step
//! then downloads B ints instead of B·V floats.
//!
//! Shape keys: `B`, `V`, `ld` (the row stride; 0 or absent: V), `k` (top-k; 0: off), `p` (top-p in
//! thousandths; 1000: off), `t` (temperature in hundredths).

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, Gpu, Launch, LaunchShape, Limit, Op, Precision, Prepared as Current, Problem,
    Result, Shape, Variant, Workload,
};

use crate::argmax::{check_dims, dims as logit_rows, ArgmaxDims, ELEMS, STRIDE};
use crate::sampling::{draw, kept_intervals, Sampling};
use crate::{FAMILY, SOURCES};

const OP: &str = "sample";

common::declare_op! {
    pub struct Sample {
        name: OP,
        description: "sampling: ids[b] drawn from softmax(logits[b, :V] / T) within top-k and top-p, one uniform per row",
        shape_keys: ["B", "V", "ld", "k", "p", "t"],
        stages: stages,
    }
}

const THREADS: u32 = 1024;
/// The row lives in shared memory (227 KiB on Hopper): V fp32 weights.
pub const MAX_V: usize = 56 * 1024;
const ROW: &str = "V <= 57344";
/// A draw this close to a token's boundary may round either way in fp32.
const BOUNDARY: f64 = 1e-5;

fn stages() -> Vec<Variant> {
    vec![Variant::kernel(
        FAMILY,
        OP,
        0,
        "threshold",
        "sample/00_threshold.cu",
        Precision::Fp32,
        "a block per row in shared memory: top-k and top-p thresholds by binary search on the weights' bits",
    )
    .with_tolerance(0.0, "token ids are exact (a draw within 1e-5 of a boundary may take either side)")]
}

/// The sizes of one call: B rows of V logits, `ld` apart, as the argmax takes them.
pub type SampleDims = ArgmaxDims;

pub fn check_shape(d: SampleDims) -> Result<()> {
    // The row limit is named before the shared stride and size checks, as it always was.
    if d.b >= 1 && d.v >= 1 {
        require(d.v <= MAX_V, ROW, || format!("V = {}", d.v))?;
    }
    check_dims(d)
}

/// The sampling stage prepared for B rows of V logits.
pub struct Prepared {
    launch: Launch,
    d: SampleDims,
}

pub fn prepare(gpu: &Gpu, variant: &Variant, d: SampleDims) -> Result<Prepared> {
    check_shape(d)?;
    let shape = LaunchShape::linear(d.b as u32, THREADS).with_shared(4 * d.v as u32);
    Ok(Prepared { launch: gpu.prepare_launch(&SOURCES, variant, "sample_threshold", shape)?, d })
}

impl Prepared {
    /// `ids[b]` drawn from row b of `logits` with `uniforms[b]` (in [0, 1)) under `s`, which must not
    /// be greedy (the argmax op is that).
    pub fn enqueue(
        &self,
        stream: &CudaStream,
        ids: &mut CudaSlice<i32>,
        logits: &CudaSlice<f32>,
        uniforms: &CudaSlice<f32>,
        s: &Sampling,
    ) -> Result<()> {
        let SampleDims { b, v, ld } = self.d;
        s.check()?;
        require(s.temperature > 0.0, "temperature > 0 (greedy is the argmax op)", || "0".into())?;
        require_len("ids", ids.len(), b)?;
        require_len("uniforms", uniforms.len(), b)?;
        require_len("logits", logits.len(), b * ld)?;
        let top_k = s.top_k.unwrap_or(v).min(v);
        let args = [
            Arg::buf(ids),
            Arg::buf(logits),
            Arg::buf(uniforms),
            Arg::int(v),
            Arg::int(ld),
            Arg::F32(1.0 / s.temperature),
            Arg::int(top_k),
            Arg::F32(s.top_p),
        ];
        // SAFETY: the arguments follow sample_threshold's signature; it reads V of each of B rows ld
        // apart and one uniform per row, writes B ids (lengths checked), and its V-float row fits the
        // shared memory requested at prepare (V <= MAX_V).
        unsafe { self.launch.enqueue(stream, &args) }
    }
}

common::single_launch_stage!(Prepared);

fn shape(b: i64, v: i64, ld: i64, k: i64, p: i64, t: i64) -> Shape {
    Shape::new(&[("B", b), ("V", v), ("ld", ld), ("k", k), ("p", p), ("t", t)])
}

fn dims(s: &Shape) -> Result<(SampleDims, Sampling)> {
    let rows = logit_rows(s)?;
    let k = s.get("k").unwrap_or(0);
    let (p, t) = (s.get("p").unwrap_or(1000), s.get("t").unwrap_or(100));
    require(k >= 0, "k >= 0 (0: off)", || format!("k = {k}"))?;
    require(t >= 1, "t >= 1 (hundredths; greedy is the argmax op)", || format!("t = {t}"))?;
    let sampling = Sampling {
        temperature: t as f32 / 100.0,
        top_k: (k > 0).then_some(k as usize),
        top_p: p as f32 / 1000.0,
        seed: 0,
    };
    sampling.check()?;
    Ok((rows, sampling))
}

impl Op for Sample {
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2's vocabulary in the model's padded rows: temperature alone, top-k 50, top-p 0.9, both;
        // at the model table's batch sizes; and a ragged vocabulary.
        vec![
            shape(1, 50257, 50304, 0, 1000, 100),
            shape(1, 50257, 50304, 50, 1000, 100),
            shape(1, 50257, 50304, 0, 900, 80),
            shape(8, 50257, 50304, 40, 950, 70),
            shape(32, 50257, 50304, 0, 900, 100),
            shape(5, 1001, 1001, 7, 500, 150),
        ]
    }
    fn validate(&self, _variant: &Variant, s: &Shape) -> Result<()> {
        check_shape(dims(s)?.0)
    }
    fn limits(&self, _v: &Variant) -> Vec<Limit> {
        vec![
            Limit {
                constraint: ROW,
                past: shape(1, 57345, 0, 0, 1000, 100),
                inside: Some(shape(1, 57344, 0, 0, 1000, 100)),
            },
            Limit {
                constraint: STRIDE,
                past: shape(2, 100, 99, 0, 1000, 100),
                inside: Some(shape(2, 100, 100, 0, 1000, 100)),
            },
            Limit { constraint: ELEMS, past: shape(1 << 16, 1 << 15, 0, 0, 1000, 100), inside: None },
        ]
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let (d, sampling) = dims(s)?;
        check_shape(d)?;
        let SampleDims { b, v, ld } = d;
        // Logit-like values; the padding columns hold larger values than any logit: a stage that
        // reads them fails.
        let mut logits = uniform(b * ld, -6.0, 6.0, seed);
        logits.chunks_mut(ld).for_each(|r| r[v..].fill(100.0));
        let draws = uniform(b, 0.0, 1.0, seed ^ 7);
        let copies = rotation_copies(gpu, (4 * b * ld) as u64);
        Ok(Box::new(SampleProblem {
            d,
            sampling,
            logits_dev: Rotated::upload(gpu, &logits, copies)?,
            uniforms: gpu.upload(&draws)?,
            ids: Rotated::outputs(gpu, b, copies)?,
            logits,
            draws,
            copies,
            prepared: Current::default(),
        }))
    }
}

struct SampleProblem {
    d: SampleDims,
    sampling: Sampling,
    logits: Vec<f32>,
    logits_dev: Rotated<f32>,
    draws: Vec<f32>,
    uniforms: CudaSlice<f32>,
    ids: Rotated<i32>,
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for SampleProblem {
    fn workload(&self) -> Workload {
        let (b, v) = (self.d.b as u64, self.d.v as u64);
        Workload { bytes: 4 * b * v + 8 * b, flops: b * v, bound: Bound::Memory }
    }
    common::problem_plumbing!(ids);
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        p.enqueue(stream, self.ids.get_mut(copy), self.logits_dev.get(copy), &self.uniforms, &self.sampling)
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (variant, _) = self.prepared.get()?;
        let ids = gpu.download(self.ids.get(copy))?;
        let (v, ld) = (self.d.v, self.d.ld);
        let mut want = Vec::with_capacity(ids.len());
        let mut boundary = 0;
        for (row, (&got, &u)) in ids.iter().zip(&self.draws).enumerate() {
            let logits = &self.logits[row * ld..][..v];
            let pick = draw(logits, &self.sampling, u as f64);
            // A different pick passes only when the draw lies within BOUNDARY of the picked token's
            // interval (fp32 sums on the device, f64 here); poisoned ids (-1) never do.
            let near = got != pick
                && kept_intervals(logits, &self.sampling)
                    .iter()
                    .any(|&(i, lo, hi)| i as i32 == got && u as f64 >= lo - BOUNDARY && (u as f64) < hi + BOUNDARY);
            boundary += usize::from(near);
            want.push(if near { got as f64 } else { pick as f64 });
        }
        let got: Vec<f32> = ids.iter().map(|&i| i as f32).collect();
        let check = Verification::new(variant.tolerance()).add("ids", &got, &want);
        Ok(if boundary > 0 { check.with_note(format!("{boundary} draws at a boundary")) } else { check })
    }
}
