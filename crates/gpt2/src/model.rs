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

use std::collections::HashMap;
use std::sync::Arc;

use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::uniform;
use common::launch::device_ptr;
use common::timing::{Timing, TimingConfig};
use common::{require, Act, ActMut, ActType, DriverContext, Error, Gpu, Result};

use attention::decode::{self as attn_decode, DecodeArgs, DecodeDims, Dtype, Heads, Layout, PagedCache, SeqLens};
use attention::kv_append::{self, Cells, KvAppendArgs, KvAppendDims};
use attention::prefill::{self, PrefillArgs, PrefillDims};
use attention::prefill_bf16::{self, PrefillBf16Args, PrefillBf16Dims};
use attention::reference::Dims as AttnDims;
use matmul::gemv::{self, GemvArgs, GemvDims};
use matmul::linear::{self, LinearArgs, LinearDims};
use matmul::linear_bf16::{self, LinearBf16Args, LinearBf16Dims, Output, Tail};
use norm::layernorm::{self, LayerNormArgs, LayerNormDims};

use crate::argmax::{self, ArgmaxDims};
use crate::cache::{KvCache, LayerCache, PAGED_BLOCK};
use crate::config::{Config, LN_EPS};
use crate::decode_step::{self as step, HostCache, MegaStep, MkIo, MkLayer, MkModel};
use crate::encoder::{self, EncoderArgs, EncoderDims, Positions, TokenIds};
use crate::graph;
use crate::plan::{Bf16Stages, Plan};
use crate::pointwise::{self, Kind};
use crate::sample::{self, SampleDims};
use crate::sampling::Sampling;
use crate::weights::{Block, Params, Weights};

/// Every op of the whole-sequence pass prepared for one (B, T), in the plan's precision.
enum Prepared {
    F32(Box<Stages32>),
    Bf16(Box<Stages16>),
}

impl Prepared {
    /// The logits a pass ending in `which` wrote, as fp32: `[B·T, V]` or `[B, V]` (from the padded
    /// `[rows, Vp]` on the device).
    fn download_logits(&self, gpu: &Gpu, which: Logits, rows: usize, (v, vp): (usize, usize)) -> Result<Vec<f32>> {
        match (self, which) {
            (Prepared::F32(p), Logits::All) => gpu.download_rows(&p.acts.logits, rows, v, vp),
            (Prepared::F32(p), Logits::Last) => gpu.download_rows(&p.last.logits, rows, v, vp),
            (Prepared::Bf16(p), Logits::All) => {
                let bits = gpu.download_rows(&p.acts.logits, rows, v, vp)?;
                Ok(bits.into_iter().map(|b| half::bf16::from_bits(b).to_f32()).collect())
            }
            (Prepared::Bf16(p), Logits::Last) => gpu.download_rows(&p.last.logits, rows, v, vp),
        }
    }
}

/// The fp32 pass's stages for one (B, T).
struct Stages32 {
    encoder: encoder::Prepared,
    layernorm: layernorm::Prepared,
    /// A block's linears, in [`BlockLinear`] order.
    linears: [linear::Prepared; 4],
    lm_head: linear::Prepared,
    attention: prefill::Prepared,
    gelu: pointwise::Prepared,
    residual: pointwise::Prepared,
    acts: Activations,
    last: LastLogits<linear::Prepared, f32>,
}

/// The bf16 pass's stages for one (B, T) ([`crate::plan::Bf16Stages`]): the block's GELU and
/// residual adds run in its linears' tails.
struct Stages16 {
    encoder: encoder::Prepared,
    layernorm: layernorm::Prepared,
    /// A block's linears, in [`BlockLinear`] order (the projections on the plan's residual stage).
    linears: [linear_bf16::Prepared; 4],
    lm_head: linear_bf16::Prepared,
    attention: prefill_bf16::Prepared,
    acts: Activations16,
    last: LastLogits<linear_bf16::Prepared, u16>,
}

/// Which positions' logits a whole-sequence pass computes: every one (what the model table's
/// prefill and Hugging Face's forward compute), or each sequence's last (what generation samples
/// from: the LM head over B rows instead of B·T).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    All,
    Last,
}

/// The LM head over each sequence's last position: those rows of the final LayerNorm's output
/// (of element type `E`), gathered, and their logits.
struct LastLogits<L, E> {
    lm_head: L,
    ln: CudaSlice<E>,
    logits: CudaSlice<f32>,
}

impl<L, E: common::cudarc::driver::DeviceRepr + common::cudarc::driver::ValidAsZeroBits> LastLogits<L, E> {
    fn new(gpu: &Gpu, cfg: &Config, b: usize, lm_head: L) -> Result<Self> {
        Ok(LastLogits { lm_head, ln: gpu.zeros(b * cfg.c)?, logits: gpu.zeros(b * cfg.padded_vocab())? })
    }

    /// Copies row `t - 1` of each of the B sequences of `ln` (`[B·T, C]`) into `self.ln`.
    fn gather(&mut self, s: &Arc<CudaStream>, ln: &CudaSlice<E>, (b, t, c): (usize, usize, usize)) -> Result<()> {
        for i in 0..b {
            let row = (i * t + t - 1) * c;
            s.memcpy_dtod(&ln.slice(row..row + c), &mut self.ln.slice_mut(i * c..(i + 1) * c))
                .ctx("gather the last positions")?;
        }
        Ok(())
    }
}

/// The activations of one fp32 pass over `rows` token positions (B·T in the prefill, B in a decode
/// step).
struct Activations {
    x: CudaSlice<f32>,
    ln: CudaSlice<f32>,
    mean: CudaSlice<f32>,
    rstd: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    att: CudaSlice<f32>,
    att_lse: CudaSlice<f32>,
    proj: CudaSlice<f32>,
    fc: CudaSlice<f32>,
    gelu: CudaSlice<f32>,
    logits: CudaSlice<f32>,
}

impl Activations {
    /// The output and input of a block's linear `which`; `fused`: a linear that applies the block's
    /// tail itself writes where the tail would (the MLP up into `gelu`, the projections into `x`).
    fn linear_io(&mut self, which: BlockLinear, fused: bool) -> (&mut CudaSlice<f32>, &CudaSlice<f32>) {
        match (which, fused) {
            (BlockLinear::Qkv, _) => (&mut self.qkv, &self.ln),
            (BlockLinear::Proj, false) => (&mut self.proj, &self.att),
            (BlockLinear::Proj, true) => (&mut self.x, &self.att),
            (BlockLinear::Fc, false) => (&mut self.fc, &self.ln),
            (BlockLinear::Fc, true) => (&mut self.gelu, &self.ln),
            (BlockLinear::FcProj, false) => (&mut self.proj, &self.gelu),
            (BlockLinear::FcProj, true) => (&mut self.x, &self.gelu),
        }
    }

    fn new(gpu: &Gpu, cfg: &Config, rows: usize) -> Result<Activations> {
        let c = cfg.c;
        Ok(Activations {
            x: gpu.zeros(rows * c)?,
            ln: gpu.zeros(rows * c)?,
            mean: gpu.zeros(rows)?,
            rstd: gpu.zeros(rows)?,
            qkv: gpu.zeros(rows * 3 * c)?,
            att: gpu.zeros(rows * c)?,
            att_lse: gpu.zeros(rows * cfg.heads)?,
            proj: gpu.zeros(rows * c)?,
            fc: gpu.zeros(rows * 4 * c)?,
            gelu: gpu.zeros(rows * 4 * c)?,
            logits: gpu.zeros(rows * cfg.padded_vocab())?,
        })
    }
}

/// The activations of one bf16 pass over `rows` positions: the residual stream `x` fp32, the rest
/// bf16 bit patterns (`gelu`: the MLP up's output, GELU applied in its tail; `logits`: every
/// position's, bf16 as Hugging Face's bf16 model returns them; the last positions' are fp32,
/// [`LastLogits`], for sampling).
struct Activations16 {
    x: CudaSlice<f32>,
    ln: CudaSlice<u16>,
    mean: CudaSlice<f32>,
    rstd: CudaSlice<f32>,
    qkv: CudaSlice<u16>,
    att: CudaSlice<u16>,
    att_lse: CudaSlice<f32>,
    gelu: CudaSlice<u16>,
    logits: CudaSlice<u16>,
}

impl Activations16 {
    fn new(gpu: &Gpu, cfg: &Config, rows: usize) -> Result<Activations16> {
        let c = cfg.c;
        Ok(Activations16 {
            x: gpu.zeros(rows * c)?,
            ln: gpu.zeros(rows * c)?,
            mean: gpu.zeros(rows)?,
            rstd: gpu.zeros(rows)?,
            qkv: gpu.zeros(rows * 3 * c)?,
            att: gpu.zeros(rows * c)?,
            att_lse: gpu.zeros(rows * cfg.heads)?,
            gelu: gpu.zeros(rows * 4 * c)?,
            logits: gpu.zeros(rows * cfg.padded_vocab())?,
        })
    }
}

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
    /// Blocks of a megakernel step's launch (`None`: its stage's default, every SM).
    mega_grid: Option<u32>,
}

impl Model {
    /// Uploads `weights` (checked against `cfg`'s shapes) for `plan`.
    pub fn new(gpu: &Gpu, cfg: Config, weights: &Weights, plan: Plan) -> Result<Model> {
        require(cfg.heads >= 1 && cfg.c.is_multiple_of(cfg.heads), "C % heads == 0", || {
            format!("C = {}, heads = {}", cfg.c, cfg.heads)
        })?;
        let want = Weights::random(&Config { layers: 0, ..cfg }, 0);
        for (name, got, n) in [
            ("wte", weights.wte.len(), want.wte.len()),
            ("wpe", weights.wpe.len(), want.wpe.len()),
            ("blocks", weights.blocks.len(), cfg.layers),
        ] {
            require(got == n, &format!("{name} of {n} elements for this config"), || format!("{got}"))?;
        }
        let lm_head = padded_head(weights, &cfg);
        let bf16 = match weight_forms(&plan)? {
            WeightForms { bf16: true, folded } => Some(Bf16Weights::new(gpu, weights, &lm_head, folded)?),
            _ => None,
        };
        let weights = DeviceWeights { p: weights.map(|w| gpu.upload(w))?, lm_head: gpu.upload(&lm_head)?, bf16 };
        Ok(Model { cfg, plan, weights, prepared: HashMap::new(), decode: None, graph: false, mega_grid: None })
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

    fn prepare(&mut self, gpu: &Gpu, b: usize, t: usize) -> Result<()> {
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
        let prepared = match &self.plan.bf16 {
            None => Prepared::F32(Box::new(self.prepare_f32(gpu, b, t, encoder)?)),
            Some(bf) => Prepared::Bf16(Box::new(self.prepare_bf16(gpu, bf, b, t, encoder)?)),
        };
        self.prepared.insert((b, t), prepared);
        Ok(())
    }

    fn prepare_f32(&self, gpu: &Gpu, b: usize, t: usize, encoder: encoder::Prepared) -> Result<Stages32> {
        let (cfg, p) = (self.cfg, &self.plan);
        let (c, m) = (cfg.c, b * t);
        let lin =
            |m: usize, n: usize, k: usize, bias: bool| linear::prepare(gpu, &p.linear, LinearDims { m, n, k, bias });
        let ad = AttnDims { b, t, c, nh: cfg.heads };
        Ok(Stages32 {
            encoder,
            layernorm: layernorm::prepare(gpu, &p.layernorm, LayerNormDims { rows: m, c, out: ActType::F32 })?,
            linears: [lin(m, 3 * c, c, true)?, lin(m, c, c, true)?, lin(m, 4 * c, c, true)?, lin(m, c, 4 * c, true)?],
            lm_head: lin(m, cfg.padded_vocab(), c, false)?,
            attention: prefill::prepare(gpu, &p.attention, PrefillDims { dims: ad, window: t })?,
            gelu: pointwise::prepare(gpu, &p.gelu, Kind::Gelu, m * 4 * c)?,
            residual: pointwise::prepare(gpu, &p.residual, Kind::Residual, m * c)?,
            acts: Activations::new(gpu, &cfg, m)?,
            last: LastLogits::new(gpu, &cfg, b, lin(b, cfg.padded_vocab(), c, false)?)?,
        })
    }

    fn prepare_bf16(
        &self,
        gpu: &Gpu,
        bf: &Bf16Stages,
        b: usize,
        t: usize,
        encoder: encoder::Prepared,
    ) -> Result<Stages16> {
        let cfg = self.cfg;
        let (c, m) = (cfg.c, b * t);
        let lin = |m: usize, n: usize, k: usize, bias: bool, tail: Tail, out: Output| {
            let stage = if tail == Tail::Residual { &bf.residual_linear } else { &bf.linear };
            linear_bf16::prepare(gpu, stage, LinearBf16Dims { m, n, k, bias, tail, out })
        };
        let dims = PrefillBf16Dims { dims: AttnDims { b, t, c, nh: cfg.heads }, causal: true };
        Ok(Stages16 {
            encoder,
            layernorm: layernorm::prepare(gpu, &bf.layernorm, LayerNormDims { rows: m, c, out: ActType::Bf16 })?,
            linears: [
                lin(m, 3 * c, c, true, Tail::None, Output::Bf16)?,
                lin(m, c, c, true, Tail::Residual, Output::F32)?,
                lin(m, 4 * c, c, true, Tail::Gelu, Output::Bf16)?,
                lin(m, c, 4 * c, true, Tail::Residual, Output::F32)?,
            ],
            lm_head: lin(m, cfg.padded_vocab(), c, false, Tail::None, Output::Bf16)?,
            attention: prefill_bf16::prepare(gpu, &bf.attention, dims)?,
            acts: Activations16::new(gpu, &cfg, m)?,
            last: LastLogits::new(gpu, &cfg, b, lin(b, cfg.padded_vocab(), c, false, Tail::None, Output::F32)?)?,
        })
    }

    /// The logits `[B, T, V]` of `tokens` (`B` rows of `T` ids each).
    pub fn forward(&mut self, gpu: &Gpu, tokens: &[Vec<i32>]) -> Result<Vec<f32>> {
        let (b, t) = self.run(gpu, tokens, Logits::All)?;
        self.prepared[&(b, t)].download_logits(gpu, Logits::All, b * t, (self.cfg.vocab, self.cfg.padded_vocab()))
    }

    /// The logits of each row's last position only, `[B, V]` (what generation samples from): the
    /// same pass with the LM head over those B rows alone.
    pub fn forward_last(&mut self, gpu: &Gpu, tokens: &[Vec<i32>]) -> Result<Vec<f32>> {
        let (b, t) = self.run(gpu, tokens, Logits::Last)?;
        self.prepared[&(b, t)].download_logits(gpu, Logits::Last, b, (self.cfg.vocab, self.cfg.padded_vocab()))
    }

    /// Checks `tokens`, prepares (B, T) and enqueues the forward pass on the harness stream.
    fn run(&mut self, gpu: &Gpu, tokens: &[Vec<i32>], logits: Logits) -> Result<(usize, usize)> {
        let b = tokens.len();
        let t = tokens.first().map_or(0, |r| r.len());
        require(b >= 1 && tokens.iter().all(|r| r.len() == t), "B >= 1 prompts of one length T", || {
            format!("lengths {:?}", tokens.iter().map(|r| r.len()).collect::<Vec<_>>())
        })?;
        self.prepare(gpu, b, t)?;
        let ids = TokenIds::upload(gpu, &tokens.concat(), self.cfg.vocab)?;
        let stream = gpu.stream().clone();
        self.enqueue_forward(&stream, b, t, &ids, None, logits)?;
        Ok((b, t))
    }

    /// The forward pass of (B, T) on `s`, ending in `logits`. With `fill`, each layer's k and v
    /// also go into the KV cache.
    fn enqueue_forward(
        &mut self,
        s: &Arc<CudaStream>,
        b: usize,
        t: usize,
        ids: &TokenIds,
        fill: Option<Fill>,
        logits: Logits,
    ) -> Result<()> {
        let ctx = Whole { w: &self.weights, ids: Some(ids), fill, logits, b, t, c: self.cfg.c };
        match self.prepared.get_mut(&(b, t)).expect("prepared before") {
            Prepared::F32(op) => forward(s, &mut Sequence { op: op.as_mut(), ctx }, &self.weights.p),
            Prepared::Bf16(op) => forward(s, &mut Sequence { op: op.as_mut(), ctx }, &self.weights.p),
        }
    }

    /// Enqueues transformer block `layer` alone, prepared for (B, T), on `s`, over whatever the
    /// activations hold: the unit the cross-family benches time.
    pub fn enqueue_one_block(
        &mut self,
        gpu: &Gpu,
        s: &Arc<CudaStream>,
        b: usize,
        t: usize,
        layer: usize,
    ) -> Result<()> {
        self.prepare(gpu, b, t)?;
        let l =
            self.weights.p.blocks.get(layer).ok_or_else(|| {
                Error::constraint(format!("a layer below {}", self.cfg.layers), format!("layer {layer}"))
            })?;
        let ctx = Whole { w: &self.weights, ids: None, fill: None, logits: Logits::All, b, t, c: self.cfg.c };
        match self.prepared.get_mut(&(b, t)).expect("prepared above") {
            Prepared::F32(op) => block(s, &mut Sequence { op: op.as_mut(), ctx }, l, layer),
            Prepared::Bf16(op) => block(s, &mut Sequence { op: op.as_mut(), ctx }, l, layer),
        }
    }
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
    /// `ln = LayerNorm(x)` with gain `w` and bias `b`.
    fn layernorm(&mut self, s: &Arc<CudaStream>, w: &CudaSlice<f32>, b: &CudaSlice<f32>) -> Result<()>;
    /// Linear `which` of block `l` (layer `layer`), with its bias.
    fn linear(
        &mut self,
        s: &Arc<CudaStream>,
        which: BlockLinear,
        l: &Block<CudaSlice<f32>>,
        layer: usize,
    ) -> Result<()>;
    /// `att = attention(qkv)` over this layer's keys and values.
    fn attention(&mut self, s: &Arc<CudaStream>, layer: usize) -> Result<()>;
    /// `gelu = GELU(fc)` (nothing where the MLP up applied it).
    fn gelu(&mut self, s: &Arc<CudaStream>) -> Result<()>;
    /// `x += proj` (nothing where the projection added it).
    fn residual(&mut self, s: &Arc<CudaStream>) -> Result<()>;
    /// `logits = ln · wteᵀ`.
    fn lm_head(&mut self, s: &Arc<CudaStream>) -> Result<()>;
}

/// The model, op by op: embeddings, the blocks, the final LayerNorm and the LM head.
fn forward(s: &Arc<CudaStream>, p: &mut impl Pass, w: &Params<CudaSlice<f32>>) -> Result<()> {
    p.embed(s)?;
    for (i, l) in w.blocks.iter().enumerate() {
        block(s, p, l, i)?;
    }
    p.layernorm(s, &w.lnf_w, &w.lnf_b)?;
    p.lm_head(s)
}

/// One transformer block (layer `layer`, parameters `l`), op by op.
fn block(s: &Arc<CudaStream>, p: &mut impl Pass, l: &Block<CudaSlice<f32>>, layer: usize) -> Result<()> {
    p.layernorm(s, &l.ln1_w, &l.ln1_b)?;
    p.linear(s, BlockLinear::Qkv, l, layer)?;
    p.attention(s, layer)?;
    p.linear(s, BlockLinear::Proj, l, layer)?;
    p.residual(s)?;
    p.layernorm(s, &l.ln2_w, &l.ln2_b)?;
    p.linear(s, BlockLinear::Fc, l, layer)?;
    p.gelu(s)?;
    p.linear(s, BlockLinear::FcProj, l, layer)?;
    p.residual(s)
}

/// What a whole-sequence pass of (B, T) runs with besides its stages: the weights, the token ids,
/// where its keys and values go (`fill`, a prefill into the KV cache) and which logits it ends in.
struct Whole<'a, 'f> {
    w: &'a DeviceWeights,
    /// `None`: a block alone ([`Model::enqueue_one_block`]), which embeds nothing.
    ids: Option<&'a TokenIds>,
    fill: Option<Fill<'f>>,
    logits: Logits,
    b: usize,
    t: usize,
    c: usize,
}

impl Whole<'_, '_> {
    /// `x = wte[token] + wpe[position]` for the pass's tokens.
    fn embed(&self, s: &Arc<CudaStream>, encoder: &encoder::Prepared, x: &mut CudaSlice<f32>) -> Result<()> {
        let tokens = self.ids.ok_or_else(|| Error::constraint("token ids for a pass that embeds", "a block alone"))?;
        encoder.enqueue(s, EncoderArgs { out: x, tokens, wte: &self.w.p.wte, wpe: &self.w.p.wpe })
    }
}

/// The whole-sequence pass of one (B, T) as a [`Pass`], on the fp32 stages ([`Stages32`]) or the
/// bf16 ones ([`Stages16`]).
struct Sequence<'a, 'f, S> {
    op: &'a mut S,
    ctx: Whole<'a, 'f>,
}

impl Pass for Sequence<'_, '_, Stages32> {
    fn embed(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        self.ctx.embed(s, &self.op.encoder, &mut self.op.acts.x)
    }

    fn layernorm(&mut self, s: &Arc<CudaStream>, w: &CudaSlice<f32>, b: &CudaSlice<f32>) -> Result<()> {
        let a = &mut self.op.acts;
        let stats = (&mut a.mean, &mut a.rstd);
        layernorm(s, &self.op.layernorm, ActMut::F32(&mut a.ln), stats, &a.x, (w, b))
    }

    fn linear(&mut self, s: &Arc<CudaStream>, which: BlockLinear, l: &Block<CudaSlice<f32>>, _: usize) -> Result<()> {
        let (weight, bias) = which.params(l);
        let (out, inp) = self.op.acts.linear_io(which, false);
        self.op.linears[which as usize].enqueue(s, LinearArgs { out, inp, weight, bias: Some(bias) })
    }

    fn attention(&mut self, s: &Arc<CudaStream>, layer: usize) -> Result<()> {
        let a = &mut self.op.acts;
        if let Some(f) = self.ctx.fill.as_mut() {
            f.append(s, layer, Act::F32(&a.qkv))?;
        }
        self.op.attention.enqueue(s, PrefillArgs { out: &mut a.att, lse: Some(&mut a.att_lse), qkv: &a.qkv })
    }

    fn gelu(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        let a = &mut self.op.acts;
        self.op.gelu.enqueue(s, &mut a.gelu, &a.fc, None)
    }

    fn residual(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        let a = &mut self.op.acts;
        self.op.residual.enqueue_in_place(s, &mut a.x, &a.proj)
    }

    fn lm_head(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        let (op, Whole { w, logits, b, t, c, .. }) = (&mut *self.op, &self.ctx);
        let (a, head) = (&mut op.acts, &w.lm_head);
        match logits {
            Logits::All => {
                op.lm_head.enqueue(s, LinearArgs { out: &mut a.logits, inp: &a.ln, weight: head, bias: None })
            }
            Logits::Last => {
                let last = &mut op.last;
                last.gather(s, &a.ln, (*b, *t, *c))?;
                last.lm_head.enqueue(s, LinearArgs { out: &mut last.logits, inp: &last.ln, weight: head, bias: None })
            }
        }
    }
}

impl Pass for Sequence<'_, '_, Stages16> {
    fn embed(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        self.ctx.embed(s, &self.op.encoder, &mut self.op.acts.x)
    }

    fn layernorm(&mut self, s: &Arc<CudaStream>, w: &CudaSlice<f32>, b: &CudaSlice<f32>) -> Result<()> {
        let a = &mut self.op.acts;
        let stats = (&mut a.mean, &mut a.rstd);
        layernorm(s, &self.op.layernorm, ActMut::Bf16(&mut a.ln), stats, &a.x, (w, b))
    }

    /// QKV and the MLP up store bf16 (the MLP up with GELU applied); the projections add into the
    /// fp32 residual stream in place.
    fn linear(
        &mut self,
        s: &Arc<CudaStream>,
        which: BlockLinear,
        l: &Block<CudaSlice<f32>>,
        layer: usize,
    ) -> Result<()> {
        let w16 = self.ctx.w.bf16()?;
        let (weight, bias16) = (&w16.blocks[layer].weights[which as usize], &w16.blocks[layer]);
        let (a, p) = (&mut self.op.acts, &self.op.linears[which as usize]);
        match which {
            BlockLinear::Qkv => {
                let bias = Some(&bias16.qkv_b);
                p.enqueue(s, LinearBf16Args { out: &mut a.qkv, inp: &a.ln, weight, bias, residual: None })
            }
            BlockLinear::Fc => {
                let bias = Some(&bias16.fc_b);
                p.enqueue(s, LinearBf16Args { out: &mut a.gelu, inp: &a.ln, weight, bias, residual: None })
            }
            BlockLinear::Proj => p.enqueue_residual_in_place(s, &mut a.x, &a.att, weight, Some(&l.proj_b)),
            BlockLinear::FcProj => p.enqueue_residual_in_place(s, &mut a.x, &a.gelu, weight, Some(&l.fcproj_b)),
        }
    }

    fn attention(&mut self, s: &Arc<CudaStream>, layer: usize) -> Result<()> {
        let a = &mut self.op.acts;
        if let Some(f) = self.ctx.fill.as_mut() {
            f.append(s, layer, Act::Bf16(&a.qkv))?;
        }
        self.op.attention.enqueue(s, PrefillBf16Args { out: &mut a.att, lse: &mut a.att_lse, qkv: &a.qkv })
    }

    /// Applied in the MLP up's tail.
    fn gelu(&mut self, _: &Arc<CudaStream>) -> Result<()> {
        Ok(())
    }

    /// Added in the projections' tails.
    fn residual(&mut self, _: &Arc<CudaStream>) -> Result<()> {
        Ok(())
    }

    fn lm_head(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        let (op, Whole { w, logits, b, t, c, .. }) = (&mut *self.op, &self.ctx);
        let (a, head) = (&mut op.acts, &w.bf16()?.lm_head);
        match logits {
            Logits::All => op.lm_head.enqueue(
                s,
                LinearBf16Args { out: &mut a.logits, inp: &a.ln, weight: head, bias: None, residual: None },
            ),
            Logits::Last => {
                let last = &mut op.last;
                last.gather(s, &a.ln, (*b, *t, *c))?;
                let args =
                    LinearBf16Args { out: &mut last.logits, inp: &last.ln, weight: head, bias: None, residual: None };
                last.lm_head.enqueue(s, args)
            }
        }
    }
}

/// Where a prefill writes its keys and values.
struct Fill<'a> {
    cache: &'a mut KvCache,
    cells: &'a Cells,
    kv: &'a kv_append::Prepared,
    q16: &'a mut CudaSlice<u16>,
}

impl Fill<'_> {
    /// Layer `layer`'s keys and values from `qkv` into the cache.
    fn append(&mut self, s: &Arc<CudaStream>, layer: usize, qkv: Act) -> Result<()> {
        let cache = self.cache.layers[layer].target();
        self.kv.enqueue(s, KvAppendArgs { q_out: &mut *self.q16, cache, qkv, cells: self.cells })
    }
}

/// A decode step's linear: the plan's GEMM on the fp32 weights, or the GEMV on their bf16 copies
/// with the block's tail fused (GELU after the MLP up, the residual add after the projections) and,
/// for the attention projection, the attention's bf16 output read as it lies.
enum DecodeLinear {
    Gemm(Box<linear::Prepared>),
    Gemv(gemv::Prepared),
}

impl DecodeLinear {
    /// Whether this linear applies its block tail itself (then the step launches no GELU or
    /// residual kernel after it, and it writes where that kernel would: [`Activations::linear_io`]);
    /// such a step's attention projection also reads the bf16 attention output directly.
    fn fuses_tail(&self) -> bool {
        matches!(self, DecodeLinear::Gemv(_))
    }

    /// `out = inp · Wᵀ + bias`, then the GEMV's tail (the residual one updates `out` in place).
    fn enqueue(
        &self,
        s: &Arc<CudaStream>,
        out: &mut CudaSlice<f32>,
        inp: Act,
        (w, w16): (&CudaSlice<f32>, Option<&CudaSlice<u16>>),
        bias: Option<&CudaSlice<f32>>,
    ) -> Result<()> {
        match self {
            DecodeLinear::Gemm(p) => {
                let Act::F32(inp) = inp else {
                    return Err(Error::constraint("fp32 activations for a GEMM", "bf16 ones"));
                };
                p.enqueue(s, LinearArgs { out, inp, weight: w, bias })
            }
            DecodeLinear::Gemv(p) => {
                let weight = w16.ok_or_else(|| Error::constraint("bf16 weights for a GEMV plan", "none made"))?;
                if p.tail() == Tail::Residual {
                    p.enqueue_residual_in_place(s, out, inp, weight, bias)
                } else {
                    p.enqueue(s, GemvArgs { out, inp, weight, bias, residual: None })
                }
            }
        }
    }
}

/// The token embedding as the LM head: `wte` with zero rows up to [`Config::padded_vocab`].
fn padded_head(w: &Weights, cfg: &Config) -> Vec<f32> {
    let mut head = w.wte.clone();
    head.resize(cfg.padded_vocab() * cfg.c, 0.0);
    head
}

/// The weights on the device, in the forms the plan's stages take, made once at load.
struct DeviceWeights {
    p: Params<CudaSlice<f32>>,
    /// The tied LM head over the padded vocabulary, `[Vp, C]`.
    lm_head: CudaSlice<f32>,
    /// bf16 copies of the linear weights, when the plan's decode step runs the GEMV or its
    /// whole-sequence pass runs in bf16.
    bf16: Option<Bf16Weights>,
}

impl DeviceWeights {
    /// Linear `which` of layer `layer` with the LayerNorm before it folded in (QKV and the MLP up),
    /// when the decode step's GEMV folds it.
    fn folded(&self, which: BlockLinear, layer: usize) -> Option<&Folded> {
        let f = self.bf16.as_ref()?.folded.as_ref()?;
        match which {
            BlockLinear::Qkv => Some(&f.blocks[layer][0]),
            BlockLinear::Fc => Some(&f.blocks[layer][1]),
            BlockLinear::Proj | BlockLinear::FcProj => None,
        }
    }

    fn bf16(&self) -> Result<&Bf16Weights> {
        self.bf16.as_ref().ok_or_else(|| Error::constraint("bf16 weights for a bf16 or GEMV plan", "none made"))
    }
}

/// bf16 copies of the linear weights (the padded LM head; per layer QKV, projection, MLP up, MLP
/// down, and the biases of the two linears that store bf16), made once at load; and for a decode
/// step whose GEMV folds the LayerNorm in, the folded linears.
struct Bf16Weights {
    blocks: Vec<Bf16Block>,
    lm_head: CudaSlice<u16>,
    folded: Option<FoldedWeights>,
}

/// A linear with the LayerNorm before it folded in ([`gemv::fold_layernorm`]): `W'` (bf16) and
/// `bias'`.
struct Folded {
    weight: CudaSlice<u16>,
    bias: CudaSlice<f32>,
}

/// Per layer QKV with ln_1 and the MLP up with ln_2 folded in, and the LM head with ln_f.
struct FoldedWeights {
    blocks: Vec<[Folded; 2]>,
    lm_head: Folded,
}

struct Bf16Block {
    /// In [`BlockLinear`] order.
    weights: [CudaSlice<u16>; 4],
    /// A linear storing bf16 takes its bias in bf16 (`linear-bf16` at `out` = 16).
    qkv_b: CudaSlice<u16>,
    fc_b: CudaSlice<u16>,
}

impl Bf16Weights {
    /// `fold`: also the LayerNorm-folded linears.
    fn new(gpu: &Gpu, w: &Weights, lm_head: &Vec<f32>, fold: bool) -> Result<Bf16Weights> {
        let conv =
            |x: &Vec<f32>| gpu.upload(&x.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect::<Vec<u16>>());
        let fold_one = |weight: &[f32], bias: Option<&[f32]>, gamma: &[f32], beta: &[f32]| -> Result<Folded> {
            let (weight, bias) = gemv::fold_layernorm(weight, bias, gamma, beta);
            Ok(Folded { weight: gpu.upload(&weight)?, bias: gpu.upload(&bias)? })
        };
        let folded = fold
            .then(|| -> Result<FoldedWeights> {
                Ok(FoldedWeights {
                    blocks: w
                        .blocks
                        .iter()
                        .map(|b| {
                            Ok([
                                fold_one(&b.qkv_w, Some(&b.qkv_b), &b.ln1_w, &b.ln1_b)?,
                                fold_one(&b.fc_w, Some(&b.fc_b), &b.ln2_w, &b.ln2_b)?,
                            ])
                        })
                        .collect::<Result<_>>()?,
                    lm_head: fold_one(lm_head, None, &w.lnf_w, &w.lnf_b)?,
                })
            })
            .transpose()?;
        Ok(Bf16Weights {
            blocks: w
                .blocks
                .iter()
                .map(|b| {
                    Ok(Bf16Block {
                        weights: [conv(&b.qkv_w)?, conv(&b.proj_w)?, conv(&b.fc_w)?, conv(&b.fcproj_w)?],
                        qkv_b: conv(&b.qkv_b)?,
                        fc_b: conv(&b.fc_b)?,
                    })
                })
                .collect::<Result<_>>()?,
            lm_head: conv(lm_head)?,
            folded,
        })
    }
}

/// What a decode step's linear reads: the LayerNorm's output (or, folding it, the residual stream),
/// or another activation of the given type.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Input {
    LayerNorm,
    Act(ActType),
}

/// Every op of one decode step prepared for a batch of `b` sequences.
struct DecodeStep {
    encoder: encoder::Prepared,
    layernorm: layernorm::Prepared,
    /// A block's linears, in [`BlockLinear`] order.
    linears: [DecodeLinear; 4],
    lm_head: DecodeLinear,
    kv: kv_append::Prepared,
    /// The QKV GEMV with kv-append in its epilogue (`decode-step` 7): then no kv-append kernel runs.
    qkv_append: Option<gemv::QkvAppend>,
    attention: attn_decode::Prepared,
    gelu: pointwise::Prepared,
    residual: pointwise::Prepared,
    acts: Activations,
    /// The LayerNorm's bf16 output, which the GEMVs read, in a bf16 plan that runs them.
    ln16: Option<CudaSlice<u16>>,
    /// The GEMVs after each LayerNorm fold it in (then no LayerNorm kernel runs).
    folds_ln: bool,
    q16: CudaSlice<u16>,
    att16: CudaSlice<u16>,
    /// The step's inputs, in device memory a captured graph reads: the new tokens, their positions,
    /// their cache cells and the lengths after the append.
    ids: TokenIds,
    pos: Positions,
    cells: Cells,
    lens: SeqLens,
    /// Greedy or sampled picks on the device into `next` (such a step downloads these B ids); a
    /// sampled step draws with `uniforms` (one per sequence, written before each step).
    argmax: argmax::Prepared,
    /// The same argmax advancing the step's inputs on the device ([`Model::decode_greedy_on_device`]),
    /// where the plan's argmax stage can.
    argmax_advance: Option<argmax::Prepared>,
    /// Each sequence's greedy picks by position `[B, context]`, written by `argmax_advance`.
    picks: CudaSlice<i32>,
    sample: sample::Prepared,
    uniforms: CudaSlice<f32>,
    next: CudaSlice<i32>,
    /// The captured step, and the cache (its id) and ending it was captured for.
    graph: Option<graph::Captured<(u64, StepEnd)>>,
    /// The whole step as one persistent kernel (a megakernel plan): it runs instead of the ops above
    /// (but `sample`), reading the step's inputs from the same buffers and writing `acts.logits`,
    /// `acts.x` and `next`.
    mega: Option<MegaStep>,
}

/// One graph-replayed decode step, op by op ([`Model::decode_step_timeline`]).
#[derive(Clone, Debug)]
pub struct StepTimeline {
    /// `(op, start, end)` in ms from the step's start, in launch order (an op recurs once a layer).
    pub ops: Vec<(&'static str, f64, f64)>,
    /// The same step captured without the event nodes: its median device time in ms.
    pub plain_ms: f64,
}

/// How a decode step ends: with the logits on the device, or with each sequence's next token picked
/// there (greedy, or drawn under the sampling settings, which a captured graph bakes in).
#[derive(Clone, Copy, Debug, PartialEq)]
enum StepEnd {
    Logits,
    Greedy,
    /// Greedy, the argmax also advancing the next step's inputs on the device.
    GreedyOnDevice,
    Sample(Sampling),
}

impl Model {
    /// Whether the decode step replays a CUDA graph (captured at the first step of a batch size and
    /// cache) instead of launching its kernels one by one.
    pub fn set_graph(&mut self, on: bool) {
        self.graph = on;
    }

    /// An empty KV cache for `b` sequences (bf16, the model's context long), in the layout of the
    /// plan's decode stage. A paged cache's pool holds every sequence's blocks for the whole
    /// context, scattered over the pool by a seeded shuffle of the block table, so decode reads
    /// through the indirection as a serving engine's fragmented pool would (which blocks a server
    /// allocates when is its policy, not the model's).
    pub fn new_cache(&self, gpu: &Gpu, b: usize) -> Result<KvCache> {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let (c, tmax) = (self.cfg.c, self.cfg.max_t);
        let layer = |i: usize| -> Result<LayerCache> {
            Ok(match attn_decode::layout_of(&self.plan.decode)? {
                Layout::Contiguous => {
                    LayerCache::Contiguous { k: gpu.zeros(b * tmax * c)?, v: gpu.zeros(b * tmax * c)? }
                }
                Layout::Paged => {
                    let blocks = b * tmax.div_ceil(PAGED_BLOCK);
                    let mut table: Vec<i32> = (0..blocks as i32).collect();
                    use rand::seq::SliceRandom;
                    table.shuffle(&mut common::data::rng(0x9A6E + i as u64));
                    LayerCache::Paged(PagedCache::zeroed(gpu, blocks, &table, b, PAGED_BLOCK, self.heads())?)
                }
            })
        };
        Ok(KvCache {
            layers: (0..self.cfg.layers).map(layer).collect::<Result<_>>()?,
            lens: vec![0; b],
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    fn heads(&self) -> Heads {
        Heads { hq: self.cfg.heads, hkv: self.cfg.heads, d: self.cfg.head_size() }
    }

    /// The kv-append sizes for `rows` QKV rows of type `input` into this model's cache of `b`
    /// sequences.
    fn kv_dims(&self, rows: usize, b: usize, input: ActType) -> Result<KvAppendDims> {
        let paged = attn_decode::layout_of(&self.plan.decode)? == Layout::Paged;
        let (tmax, c, head) = (self.cfg.max_t, self.cfg.c, self.cfg.head_size());
        Ok(KvAppendDims { rows, b, tmax, c, head, block_size: if paged { PAGED_BLOCK } else { 0 }, input })
    }

    /// Runs the prompt of sequence `slot` (its cache must be empty) through the whole-sequence pass,
    /// writing every layer's keys and values into the cache; returns the last position's logits.
    pub fn prefill_into(&mut self, gpu: &Gpu, cache: &mut KvCache, slot: usize, prompt: &[i32]) -> Result<Vec<f32>> {
        let (t, c, tmax) = (prompt.len(), self.cfg.c, self.cfg.max_t);
        let b = cache.lens.len();
        require(slot < b && cache.lens[slot] == 0, "an empty cache slot", || format!("slot {slot} of {b}"))?;
        self.prepare(gpu, 1, t)?;
        let ids = TokenIds::upload(gpu, prompt, self.cfg.vocab)?;
        let cells = Cells::upload(gpu, &(0..t).map(|p| (slot, p)).collect::<Vec<_>>(), b, tmax)?;
        // The whole-sequence pass's QKV rows: bf16 in a bf16 plan.
        let qkv = if self.plan.bf16.is_some() { ActType::Bf16 } else { ActType::F32 };
        let kv = kv_append::prepare(gpu, &self.plan.kv_append, self.kv_dims(t, b, qkv)?)?;
        let mut q16 = gpu.zeros::<u16>(t * c)?;
        let stream = gpu.stream().clone();
        let fill = Fill { cache, cells: &cells, kv: &kv, q16: &mut q16 };
        self.enqueue_forward(&stream, 1, t, &ids, Some(fill), Logits::Last)?;
        cache.lens[slot] = t;
        self.prepared[&(1, t)].download_logits(gpu, Logits::Last, 1, (self.cfg.vocab, self.cfg.padded_vocab()))
    }

    /// Prepares (compiles and loads) every kernel generation will run for `b` sequences with
    /// prompts of `prompt_lens` tokens: each prompt length's whole-sequence pass and the decode step.
    /// What generation then times is the work, not NVRTC.
    pub fn prepare_generation(&mut self, gpu: &Gpu, b: usize, prompt_lens: &[usize]) -> Result<()> {
        for &t in prompt_lens {
            self.prepare(gpu, 1, t)?;
        }
        self.prepare_decode(gpu, b)
    }

    fn prepare_decode(&mut self, gpu: &Gpu, b: usize) -> Result<()> {
        if self.decode.as_ref().is_some_and(|(n, _)| *n == b) {
            return Ok(());
        }
        let (cfg, p) = (self.cfg, &self.plan);
        let c = cfg.c;
        let (ln_stage, ln_out) = match (&p.bf16, &p.gemv) {
            (Some(bf), Some(_)) => (&bf.layernorm, ActType::Bf16),
            _ => (&p.layernorm, ActType::F32),
        };
        // A GEMV that folds the LayerNorm in (stages 5, 6) takes QKV, the MLP up and the LM head with
        // it: they read the residual stream (fp32) and add the folded shift as a bias.
        let fold = p.gemv.as_ref().is_some_and(gemv::folds_layernorm);
        // A dependent-launch step (`decode-step` 6, 7): the GEMVs, kv-append, decode attention and the
        // argmax are built as links of a chain (each waits for the kernel before it inside the
        // kernel) and launched as programmatic dependents; the encoder, first, is not.
        let step_plan = p.step.plan::<step::Plan>()?;
        let dependent = step_plan.dependent();
        let link = |v: &common::Variant| {
            let mut v = v.clone();
            if dependent {
                v.switch_on(common::DEPENDENT_LAUNCH);
            }
            v
        };
        let gemv_stage = p.gemv.as_ref().map(link);
        let lin = |n: usize, k: usize, bias: bool, tail: Tail, input: Input| -> Result<DecodeLinear> {
            let ln = fold && input == Input::LayerNorm;
            let input = match input {
                Input::LayerNorm if ln => ActType::F32,
                Input::LayerNorm => ln_out,
                Input::Act(t) => t,
            };
            let bias = bias || ln;
            Ok(match &gemv_stage {
                Some(v) => DecodeLinear::Gemv(gemv::prepare(gpu, v, GemvDims { m: b, n, k, bias, tail, input, ln })?),
                None => DecodeLinear::Gemm(Box::new(linear::prepare(gpu, &p.linear, LinearDims { m: b, n, k, bias })?)),
            })
        };
        let dd = DecodeDims {
            b,
            heads: self.heads(),
            tmax: cfg.max_t,
            dtype: Dtype::Bf16,
            block_size: PAGED_BLOCK,
            splits: 0,
        };
        let kv_dims = self.kv_dims(b, b, ActType::F32)?;
        let argmax_dims = ArgmaxDims { b, v: cfg.vocab, ld: cfg.padded_vocab() };
        // `decode-step` 7: the QKV GEMV appends to the (contiguous) cache in its epilogue.
        let qkv_append = match (&gemv_stage, step_plan.append_in_qkv()) {
            (_, false) => None,
            (Some(v), true) if fold && attn_decode::layout_of(&p.decode)? == Layout::Contiguous => {
                let d = GemvDims { m: b, n: 3 * c, k: c, bias: true, tail: Tail::None, input: ActType::F32, ln: true };
                Some(gemv::prepare_qkv_append(gpu, v, d)?)
            }
            _ => {
                return Err(Error::constraint(
                    "a folding GEMV stage and a contiguous cache for kv-append in the QKV epilogue (decode-step 7)",
                    format!("gemv {:?}, decode stage {}", p.gemv.as_ref().map(|v| v.stage), p.decode.stage),
                ))
            }
        };
        // A bf16 plan's GEMVs read its bf16 LayerNorm's output; otherwise the plan's fp32 one's.
        let step = DecodeStep {
            encoder: encoder::prepare(gpu, &p.encoder, EncoderDims { b, t: 1, c, vocab: cfg.vocab, max_t: cfg.max_t })?,
            layernorm: layernorm::prepare(gpu, ln_stage, LayerNormDims { rows: b, c, out: ln_out })?,
            linears: [
                lin(3 * c, c, true, Tail::None, Input::LayerNorm)?,
                lin(c, c, true, Tail::Residual, Input::Act(ActType::Bf16))?,
                lin(4 * c, c, true, Tail::Gelu, Input::LayerNorm)?,
                lin(c, 4 * c, true, Tail::Residual, Input::Act(ActType::F32))?,
            ],
            lm_head: lin(cfg.padded_vocab(), c, false, Tail::None, Input::LayerNorm)?,
            folds_ln: fold,
            kv: kv_append::prepare(gpu, &link(&p.kv_append), kv_dims)?,
            qkv_append,
            attention: attn_decode::prepare(gpu, &link(&p.decode), dd)?,
            gelu: pointwise::prepare(gpu, &p.gelu, Kind::Gelu, b * 4 * c)?,
            residual: pointwise::prepare(gpu, &p.residual, Kind::Residual, b * c)?,
            acts: Activations::new(gpu, &cfg, b)?,
            ln16: if ln_out == ActType::Bf16 && !fold { Some(gpu.zeros(b * c)?) } else { None },
            q16: gpu.zeros(b * c)?,
            att16: gpu.zeros(b * c)?,
            ids: TokenIds::upload(gpu, &vec![0; b], cfg.vocab)?,
            pos: Positions::upload(gpu, &vec![0; b], cfg.max_t)?,
            cells: Cells::upload(gpu, &(0..b).map(|i| (i, 0)).collect::<Vec<_>>(), b, cfg.max_t)?,
            lens: SeqLens::new(gpu, &vec![1; b], cfg.max_t)?,
            argmax: argmax::prepare(gpu, &link(&p.argmax), argmax_dims)?,
            // The greedy loop on the device needs an argmax that can advance the inputs (the split
            // stage's); a megakernel picks the ids itself.
            argmax_advance: match argmax::advances(&p.argmax) && !is_megakernel(&p.step)? {
                true => Some(argmax::prepare_advance(gpu, &link(&p.argmax), argmax_dims)?),
                false => None,
            },
            picks: gpu.zeros(b * cfg.max_t)?,
            sample: sample::prepare(gpu, &p.sample, SampleDims { b, v: cfg.vocab, ld: cfg.padded_vocab() })?,
            uniforms: gpu.zeros(b)?,
            next: gpu.zeros(b)?,
            graph: None,
            mega: match is_megakernel(&p.step)? {
                false => None,
                true => {
                    require(
                        attn_decode::layout_of(&p.decode)? == Layout::Contiguous,
                        "a contiguous cache for a megakernel step",
                        || format!("decode stage {} reads the paged layout", p.decode.stage),
                    )?;
                    Some(MegaStep::prepare(gpu, &p.step, cfg, b, self.mega_grid)?)
                }
            },
        };
        self.decode = Some((b, step));
        Ok(())
    }

    /// One token for every sequence of `cache`: `tokens[i]` goes in at position `lens[i]`; returns
    /// the logits `[B, V]` and appends to the cache.
    pub fn decode_step(&mut self, gpu: &Gpu, cache: &mut KvCache, tokens: &[i32]) -> Result<Vec<f32>> {
        self.run_step(gpu, cache, tokens, StepEnd::Logits)?;
        let (_, op) = self.decode.as_ref().expect("prepared by run_step");
        gpu.download_rows(&op.acts.logits, cache.lens.len(), self.cfg.vocab, self.cfg.padded_vocab())
    }

    /// A greedy decode step: as [`Model::decode_step`], with the plan's `argmax` picking each
    /// sequence's next token on the device; returns those B ids (the logits stay on the device).
    pub fn decode_step_greedy(&mut self, gpu: &Gpu, cache: &mut KvCache, tokens: &[i32]) -> Result<Vec<i32>> {
        self.run_step(gpu, cache, tokens, StepEnd::Greedy)?;
        let (_, op) = self.decode.as_ref().expect("prepared by run_step");
        let ids = gpu.download(&op.next)?;
        // A megakernel step that failed a wait leaves -1: its error says which.
        if ids.iter().any(|&i| i < 0) {
            self.check_step(gpu)?;
        }
        Ok(ids)
    }

    /// Whether [`Model::decode_greedy_on_device`] runs under this plan: a composed step (not a
    /// megakernel) whose argmax stage can advance the inputs (split-row).
    pub fn has_device_loop(&self) -> Result<bool> {
        Ok(!is_megakernel(&self.plan.step)? && argmax::advances(&self.plan.argmax))
    }

    /// `steps` greedy steps with the inputs advanced on the device (a composed step whose argmax is
    /// the split stage): each step's argmax writes the next step's token, position, cache cell and
    /// length and records its pick, so the host writes only the first step's inputs, enqueues the
    /// steps back to back (replaying the graph when graphs are on) and downloads the picks once.
    /// Returns each sequence's `steps` tokens; the cache advances by `steps`.
    pub fn decode_greedy_on_device(
        &mut self,
        gpu: &Gpu,
        cache: &mut KvCache,
        tokens: &[i32],
        steps: usize,
    ) -> Result<Vec<Vec<i32>>> {
        let tmax = self.cfg.max_t;
        require(steps >= 1, "steps >= 1", || "0".into())?;
        if let Some((i, &l)) = cache.lens.iter().enumerate().find(|(_, &l)| l + steps > tmax) {
            return Err(Error::constraint(
                format!("every sequence's length + steps <= the context {tmax}"),
                format!("sequence {i}: {l} + {steps}"),
            ));
        }
        let from = cache.lens.clone();
        self.begin_step(gpu, cache, tokens)?;
        let (_, op) = self.decode.as_mut().expect("prepared by begin_step");
        require(
            op.argmax_advance.is_some(),
            "a composed step with a split-row argmax (1) for the device loop",
            || format!("argmax {}, decode-step {}", self.plan.argmax.stage, self.plan.step.stage),
        )?;
        let s = gpu.stream().clone();
        for _ in 0..steps {
            enqueue_step(self.graph, &s, &self.weights, op, cache, StepEnd::GreedyOnDevice)?;
        }
        cache.lens.iter_mut().for_each(|l| *l += steps);
        let picks = gpu.download(&op.picks)?;
        Ok(from.iter().enumerate().map(|(b, &l)| picks[b * tmax + l..b * tmax + l + steps].to_vec()).collect())
    }

    /// A sampled decode step: as [`Model::decode_step`], with the plan's `sample` stage drawing each
    /// sequence's next token on the device under `s` (not greedy) with `uniforms[i]` in [0, 1);
    /// returns those B ids (the logits stay on the device).
    pub fn decode_step_sampled(
        &mut self,
        gpu: &Gpu,
        cache: &mut KvCache,
        tokens: &[i32],
        s: &Sampling,
        uniforms: &[f32],
    ) -> Result<Vec<i32>> {
        s.check()?;
        require(s.temperature > 0.0, "temperature > 0 for a sampled step (0: greedy)", || "0".into())?;
        require(uniforms.len() == cache.lens.len(), "one draw per sequence", || format!("{} draws", uniforms.len()))?;
        require(uniforms.iter().all(|u| (0.0..1.0).contains(u)), "draws in [0, 1)", || format!("{uniforms:?}"))?;
        self.prepare_decode(gpu, cache.lens.len())?;
        let (_, op) = self.decode.as_mut().expect("prepared above");
        gpu.stream().memcpy_htod(uniforms, &mut op.uniforms).ctx("copy the draws")?;
        // The seed does not reach the device: steps differing only in it share a graph.
        self.run_step(gpu, cache, tokens, StepEnd::Sample(Sampling { seed: 0, ..*s }))?;
        let (_, op) = self.decode.as_ref().expect("prepared by run_step");
        gpu.download(&op.next)
    }

    /// Writes the step's inputs, enqueues the step (replaying its graph when graphs are on) and
    /// advances the cache's lengths.
    fn run_step(&mut self, gpu: &Gpu, cache: &mut KvCache, tokens: &[i32], end: StepEnd) -> Result<()> {
        self.begin_step(gpu, cache, tokens)?;
        let (_, op) = self.decode.as_mut().expect("prepared by begin_step");
        enqueue_step(self.graph, gpu.stream(), &self.weights, op, cache, end)?;
        cache.lens.iter_mut().for_each(|l| *l += 1);
        Ok(())
    }

    /// One eager decode step with an event after every op, enqueued behind a closed
    /// [`Gate`](common::timing::Gate) so the gaps of the host's launches are not counted: each op's
    /// device time in enqueue order, `(name, ms)` (ops of one name recur once per layer). The
    /// logits stay on the device.
    pub fn decode_step_profiled(
        &mut self,
        gpu: &Gpu,
        cache: &mut KvCache,
        tokens: &[i32],
    ) -> Result<Vec<(&'static str, f64)>> {
        self.begin_step(gpu, cache, tokens)?;
        let (_, op) = self.decode.as_mut().expect("prepared by begin_step");
        let s = gpu.stream().clone();
        let timed = Some(common::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let event = || gpu.context().new_event(timed).ctx("event");
        let gate = common::timing::Gate::close(gpu)?;
        let start = event()?;
        start.record(&s).ctx("record")?;
        let mut marks = Vec::new();
        enqueue_decode(&s, &self.weights, op, cache, StepEnd::Logits, &mut |name| {
            let e = event()?;
            e.record(&s).ctx("record")?;
            marks.push((name, e));
            Ok(())
        })?;
        gate.open()?;
        gpu.synchronize()?;
        let mut out = Vec::with_capacity(marks.len());
        let mut prev = &start;
        for (name, e) in &marks {
            out.push((*name, prev.elapsed_ms(e).ctx("elapsed")? as f64));
            prev = e;
        }
        cache.lens.iter_mut().for_each(|l| *l += 1);
        Ok(out)
    }

    /// The greedy decode step as a CUDA graph with an event node after every op, replayed `replays`
    /// times: where the replayed step's device time goes, op by op in launch order. Returns each op's
    /// `(name, start, end)` in ms from the step's start (medians over the replays) and the median
    /// device time of the same step captured without the event nodes (what they cost is the
    /// difference). Every replay writes the same cache cells; the lengths advance once at the end.
    pub fn decode_step_timeline(
        &mut self,
        gpu: &Gpu,
        cache: &mut KvCache,
        tokens: &[i32],
        replays: usize,
    ) -> Result<StepTimeline> {
        use common::cudarc::driver::sys::{CUevent_flags, CUevent_record_flags};
        require(replays >= 1, "replays >= 1", || format!("replays = {replays}"))?;
        self.begin_step(gpu, cache, tokens)?;
        let (_, op) = self.decode.as_mut().expect("prepared by begin_step");
        let s = gpu.stream().clone();
        let event = || gpu.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).ctx("event");
        // An external record inside a capture becomes an event node of the graph, recorded at each replay.
        let record = |e: &common::cudarc::driver::CudaEvent, st: &CudaStream| {
            let flags = CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32;
            // SAFETY: the event and the stream are live for the call.
            unsafe { common::cudarc::driver::sys::cuEventRecordWithFlags(e.cu_event(), st.cu_stream(), flags) }
                .result()
                .ctx("record an event node")
        };
        let start = event()?;
        let mut marks = Vec::new();
        let w = &self.weights;
        let marked = common::timing::capture(&s, |st| {
            record(&start, st)?;
            enqueue_decode(st, w, op, cache, StepEnd::Greedy, &mut |name| {
                let e = event()?;
                record(&e, st)?;
                marks.push((name, e));
                Ok(())
            })
        })?;
        let plain =
            common::timing::capture(&s, |st| enqueue_decode(st, w, op, cache, StepEnd::Greedy, &mut |_| Ok(())))?;
        let (before, after) = (event()?, event()?);
        let mut offsets = vec![Vec::with_capacity(replays); marks.len()];
        let mut plain_ms = Vec::with_capacity(replays);
        for _ in 0..replays {
            marked.launch().ctx("replay the marked step")?;
            before.record(&s).ctx("record")?;
            plain.launch().ctx("replay the step")?;
            after.record(&s).ctx("record")?;
            s.synchronize().ctx("the replays")?;
            for ((_, e), o) in marks.iter().zip(&mut offsets) {
                o.push(start.elapsed_ms(e).ctx("elapsed")? as f64);
            }
            plain_ms.push(before.elapsed_ms(&after).ctx("elapsed")? as f64);
        }
        let median = |v: &mut Vec<f64>| Timing::from_samples(v).median_ms;
        let mut ops = Vec::with_capacity(marks.len());
        let mut prev = 0.0;
        for ((name, _), o) in marks.iter().zip(&mut offsets) {
            let end = median(o);
            ops.push((*name, prev, end));
            prev = end;
        }
        cache.lens.iter_mut().for_each(|l| *l += 1);
        Ok(StepTimeline { ops, plain_ms: median(&mut plain_ms) })
    }

    /// Kernels in the captured decode graph (every launch of one step), once a graph step ran.
    pub fn decode_graph_kernels(&self) -> Result<Option<usize>> {
        let Some((_, step)) = &self.decode else { return Ok(None) };
        let Some(g) = &step.graph else { return Ok(None) };
        g.kernels().map(Some)
    }

    /// Checks a step's tokens against `cache`, prepares the step for its batch size and writes the
    /// step's inputs into the step's own device buffers (where a captured graph reads them).
    fn begin_step(&mut self, gpu: &Gpu, cache: &KvCache, tokens: &[i32]) -> Result<()> {
        let (b, tmax) = (cache.lens.len(), self.cfg.max_t);
        require(tokens.len() == b, "one token per cached sequence", || {
            format!("{} tokens, {b} sequences", tokens.len())
        })?;
        if let Some((i, _)) = cache.lens.iter().enumerate().find(|(_, &l)| l == 0 || l >= tmax) {
            return Err(Error::constraint(
                format!("every sequence prefilled and below the context {tmax}"),
                format!("sequence {i} holds {}", cache.lens[i]),
            ));
        }
        self.prepare_decode(gpu, b)?;
        let (_, op) = self.decode.as_mut().expect("prepared above");
        if let Some(mega) = op.mega.as_mut() {
            let (w, p) = (&self.weights, &self.weights.p);
            let bf = w.bf16()?;
            let folded =
                bf.folded.as_ref().ok_or_else(|| Error::constraint("folded weights for a megakernel", "none"))?;
            let layers: Vec<MkLayer> = cache
                .layers
                .iter()
                .enumerate()
                .map(|(l, lc)| {
                    let LayerCache::Contiguous { k, v } = lc else {
                        return Err(Error::constraint("a contiguous cache for a megakernel step", "a paged one"));
                    };
                    let [qkv, fc] = &folded.blocks[l];
                    Ok(MkLayer {
                        qkv_w: device_ptr(&qkv.weight),
                        qkv_b: device_ptr(&qkv.bias),
                        proj_w: device_ptr(&bf.blocks[l].weights[1]),
                        proj_b: device_ptr(&p.blocks[l].proj_b),
                        fc_w: device_ptr(&fc.weight),
                        fc_b: device_ptr(&fc.bias),
                        fcproj_w: device_ptr(&bf.blocks[l].weights[3]),
                        fcproj_b: device_ptr(&p.blocks[l].fcproj_b),
                        k: device_ptr(k),
                        v: device_ptr(v),
                    })
                })
                .collect::<Result<_>>()?;
            let model = MkModel {
                wte: device_ptr(&p.wte),
                wpe: device_ptr(&p.wpe),
                head_w: device_ptr(&folded.lm_head.weight),
                head_b: device_ptr(&folded.lm_head.bias),
            };
            mega.bind(gpu, model, &layers, cache.id)?;
        }
        op.ids.set(gpu, tokens)?;
        op.pos.set(gpu, &cache.lens)?;
        op.cells.set(gpu, &cache.lens.iter().enumerate().map(|(i, &l)| (i, l)).collect::<Vec<_>>())?;
        op.lens.set(gpu, &cache.lens.iter().map(|l| l + 1).collect::<Vec<_>>())
    }

    /// A cache of `b` sequences that claim `len` positions each, for timing decode steps at that
    /// length without a prefill. Its keys and values are zeros: no stage's time depends on them.
    pub fn timing_cache(&self, gpu: &Gpu, b: usize, len: usize) -> Result<KvCache> {
        require(len >= 1 && len < self.cfg.max_t, &format!("1 <= len < context {}", self.cfg.max_t), || {
            format!("len = {len}")
        })?;
        let mut cache = self.new_cache(gpu, b)?;
        cache.lens.iter_mut().for_each(|l| *l = len);
        Ok(cache)
    }

    /// Times the whole-sequence forward pass of `b` rows of `t` random tokens ending in `logits`
    /// (CUDA events).
    pub fn time_forward(
        &mut self,
        gpu: &Gpu,
        b: usize,
        t: usize,
        logits: Logits,
        cfg: &TimingConfig,
    ) -> Result<Timing> {
        self.prepare(gpu, b, t)?;
        let tokens: Vec<i32> = uniform(b * t, 0.0, (self.cfg.vocab - 1) as f32, 7).iter().map(|&x| x as i32).collect();
        let ids = TokenIds::upload(gpu, &tokens, self.cfg.vocab)?;
        common::timing::time(gpu, 1, cfg, |s, _| self.enqueue_forward(s, b, t, &ids, None, logits))
    }
}

/// Whether a `decode-step` stage is a megakernel (stages 0, 6 and 7 are the composed step).
fn is_megakernel(v: &common::Variant) -> Result<bool> {
    Ok(v.plan::<step::Plan>()?.model_plan().is_none())
}

/// The forms of the weights a plan reads besides the fp32 ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WeightForms {
    /// bf16 copies (a GEMV decode step, a bf16 pass or a megakernel).
    bf16: bool,
    /// The LayerNorms folded into the linears after them (a folding GEMV or a megakernel).
    folded: bool,
}

fn weight_forms(plan: &Plan) -> Result<WeightForms> {
    let mega = is_megakernel(&plan.step)?;
    Ok(WeightForms {
        bf16: mega || plan.gemv.is_some() || plan.bf16.is_some(),
        folded: mega || plan.gemv.as_ref().is_some_and(gemv::folds_layernorm),
    })
}

/// The decode step as `gpt2/decode-step` drives it: a stage set, a cache filled from the host, the
/// greedy step replayed without advancing, its outputs read back.
impl Model {
    /// Runs the decode step with `decode-step` stage `v` (re-prepared at the next step), a
    /// megakernel on `grid` blocks (`None`: its default).
    pub fn set_step_stage(&mut self, v: common::Variant, grid: Option<u32>) {
        self.plan.step = v;
        self.mega_grid = grid;
        self.decode = None;
    }

    /// A cache of `lens.len()` sequences holding `host`'s keys and values and claiming `lens`.
    pub(crate) fn cache_from_host(&self, gpu: &Gpu, host: &HostCache, lens: &[usize]) -> Result<KvCache> {
        let mut cache = self.new_cache(gpu, lens.len())?;
        for (l, layer) in cache.layers.iter_mut().enumerate() {
            let LayerCache::Contiguous { k, v } = layer else {
                return Err(Error::constraint("a contiguous cache to fill from the host", "a paged one"));
            };
            gpu.stream().memcpy_htod(&host.k[l], k).ctx("upload the keys")?;
            gpu.stream().memcpy_htod(&host.v[l], v).ctx("upload the values")?;
        }
        cache.lens = lens.to_vec();
        Ok(cache)
    }

    /// Writes a greedy step's inputs for `cache` (as a step does, without running it); returns the
    /// megakernel's resources, if the step runs one.
    pub fn prepare_step(&mut self, gpu: &Gpu, cache: &KvCache, tokens: &[i32]) -> Result<Vec<common::ResourceUse>> {
        self.begin_step(gpu, cache, tokens)?;
        let (_, op) = self.decode.as_ref().expect("prepared by begin_step");
        Ok(op.mega.iter().map(MegaStep::resources).collect())
    }

    /// Enqueues the greedy step prepared by [`Model::prepare_step`] on `s` as its CUDA graph
    /// (captured at the first call for this cache); the lengths do not advance, so every replay
    /// writes the same cells.
    pub fn replay_step(&mut self, s: &Arc<CudaStream>, cache: &mut KvCache) -> Result<()> {
        let (_, op) = self.decode.as_mut().ok_or(Error::NotPrepared)?;
        enqueue_step(true, s, &self.weights, op, cache, StepEnd::Greedy)
    }

    /// The logits `[B, V]` the last decode step left on the device (a greedy or sampled step keeps
    /// them there).
    pub fn last_logits(&self, gpu: &Gpu, b: usize) -> Result<Vec<f32>> {
        let (n, op) = self.decode.as_ref().ok_or(Error::NotPrepared)?;
        require(b == *n, "the batch of the last step", || format!("{b}, the step had {n}"))?;
        gpu.download_rows(&op.acts.logits, b, self.cfg.vocab, self.cfg.padded_vocab())
    }

    /// Fails with the megakernel's typed error when its last launch reported one.
    pub fn check_step(&mut self, gpu: &Gpu) -> Result<()> {
        match self.decode.as_mut().and_then(|(_, op)| op.mega.as_mut()) {
            Some(m) => m.check(gpu),
            None => Ok(()),
        }
    }

    /// NaN in the step's logits, -1 in its ids and NaN in the cells it appends to (at `lens`).
    pub(crate) fn poison_step(&mut self, gpu: &Gpu, cache: &mut KvCache, lens: &[usize]) -> Result<()> {
        let (_, op) = self.decode.as_mut().ok_or(Error::NotPrepared)?;
        gpu.poison(&mut op.acts.logits)?;
        gpu.stream().memcpy_htod(&vec![-1i32; lens.len()], &mut op.next).ctx("poison the ids")?;
        let (c, tmax) = (self.cfg.c, self.cfg.max_t);
        let nan = vec![0x7FC0u16; c];
        for layer in &mut cache.layers {
            let LayerCache::Contiguous { k, v } = layer else { continue };
            for (b, &p) in lens.iter().enumerate() {
                let cell = (b * tmax + p) * c;
                gpu.stream().memcpy_htod(&nan, &mut k.slice_mut(cell..cell + c)).ctx("poison a cell")?;
                gpu.stream().memcpy_htod(&nan, &mut v.slice_mut(cell..cell + c)).ctx("poison a cell")?;
            }
        }
        Ok(())
    }

    /// The last step's logits `[B, V]`, ids `[B]`, and the k and v it appended at `lens` in every
    /// layer, `[L, B, C]` each.
    pub(crate) fn step_outputs(&self, gpu: &Gpu, cache: &KvCache, lens: &[usize]) -> Result<StepOutputs> {
        let (_, op) = self.decode.as_ref().ok_or(Error::NotPrepared)?;
        let b = lens.len();
        let logits = gpu.download_rows(&op.acts.logits, b, self.cfg.vocab, self.cfg.padded_vocab())?;
        let ids = gpu.download(&op.next)?;
        let (c, tmax) = (self.cfg.c, self.cfg.max_t);
        let (mut k_out, mut v_out) = (Vec::new(), Vec::new());
        for layer in &cache.layers {
            let LayerCache::Contiguous { k, v } = layer else {
                return Err(Error::constraint("a contiguous cache to read back", "a paged one"));
            };
            for (b, &p) in lens.iter().enumerate() {
                let cell = (b * tmax + p) * c;
                for (src, out) in [(k, &mut k_out), (v, &mut v_out)] {
                    let bits: Vec<u16> = gpu.stream().clone_dtoh(&src.slice(cell..cell + c)).ctx("read a cell")?;
                    out.extend(bits.into_iter().map(|x| half::bf16::from_bits(x).to_f32()));
                }
            }
        }
        Ok(StepOutputs { logits, ids, k: k_out, v: v_out })
    }
}

/// What [`Model::step_outputs`] reads back: logits `[B, V]`, ids `[B]`, and the appended k and v of
/// every layer, `[L, B, C]` each.
pub(crate) struct StepOutputs {
    pub logits: Vec<f32>,
    pub ids: Vec<i32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// One decode step ending `end` on `s`: its CUDA graph replayed when `graph` (captured at the first
/// call for this cache, whose K/V buffers are baked into the kernels' arguments, and ending), else
/// its kernels launched one by one.
fn enqueue_step(
    graph: bool,
    s: &Arc<CudaStream>,
    weights: &DeviceWeights,
    op: &mut DecodeStep,
    cache: &mut KvCache,
    end: StepEnd,
) -> Result<()> {
    if !graph {
        return enqueue_decode(s, weights, op, cache, end, &mut |_| Ok(()));
    }
    let mut captured = op.graph.take();
    let replayed = graph::replay(&mut captured, (cache.id, end), s, |st| {
        enqueue_decode(st, weights, op, cache, end, &mut |_| Ok(()))
    });
    op.graph = captured;
    replayed
}

/// One decode step's kernels, op by op, on `s`, reading the step's inputs from `op`'s buffers.
/// Ending `Greedy`, the plan's argmax picks each sequence's next token into `op.next`; ending
/// `Sample`, the plan's sampling stage draws it there. `mark(name)` is called after each op is
/// enqueued (the per-op breakdown records an event there).
fn enqueue_decode(
    s: &Arc<CudaStream>,
    weights: &DeviceWeights,
    op: &mut DecodeStep,
    cache: &mut KvCache,
    end: StepEnd,
    mark: &mut dyn FnMut(&'static str) -> Result<()>,
) -> Result<()> {
    if let Some(mega) = &op.mega {
        let io = MkIo {
            ids: device_ptr(op.ids.device()),
            pos: device_ptr(op.pos.device()),
            lens: device_ptr(op.lens.device()),
            x: device_ptr(&op.acts.x),
            logits: device_ptr(&op.acts.logits),
            next: device_ptr(&op.next),
        };
        mega.enqueue(s, io)?;
        mark("decode-step megakernel")?;
        return match end {
            // The megakernel picked the greedy ids already.
            StepEnd::Logits | StepEnd::Greedy => Ok(()),
            StepEnd::GreedyOnDevice => {
                Err(Error::constraint("a composed step for the device loop", "a megakernel (it picks the ids itself)"))
            }
            StepEnd::Sample(sampling) => {
                op.sample.enqueue(s, &mut op.next, &op.acts.logits, &op.uniforms, &sampling)?;
                mark("sample")
            }
        };
    }
    let mut step = Step { op, w: weights, cache, mark };
    forward(s, &mut step, &weights.p)?;
    let Step { op, mark, .. } = step;
    let a = &mut op.acts;
    match end {
        StepEnd::Logits => Ok(()),
        StepEnd::GreedyOnDevice => {
            let adv = op.argmax_advance.as_ref().ok_or_else(|| {
                Error::constraint("an argmax stage that advances the inputs (split-row) for the device loop", "none")
            })?;
            let tmax = op.cells.bounds().1;
            let args = argmax::AdvanceArgs {
                picks: &mut op.picks,
                tokens: op.ids.device_mut(),
                pos: op.pos.device_mut(),
                cell_pos: op.cells.positions_mut(),
                lens: op.lens.device_mut(),
                tmax,
            };
            // SAFETY: the positions were checked below the context when written (begin_step), and the
            // kernel moves them on only while they stay below it.
            unsafe { adv.enqueue_advance(s, &mut op.next, &a.logits, args)? };
            mark("argmax + advance")
        }
        StepEnd::Greedy => {
            op.argmax.enqueue(s, &mut op.next, &a.logits)?;
            mark("argmax")
        }
        StepEnd::Sample(sampling) => {
            op.sample.enqueue(s, &mut op.next, &a.logits, &op.uniforms, &sampling)?;
            mark("sample")
        }
    }
}

/// One decode step's ops as a [`Pass`], with `mark` called after each.
struct Step<'a> {
    op: &'a mut DecodeStep,
    w: &'a DeviceWeights,
    cache: &'a mut KvCache,
    mark: &'a mut dyn FnMut(&'static str) -> Result<()>,
}

impl Pass for Step<'_> {
    /// At each sequence's own position.
    fn embed(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        let (op, w) = (&mut *self.op, &self.w.p);
        let args = EncoderArgs { out: &mut op.acts.x, tokens: &op.ids, wte: &w.wte, wpe: &w.wpe };
        op.encoder.enqueue_at(s, args, &op.pos)?;
        (self.mark)("encoder")
    }

    /// Nothing when the GEMVs after it fold it in.
    fn layernorm(&mut self, s: &Arc<CudaStream>, w: &CudaSlice<f32>, b: &CudaSlice<f32>) -> Result<()> {
        let op = &mut *self.op;
        if op.folds_ln {
            return Ok(());
        }
        let a = &mut op.acts;
        let out = match op.ln16.as_mut() {
            Some(ln) => ActMut::Bf16(ln),
            None => ActMut::F32(&mut a.ln),
        };
        layernorm(s, &op.layernorm, out, (&mut a.mean, &mut a.rstd), &a.x, (w, b))?;
        (self.mark)("layernorm")
    }

    fn linear(
        &mut self,
        s: &Arc<CudaStream>,
        which: BlockLinear,
        l: &Block<CudaSlice<f32>>,
        layer: usize,
    ) -> Result<()> {
        let (weight, bias) = which.params(l);
        let w16 = self.w.bf16.as_ref().map(|x| &x.blocks[layer].weights[which as usize]);
        let op = &mut *self.op;
        let linear = &op.linears[which as usize];
        let fused = linear.fuses_tail();
        if let (Some(f), Some(fused), BlockLinear::Qkv) = (self.w.folded(which, layer), &op.qkv_append, which) {
            // ln_1 folded in and kv-append in the epilogue: q to bf16, k and v into the cache.
            let (seq, pos) = op.cells.device();
            let LayerCache::Contiguous { k, v } = &mut self.cache.layers[layer] else {
                return Err(Error::constraint("a contiguous cache for kv-append in the QKV epilogue", "a paged one"));
            };
            let (cache_b, tmax) = op.cells.bounds();
            let c = f.bias.len() / 3;
            require(k.len() == cache_b * tmax * c, "the cache the cells were made for", || {
                format!("{} elements for cells below ({cache_b}, {tmax}), C = {c}", k.len())
            })?;
            let args = gemv::QkvAppendArgs {
                q_out: &mut op.q16,
                k_cache: k,
                v_cache: v,
                seq,
                pos,
                tmax,
                inp: &op.acts.x,
                weight: &f.weight,
                bias: &f.bias,
            };
            // SAFETY: `Cells` holds cells below (B, tmax) of this cache (checked above).
            unsafe { fused.enqueue(s, args)? };
            return (self.mark)("linear qkv + kv-append");
        }
        if let Some(f) = self.w.folded(which, layer).filter(|_| op.folds_ln) {
            // The LayerNorm folded in: the raw residual stream, W' and bias'.
            let a = &mut op.acts;
            let out = if which == BlockLinear::Qkv { &mut a.qkv } else { &mut a.gelu };
            linear.enqueue(s, out, Act::F32(&a.x), (weight, Some(&f.weight)), Some(&f.bias))?;
            return (self.mark)(which.name());
        }
        let (out, inp) = op.acts.linear_io(which, fused);
        let inp = match (which, &op.ln16) {
            // A bf16 plan's GEMVs read its LayerNorm's bf16 output.
            (BlockLinear::Qkv | BlockLinear::Fc, Some(ln)) => Act::Bf16(ln),
            // A fused attention projection reads the attention's bf16 output (no widening pass).
            (BlockLinear::Proj, _) if fused => Act::Bf16(&op.att16),
            _ => Act::F32(inp),
        };
        linear.enqueue(s, out, inp, (weight, w16), Some(bias))?;
        (self.mark)(which.name())
    }

    /// The new token's k and v into the cache (and q to bf16), decode attention over the cache, and
    /// its bf16 output widened for a projection that reads fp32 (a GEMV plan's reads it as bf16).
    fn attention(&mut self, s: &Arc<CudaStream>, layer: usize) -> Result<()> {
        let op = &mut *self.op;
        let a = &mut op.acts;
        if op.qkv_append.is_none() {
            let target = self.cache.layers[layer].target();
            let args = KvAppendArgs { q_out: &mut op.q16, cache: target, qkv: Act::F32(&a.qkv), cells: &op.cells };
            op.kv.enqueue(s, args)?;
            (self.mark)("kv-append")?;
        }
        let args = DecodeArgs {
            out: &mut op.att16,
            lse: &mut a.att_lse,
            q: &op.q16,
            cache: self.cache.layers[layer].read(),
            seq_lens: &op.lens,
            alibi: None,
        };
        op.attention.enqueue(s, args)?;
        (self.mark)("decode attention")?;
        if op.linears[BlockLinear::Proj as usize].fuses_tail() {
            return Ok(());
        }
        op.kv.enqueue_widen(s, &mut a.att, &op.att16)?;
        (self.mark)("kv-append")
    }

    /// Nothing when the MLP up applied it.
    fn gelu(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        if self.op.linears[BlockLinear::Fc as usize].fuses_tail() {
            return Ok(());
        }
        let a = &mut self.op.acts;
        self.op.gelu.enqueue(s, &mut a.gelu, &a.fc, None)?;
        (self.mark)("gelu")
    }

    /// Nothing when the projections applied it.
    fn residual(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        if self.op.linears[BlockLinear::Proj as usize].fuses_tail() {
            return Ok(());
        }
        let a = &mut self.op.acts;
        self.op.residual.enqueue_in_place(s, &mut a.x, &a.proj)?;
        (self.mark)("residual")
    }

    fn lm_head(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        let op = &mut *self.op;
        let folded = self.w.bf16.as_ref().and_then(|x| x.folded.as_ref()).filter(|_| op.folds_ln);
        if let Some(f) = folded {
            let (a, head) = (&mut op.acts, &f.lm_head);
            op.lm_head.enqueue(
                s,
                &mut a.logits,
                Act::F32(&a.x),
                (&self.w.lm_head, Some(&head.weight)),
                Some(&head.bias),
            )?;
            return (self.mark)("linear lm-head");
        }
        let w16 = self.w.bf16.as_ref().map(|x| &x.lm_head);
        let ln = match &op.ln16 {
            Some(ln) => Act::Bf16(ln),
            None => Act::F32(&op.acts.ln),
        };
        op.lm_head.enqueue(s, &mut op.acts.logits, ln, (&self.w.lm_head, w16), None)?;
        (self.mark)("linear lm-head")
    }
}

/// `out = LayerNorm(x)` with gain and bias `w`, writing each row's mean and rstd into `stats`.
fn layernorm(
    s: &Arc<CudaStream>,
    p: &layernorm::Prepared,
    out: ActMut,
    (mean, rstd): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
    x: &CudaSlice<f32>,
    (weight, bias): (&CudaSlice<f32>, &CudaSlice<f32>),
) -> Result<()> {
    p.enqueue(s, LayerNormArgs { out, mean, rstd, inp: x, weight, bias, eps: LN_EPS })
}
