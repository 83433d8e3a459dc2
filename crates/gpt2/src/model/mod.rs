//! GPT-2, composed from the ladders: one prepared stage per op, chosen by a plan.
//!
//! The model is OpenAI's and Hugging Face's: learned token and position embeddings, pre-LayerNorm
//! blocks (ln_1, causal self-attention with a fused QKV projection and an output projection,
//! residual; ln_2, an MLP of 4C with GELU in its tanh form, residual), ln_f, and the LM head tied to
//! the token embedding. [`block`] reads top to bottom: every call names the op it runs, and the
//! whole-sequence pass and the decode step run it alike (each a [`Pass`] over its own stages).
//!
//! Two ways through it: the whole-sequence forward pass ([`Model::forward`], every position's
//! logits; generation without a KV cache repeats it over the growing prefix), and the KV cache
//! ([`KvCache`]): [`Model::prefill_into`] runs a prompt and fills its slot's keys and values, then
//! [`Model::decode_step`] runs one token per sequence against the cache (decode attention).
//! Around it: the configuration and weights (`config`, `weights`), the plans (`plan`), the cache
//! (`cache`), the decode step's CUDA graph (`graph`) and the f64 reference (`reference`).
//!
//! This file is the model: its weights' upload, the [`Pass`] trait and [`forward`] and [`block`].
//! Beside it: `sequence` (the whole-sequence pass's stages, activations and [`Pass`]),
//! `decode_engine` (the decode step's stages, its [`Pass`], graphs and endings), `device_weights`
//! (the forms of the weights the stages read), `profile` (per-op timing) and `harness` (the step as
//! `gpt2/decode-step` checks it).

use std::collections::HashMap;
use std::sync::Arc;

use common::cudarc::driver::{CudaSlice, CudaStream};
use common::{require, ActMut, Gpu, Result};

use matmul::{gemv, gemv_fp8};
use norm::layernorm::{self, LayerNormArgs};

use crate::config::{Config, LN_EPS};
use crate::encoder::{self, EncoderDims};
use crate::megakernel as step;
use crate::plan::Plan;
use crate::weights::{Block, Params, Weights};

mod decode_engine;
mod device_weights;
mod harness;
mod profile;
mod sequence;

pub(crate) use decode_engine::folded_gemv;
use decode_engine::DecodeStep;
use device_weights::{padded_head, Bf16Weights, DeviceWeights, Fp8Weights};
pub use harness::StepOutputs;
pub(crate) use harness::{splitmix, HostCache};
pub use profile::StepTimeline;
pub use sequence::Logits;
use sequence::Prepared;

/// GPT-2 on the device with a plan.
pub struct Model {
    pub cfg: Config,
    pub plan: Plan,
    weights: DeviceWeights,
    prepared: HashMap<(usize, usize), Prepared>,
    /// The decode step, prepared for one batch size.
    decode: Option<(usize, DecodeStep)>,
    /// Replay the decode step from a CUDA graph captured once per batch size and cache.
    graph: bool,
    /// The decode step's launch settings that `gpt2/decode-step`'s shape keys set.
    step_launch: StepLaunch,
}

/// Launch settings of the decode step that its ladder sweeps (`grid`, `splits` and `warps` shape keys);
/// `None` takes the stage's own choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepLaunch {
    /// Blocks of a megakernel step's launch (default: its blocks per SM times the SMs).
    pub grid: Option<u32>,
    /// Splits of a composed step's decode attention (default: the attention stage's heuristic).
    pub splits: Option<usize>,
    /// Warps a block of a composed step's decode attention, on its stage 11 (default: by shape).
    pub attention_warps: Option<usize>,
}

impl Model {
    /// Uploads `weights` (checked against `cfg`'s shapes) for `plan`.
    pub fn new(gpu: &Gpu, cfg: Config, weights: &Weights, plan: Plan) -> Result<Model> {
        require(cfg.heads >= 1 && cfg.c.is_multiple_of(cfg.heads), "C % heads == 0", || {
            format!("C = {}, heads = {}", cfg.c, cfg.heads)
        })?;
        // The embeddings' sizes as `Weights::random` makes them (not by drawing 39M values to measure).
        for (name, got, n) in [
            ("wte", weights.wte.len(), cfg.vocab * cfg.c),
            ("wpe", weights.wpe.len(), cfg.max_t * cfg.c),
            ("blocks", weights.blocks.len(), cfg.layers),
        ] {
            require(got == n, &format!("{name} of {n} elements for this config"), || format!("{got}"))?;
        }
        let lm_head = padded_head(weights, &cfg);
        let forms = weight_forms(&plan)?;
        let bf16 = forms.bf16.then(|| Bf16Weights::new(gpu, weights, &lm_head, forms.folded)).transpose()?;
        let fp8 = forms.fp8.then(|| Fp8Weights::new(gpu, &cfg, weights, &lm_head, forms.fp8_folded)).transpose()?;
        let weights = DeviceWeights { p: weights.map(|w| gpu.upload(w))?, lm_head: gpu.upload(&lm_head)?, bf16, fp8 };
        Ok(Model {
            cfg,
            plan,
            weights,
            prepared: HashMap::new(),
            decode: None,
            graph: false,
            step_launch: StepLaunch::default(),
        })
    }

    /// Runs `plan` from now on, over the weights already on the device: it must read the same
    /// forms of them (bf16 copies, folded LayerNorms) as the plan the model was made for.
    pub fn set_plan(&mut self, plan: Plan) -> Result<()> {
        let (want, have) = (weight_forms(&plan)?, weight_forms(&self.plan)?);
        require(want == have, "a plan over the same device weights (bf16 copies, folded LayerNorms)", || {
            format!("{} needs {want:?}, the model holds {have:?}", plan.name)
        })?;
        self.plan = plan;
        self.prepared.clear();
        self.decode = None;
        Ok(())
    }

    pub(super) fn prepare(&mut self, gpu: &Gpu, b: usize, t: usize) -> Result<()> {
        if self.prepared.contains_key(&(b, t)) {
            return Ok(());
        }
        // Each (B, T) holds its activations (the logits alone are B·T·V floats): keep a few, so
        // generation without a cache, one T per step, does not pile them up.
        if self.prepared.len() >= 4 {
            self.prepared.clear();
        }
        let cfg = self.cfg;
        require(t >= 1 && t <= cfg.max_t, &format!("1 <= T <= context {}", cfg.max_t), || format!("T = {t}"))?;
        let ed = EncoderDims { b, t, c: cfg.c, vocab: cfg.vocab, max_t: cfg.max_t };
        let encoder = encoder::prepare(gpu, &self.plan.encoder, ed)?;
        let prepared = match (&self.plan.bf16, &self.plan.fp8) {
            (None, _) => Prepared::F32(Box::new(self.prepare_f32(gpu, b, t, encoder)?)),
            (Some(bf), None) => Prepared::Bf16(Box::new(self.prepare_bf16(gpu, bf, b, t, encoder)?)),
            (Some(bf), Some(f8)) => Prepared::Fp8(Box::new(self.prepare_fp8(gpu, (bf, f8), b, t, encoder)?)),
        };
        self.prepared.insert((b, t), prepared);
        Ok(())
    }
}

/// One transformer block as a pass runs it: its fp32 parameters and its index (the layer of the KV
/// cache and of the weights' other forms).
#[derive(Clone, Copy)]
struct Layer<'a> {
    w: &'a Block<CudaSlice<f32>>,
    index: usize,
}

/// A block's four linears, in forward order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockLinear {
    Qkv,
    Proj,
    Fc,
    FcProj,
}

impl BlockLinear {
    /// The weight and bias of this linear in block `l`.
    fn params<T>(self, l: &Block<T>) -> (&T, &T) {
        match self {
            BlockLinear::Qkv => (&l.qkv_w, &l.qkv_b),
            BlockLinear::Proj => (&l.proj_w, &l.proj_b),
            BlockLinear::Fc => (&l.fc_w, &l.fc_b),
            BlockLinear::FcProj => (&l.fcproj_w, &l.fcproj_b),
        }
    }

    /// The name a per-op breakdown gives it.
    fn name(self) -> &'static str {
        match self {
            BlockLinear::Qkv => "linear qkv",
            BlockLinear::Proj => "linear proj",
            BlockLinear::Fc => "linear fc",
            BlockLinear::FcProj => "linear fcproj",
        }
    }
}

/// The ops of the model as one pass runs them on its prepared stages and activations: the
/// whole-sequence pass in fp32 or bf16 ([`Sequence`]) and the decode step ([`Step`]) each
/// implement it, and [`forward`] and [`block`] call them in order.
trait Pass {
    /// `x = wte[token] + wpe[position]`.
    fn embed(&mut self, s: &Arc<CudaStream>) -> Result<()>;
    /// `ln = LayerNorm(x)` with gain `w` and bias `b` (nothing where the linears after it take it in:
    /// a GEMV that folds it, the fp8 quantizer).
    fn layernorm(&mut self, s: &Arc<CudaStream>, w: &CudaSlice<f32>, b: &CudaSlice<f32>) -> Result<()>;
    /// `qkv = ln · Wᵀ + b` of layer `l`.
    fn qkv(&mut self, s: &Arc<CudaStream>, l: Layer) -> Result<()>;
    /// `att = attention(qkv)` over this layer's keys and values.
    fn attention(&mut self, s: &Arc<CudaStream>, layer: usize) -> Result<()>;
    /// `x += inp · Wᵀ + b` for projection `which` (the attention's, from `att`; the MLP's down, from
    /// `gelu`): one kernel where the linear adds the residual in its tail, else the linear and the
    /// residual add.
    fn linear_residual(&mut self, s: &Arc<CudaStream>, which: BlockLinear, l: Layer) -> Result<()>;
    /// `gelu = GELU(ln · Wᵀ + b)`, the MLP up: one kernel where the linear applies GELU in its tail,
    /// else the linear and the GELU.
    fn linear_gelu(&mut self, s: &Arc<CudaStream>, l: Layer) -> Result<()>;
    /// `logits = ln · wteᵀ`.
    fn lm_head(&mut self, s: &Arc<CudaStream>) -> Result<()>;
}

/// The model, op by op: embeddings, the blocks, the final LayerNorm and the LM head.
fn forward(s: &Arc<CudaStream>, p: &mut impl Pass, w: &Params<CudaSlice<f32>>) -> Result<()> {
    p.embed(s)?;
    for (index, w) in w.blocks.iter().enumerate() {
        block(s, p, Layer { w, index })?;
    }
    p.layernorm(s, &w.lnf_w, &w.lnf_b)?;
    p.lm_head(s)
}

/// One transformer block, op by op.
fn block(s: &Arc<CudaStream>, p: &mut impl Pass, l: Layer) -> Result<()> {
    p.layernorm(s, &l.w.ln1_w, &l.w.ln1_b)?;
    p.qkv(s, l)?;
    p.attention(s, l.index)?;
    p.linear_residual(s, BlockLinear::Proj, l)?;
    p.layernorm(s, &l.w.ln2_w, &l.w.ln2_b)?;
    p.linear_gelu(s, l)?;
    p.linear_residual(s, BlockLinear::FcProj, l)
}

/// Whether a `decode-step` stage is a megakernel (stages 0, 6 and 7 are the composed step).
fn is_megakernel(v: &common::Variant) -> Result<bool> {
    Ok(v.plan::<step::Plan>()?.model_plan().is_none())
}

/// The forms of the weights a plan reads besides the fp32 ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WeightForms {
    /// bf16 copies (a bf16 GEMV decode step, a bf16 pass's linears or a megakernel).
    bf16: bool,
    /// The LayerNorms folded into the bf16 linears after them (a folding GEMV or a megakernel).
    folded: bool,
    /// e4m3 blocks (an fp8 plan).
    fp8: bool,
    /// The LayerNorms folded into the e4m3 linears after them (a folding FP8 GEMV).
    fp8_folded: bool,
}

fn weight_forms(plan: &Plan) -> Result<WeightForms> {
    let mega = is_megakernel(&plan.step)?;
    let fp8 = plan.fp8.as_ref();
    Ok(WeightForms {
        bf16: mega || plan.gemv.is_some() || (plan.bf16.is_some() && fp8.is_none()),
        folded: mega || plan.gemv.as_ref().is_some_and(gemv::folds_layernorm),
        fp8: fp8.is_some(),
        fp8_folded: fp8.is_some_and(|f| gemv_fp8::folds_layernorm(&f.gemv)),
    })
}

/// `out = LayerNorm(x)` with gain and bias `w`, writing each row's mean and rstd into `stats`.
fn enqueue_layernorm(
    s: &Arc<CudaStream>,
    p: &layernorm::Prepared,
    out: ActMut,
    (mean, rstd): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
    x: &CudaSlice<f32>,
    (weight, bias): (&CudaSlice<f32>, &CudaSlice<f32>),
) -> Result<()> {
    p.enqueue(s, LayerNormArgs { out, mean, rstd, inp: x, weight, bias, eps: LN_EPS })
}
