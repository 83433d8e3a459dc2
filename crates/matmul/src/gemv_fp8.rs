//! `matmul/gemv-fp8`: the decode GEMV on e4m3 weights (issue 48), `out[M, N] = inp[M, K] ·
//! dequant(W)[N, K]ᵀ (+ bias)` then `gemv`'s tails, with W in [`crate::fp8`]'s format: 1-byte codes
//! and an fp32 scale per 128 × 128 block, quantized once at load. At M = 1 the floor is reading W:
//! 1 byte a weight (plus 4 bytes of scale per 16 K weights), half of `gemv`'s.
//!
//! Shape keys are `gemv`'s (`M`, `N`, `K`, `bias`, `epi`, `in`, `ln`), with `ln` = 1 folding the
//! LayerNorm's gain into W before the quantization ([`gemv::fold_layernorm_f32`]). A stage is checked
//! against the f64 product on the dequantized weights, so the kernel's error is separated from the
//! format's; the format's (the same product on the unquantized weights against the exact layer) is
//! the check's note.

use common::check::{compare, Verification};
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, Rotated};
use common::{
    require, ActBuf, ActType, Bound, Gpu, LaunchShape, Limit, Op, Precision, Prepared as Current, Problem,
    Requirements, Result, Shape, Variant, Workload,
};

pub use crate::gemv::Prepared;
use crate::gemv::{self, GemvArgs, GemvDims, GemvInputs, GemvWeight};
use crate::linear_bf16::Tail;
use crate::{fp8, FAMILY, SOURCES};

const OP: &str = "gemv-fp8";

common::declare_op! {
    pub struct GemvFp8 {
        name: OP,
        description: "decode GEMV on e4m3 weights with 128 x 128 block scales: out[M,N] = inp[M,K] . dequant(W)[N,K]^T + bias, then GELU or + residual (M <= 64)",
        shape_keys: ["M", "N", "K", "bias", "epi", "in", "ln"],
        stages: stages,
    }
}

const K_ALIGN: &str = "K % 16 == 0";
const LN_STAGE: &str = "ln = 1 on a stage that folds the LayerNorm (1)";
const ONE_PASS_K: &str = "K <= 2048";
const SPLIT_PASS_K: &str = "K <= 8192";

/// How a stage maps rows of W to threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// A warp per row of W, 4 warps a block, M rows of inp in passes of up to 8.
    Warp,
    /// [`Plan::Warp`] with a lane's pieces of the row loaded at once, [`pieces_per_lane`] of them.
    WarpLoadsFirst,
    /// [`Plan::WarpLoadsFirst`] on a persistent grid: each warp's next row requested before its
    /// current one is used, its share of inp's row in registers for all its rows; with
    /// `split_long_rows` (stage 4), a row of K > 2048 over the block's 4 warps.
    WarpStreamed { split_long_rows: bool },
    /// A block of warps per 16 rows of W on the tensor cores, all M rows at once; the warps per
    /// block chosen per shape ([`mma_split`]). Folds the LayerNorm.
    Mma,
}

fn stages() -> Vec<Variant> {
    let k = |stage, name, file, plan: Plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Fp8, summary)
            .with_plan(plan)
            .with_requirements(Requirements::SM90)
    };
    vec![
        k(
            0,
            "warp-row",
            "gemv-fp8/00_warp_row.cu",
            Plan::Warp,
            "gemv stage 1 on e4m3 codes: a warp per row, 16 codes a lane (16-byte loads) converted exactly to fp32, a scale a piece",
        ),
        k(
            1,
            "skinny-mma",
            "gemv-fp8/01_skinny_mma.cu",
            Plan::Mma,
            "mma.sync on 16 rows of W x all M rows of inp, codes converted to bf16 in registers, the block scale on inp; LayerNorm foldable",
        )
        .with_tunables(&[("GEMV_WARPS", 2048), ("GEMV_UNROLL", 4)]),
        k(
            2,
            "loads-first",
            "gemv-fp8/02_loads_first.cu",
            Plan::WarpLoadsFirst,
            "stage 0 with a lane's pieces of the row all requested before the first conversion: one trip to memory a warp, not ceil(K / 512)",
        ),
        k(
            3,
            "streamed-rows",
            "gemv-fp8/03_streamed_rows.cu",
            Plan::WarpStreamed { split_long_rows: false },
            "stage 2 on a persistent grid: each warp takes every S-th row, requests the next before it uses the current, and keeps its share of inp in registers",
        ),
        k(
            4,
            "split-rows",
            "gemv-fp8/04_split_rows.cu",
            Plan::WarpStreamed { split_long_rows: true },
            "stage 3 with a row of K > 2048 split over the block's 4 warps (2 pieces a lane at K = 3072), sums met in shared memory",
        ),
    ]
}

/// Pieces of 16 codes a lane loads at once when `warps` warps share a row of `k` codes (stages 2-4):
/// the fewest of 1, 2, 4, 8 that cover the row (8 beyond K = 4096 a warp, in passes).
fn pieces_per_lane(k: usize, warps: usize) -> usize {
    (k / 16).div_ceil(32 * warps).next_power_of_two().min(8)
}
/// Warps per block of the tensor-core stage for `blocks` blocks of 16 rows, `steps` 64-wide steps of
/// K and a tile of `mt` columns: about `target` warps over the grid, at least 8 (fewer lose at the
/// LM head in `gemv`), at most 16 (8 for mt >= 32, where the accumulators take the registers: 78-188
/// registers a thread, so 1024 threads do not fit an SM's registers), and
/// no more than the steps (a warp with none only waits at the reduction), but never under 4: the
/// reduction's 128 threads each store one of a tile's 16 x 8 outputs.
fn mma_split(blocks: u32, steps: u32, mt: u32, target: u32) -> u32 {
    let cap = if mt >= 32 { 8 } else { 16 };
    target.div_ceil(blocks).next_power_of_two().clamp(8, cap).min(steps).max(4)
}

/// Whether stage `v` can fold the LayerNorm before it (`ln` = 1: the tensor-core stage).
pub fn folds_layernorm(v: &Variant) -> bool {
    v.plan::<Plan>().is_ok_and(|p| p == Plan::Mma)
}

pub fn check_shape(v: &Variant, d: GemvDims) -> Result<()> {
    d.check_common(v, folds_layernorm(v), LN_STAGE)?;
    require(d.k.is_multiple_of(16), K_ALIGN, || format!("K = {}", d.k))?;
    if let Plan::WarpStreamed { split_long_rows } = v.plan::<Plan>()? {
        let (limit, constraint) = if split_long_rows { (8192, SPLIT_PASS_K) } else { (2048, ONE_PASS_K) };
        require(d.k <= limit, constraint, || format!("K = {}", d.k))?;
    }
    Ok(())
}

pub fn prepare(gpu: &Gpu, v: &Variant, d: GemvDims) -> Result<Prepared> {
    check_shape(v, d)?;
    // The FMA stages' entries: fp32 or bf16 inp, then the rows of inp a pass and the pieces a lane.
    let fma = if d.input == ActType::Bf16 { "gemv_fp8_bf16_" } else { "gemv_fp8_" };
    let mt = d.m.next_power_of_two().min(8);
    let warp_rows = LaunchShape::linear((d.n as u32).div_ceil(4), 128);
    let (entry, shape) = match v.plan::<Plan>()? {
        Plan::Warp => (format!("{fma}m{mt}"), warp_rows),
        Plan::WarpLoadsFirst => (format!("{fma}m{mt}_p{}", pieces_per_lane(d.k, 1)), warp_rows),
        Plan::WarpStreamed { split_long_rows } => {
            // A long row over the block's 4 warps (stage 4), else a warp a row.
            let split = if split_long_rows && d.k > 2048 { 4 } else { 1 };
            let entry = format!("{fma}p{}{}", pieces_per_lane(d.k, split), if split > 1 { "_k4" } else { "" });
            let blocks = (d.n as u32).div_ceil(4 / split as u32);
            // As many blocks as are resident at once (the occupancy of this entry's registers), no
            // more: a block that waits for a slot is a second wave.
            let probe = gpu.prepare_launch(&SOURCES, v, &entry, LaunchShape::linear(blocks, 128))?;
            let resident = gpu.info().sm_count * probe.resources().blocks_per_sm.max(1);
            (entry, LaunchShape::linear(blocks.min(resident), 128))
        }
        Plan::Mma => {
            let mt = d.m.next_power_of_two().max(8);
            let entry = match (d.ln, d.input) {
                (true, _) => "gemv_fp8_mma_ln_m",
                (false, ActType::F32) => "gemv_fp8_mma_m",
                (false, ActType::Bf16) => "gemv_fp8_mma_bf16_m",
            };
            let blocks = (d.n as u32).div_ceil(16);
            let split = mma_split(blocks, (d.k as u32).div_ceil(64), mt as u32, v.tunable("GEMV_WARPS")?);
            (format!("{entry}{mt}"), LaunchShape::linear(blocks, 32 * split).with_shared(split * 16 * 8 * 4))
        }
    };
    Ok(Prepared { launch: gpu.prepare_launch(&SOURCES, v, &entry, shape)?, d, weights: Precision::Fp8 })
}

impl Op for GemvFp8 {
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2 124M's five linears at one sequence (QKV, attention projection, MLP up, MLP down, LM
        // head), the MLP up at 8 and 32 sequences, and the folded LayerNorm where the decode step
        // has one: QKV, the MLP up with GELU (at 1 and 32), the LM head.
        vec![
            gemv::shape(1, 2304, 768, 1),
            gemv::shape(1, 768, 768, 1),
            gemv::shape(1, 3072, 768, 1),
            gemv::shape(1, 768, 3072, 1),
            gemv::shape(1, 50257, 768, 0),
            gemv::shape(8, 3072, 768, 1),
            gemv::shape(32, 3072, 768, 1),
            gemv::shape_ln(1, 2304, 768, 0),
            gemv::shape_ln(1, 3072, 768, 1),
            gemv::shape_ln(32, 3072, 768, 1),
            gemv::shape_ln(1, 50257, 768, 0),
        ]
    }
    fn validate(&self, v: &Variant, s: &Shape) -> Result<()> {
        check_shape(v, gemv::dims(s)?)
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        let mut l = gemv::common_limits();
        l.push(Limit { constraint: K_ALIGN, past: gemv::shape(3, 40, 40, 1), inside: Some(gemv::shape(3, 40, 48, 1)) });
        match v.plan::<Plan>() {
            Ok(Plan::WarpStreamed { split_long_rows: false }) => l.push(Limit {
                constraint: ONE_PASS_K,
                past: gemv::shape(1, 64, 2064, 1),
                inside: Some(gemv::shape(1, 64, 2048, 1)),
            }),
            Ok(Plan::WarpStreamed { split_long_rows: true }) => l.push(Limit {
                constraint: SPLIT_PASS_K,
                past: gemv::shape(1, 64, 8208, 1),
                inside: Some(gemv::shape(1, 64, 8192, 1)),
            }),
            _ => {}
        }
        l
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let d = gemv::dims(s)?;
        let GemvInputs { inp_dev, inp, w32, bias, residual, layernorm } = GemvInputs::new(gpu, d, seed)?;
        // What the stage multiplies (the weight it quantizes, its bias, its input rows) and the
        // layer it stands for (the LayerNorm's output, or inp, and the unquantized W).
        let (quantized, bias_dev, rows, exact_rows) = if let Some((gamma, beta)) = layernorm {
            let (folded, shift) = gemv::fold_layernorm_f32(&w32, Some(&bias), &gamma, &beta);
            // The normalized rows alone are what meets W'.
            let (ones, zeros) = (vec![1.0; d.k], vec![0.0; d.k]);
            let (normalized, _, _) = norm::layernorm::reference(&inp, &ones, &zeros, d.m, d.k, gemv::LN_EPS);
            let (exact_rows, _, _) = norm::layernorm::reference(&inp, &gamma, &beta, d.m, d.k, gemv::LN_EPS);
            (fp8::quantize_blocks(&folded, d.n, d.k), shift, normalized, exact_rows)
        } else {
            let rows: Vec<f64> = inp.iter().map(|&v| v as f64).collect();
            (fp8::quantize_blocks(&w32, d.n, d.k), bias.clone(), rows.clone(), rows)
        };
        let dequantized: Vec<f64> = quantized.dequantize().into_iter().map(f64::from).collect();
        let reference = gemv::reference(d, &rows, &dequantized, &bias_dev, residual.as_deref());
        let exact_w: Vec<f64> = w32.iter().map(|&v| v as f64).collect();
        let exact = gemv::reference(d, &exact_rows, &exact_w, &bias, residual.as_deref());
        let format_error = compare("format", &reference, &exact).rel_l2;
        // The codes rotate (they are what a decode step streams from memory); the scales with them.
        let copies = rotation_copies(gpu, (d.n * d.k) as u64);
        Ok(Box::new(GemvFp8Problem {
            d,
            inp: inp_dev,
            codes: Rotated::upload(gpu, &quantized.codes, copies)?,
            scales: Rotated::upload(gpu, &quantized.scales, copies)?,
            bias: gpu.upload(&bias_dev)?,
            residual: residual.map(|r| gpu.upload(&r)).transpose()?,
            out: Rotated::outputs(gpu, d.m * d.n, copies)?,
            reference,
            format_error,
            copies,
            prepared: Current::default(),
        }))
    }
}

struct GemvFp8Problem {
    d: GemvDims,
    inp: ActBuf,
    codes: Rotated<u8>,
    scales: Rotated<f32>,
    bias: CudaSlice<f32>,
    residual: Option<CudaSlice<f32>>,
    out: Rotated<f32>,
    /// The f64 product on the dequantized weights: what the kernel must match.
    reference: Vec<f64>,
    /// That product's relative L2 distance from the layer on unquantized weights.
    format_error: f64,
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for GemvFp8Problem {
    fn workload(&self) -> Workload {
        let GemvDims { m, n, k, bias, tail, input, .. } = self.d;
        let residual = if tail == Tail::Residual { 4 * m * n } else { 0 };
        let scales = 4 * fp8::groups(n) * fp8::groups(k);
        let bytes = n * k + scales + input.bytes() * m * k + 4 * m * n + if bias { 4 * n } else { 0 } + residual;
        Workload { bytes: bytes as u64, flops: (2 * m * n * k) as u64, bound: Bound::Memory }
    }
    common::problem_plumbing!(out);
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let args = GemvArgs {
            out: self.out.get_mut(copy),
            inp: self.inp.act(),
            weight: GemvWeight::Fp8 { codes: self.codes.get(copy), scales: self.scales.get(copy) },
            bias: self.d.bias.then_some(&self.bias),
            residual: self.residual.as_ref(),
        };
        p.enqueue(stream, args)
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        Ok(Verification::new(v.tolerance())
            .add("out (on the dequantized W)", &gpu.download(self.out.get(copy))?, &self.reference)
            .with_note(format!("format: e4m3 W against the unquantized layer, rel L2 {:.2e}", self.format_error)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_never_exceeds_the_steps() {
        // QKV at M = 1: 144 blocks, 12 steps of 64 at K = 768.
        assert_eq!(mma_split(144, 12, 8, 2048), 12);
        // The LM head's folded entry at M = 5 and K = 2080 asked for 32 warps (1024 threads) once.
        assert_eq!(mma_split(9, 33, 8, 2048), 16);
        // MLP down: 48 blocks, 48 steps: the cap of 16.
        assert_eq!(mma_split(48, 48, 8, 2048), 16);
        // The LM head: the floor of 8.
        assert_eq!(mma_split(3142, 12, 8, 2048), 8);
        // A short K: one step, and still the reduction's four warps.
        assert_eq!(mma_split(4, 1, 8, 2048), 4);
        assert_eq!(mma_split(2, 3, 8, 2048), 4);
    }

    #[test]
    fn a_row_takes_one_pass_of_pieces() {
        assert_eq!(pieces_per_lane(16, 1), 1);
        assert_eq!(pieces_per_lane(512, 1), 1);
        assert_eq!(pieces_per_lane(768, 1), 2);
        assert_eq!(pieces_per_lane(3072, 1), 8);
        assert_eq!(pieces_per_lane(8192, 1), 8);
        // Split over 4 warps: MLP down's 192 pieces are 2 a lane; 130 pieces need 2, not 1.
        assert_eq!(pieces_per_lane(3072, 4), 2);
        assert_eq!(pieces_per_lane(2080, 4), 2);
        assert_eq!(pieces_per_lane(8192, 4), 4);
    }
}
