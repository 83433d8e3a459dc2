//! The quantizer op: a bf16 cache `[rows, D]` to INT4 rows (row-wise or group-wise), or a
//! `[Tmax, HKV, D]` cache (`rows = Tmax * HKV`) to the fragment layout of K or V, verified byte for
//! byte against the CPU quantizer and layout in [`crate::format`].

use common::check::{compare_by, ErrorStats, Verification, COMPARE_CHUNK};
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{fill_uniform, rotation_copies, zeroed_bf16, Rotated};
use common::{
    require, require_len, Arg, Bound, Define, Gpu, Launch, LaunchShape, Limit, Op, Precision, Prepared as Current,
    Problem, ResourceUse, Result, Shape, Variant, Workload,
};
use half::bf16;
use rayon::prelude::*;
use std::borrow::Cow;

use crate::format::{
    check_int4, dequantize_row, fragment_cache_bytes, from_fragments, int4_row_bytes, quantize, to_fragments, Role,
};
use crate::{FAMILY, SOURCES};

const OP: &str = "quantize";

common::declare_op! {
    pub struct Quantize {
        name: OP,
        description: "bf16 KV-cache rows -> INT4 (G = 1 row-wise or 4 group-wise fp16 scale/shift pairs + packed codes)",
        shape_keys: ["rows", "D", "G", "HKV"],
        stages: stages,
    }
}

const HEAD_DIM: &str = "D in {64, 128}";
const GROUPS: &str = "groups in {1 (row-wise), 4 (group-wise)}";

/// What a quantizer stage writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantizePlan {
    /// Rows in the row layout, one warp a row, `QZ_WARPS` rows a block.
    Rows,
    /// The fragment layout for K or V, one warp a chunk of 16 tokens, `QZ_WARPS` chunks a block.
    Fragments(Role),
}

fn stages() -> Vec<Variant> {
    const ROLE_V: &[Define] = &[Define::new("QZ_ROLE_V", "1")];
    let fragments = |stage, name, role, defines: &'static [Define], summary| {
        Variant::kernel(FAMILY, OP, stage, name, "quantize/01_fragments.cu", Precision::Int4Bf16, summary)
            .with_plan(QuantizePlan::Fragments(role))
            .with_defines(defines)
            .with_tunables(&[("QZ_WARPS", 4)])
    };
    vec![
        Variant::kernel(
            FAMILY,
            OP,
            0,
            "warp-per-row",
            "quantize/00_warp_per_row.cu",
            Precision::Int4Bf16,
            "one warp per row: shuffle min/max per group, directed-rounding fp16 scales, OR-packed words",
        )
        .with_plan(QuantizePlan::Rows)
        .with_tunables(&[("QZ_WARPS", 8)]),
        fragments(1, "fragments-k", Role::K, &[], "stage 0's codes, written in K's fragment layout (warp per chunk)"),
        fragments(
            2,
            "fragments-v",
            Role::V,
            ROLE_V,
            "stage 0's codes, written in V's fragment layout (two tokens a word; warp per chunk)",
        ),
    ]
}

/// The sizes of one quantizer call: `rows` rows of `d` values in `groups` groups; for the fragment
/// layout the rows are `[Tmax, HKV]` (`rows = Tmax * hkv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantizeDims {
    pub rows: usize,
    pub d: usize,
    pub groups: usize,
    pub hkv: usize,
}

impl QuantizeDims {
    /// Tokens per KV head (the fragment layout's `Tmax`).
    pub fn tmax(&self) -> usize {
        self.rows / self.hkv
    }

    /// Output bytes of stage plan `plan`.
    pub fn out_bytes(&self, plan: QuantizePlan) -> usize {
        match plan {
            QuantizePlan::Rows => self.rows * int4_row_bytes(self.d, self.groups),
            QuantizePlan::Fragments(_) => fragment_cache_bytes(1, self.tmax(), self.hkv, self.d, self.groups),
        }
    }
}

const HKV_DIVIDES: &str = "rows % HKV == 0";

/// Shape constraints: what the stage header's `Limits:` line documents, and rows within `int`.
pub fn check_shape(v: &Variant, q: QuantizeDims) -> Result<()> {
    let plan = v.plan::<QuantizePlan>()?;
    check_int4(q.d, q.groups)?;
    require(q.rows >= 1, "rows >= 1", || format!("rows = {}", q.rows))?;
    require(q.rows <= i32::MAX as usize, "rows < 2^31", || format!("rows = {}", q.rows))?;
    require((1..=65_535).contains(&q.hkv), "1 <= HKV <= 65535", || format!("HKV = {}", q.hkv))?;
    if let QuantizePlan::Fragments(_) = plan {
        require(q.rows.is_multiple_of(q.hkv), HKV_DIVIDES, || format!("rows = {}, HKV = {}", q.rows, q.hkv))?;
    }
    Ok(())
}

/// The quantizer prepared for one size.
pub struct Prepared {
    launch: Launch,
    q: QuantizeDims,
    plan: QuantizePlan,
}

/// The buffers of one quantizer call.
pub struct QuantizeArgs<'a> {
    /// [`QuantizeDims::out_bytes`]: `rows * int4_row_bytes(d, groups)` bytes for rows.
    pub out: &'a mut CudaSlice<u8>,
    /// `rows * d` values.
    pub inp: &'a CudaSlice<bf16>,
}

pub fn prepare(gpu: &Gpu, v: &Variant, q: QuantizeDims) -> Result<Prepared> {
    check_shape(v, q)?;
    let plan = v.plan::<QuantizePlan>()?;
    let warps = v.tunable("QZ_WARPS")?;
    let (entry, shape) = match plan {
        QuantizePlan::Rows => ("quantize_int4", LaunchShape::linear((q.rows as u32).div_ceil(warps), 32 * warps)),
        QuantizePlan::Fragments(_) => {
            let chunks = q.tmax().div_ceil(crate::format::CHUNK) as u32;
            ("quantize_int4_fragments", LaunchShape::new((chunks.div_ceil(warps), q.hkv as u32, 1), (32 * warps, 1, 1)))
        }
    };
    Ok(Prepared { launch: gpu.prepare_launch(&SOURCES, v, entry, shape)?, q, plan })
}

impl Prepared {
    /// Enqueues the quantizer on `stream` after checking the buffer lengths.
    pub fn enqueue(&self, stream: &CudaStream, a: QuantizeArgs) -> Result<()> {
        let QuantizeDims { rows, d, groups, .. } = self.q;
        require_len("inp", a.inp.len(), rows * d)?;
        require_len("out", a.out.len(), self.q.out_bytes(self.plan))?;
        let count = match self.plan {
            QuantizePlan::Rows => rows,
            QuantizePlan::Fragments(_) => self.q.tmax(),
        };
        let args = [Arg::buf(a.out), Arg::buf(a.inp), Arg::int(count), Arg::int(d), Arg::int(groups)];
        // SAFETY: the argument list matches the kernel signature; lengths were checked above.
        unsafe { self.launch.enqueue(stream, &args) }
    }
}

common::single_launch_stage!(Prepared);

/// Test data for a cache: uniform in [-1, 1) with one outlier channel (d = 3, x6) in the first
/// group, the shape of real K caches that makes group-wise scales pay off.
pub fn cache_values(n: usize, d: usize, seed: u64) -> Vec<bf16> {
    let mut x = zeroed_bf16(n);
    fill_cache_values(&mut x, d, seed);
    x
}

/// [`cache_values`]`(out.len(), d, seed)` drawn into `out` on every core.
pub fn fill_cache_values(out: &mut [bf16], d: usize, seed: u64) {
    fill_uniform(out, -1.0, 1.0, seed, |i, x| bf16::from_f32(if i % d == 3 { 6.0 * x } else { x }));
}

/// A quantizer shape: `rows` rows of `d` values in `g` groups, `hkv` KV heads (the fragment layout's
/// `[Tmax, HKV]`).
pub fn qshape(rows: i64, d: i64, g: i64, hkv: i64) -> Shape {
    Shape::new(&[("rows", rows), ("D", d), ("G", g), ("HKV", hkv)])
}

fn dims(shape: &Shape) -> Result<QuantizeDims> {
    Ok(QuantizeDims {
        rows: shape.dim("rows", i32::MAX as i64)?,
        d: shape.dim("D", 1 << 20)?,
        groups: shape.dim("G", 1 << 20)?,
        hkv: shape.dim("HKV", 1 << 20)?,
    })
}

impl Op for Quantize {
    fn default_shapes(&self) -> Vec<Shape> {
        // rows = B * Tmax * HKV of the decode caches at B = 32 and 128.
        let mut v = Vec::new();
        for rows in [262_144, 1_048_576] {
            for g in [1, 4] {
                v.push(qshape(rows, 128, g, 1));
            }
        }
        v
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        check_shape(v, dims(shape)?)
    }
    fn limits(&self, _v: &Variant) -> Vec<Limit> {
        vec![
            Limit { constraint: HEAD_DIM, past: qshape(3, 96, 1, 1), inside: Some(qshape(3, 64, 1, 1)) },
            Limit { constraint: GROUPS, past: qshape(3, 128, 2, 1), inside: Some(qshape(3, 128, 4, 1)) },
        ]
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let q = dims(shape)?;
        check_int4(q.d, q.groups)?;
        let x = cache_values(q.rows * q.d, q.d, seed);
        let reference = quantize(&x, q.d, q.groups);
        // The reference's rows dequantized against the bf16 input, a stretch of rows at a time.
        let cost = compare_by("quantization", x.len(), |first, deq: &mut [f64], xf| {
            dequantize_stretch(&reference, q.d, q.groups, first, deq);
            xf.iter_mut().zip(&x[first..]).for_each(|(o, v)| *o = v.to_f64());
        })
        .rel_l2;
        let rb = int4_row_bytes(q.d, q.groups);
        let copies = rotation_copies(gpu, (q.rows * (2 * q.d + rb)) as u64);
        Ok(Box::new(QuantizeProblem {
            q,
            inp: Rotated::upload(gpu, &x, copies)?,
            out: Rotated::outputs(gpu, q.rows * rb, copies)?,
            reference,
            cost,
            reference_fragments: None,
            copies,
            prepared: Current::default(),
        }))
    }
}

struct QuantizeProblem {
    q: QuantizeDims,
    inp: Rotated<bf16>,
    /// Sized for the prepared stage's layout.
    out: Rotated<u8>,
    /// The CPU quantizer's rows, and their dequantized values' error against the bf16 input (rel L2).
    reference: Vec<u8>,
    cost: f64,
    /// The same bytes in the prepared fragment stage's layout.
    reference_fragments: Option<(Role, Vec<u8>)>,
    copies: usize,
    prepared: Current<Prepared>,
}

/// Every byte of `out` against `reference`: each one that differs (or is missing) counts as a
/// non-finite element, so any mismatch fails the check whatever the tolerance. Counted a stretch
/// at a time on every core; what comparing a vector of NaN at the mismatches (0 elsewhere) with
/// zeros gave, without making either (a quantizer's output is 80 MB at 2^20 rows).
pub fn byte_mismatches(output: &str, out: &[u8], reference: &[u8]) -> ErrorStats {
    let n = out.len().min(reference.len());
    let stretches: Vec<(usize, Option<usize>)> = out[..n]
        .par_chunks(COMPARE_CHUNK)
        .zip(reference[..n].par_chunks(COMPARE_CHUNK))
        .map(|(o, r)| match o == r {
            true => (0, None),
            false => (o.iter().zip(r).filter(|(a, b)| a != b).count(), o.iter().zip(r).position(|(a, b)| a != b)),
        })
        .collect();
    let mismatched: usize = stretches.iter().map(|s| s.0).sum();
    let first = stretches.iter().enumerate().find_map(|(c, s)| s.1.map(|i| c * COMPARE_CHUNK + i));
    let missing = reference.len().saturating_sub(n);
    ErrorStats {
        output: output.to_string(),
        rel_l2: 0.0,
        max_abs: 0.0,
        non_finite: mismatched + missing,
        first_non_finite: first.or((missing > 0).then_some(n)),
        count: reference.len(),
    }
}

/// Elements `first..first + out.len()` of the INT4 rows `rows` (of `d` values in `groups`
/// groups) dequantized into `out`: one stretch of [`compare_by`] (whole rows: `d` divides the
/// stretch), so that no side of a comparison is dequantized whole (2^27 f64 at 2^20 rows of 128).
fn dequantize_stretch(rows: &[u8], d: usize, groups: usize, first: usize, out: &mut [f64]) {
    debug_assert_eq!((first % d, out.len() % d), (0, 0));
    let rb = int4_row_bytes(d, groups);
    for (o, row) in out.chunks_mut(d).zip(rows[first / d * rb..].chunks(rb)) {
        dequantize_row(row, d, groups, o);
    }
}

impl Problem for QuantizeProblem {
    fn workload(&self) -> Workload {
        let (r, d) = (self.q.rows as u64, self.q.d as u64);
        let rb = int4_row_bytes(self.q.d, self.q.groups) as u64;
        Workload { bytes: r * (2 * d + rb), flops: 4 * r * d, bound: Bound::Memory }
    }
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        let plan = v.plan::<QuantizePlan>()?;
        let bytes = self.q.out_bytes(plan);
        if self.out.get(0).len() != bytes {
            self.out = Rotated::outputs(gpu, bytes, self.copies)?;
        }
        if let QuantizePlan::Fragments(role) = plan {
            if self.reference_fragments.as_ref().is_none_or(|(r, _)| *r != role) {
                let QuantizeDims { d, groups, hkv, .. } = self.q;
                let frag = to_fragments(&self.reference, 1, self.q.tmax(), hkv, d, groups, role);
                self.reference_fragments = Some((role, frag));
            }
        }
        Ok(self.prepared.set(v, prepare(gpu, v, self.q)?))
    }
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        p.enqueue(stream, QuantizeArgs { out: self.out.get_mut(copy), inp: self.inp.get(copy) })
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, p) = self.prepared.get()?;
        let QuantizeDims { d, groups, hkv, .. } = self.q;
        let out = gpu.download(self.out.get(copy))?;
        // The fragment layout is compared byte for byte in its own order, and read back as rows for
        // the dequantized comparison.
        let (want_bytes, rows_out) = match (p.plan, &self.reference_fragments) {
            (QuantizePlan::Fragments(role), Some((r, frag))) if *r == role => {
                (&frag[..], Cow::Owned(from_fragments(&out, 1, self.q.tmax(), hkv, d, groups, role)))
            }
            (QuantizePlan::Fragments(_), _) => return Err(common::Error::NotPrepared),
            (QuantizePlan::Rows, _) => (&self.reference[..], Cow::Borrowed(&out)),
        };
        // The rows written dequantized against the reference's, a stretch of rows at a time.
        require_len("output rows", rows_out.len(), self.reference.len())?;
        let dequantized = compare_by("dequantized", self.q.rows * d, |first, got: &mut [f64], want| {
            dequantize_stretch(&rows_out, d, groups, first, got);
            dequantize_stretch(&self.reference, d, groups, first, want);
        });
        Ok(Verification::new(v.tolerance())
            .add_stats(byte_mismatches("bytes", &out, want_bytes))
            .add_stats(dequantized)
            .with_note(format!("quantization error vs the bf16 input: rel L2 {:.2e}", self.cost)))
    }
}
