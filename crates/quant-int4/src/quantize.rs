//! The quantizer op: a bf16 cache `[rows, D]` to INT4 rows (row-wise or group-wise), verified byte
//! for byte against the CPU quantizer in [`crate::format`].

use common::check::{compare, Verification};
use common::cudarc::driver::{CudaSlice, PushKernelArg};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, Bound, DriverContext, Error, Gpu, LaunchShape, Op, Precision, Problem, Result, Shape, Source, Variant,
    Workload,
};
use half::bf16;

use crate::format::{check_int4, dequantize, int4_row_bytes, quantize};
use crate::FAMILY;

const OP: &str = "quantize";

/// How a stage maps rows onto the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// One warp per row, `rows_per_block` warps per block.
    WarpPerRow { rows_per_block: u32 },
}

fn stages() -> Vec<(Variant, Plan)> {
    vec![(
        Variant::kernel(
            FAMILY,
            OP,
            0,
            "warp-per-row",
            "quantize/00_warp_per_row.cu",
            Precision::Int4Bf16,
            "one warp per row: shuffle min/max per group, directed-rounding fp16 scales, OR-packed words",
        ),
        Plan::WarpPerRow { rows_per_block: 8 },
    )]
}

fn plan(v: &Variant) -> Result<Plan> {
    stages().into_iter().find(|(s, _)| s.source == v.source && s.stage == v.stage).map(|(_, p)| p).ok_or_else(|| {
        Error::Unknown { what: "quantize stage", name: v.name.to_string(), known: "warp-per-row".into() }
    })
}

/// Shape constraints: `rows` rows of `d` values in `groups` groups.
pub fn check_shape(v: &Variant, rows: usize, d: usize, groups: usize) -> Result<()> {
    check_int4(d, groups)?;
    require(rows >= 1, "rows >= 1", || format!("rows = {rows}"))?;
    require(rows < i32::MAX as usize, "rows < 2^31", || format!("rows = {rows}"))?;
    plan(v).map(|_| ())
}

/// The buffers of one quantizer call.
pub struct QuantizeArgs<'a> {
    /// `rows * int4_row_bytes(d, groups)` bytes.
    pub out: &'a mut CudaSlice<u8>,
    /// `rows * d` values.
    pub inp: &'a CudaSlice<bf16>,
    pub rows: usize,
    pub d: usize,
    pub groups: usize,
}

/// Launches stage `v` of the quantizer after checking the shape and the buffer lengths.
pub fn forward(gpu: &Gpu, v: &Variant, a: QuantizeArgs) -> Result<()> {
    let (rows, d, groups) = (a.rows, a.d, a.groups);
    check_shape(v, rows, d, groups)?;
    let want_out = rows * int4_row_bytes(d, groups);
    require(a.inp.len() == rows * d, &format!("len(inp) == rows * D = {}", rows * d), || {
        format!("len(inp) = {}", a.inp.len())
    })?;
    require(a.out.len() == want_out, &format!("len(out) == rows * (4G + D/2) = {want_out}"), || {
        format!("len(out) = {}", a.out.len())
    })?;
    let Plan::WarpPerRow { rows_per_block } = plan(v)?;
    let kernel = gpu.kernel(crate::sources(), v, "quantize_int4")?;
    let cfg = kernel.config(gpu, LaunchShape::linear((rows as u32).div_ceil(rows_per_block), 32 * rows_per_block))?;
    let (rows_i, d_i, g_i) = (rows as i32, d as i32, groups as i32);
    let mut b = gpu.stream().launch_builder(kernel.function());
    b.arg(a.out).arg(a.inp).arg(&rows_i).arg(&d_i).arg(&g_i);
    // SAFETY: the argument list matches the kernel signature; lengths were checked above.
    unsafe { b.launch(cfg) }.map(|_| ()).ctx("launch quantize_int4")
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

impl Op for Quantize {
    fn family(&self) -> &'static str {
        FAMILY
    }
    fn name(&self) -> &'static str {
        OP
    }
    fn description(&self) -> &'static str {
        "bf16 KV-cache rows -> INT4 (G = 1 row-wise or 4 group-wise fp16 scale/shift pairs + packed codes)"
    }
    fn sources(&self) -> &'static [common::KernelSource] {
        crate::sources()
    }
    fn variants(&self) -> Vec<Variant> {
        stages().into_iter().map(|(v, _)| v).collect()
    }
    fn shape_keys(&self) -> &'static [&'static str] {
        &["rows", "D", "G"]
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
        check_shape(v, shape.dim("rows", i32::MAX as i64)?, shape.dim("D", 1 << 20)?, shape.dim("G", 1 << 20)?)
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let rows = shape.dim("rows", i32::MAX as i64)?;
        let d = shape.dim("D", 1 << 20)?;
        let groups = shape.dim("G", 1 << 20)?;
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
    fn launch(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<()> {
        let (rows, d, groups) = (self.rows, self.d, self.groups);
        forward(gpu, v, QuantizeArgs { out: self.out.get_mut(copy), inp: self.inp.get(copy), rows, d, groups })
    }
    fn verify(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<Verification> {
        debug_assert!(matches!(v.source, Source::Kernel(_)));
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
