//! The quantizer op: a bf16 cache `[rows, D]` to INT4 rows (row-wise or group-wise), verified byte
//! for byte against the CPU quantizer in [`crate::format`].

use common::check::{compare, Verification};
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, Gpu, Launch, LaunchShape, Limit, Op, OpInfo, Precision, Prepared as Current,
    PreparedStage, Problem, ResourceUse, Result, Shape, Variant, Workload,
};
use half::bf16;

use crate::format::{check_int4, dequantize, int4_row_bytes, quantize};
use crate::{FAMILY, SOURCES};

const OP: &str = "quantize";

const HEAD_DIM: &str = "D in {64, 128}";
const GROUPS: &str = "groups in {1 (row-wise), 4 (group-wise)}";

/// One warp per row, `QZ_WARPS` rows per block: the only plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WarpPerRow;

fn stages() -> Vec<Variant> {
    vec![Variant::kernel(
        FAMILY,
        OP,
        0,
        "warp-per-row",
        "quantize/00_warp_per_row.cu",
        Precision::Int4Bf16,
        "one warp per row: shuffle min/max per group, directed-rounding fp16 scales, OR-packed words",
    )
    .with_plan(WarpPerRow)
    .with_tunables(&[("QZ_WARPS", 8)])]
}

/// The sizes of one quantizer call: `rows` rows of `d` values in `groups` groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantizeDims {
    pub rows: usize,
    pub d: usize,
    pub groups: usize,
}

/// Shape constraints: what the stage header's `Limits:` line documents, and rows within `int`.
pub fn check_shape(v: &Variant, q: QuantizeDims) -> Result<()> {
    v.plan::<WarpPerRow>()?;
    check_int4(q.d, q.groups)?;
    require(q.rows >= 1, "rows >= 1", || format!("rows = {}", q.rows))?;
    require(q.rows <= i32::MAX as usize, "rows < 2^31", || format!("rows = {}", q.rows))
}

/// The quantizer prepared for one size.
pub struct Prepared {
    launch: Launch,
    q: QuantizeDims,
}

/// The buffers of one quantizer call.
pub struct QuantizeArgs<'a> {
    /// `rows * int4_row_bytes(d, groups)` bytes.
    pub out: &'a mut CudaSlice<u8>,
    /// `rows * d` values.
    pub inp: &'a CudaSlice<bf16>,
}

pub fn prepare(gpu: &Gpu, v: &Variant, q: QuantizeDims) -> Result<Prepared> {
    check_shape(v, q)?;
    let warps = v.tunable("QZ_WARPS")?;
    let shape = LaunchShape::linear((q.rows as u32).div_ceil(warps), 32 * warps);
    Ok(Prepared { launch: gpu.prepare_launch(&SOURCES, v, "quantize_int4", shape)?, q })
}

impl Prepared {
    /// Enqueues the quantizer on `stream` after checking the buffer lengths.
    pub fn enqueue(&self, stream: &CudaStream, a: QuantizeArgs) -> Result<()> {
        let QuantizeDims { rows, d, groups } = self.q;
        require_len("inp", a.inp.len(), rows * d)?;
        require_len("out", a.out.len(), rows * int4_row_bytes(d, groups))?;
        let args = [Arg::buf(a.out), Arg::buf(a.inp), Arg::int(rows), Arg::int(d), Arg::int(groups)];
        // SAFETY: the argument list matches the kernel signature; lengths were checked above.
        unsafe { self.launch.enqueue(stream, &args) }
    }
}

impl PreparedStage for Prepared {
    fn resources(&self) -> Vec<ResourceUse> {
        vec![self.launch.resources().clone()]
    }
}

/// Test data for a cache: uniform in [-1, 1) with one outlier channel (d = 3, x6) in the first
/// group, the shape of real K caches that makes group-wise scales pay off.
pub fn cache_values(n: usize, d: usize, seed: u64) -> Vec<bf16> {
    uniform(n, -1.0, 1.0, seed)
        .into_iter()
        .enumerate()
        .map(|(i, x)| bf16::from_f32(if i % d == 3 { 6.0 * x } else { x }))
        .collect()
}

pub struct Quantize;

fn qshape(rows: i64, d: i64, g: i64) -> Shape {
    Shape::new(&[("rows", rows), ("D", d), ("G", g)])
}

fn dims(shape: &Shape) -> Result<QuantizeDims> {
    Ok(QuantizeDims {
        rows: shape.dim("rows", i32::MAX as i64)?,
        d: shape.dim("D", 1 << 20)?,
        groups: shape.dim("G", 1 << 20)?,
    })
}

static INFO: OpInfo = OpInfo {
    family: FAMILY,
    name: OP,
    description: "bf16 KV-cache rows -> INT4 (G = 1 row-wise or 4 group-wise fp16 scale/shift pairs + packed codes)",
    sources: &SOURCES,
    shape_keys: &["rows", "D", "G"],
    stages,
};

impl Op for Quantize {
    fn info(&self) -> &'static OpInfo {
        &INFO
    }
    fn default_shapes(&self) -> Vec<Shape> {
        // rows = B * Tmax * HKV of the decode caches at B = 32 and 128.
        let mut v = Vec::new();
        for rows in [262_144, 1_048_576] {
            for g in [1, 4] {
                v.push(Shape::new(&[("rows", rows), ("D", 128), ("G", g)]));
            }
        }
        v
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        check_shape(v, dims(shape)?)
    }
    fn limits(&self, _v: &Variant) -> Vec<Limit> {
        vec![
            Limit { constraint: HEAD_DIM, past: qshape(3, 96, 1), inside: Some(qshape(3, 64, 1)) },
            Limit { constraint: GROUPS, past: qshape(3, 128, 2), inside: Some(qshape(3, 128, 4)) },
        ]
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let QuantizeDims { rows, d, groups } = dims(shape)?;
        check_int4(d, groups)?;
        let x = cache_values(rows * d, d, seed);
        let reference = quantize(&x, d, groups);
        let rb = int4_row_bytes(d, groups);
        let copies = rotation_copies(gpu, (rows * (2 * d + rb)) as u64);
        Ok(Box::new(QuantizeProblem {
            rows,
            d,
            groups,
            inp: Rotated::upload(gpu, &x, copies)?,
            out: Rotated::outputs(gpu, rows * rb, copies)?,
            x,
            reference,
            copies,
            prepared: Current::default(),
        }))
    }
}

struct QuantizeProblem {
    rows: usize,
    d: usize,
    groups: usize,
    inp: Rotated<bf16>,
    out: Rotated<u8>,
    x: Vec<bf16>,
    reference: Vec<u8>,
    copies: usize,
    prepared: Current<Prepared>,
}

/// `NaN` where the bytes differ, 0 where they agree: compared with zeros, every mismatch counts as
/// a non-finite element and fails the check, whatever the tolerance.
pub fn byte_mismatches(out: &[u8], reference: &[u8]) -> Vec<f32> {
    let mut m: Vec<f32> = out.iter().zip(reference).map(|(a, b)| if a == b { 0.0 } else { f32::NAN }).collect();
    m.resize(reference.len(), f32::NAN);
    m
}

impl Problem for QuantizeProblem {
    fn workload(&self) -> Workload {
        let (r, d) = (self.rows as u64, self.d as u64);
        let rb = int4_row_bytes(self.d, self.groups) as u64;
        Workload { bytes: r * (2 * d + rb), flops: 4 * r * d, bound: Bound::Memory }
    }
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        let q = QuantizeDims { rows: self.rows, d: self.d, groups: self.groups };
        Ok(self.prepared.set(v, prepare(gpu, v, q)?))
    }
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        p.enqueue(stream, QuantizeArgs { out: self.out.get_mut(copy), inp: self.inp.get(copy) })
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        let out = gpu.download(self.out.get(copy))?;
        let zeros = vec![0.0f64; self.reference.len()];
        let got = dequantize(&out, self.d, self.groups);
        let want = dequantize(&self.reference, self.d, self.groups);
        let x: Vec<f64> = self.x.iter().map(|v| v.to_f64()).collect();
        let cost = compare("quantization", &want, &x);
        Ok(Verification::new(v.tolerance())
            .add("bytes", &byte_mismatches(&out, &self.reference), &zeros)
            .add("dequantized", &got, &want)
            .with_note(format!("quantization error vs the bf16 input: rel L2 {:.2e}", cost.rel_l2)))
    }
}
