//! `matmul/quantize-fp8`: bf16 `[M, K]` to e4m3 codes and fp32 scales, the first op of issue 48's
//! FP8 ladder. Activations get one scale per row per 128 channels, weights one per 128 × 128 block
//! (the scheme and its CPU quantizer: [`crate::fp8`]). A stage must match the CPU quantizer byte for
//! byte: codes and scales bit for bit, NaN and ±Inf elements included.
//!
//! Shape keys: `M` rows (a weight's N), `K` channels, `blocks` (0: 1 × 128 row groups, activations;
//! 1: 128 × 128 blocks, weights), `ln` (1: fp32 rows in and the LayerNorm before the linear taken into
//! the quantizer, stage 2; checked on the dequantized values against the CPU quantizer on the f64
//! LayerNorm, [`LN_TOLERANCE`]).

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, Gpu, Launch, LaunchShape, Limit, Op, Precision, Prepared as Current, Problem,
    Requirements, Result, Shape, Variant, Workload,
};
use half::bf16;

use crate::fp8;
use crate::{FAMILY, SOURCES};

const OP: &str = "quantize-fp8";

common::declare_op! {
    pub struct QuantizeFp8 {
        name: OP,
        description: "bf16 [M, K] to e4m3 codes and fp32 scales: one per row per 128 channels (activations) or per 128 x 128 block (weights)",
        shape_keys: ["M", "K", "blocks", "ln"],
        stages: stages,
    }
}

const THREADS: u32 = 256;
const ELEMS: &str = "M * K < 2^31";
const K_VECTORS: &str = "K % 8 == 0";
const LN_STAGE: &str = "ln = 1 on a stage that takes the LayerNorm in (2), rows only (blocks = 0)";
const LN_K: &str = "K <= 4096 at ln = 1";
/// The LayerNorm's epsilon in the problem (GPT-2's).
const EPS: f32 = 1e-5;
/// How far stage 2's dequantized LayerNorm may be from the CPU quantizer's on the f64 LayerNorm: a
/// code differs only where the two LayerNorms fall on either side of a rounding midpoint (~1e-6 of
/// the elements, one e4m3 step each: ~1e-4 relative L2).
pub const LN_TOLERANCE: f64 = 1e-3;
/// The float4-per-lane counts stage 2's LayerNorm entry is instantiated for.
const LN_ENTRIES: [usize; 10] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32];

/// How a stage reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// An element at a time: a warp a row group.
    Elements,
    /// Eight elements a lane (16-byte loads, 8-byte stores): half a warp a row group.
    Vectors,
    /// [`Plan::Vectors`], and the LayerNorm before the linear taken in (`ln` = 1): a warp a row.
    LayerNorm,
}

impl Plan {
    /// Row groups a block of the row quantizer takes.
    fn groups_per_block(self) -> usize {
        match self {
            Plan::Elements => THREADS as usize / 32,
            Plan::Vectors | Plan::LayerNorm => THREADS as usize / 16,
        }
    }
}

fn stages() -> Vec<Variant> {
    let k = |stage, name, file, plan: Plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Fp32, summary)
            .with_plan(plan)
            .with_tolerance(0.0, "codes and scales bit for bit")
            .with_requirements(Requirements::SM90)
    };
    vec![
        k(
            0,
            "group-reduce",
            "quantize-fp8/00_group_reduce.cu",
            Plan::Elements,
            "one warp a row's 128 channels (a shuffle max, then the codes) and one block a weight's 128 x 128 block (a block max); cvt.rn.satfinite.e4m3x2.f32",
        ),
        k(
            1,
            "vectors",
            "quantize-fp8/01_vectors.cu",
            Plan::Vectors,
            "stage 0 with 16-byte loads and 8-byte code stores: 8 elements a lane, half a warp a row group, 16 rows a pass of a weight block",
        ),
        k(
            2,
            "layernorm",
            "quantize-fp8/02_layernorm.cu",
            Plan::LayerNorm,
            "stage 1, and the LayerNorm before the linear taken in (ln = 1): fp32 rows in, a warp a row in registers, its codes and row scales out without the bf16 LayerNorm between",
        ),
    ]
}

/// Whether stage `v` can take the LayerNorm before a linear in (`ln` = 1).
pub fn takes_layernorm(v: &Variant) -> bool {
    v.plan::<Plan>().is_ok_and(|p| p == Plan::LayerNorm)
}

/// The sizes of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantizeDims {
    pub m: usize,
    pub k: usize,
    /// 128 × 128 blocks (weights) instead of 1 × 128 row groups (activations).
    pub blocks: bool,
    /// fp32 rows in, quantized after the LayerNorm (gain and shift given with the call).
    pub ln: bool,
}

impl QuantizeDims {
    fn of(s: &Shape) -> Result<QuantizeDims> {
        let (m, k) = (s.dim("M", i32::MAX as i64)?, s.dim("K", i32::MAX as i64)?);
        let blocks = s.get("blocks").unwrap_or(0);
        require((0..=1).contains(&blocks), "blocks in {0, 1}", || format!("blocks = {blocks}"))?;
        let ln = s.get("ln").unwrap_or(0);
        require((0..=1).contains(&ln), "ln in {0, 1}", || format!("ln = {ln}"))?;
        Ok(QuantizeDims { m, k, blocks: blocks == 1, ln: ln == 1 })
    }

    /// Scales: `[M, ceil(K / 128)]` or `[ceil(M / 128), ceil(K / 128)]`.
    pub fn scales(&self) -> usize {
        let rows = if self.blocks { fp8::groups(self.m) } else { self.m };
        rows * fp8::groups(self.k)
    }
}

pub fn check(d: QuantizeDims) -> Result<()> {
    require(d.m >= 1 && d.k >= 1, "M, K >= 1", || format!("M = {}, K = {}", d.m, d.k))?;
    require(d.m.checked_mul(d.k).is_some_and(|x| x < 1 << 31), ELEMS, || format!("M = {}, K = {}", d.m, d.k))
}

/// A stage prepared for one shape.
pub struct Prepared {
    launch: Launch,
    d: QuantizeDims,
}

/// What stage `v` needs of the shape beyond [`check`].
fn check_stage(v: &Variant, d: QuantizeDims) -> Result<()> {
    check(d)?;
    let plan = v.plan::<Plan>()?;
    if plan != Plan::Elements {
        require(d.k.is_multiple_of(8), K_VECTORS, || format!("K = {}", d.k))?;
    }
    if d.ln {
        require(plan == Plan::LayerNorm && !d.blocks, LN_STAGE, || format!("stage {}, blocks {}", v.stage, d.blocks))?;
        require(d.k <= 4096, LN_K, || format!("K = {}", d.k))?;
    }
    Ok(())
}

pub fn prepare(gpu: &Gpu, variant: &Variant, d: QuantizeDims) -> Result<Prepared> {
    check_stage(variant, d)?;
    let per_block = variant.plan::<Plan>()?.groups_per_block();
    let (entry, grid) = match (d.blocks, d.ln) {
        (true, _) => ("quantize_blocks_fp8".to_string(), d.scales()),
        // A warp a row, N float4 a lane (the smallest instantiated N covering K).
        (false, true) => {
            let n = LN_ENTRIES.into_iter().find(|&n| n * 128 >= d.k).expect("K <= 4096 checked above");
            (format!("quantize_rows_layernorm_fp8_{n}"), d.m.div_ceil(THREADS as usize / 32))
        }
        (false, false) => ("quantize_rows_fp8".to_string(), d.scales().div_ceil(per_block)),
    };
    let shape = LaunchShape::linear(grid as u32, THREADS);
    Ok(Prepared { launch: gpu.prepare_launch(&SOURCES, variant, &entry, shape)?, d })
}

impl Prepared {
    pub fn enqueue(
        &self,
        stream: &CudaStream,
        codes: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<f32>,
        x: &CudaSlice<u16>,
    ) -> Result<()> {
        let QuantizeDims { m, k, .. } = self.d;
        require(!self.d.ln, "bf16 rows for a stage prepared with ln = 0", || "ln = 1".into())?;
        require_len("codes", codes.len(), m * k)?;
        require_len("scales", scales.len(), self.d.scales())?;
        require_len("x", x.len(), m * k)?;
        // SAFETY: both entries take (codes, scales, x, M, K); lengths checked above, M * K < 2^31 at
        // prepare, and the grid covers exactly the scales' groups.
        unsafe {
            self.launch.enqueue(stream, &[Arg::buf(codes), Arg::buf(scales), Arg::buf(x), Arg::int(m), Arg::int(k)])
        }
    }
}

impl Prepared {
    /// Whether this call takes fp32 rows and the LayerNorm before the linear (`ln` = 1).
    pub fn takes_layernorm(&self) -> bool {
        self.d.ln
    }

    /// `ln` = 1: the codes and scales of `LayerNorm(x)` with gain `gamma` and shift `beta` (K each),
    /// `x` fp32 `[M, K]`.
    pub fn enqueue_layernorm(
        &self,
        stream: &CudaStream,
        codes: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        (gamma, beta): (&CudaSlice<f32>, &CudaSlice<f32>),
        eps: f32,
    ) -> Result<()> {
        let QuantizeDims { m, k, ln, .. } = self.d;
        require(ln, "a stage prepared with ln = 1 for the LayerNorm's rows", || "ln = 0".into())?;
        require(eps.is_finite() && eps > 0.0, "eps > 0", || format!("eps = {eps}"))?;
        require_len("codes", codes.len(), m * k)?;
        require_len("scales", scales.len(), self.d.scales())?;
        require_len("x", x.len(), m * k)?;
        require_len("gamma", gamma.len(), k)?;
        require_len("beta", beta.len(), k)?;
        let args = [
            Arg::buf(codes),
            Arg::buf(scales),
            Arg::buf(x),
            Arg::buf(gamma),
            Arg::buf(beta),
            Arg::int(m),
            Arg::int(k),
            Arg::F32(eps),
        ];
        // SAFETY: the LayerNorm entries take (codes, scales, x, gamma, beta, M, K, eps); lengths checked
        // above, K % 8 == 0 and K <= 4096 at prepare (16-byte rows, N * 128 >= K float4 a lane), the
        // grid a warp a row.
        unsafe { self.launch.enqueue(stream, &args) }
    }
}

common::single_launch_stage!(Prepared);

pub fn shape(m: i64, k: i64, blocks: i64) -> Shape {
    Shape::new(&[("M", m), ("K", k), ("blocks", blocks)])
}

/// [`shape`] of rows with the LayerNorm taken in (`ln` = 1).
pub fn shape_ln(m: i64, k: i64) -> Shape {
    Shape::new(&[("M", m), ("K", k), ("blocks", 0), ("ln", 1)])
}

impl Op for QuantizeFp8 {
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2's prefill activations (B = 4, T = 1024) into its two K widths, and its four weight
        // matrices.
        vec![
            shape(4096, 768, 0),
            shape(4096, 3072, 0),
            shape(2304, 768, 1),
            shape(768, 768, 1),
            shape(3072, 768, 1),
            shape(768, 3072, 1),
            shape_ln(4096, 768),
        ]
    }
    fn validate(&self, v: &Variant, s: &Shape) -> Result<()> {
        check_stage(v, QuantizeDims::of(s)?)
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        let mut l =
            vec![Limit { constraint: ELEMS, past: shape(1 << 16, 1 << 15, 0), inside: Some(shape(3, 1000, 1)) }];
        let plan = v.plan::<Plan>().ok();
        if plan.is_some_and(|p| p != Plan::Elements) {
            l.push(Limit { constraint: K_VECTORS, past: shape(3, 1001, 0), inside: Some(shape(3, 1000, 0)) });
        }
        if plan == Some(Plan::LayerNorm) {
            l.push(Limit { constraint: LN_K, past: shape_ln(3, 4104), inside: Some(shape_ln(3, 4096)) });
        }
        l
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let d = QuantizeDims::of(s)?;
        check(d)?;
        let copies = rotation_copies(gpu, ((if d.ln { 5 } else { 3 }) * d.m * d.k) as u64);
        let (input, codes, scales) = if d.ln {
            // fp32 rows with a non-zero mean and spread (as norm/layernorm's), a gain and a shift.
            let x = uniform(d.m * d.k, -2.0, 3.0, seed);
            let (gamma, beta) = (uniform(d.k, 0.5, 1.5, seed ^ 1), uniform(d.k, -0.5, 0.5, seed ^ 2));
            let y = layernorm_f64(&x, &gamma, &beta, d.k);
            let q = fp8::quantize_rows(&y, d.m, d.k);
            let input = Input::LayerNorm {
                x: Rotated::upload(gpu, &x, copies)?,
                gamma: gpu.upload(&gamma)?,
                beta: gpu.upload(&beta)?,
            };
            (input, (q.dequantize(), q.codes), q.scales)
        } else {
            let x = inputs(d, seed);
            let (codes, scales) = if d.blocks {
                let q = fp8::quantize_blocks(&x, d.m, d.k);
                (q.codes, q.scales)
            } else {
                let q = fp8::quantize_rows(&x, d.m, d.k);
                (q.codes, q.scales)
            };
            let host: Vec<u16> = x.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
            let numbers = codes.iter().map(|&c| f32::from(c)).collect();
            (Input::Bf16(Rotated::upload(gpu, &host, copies)?), (numbers, codes), scales)
        };
        let (codes, raw_codes) = codes;
        Ok(Box::new(QuantizeProblem {
            d,
            input,
            codes: Rotated::outputs(gpu, d.m * d.k, copies)?,
            scales: Rotated::outputs(gpu, d.scales(), copies)?,
            want_codes: codes.iter().map(|&c| c as f64).collect(),
            want_raw_codes: raw_codes,
            want_scales: scales.iter().map(|&s| s as f64).collect(),
            copies,
            prepared: Current::default(),
        }))
    }
}

/// LayerNorm of each row of `x` (`[rows, k]`) in f64 with `gamma` and `beta`, rounded to f32: what the
/// CPU quantizer quantizes for stage 2's check.
fn layernorm_f64(x: &[f32], gamma: &[f32], beta: &[f32], k: usize) -> Vec<f32> {
    x.chunks(k)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / k as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / k as f64;
            let rstd = 1.0 / (var + EPS as f64).sqrt();
            row.iter()
                .zip(gamma.iter().zip(beta))
                .map(move |(&v, (&g, &b))| ((v as f64 - mean) * rstd * g as f64 + b as f64) as f32)
        })
        .collect()
}

/// bf16 values (as f32) whose magnitude changes from row to row over 2^-12 .. 2^12, so that scales
/// and subnormal codes vary; row 1 (when there is one) carries a NaN and a +Inf, and a -Inf in its
/// last group, which must come out as NaN codes and leave their groups' scales to the finite values.
fn inputs(d: QuantizeDims, seed: u64) -> Vec<f32> {
    let mut x = uniform(d.m * d.k, -1.0, 1.0, seed);
    let exps = uniform(d.m, -12.0, 12.0, seed ^ 0x5CA1E);
    for (row, e) in x.chunks_mut(d.k).zip(exps) {
        let s = e.round().exp2();
        row.iter_mut().for_each(|v| *v = bf16::from_f32(*v * s).to_f32());
    }
    if d.m > 1 {
        let row = &mut x[d.k..2 * d.k];
        row[0] = f32::NAN;
        row[(d.k / 2).min(d.k - 1)] = f32::INFINITY;
        row[d.k - 1] = f32::NEG_INFINITY;
    }
    x
}

/// What a problem quantizes.
enum Input {
    /// bf16 bit patterns, as the model's activations hold them.
    Bf16(Rotated<u16>),
    /// fp32 rows and the LayerNorm's gain and shift (`ln` = 1).
    LayerNorm { x: Rotated<f32>, gamma: CudaSlice<f32>, beta: CudaSlice<f32> },
}

struct QuantizeProblem {
    d: QuantizeDims,
    input: Input,
    codes: Rotated<u8>,
    scales: Rotated<f32>,
    /// The CPU quantizer's codes (with `ln` = 1: its dequantized values) and scales, as the numbers
    /// the comparison reads.
    want_codes: Vec<f64>,
    /// The CPU quantizer's code bytes, for the note's count of differing codes.
    want_raw_codes: Vec<u8>,
    want_scales: Vec<f64>,
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for QuantizeProblem {
    fn workload(&self) -> Workload {
        let n = (self.d.m * self.d.k) as u64;
        // bf16 in (2 bytes) or fp32 rows (4) and the gain and shift; a code out (1), a scale a group.
        let (read, flops) = if self.d.ln { (4 * n + 8 * self.d.k as u64, 10 * n) } else { (2 * n, 2 * n) };
        Workload { bytes: read + n + 4 * self.d.scales() as u64, flops, bound: Bound::Memory }
    }
    // Poisoned codes are 0xFF: the negative NaN code, never the CPU's (a NaN element is 0x7F); scales NaN.
    common::problem_plumbing!(codes, scales);
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let (codes, scales) = (self.codes.get_mut(copy), self.scales.get_mut(copy));
        match &self.input {
            Input::Bf16(x) => p.enqueue(stream, codes, scales, x.get(copy)),
            Input::LayerNorm { x, gamma, beta } => {
                p.enqueue_layernorm(stream, codes, scales, x.get(copy), (gamma, beta), EPS)
            }
        }
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        // Compared as numbers at tolerance 0: one differing code or scale fails (scales are positive,
        // so equal values are equal bits), and a poisoned scale is NaN. With the LayerNorm taken in,
        // the dequantized values at LN_TOLERANCE.
        let raw = gpu.download(self.codes.get(copy))?;
        let scales = gpu.download(self.scales.get(copy))?;
        let code_diffs = raw.iter().zip(&self.want_raw_codes).filter(|(a, b)| a != b).count();
        let scale_diffs = scales.iter().zip(&self.want_scales).filter(|(g, w)| **g as f64 != **w).count();
        let note = format!(
            "{code_diffs} of {} codes, {scale_diffs} of {} scales differ{}",
            raw.len(),
            scales.len(),
            if self.d.ln { " (scales by an fp32 rounding: the LayerNorm in fp32 against f64)" } else { "" }
        );
        let (codes, tolerance, what) = if self.d.ln {
            let q = fp8::Fp8Rows { m: self.d.m, k: self.d.k, codes: raw, scales: scales.clone() };
            (q.dequantize(), LN_TOLERANCE, "values (the CPU quantizer's on the f64 LayerNorm)")
        } else {
            (raw.into_iter().map(f32::from).collect(), v.tolerance(), "codes (the CPU quantizer's)")
        };
        let mut ver =
            Verification::new(tolerance).add(what, &codes, &self.want_codes).add("scales", &scales, &self.want_scales);
        ver.note = Some(note);
        Ok(ver)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_count_groups_and_blocks() {
        let d = |m, k, blocks| QuantizeDims { m, k, blocks, ln: false };
        assert_eq!(d(3, 129, false).scales(), 6);
        assert_eq!(d(129, 129, true).scales(), 4);
        assert_eq!(d(128, 128, true).scales(), 1);
    }

    #[test]
    fn inputs_carry_the_non_finite_row_and_varied_scales() {
        let d = QuantizeDims { m: 5, k: 130, blocks: false, ln: false };
        let x = inputs(d, 3);
        assert!(x[d.k].is_nan() && x[d.k + 65] == f32::INFINITY && x[2 * d.k - 1] == f32::NEG_INFINITY);
        let q = fp8::quantize_rows(&x, d.m, d.k);
        assert_eq!(q.codes[d.k], fp8::NAN_CODE);
        let distinct: std::collections::BTreeSet<u32> = q.scales.iter().map(|s| s.to_bits()).collect();
        assert!(distinct.len() > 3, "row magnitudes vary: {distinct:?}");
        assert!(x.iter().filter(|v| v.is_finite()).all(|&v| bf16::from_f32(v).to_f32() == v), "bf16 values");
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        assert!(QuantizeDims::of(&shape(2, 3, 2)).is_err());
        assert!(check(QuantizeDims { m: 0, k: 3, blocks: false, ln: false }).is_err());
        assert!(check(QuantizeDims { m: 1 << 16, k: 1 << 15, blocks: true, ln: false }).is_err());
        assert!(QuantizeDims::of(&Shape::new(&[("M", 2), ("K", 8), ("ln", 2)])).is_err());
    }
}
