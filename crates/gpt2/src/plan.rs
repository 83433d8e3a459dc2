//! Plans: one stage per op of the model, named (the model table's rows) or with overrides.
//! `fastest` and `fastest-bf16` are chosen on the device ([`crate::fastest::resolve`]).

use attention::decode::Decode;
use attention::kv_append::KvAppend;
use attention::prefill::Prefill;
use attention::prefill_bf16::PrefillBf16;
use common::{Error, Op, Result, Variant};
use matmul::gemv::Gemv;
use matmul::gemv_fp8::GemvFp8;
use matmul::linear::Linear;
use matmul::linear_bf16::LinearBf16;
use matmul::linear_fp8::LinearFp8;
use matmul::quantize_fp8::QuantizeFp8;
use norm::layernorm::LayerNorm;

use crate::argmax::Argmax;
use crate::encoder::Encoder;
use crate::megakernel;
use crate::pointwise::{Gelu, Residual};
use crate::sample::Sample;

/// One stage per op: the model-level ablation.
#[derive(Clone, Debug)]
pub struct Plan {
    pub name: String,
    pub encoder: Variant,
    pub layernorm: Variant,
    pub linear: Variant,
    pub attention: Variant,
    pub gelu: Variant,
    pub residual: Variant,
    /// Decode attention over the KV cache (bf16: the decode ladder's cache types). Its layout is the
    /// cache's: a paged stage (3, 4) gives the model a paged cache.
    pub decode: Variant,
    /// Moving q, k and v between the QKV GEMM and the bf16 cache.
    pub kv_append: Variant,
    /// The decode step's linears as `matmul/gemv` on bf16 copies of the weights (made once at load);
    /// `None`: the plan's `linear` on the fp32 weights.
    pub gemv: Option<Variant>,
    /// Greedy sampling on the device (a greedy decode step downloads ids, not logits).
    pub argmax: Variant,
    /// Temperature, top-k and top-p sampling on the device (a sampled step downloads ids too).
    pub sample: Variant,
    /// How the decode step runs: stage 0, the ops above as kernels of their own (replayed as a
    /// CUDA graph with `--graph`); a megakernel stage, the whole step in one persistent kernel
    /// (`gpt2/decode-step`), which replaces the step's ops above but `sample`.
    pub step: Variant,
    /// The whole-sequence pass on bf16 activations (`None`: fp32, the stages above).
    pub bf16: Option<Bf16Stages>,
    /// The linears on e4m3 weights (`None`: the bf16 or fp32 ones): the bf16 pass's linears and the
    /// decode step's GEMVs replaced.
    pub fp8: Option<Fp8Stages>,
    /// The saved sweep configurations the `fastest` plans applied (`ladder sweep --save-best`), one
    /// line each: `op/NN-stage NAME=value,... (best at SHAPE)`.
    pub tuned: Vec<String>,
}

/// The stages of a bf16 whole-sequence pass: the residual stream stays fp32 (the encoder writes it,
/// the projections add into it in their GEMM's tail); LayerNorm reads it and stores bf16, the
/// linears read bf16 and store bf16 (QKV; the MLP up with GELU) or add into the stream (the
/// projections); attention reads and writes bf16. The decode step's LayerNorm is `layernorm` too
/// when its linears run the GEMV (which then reads bf16).
#[derive(Clone, Debug)]
pub struct Bf16Stages {
    /// A LayerNorm stage storing bf16 (`norm/layernorm` at `out` = 16).
    pub layernorm: Variant,
    /// A `matmul/linear-bf16` stage that fuses the tails and stores bf16 (stage 12 on, or cuBLASLt):
    /// QKV, the MLP up with GELU, the LM head.
    pub linear: Variant,
    /// The `matmul/linear-bf16` stage of the two projections, which add into the fp32 residual
    /// stream in their tail (a choice of its own: an epilogue that reads as much as it writes, and
    /// N = C columns, where another tiling may win).
    pub residual_linear: Variant,
    /// A `attention/prefill-bf16` stage.
    pub attention: Variant,
}

/// The stages of an fp8 plan's linears, over the bf16 pass (its LayerNorm, attention and fp32 residual
/// stream): in the whole-sequence pass each linear's bf16 input quantized to e4m3 with one scale per
/// row per 128 channels, then the FP8 tensor-core linear on the weights' 128 x 128 blocks (made once at
/// load) with the bf16 pass's tails; in the decode step the FP8 GEMV on the same blocks (folded with
/// the LayerNorm before it where the stage folds).
#[derive(Clone, Debug)]
pub struct Fp8Stages {
    /// A `matmul/quantize-fp8` stage (activations: 1 x 128 row scales).
    pub quantize: Variant,
    /// A `matmul/linear-fp8` stage with the tails and a bf16 output (stage 4 on): every linear of the
    /// whole-sequence pass, the LM head included.
    pub linear: Variant,
    /// A `matmul/gemv-fp8` stage: the decode step's linears.
    pub gemv: Variant,
}

/// The op names a plan assigns, in forward order (`decode`, `kv-append` and `gemv` run with the KV
/// cache; `gemv=off` gives the decode step the plan's `linear`; `argmax` ends a greedy decode step,
/// `sample` a sampled one; `decode-step` above 0 runs the step as a megakernel); then the bf16
/// pass's four, all on (a bf16 plan) or all off; then the fp8 linears' three, all on (an fp8 plan,
/// over a bf16 pass) or all off.
pub const PLAN_OPS: [&str; 19] = [
    "encoder",
    "layernorm",
    "linear",
    "attention",
    "gelu",
    "residual",
    "decode",
    "kv-append",
    "gemv",
    "argmax",
    "sample",
    "decode-step",
    "layernorm-bf16",
    "linear-bf16",
    "linear-bf16-residual",
    "attention-bf16",
    "quantize-fp8",
    "linear-fp8",
    "gemv-fp8",
];

/// The index in [`PLAN_OPS`] of the bf16 pass's first op.
pub(crate) const BF16_OPS: usize = 12;

/// The index in [`PLAN_OPS`] of the fp8 linears' first op.
pub(crate) const FP8_OPS: usize = 16;

/// One stage per op of [`PLAN_OPS`].
pub type Stages = [u32; PLAN_OPS.len()];

/// No stage: an optional op (`gemv`, the bf16 pass's) is off.
pub(crate) const OFF: u32 = u32::MAX;

fn stage_of(op: &dyn Op, stage: u32) -> Result<Variant> {
    stage_in(op.variants(), &format!("{}/{}", op.family(), op.name()), stage)
}

/// Stage `stage` of the stage list `variants` of op `op` (`family/name`).
fn stage_in(variants: Vec<Variant>, op: &str, stage: u32) -> Result<Variant> {
    let have: Vec<u32> = variants.iter().map(|v| v.stage).collect();
    variants
        .into_iter()
        .find(|v| v.stage == stage)
        .ok_or_else(|| Error::constraint(format!("{op} stage in {have:?}"), format!("stage {stage}")))
}

/// The named plans, in the model table's order. `fastest` and `fastest-bf16` are chosen on the
/// device ([`crate::fastest::resolve`]); the others are fixed.
pub const PLAN_NAMES: [&str; 11] =
    ["naive", "report", "fp32", "cublas", "cublas-gemv", "bf16", "fp8", "pdl", "megakernel", "fastest", "fastest-bf16"];

impl Plan {
    /// - `naive`: stage 0 of every op;
    /// - `report`: the stages the report's model ended with, where a ladder has them: its
    ///   block-reduction LayerNorm, cuBLAS fp32 GEMMs, its tuned FlashAttention-2, elementwise GELU
    ///   and residual kernels (it fused them into its bias kernel; the model does not fuse yet), and
    ///   its attention kernels run on the one query of a decode step (decode stage 0);
    /// - `fp32`: our fastest fp32 stage of every op, no tensor cores in the prefill (the plan that
    ///   must match Hugging Face to 1e-4);
    /// - `cublas`: `fp32` with cuBLAS fp32 for every linear;
    /// - `cublas-gemv`: cuBLAS TF32 for the prefill's linears, and the decode step's linears as
    ///   our GEMV on bf16 weights;
    /// - `bf16`: the whole-sequence pass on bf16 activations with the last rung of each bf16 ladder
    ///   (LayerNorm 07 storing bf16, `linear-bf16` 16 for every linear, `prefill-bf16` 13), the
    ///   decode step on the tensor-core GEMV with the LayerNorms folded in (05);
    /// - `fp8`: `bf16` with every linear on e4m3 weights in 128 x 128 blocks: in the whole-sequence
    ///   pass each linear's input quantized (`quantize-fp8` 2, which takes the LayerNorms before QKV,
    ///   the MLP up and the LM head in: no LayerNorm kernel) and `linear-fp8` 8 with the tails (its
    ///   wide tile at the LM head, stage 7's kernel at the others), the LM head included; the decode
    ///   step on `gemv-fp8` 1 with the LayerNorms folded in;
    /// - `pdl`: `bf16` with the decode step as a programmatic-dependent chain (`decode-step` 17):
    ///   every kernel after the encoder starts under the one before it and waits for it inside the
    ///   kernel, the GEMVs (stage 8) with their first pass of weights already copied, a folded
    ///   LayerNorm's rows read once and the epilogue's operands read before the products, the
    ///   folded ones at 8 warps a block so that the next link fits beside them, kv-append in the QKV
    ///   GEMV's epilogue, decode attention 11 (the cached K/V rows requested before the wait, 16
    ///   warps a block where its blocks do not fill the SMs) with its split merge done by the
    ///   attention projection as it stages its input, and a greedy
    ///   step's picks made in the LM head's epilogue, that LM head on resident blocks walking row
    ///   tiles (`gemv` 9's switch);
    /// - `megakernel`: `bf16` with the decode step as one persistent kernel (`decode-step` 5).
    ///
    /// `fastest` and `fastest-bf16` need the device: see [`crate::fastest::resolve`].
    pub fn named(name: &str) -> Result<Plan> {
        let stages: Stages = match name {
            "naive" => [0, 0, 0, 0, 0, 0, 0, 0, OFF, 0, 0, 0, OFF, OFF, OFF, OFF, OFF, OFF, OFF],
            "report" => [0, 4, 90, 5, 0, 0, 0, 0, OFF, 0, 0, 0, OFF, OFF, OFF, OFF, OFF, OFF, OFF],
            "fp32" => [0, 6, 2, 5, 1, 1, 7, 0, OFF, 0, 0, 0, OFF, OFF, OFF, OFF, OFF, OFF, OFF],
            "cublas" => [0, 6, 90, 5, 1, 1, 7, 0, OFF, 0, 0, 0, OFF, OFF, OFF, OFF, OFF, OFF, OFF],
            "cublas-gemv" => [0, 6, 91, 5, 1, 1, 7, 0, 1, 0, 0, 0, OFF, OFF, OFF, OFF, OFF, OFF, OFF],
            "bf16" => [0, 6, 91, 6, 1, 1, 7, 0, 5, 1, 0, 0, 7, 16, 16, 13, OFF, OFF, OFF],
            "fp8" => [0, 6, 91, 6, 1, 1, 7, 0, OFF, 1, 0, 0, 7, 16, 16, 13, 2, 8, 1],
            "pdl" => [0, 6, 91, 6, 1, 1, 11, 0, 8, 1, 0, 17, 7, 16, 16, 13, OFF, OFF, OFF],
            "megakernel" => [0, 6, 91, 6, 1, 1, 7, 0, 5, 1, 0, 5, 7, 16, 16, 13, OFF, OFF, OFF],
            "fastest" | "fastest-bf16" => {
                return Err(Error::constraint(
                    "a device to choose the fastest stages on (fastest::resolve)",
                    format!("'{name}' without one"),
                ))
            }
            _ => return Err(Error::constraint(format!("plan in {PLAN_NAMES:?}"), format!("'{name}'"))),
        };
        Plan::from_stages(name, stages)
    }

    /// A named plan with ops set to other stages, `NAME[:op=stage,...]` (not `fastest`, which needs
    /// the device).
    pub fn parse(spec: &str) -> Result<Plan> {
        let (name, overrides) = spec.split_once(':').unwrap_or((spec, ""));
        Plan::named(name)?.with_overrides(overrides)
    }

    /// Checks `NAME[:op=stage,...]` without a device: a known name, overrides that name ops and
    /// stages (for `fastest`, checked against `naive`, for `fastest-bf16` against `bf16`: the chosen
    /// stages come later).
    pub fn check_spec(spec: &str) -> Result<()> {
        let (name, overrides) = spec.split_once(':').unwrap_or((spec, ""));
        let base = match name {
            "fastest" => "naive",
            "fastest-bf16" => "bf16",
            _ => name,
        };
        Plan::named(base)?.with_overrides(overrides).map(|_| ())
    }

    /// The stage of each op of [`PLAN_OPS`] (`u32::MAX`: off).
    pub fn stages(&self) -> Stages {
        [
            self.encoder.stage,
            self.layernorm.stage,
            self.linear.stage,
            self.attention.stage,
            self.gelu.stage,
            self.residual.stage,
            self.decode.stage,
            self.kv_append.stage,
            self.gemv.as_ref().map_or(OFF, |v| v.stage),
            self.argmax.stage,
            self.sample.stage,
            self.step.stage,
            self.bf16.as_ref().map_or(OFF, |b| b.layernorm.stage),
            self.bf16.as_ref().map_or(OFF, |b| b.linear.stage),
            self.bf16.as_ref().map_or(OFF, |b| b.residual_linear.stage),
            self.bf16.as_ref().map_or(OFF, |b| b.attention.stage),
            self.fp8.as_ref().map_or(OFF, |f| f.quantize.stage),
            self.fp8.as_ref().map_or(OFF, |f| f.linear.stage),
            self.fp8.as_ref().map_or(OFF, |f| f.gemv.stage),
        ]
    }

    pub(crate) fn from_stages(name: &str, s: Stages) -> Result<Plan> {
        let bf16 = match s[BF16_OPS..FP8_OPS] {
            [OFF, OFF, OFF, OFF] => None,
            [ln, lin, res, att] if ![ln, lin, res, att].contains(&OFF) => Some(Bf16Stages {
                layernorm: stage_of(&LayerNorm, ln)?,
                linear: stage_of(&LinearBf16, lin)?,
                residual_linear: stage_of(&LinearBf16, res)?,
                attention: stage_of(&PrefillBf16, att)?,
            }),
            _ => {
                return Err(Error::constraint(
                    "the bf16 pass's ops all on (a bf16 pass) or all off",
                    format!("{:?}", &PLAN_OPS[BF16_OPS..FP8_OPS]),
                ))
            }
        };
        let fp8 = match s[FP8_OPS..] {
            [OFF, OFF, OFF] => None,
            [q, lin, gemv] if ![q, lin, gemv].contains(&OFF) && bf16.is_some() && s[8] == OFF && s[11] == 0 => {
                Some(Fp8Stages {
                    quantize: stage_of(&QuantizeFp8, q)?,
                    linear: stage_of(&LinearFp8, lin)?,
                    gemv: stage_of(&GemvFp8, gemv)?,
                })
            }
            _ => {
                return Err(Error::constraint(
                    "the fp8 linears all on (over a bf16 pass, with gemv off and decode-step 0: gemv-fp8 is the \
                     composed step's GEMV) or all off",
                    format!(
                        "{:?} with bf16 pass {}, gemv {}, decode-step {}",
                        &s[FP8_OPS..],
                        bf16.is_some(),
                        s[8] != OFF,
                        s[11]
                    ),
                ))
            }
        };
        Ok(Plan {
            name: name.to_string(),
            encoder: stage_of(&Encoder, s[0])?,
            layernorm: stage_of(&LayerNorm, s[1])?,
            linear: stage_of(&Linear, s[2])?,
            attention: stage_of(&Prefill, s[3])?,
            gelu: stage_of(&Gelu, s[4])?,
            residual: stage_of(&Residual, s[5])?,
            decode: stage_of(&Decode, s[6])?,
            kv_append: stage_of(&KvAppend, s[7])?,
            gemv: if s[8] == OFF { None } else { Some(stage_of(&Gemv, s[8])?) },
            argmax: stage_of(&Argmax, s[9])?,
            sample: stage_of(&Sample, s[10])?,
            // The decode step's stage list without its op, which drives the model (no import circle).
            step: stage_in(megakernel::stages(), &format!("{}/{}", crate::FAMILY, megakernel::OP), s[11])?,
            bf16,
            fp8,
            tuned: Vec::new(),
        })
    }

    /// Whether the model runs op `i` of [`PLAN_OPS`] under this plan: a bf16 plan's whole-sequence
    /// pass replaces the fp32 LayerNorm, linear, attention, GELU and residual stages, and its decode
    /// step runs them only without a GEMV; an fp8 plan's linears replace the bf16 pass's.
    pub fn runs(&self, i: usize) -> bool {
        let step_gemv = self.gemv.is_some() || self.fp8.is_some();
        let replaced = ((1..=5).contains(&i) && self.bf16.is_some() && step_gemv)
            || ((BF16_OPS + 1..BF16_OPS + 3).contains(&i) && self.fp8.is_some());
        self.stages()[i] != OFF && !replaced
    }

    /// The decode step's GEMV: `gemv` on bf16 copies of the weights, or an fp8 plan's `gemv-fp8` on
    /// e4m3 blocks (`None`: the step's linears on the plan's `linear`).
    pub fn step_gemv(&self) -> Option<StepGemv<'_>> {
        match (&self.fp8, &self.gemv) {
            (Some(f), _) => Some(StepGemv::Fp8(&f.gemv)),
            (None, Some(v)) => Some(StepGemv::Bf16(v)),
            (None, None) => None,
        }
    }

    /// The variant of op `i` of [`PLAN_OPS`] (`None`: an optional op that is off).
    pub fn variant_mut(&mut self, i: usize) -> Option<&mut Variant> {
        match i {
            0 => Some(&mut self.encoder),
            1 => Some(&mut self.layernorm),
            2 => Some(&mut self.linear),
            3 => Some(&mut self.attention),
            4 => Some(&mut self.gelu),
            5 => Some(&mut self.residual),
            6 => Some(&mut self.decode),
            7 => Some(&mut self.kv_append),
            8 => self.gemv.as_mut(),
            9 => Some(&mut self.argmax),
            10 => Some(&mut self.sample),
            11 => Some(&mut self.step),
            12 => self.bf16.as_mut().map(|b| &mut b.layernorm),
            13 => self.bf16.as_mut().map(|b| &mut b.linear),
            14 => self.bf16.as_mut().map(|b| &mut b.residual_linear),
            15 => self.bf16.as_mut().map(|b| &mut b.attention),
            16 => self.fp8.as_mut().map(|f| &mut f.quantize),
            17 => self.fp8.as_mut().map(|f| &mut f.linear),
            18 => self.fp8.as_mut().map(|f| &mut f.gemv),
            _ => None,
        }
    }

    /// This plan with single ops set to other stages: `op=stage,...` (ops as in [`PLAN_OPS`]).
    pub fn with_overrides(self, spec: &str) -> Result<Plan> {
        let mut stages = self.stages();
        for item in spec.split(',').filter(|s| !s.is_empty()) {
            let (op, stage) = item
                .split_once('=')
                .ok_or_else(|| Error::constraint("--plan overrides as op=stage", format!("'{item}'")))?;
            let i = PLAN_OPS
                .iter()
                .position(|&o| o == op)
                .ok_or_else(|| Error::constraint(format!("op in {PLAN_OPS:?}"), format!("'{op}'")))?;
            stages[i] = match stage {
                "off" if op == "gemv" || i >= BF16_OPS => OFF,
                _ => stage.parse().map_err(|_| {
                    Error::constraint("a stage number (gemv and the bf16 ops: or off)", format!("'{stage}'"))
                })?,
            };
        }
        let name = if spec.is_empty() { self.name.clone() } else { format!("{}+{spec}", self.name) };
        Plan::from_stages(&name, stages)
    }
}

/// The decode step's GEMV stage and the weights it reads ([`Plan::step_gemv`]).
#[derive(Clone, Copy, Debug)]
pub enum StepGemv<'a> {
    /// `matmul/gemv` on bf16 copies.
    Bf16(&'a Variant),
    /// `matmul/gemv-fp8` on e4m3 blocks.
    Fp8(&'a Variant),
}

impl StepGemv<'_> {
    /// Whether the stage folds the LayerNorm before QKV, the MLP up and the LM head into them.
    pub fn folds_layernorm(self) -> bool {
        match self {
            StepGemv::Bf16(v) => matmul::gemv::folds_layernorm(v),
            StepGemv::Fp8(v) => matmul::gemv_fp8::folds_layernorm(v),
        }
    }
}
