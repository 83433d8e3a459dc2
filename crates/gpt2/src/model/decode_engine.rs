//! The decode step: one token per cached sequence, its ops prepared for a batch size, enqueued op by
//! op as a [`Pass`] or as a megakernel, replayed as a CUDA graph, and ended on the device (greedy,
//! sampled, or greedy with the inputs advanced there).

use std::sync::Arc;

use common::cudarc::driver::{CudaSlice, CudaStream};
use common::launch::device_ptr;
use common::{require, Act, ActMut, ActType, DriverContext, Error, Gpu, Result};

use attention::decode::{self as attn_decode, DecodeArgs, DecodeDims, Dtype, Heads, Layout, PagedCache, SeqLens};
use attention::kv_append::{self, Cells, KvAppendArgs, KvAppendDims};
use matmul::gemv::{self, GemvArgs, GemvDims, GemvWeight};
use matmul::gemv_fp8;
use matmul::linear::{self, LinearArgs, LinearDims};
use matmul::linear_bf16::Tail;
use norm::layernorm::{self, LayerNormDims};

use super::device_weights::{DeviceWeights, LinearWeight};
use super::sequence::{Activations, Fill, Logits};
use super::{enqueue_layernorm, forward, is_megakernel, BlockLinear, Layer, Model, Pass};
use crate::argmax::{self, ArgmaxDims};
use crate::cache::{KvCache, LayerCache, PAGED_BLOCK};
use crate::encoder::{self, EncoderArgs, EncoderDims, Positions, TokenIds};
use crate::graph;
use crate::megakernel::{self as step, MegaStep, MkIo, MkLayer, MkModel};
use crate::plan::StepGemv;
use crate::pointwise::{self, Kind};
use crate::sample::{self, SampleDims};
use crate::sampling::Sampling;

/// `decode-step` 12's target of warps in flight for the folded GEMVs (`gemv`'s GEMV_WARPS, 2048 in
/// its stage list): 8 warps a block at GPT-2's QKV, MLP up and LM head.
const NARROW_GEMV_WARPS: u32 = 1024;

/// The stage of the composed step's folded GEMVs (QKV, the MLP up, the LM head), from its GEMV stage
/// `gemv` (already a link of the chain where the step is one): at `decode-step` 12-14
/// [`NARROW_GEMV_WARPS`] a block, so that the next link's blocks, and their weight copies, fit on the
/// SMs beside them; else `gemv`. `DecodeStep`'s `extra_builds` compiles what this gives.
pub(crate) fn folded_gemv(gemv: &common::Variant, step: step::Plan) -> Result<common::Variant> {
    let mut v = gemv.clone();
    if step.narrow_folded_gemvs() {
        v.set_tunable("GEMV_WARPS", NARROW_GEMV_WARPS)?;
    }
    Ok(v)
}

/// A decode step's linear: the plan's GEMM on the fp32 weights, or a GEMV (on their bf16 copies, or
/// an fp8 plan's on their e4m3 blocks) with the block's tail fused (GELU after the MLP up, the
/// residual add after the projections) and, for the attention projection, the attention's bf16
/// output read as it lies.
enum DecodeLinear {
    Gemm(Box<linear::Prepared>),
    Gemv(gemv::Prepared),
    GemvFp8(gemv_fp8::Prepared),
}

impl DecodeLinear {
    /// Whether this linear applies its block tail itself (then the step launches no GELU or
    /// residual kernel after it, and it writes where that kernel would: [`Activations::linear_io`]);
    /// such a step's attention projection also reads the bf16 attention output directly.
    fn fuses_tail(&self) -> bool {
        matches!(self, DecodeLinear::Gemv(_) | DecodeLinear::GemvFp8(_))
    }

    /// `out = inp · Wᵀ + bias` on the form of `w` the stage reads, then the GEMV's tail (the
    /// residual one updates `out` in place).
    fn enqueue(
        &self,
        s: &Arc<CudaStream>,
        out: &mut CudaSlice<f32>,
        inp: Act,
        w: LinearWeight,
        bias: Option<&CudaSlice<f32>>,
    ) -> Result<()> {
        match self {
            DecodeLinear::Gemm(p) => {
                let Act::F32(inp) = inp else {
                    return Err(Error::constraint("fp32 activations for a GEMM", "bf16 ones"));
                };
                p.enqueue(s, LinearArgs { out, inp, weight: w.f32, bias })
            }
            DecodeLinear::Gemv(p) => {
                let weight = w.bf16.ok_or_else(|| Error::constraint("bf16 weights for a GEMV plan", "none made"))?;
                enqueue_gemv(p, s, out, inp, GemvWeight::Bf16(weight), bias)
            }
            DecodeLinear::GemvFp8(p) => {
                let w8 = w.fp8.ok_or_else(|| Error::constraint("e4m3 weights for an fp8 plan", "none made"))?;
                enqueue_gemv(p, s, out, inp, GemvWeight::Fp8 { codes: &w8.codes, scales: &w8.scales }, bias)
            }
        }
    }
}

/// A decode step's GEMV: its residual tail updates `out` in place.
fn enqueue_gemv(
    p: &gemv::Prepared,
    s: &Arc<CudaStream>,
    out: &mut CudaSlice<f32>,
    inp: Act,
    weight: GemvWeight,
    bias: Option<&CudaSlice<f32>>,
) -> Result<()> {
    if p.tail() == Tail::Residual {
        p.enqueue_residual_in_place(s, out, inp, weight, bias)
    } else {
        p.enqueue(s, GemvArgs { out, inp, weight, bias, residual: None })
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
pub(super) struct DecodeStep {
    encoder: encoder::Prepared,
    layernorm: layernorm::Prepared,
    /// A block's linears, in [`BlockLinear`] order.
    linears: [DecodeLinear; 4],
    lm_head: DecodeLinear,
    /// The LM head making a greedy step's picks in its epilogue (`decode-step` 15), the words it
    /// merges them into (zero between steps) and the argmax that reads them (plain and advancing):
    /// a greedy step runs these instead of `lm_head` and the argmax.
    head_picks: Option<LmHeadPicks>,
    kv: kv_append::Prepared,
    /// The QKV GEMV with kv-append in its epilogue (`decode-step` 7, 9-14): then no kv-append kernel runs.
    qkv_append: Option<gemv::QkvAppend>,
    attention: attn_decode::Prepared,
    /// The attention projection merging the attention's split partials (`decode-step` 14, where the
    /// attention splits): then it runs instead of `linears`' projection.
    proj_merge: Option<gemv::MergingGemv>,
    gelu: pointwise::Prepared,
    residual: pointwise::Prepared,
    pub(super) acts: Activations,
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
    pub(super) next: CudaSlice<i32>,
    /// The captured step, and the cache (its id) and ending it was captured for.
    graph: Option<graph::Captured<(u64, StepEnd)>>,
    /// The whole step as one persistent kernel (a megakernel plan): it runs instead of the ops above
    /// (but `sample`), reading the step's inputs from the same buffers and writing `acts.logits`,
    /// `acts.x` and `next`.
    pub(super) mega: Option<MegaStep>,
}

/// `decode-step` 15's end of a greedy step: the picking LM head and the argmax reading its words.
struct LmHeadPicks {
    lm_head: gemv::PickingGemv,
    words: CudaSlice<u64>,
    reader: argmax::PickReader,
    reader_advance: argmax::PickReader,
}

/// How a decode step ends: with the logits on the device, or with each sequence's next token picked
/// there (greedy, or drawn under the sampling settings, which a captured graph bakes in).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum StepEnd {
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
        let step_gemv = p.step_gemv();
        let (ln_stage, ln_out) = match (&p.bf16, step_gemv) {
            (Some(bf), Some(_)) => (&bf.layernorm, ActType::Bf16),
            _ => (&p.layernorm, ActType::F32),
        };
        // A GEMV that folds the LayerNorm in (`gemv` 5-8; `gemv-fp8` 1) takes QKV, the MLP up and the
        // LM head with it: they read the residual stream (fp32) and add the folded shift as a bias.
        let fold = step_gemv.is_some_and(StepGemv::folds_layernorm);
        // A dependent-launch step (`decode-step` 6, 7, 9-14): the GEMVs, kv-append, decode attention and the
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
        let folded_stage = gemv_stage.as_ref().map(|v| folded_gemv(v, step_plan)).transpose()?;
        let lin = |n: usize, k: usize, bias: bool, tail: Tail, input: Input| -> Result<DecodeLinear> {
            let ln = fold && input == Input::LayerNorm;
            let gemv_stage = if ln { &folded_stage } else { &gemv_stage };
            let input = match input {
                Input::LayerNorm if ln => ActType::F32,
                Input::LayerNorm => ln_out,
                Input::Act(t) => t,
            };
            let bias = bias || ln;
            let d = GemvDims { m: b, n, k, bias, tail, input, ln };
            Ok(match (&gemv_stage, step_gemv) {
                (Some(v), _) => DecodeLinear::Gemv(gemv::prepare(gpu, v, d)?),
                (None, Some(StepGemv::Fp8(v))) => DecodeLinear::GemvFp8(gemv_fp8::prepare(gpu, v, d)?),
                _ => DecodeLinear::Gemm(Box::new(linear::prepare(gpu, &p.linear, LinearDims { m: b, n, k, bias })?)),
            })
        };
        let dd = DecodeDims {
            b,
            heads: self.heads(),
            tmax: cfg.max_t,
            dtype: Dtype::Bf16,
            block_size: PAGED_BLOCK,
            splits: self.step_launch.splits.unwrap_or(0),
            warps: self.step_launch.attention_warps.unwrap_or(0),
        };
        let kv_dims = self.kv_dims(b, b, ActType::F32)?;
        let argmax_dims = ArgmaxDims { b, v: cfg.vocab, ld: cfg.padded_vocab() };
        // `decode-step` 7, 9-14: the QKV GEMV appends to the (contiguous) cache in its epilogue.
        let qkv_append = match (&folded_stage, step_plan.append_in_qkv()) {
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
        // `decode-step` 14: decode attention leaves its split partials and the projection merges
        // them; where the attention does not split, it writes its output as before.
        let mut attention_stage = link(&p.decode);
        if step_plan.merges_in_projection() {
            attention_stage.switch_on(attn_decode::PARTIALS_OUT);
        }
        let attention = attn_decode::prepare(gpu, &attention_stage, dd)?;
        let proj_merge = match (attention.partials(), &gemv_stage) {
            (None, _) => None,
            (Some(parts), Some(v)) => {
                let d =
                    GemvDims { m: b, n: c, k: c, bias: true, tail: Tail::Residual, input: ActType::Bf16, ln: false };
                Some(gemv::prepare_merging(gpu, v, d, cfg.heads, parts.splits)?)
            }
            (Some(_), None) => {
                return Err(Error::constraint("a GEMV stage to merge decode attention's partials", "no GEMV"))
            }
        };
        // `decode-step` 15: a greedy step's LM head makes the picks, the argmax reads them.
        let head_picks = match (step_plan.picks_in_lm_head(), &folded_stage) {
            (false, _) => None,
            (true, Some(v)) if fold => {
                let d = GemvDims {
                    m: b,
                    n: cfg.padded_vocab(),
                    k: c,
                    bias: true,
                    tail: Tail::None,
                    input: ActType::F32,
                    ln: true,
                };
                // `decode-step` 16: the picking LM head on resident blocks (gemv 9's switch).
                let mut v = v.clone();
                if step_plan.resident_lm_head() {
                    v.switch_on(gemv::RESIDENT_TILES);
                }
                Some(LmHeadPicks {
                    lm_head: gemv::prepare_picking(gpu, &v, d, cfg.vocab)?,
                    words: gpu.zeros(b * gemv::PICK_WORDS_PER_ROW)?,
                    reader: argmax::prepare_pick_reader(gpu, &link(&p.argmax), b, false)?,
                    reader_advance: argmax::prepare_pick_reader(gpu, &link(&p.argmax), b, true)?,
                })
            }
            _ => {
                return Err(Error::constraint(
                    "a folding GEMV stage for the picks in the LM head (decode-step 15)",
                    format!("gemv {:?}", p.gemv.as_ref().map(|v| v.stage)),
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
            head_picks,
            folds_ln: fold,
            kv: kv_append::prepare(gpu, &link(&p.kv_append), kv_dims)?,
            qkv_append,
            attention,
            proj_merge,
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
                    Some(MegaStep::prepare(gpu, &p.step, cfg, b, self.step_launch.grid)?)
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
    /// Kernels in the captured decode graph (every launch of one step), once a graph step ran.
    pub fn decode_graph_kernels(&self) -> Result<Option<usize>> {
        let Some((_, step)) = &self.decode else { return Ok(None) };
        let Some(g) = &step.graph else { return Ok(None) };
        g.kernels().map(Some)
    }

    /// Checks a step's tokens against `cache`, prepares the step for its batch size and writes the
    /// step's inputs into the step's own device buffers (where a captured graph reads them).
    pub(super) fn begin_step(&mut self, gpu: &Gpu, cache: &KvCache, tokens: &[i32]) -> Result<()> {
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
}

/// One decode step ending `end` on `s`: its CUDA graph replayed when `graph` (captured at the first
/// call for this cache, whose K/V buffers are baked into the kernels' arguments, and ending), else
/// its kernels launched one by one.
pub(super) fn enqueue_step(
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
pub(super) fn enqueue_decode(
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
    let mut step = Step { op, w: weights, cache, mark, end };
    forward(s, &mut step, &weights.p)?;
    let Step { op, mark, .. } = step;
    let a = &mut op.acts;
    match (end, &mut op.head_picks) {
        (StepEnd::Logits, _) => Ok(()),
        (StepEnd::GreedyOnDevice, head_picks) => {
            let tmax = op.cells.bounds().1;
            let args = argmax::AdvanceArgs {
                picks: &mut op.picks,
                tokens: op.ids.device_mut(),
                pos: op.pos.device_mut(),
                cell_pos: op.cells.positions_mut(),
                lens: op.lens.device_mut(),
                tmax,
            };
            // SAFETY (both): the positions were checked below the context when written
            // (begin_step), and the kernel moves them on only while they stay below it.
            if let Some(p) = head_picks {
                unsafe { p.reader_advance.enqueue_advance(s, &mut op.next, &mut p.words, args)? };
                return mark("argmax from picks + advance");
            }
            let adv = op.argmax_advance.as_ref().ok_or_else(|| {
                Error::constraint("an argmax stage that advances the inputs (split-row) for the device loop", "none")
            })?;
            unsafe { adv.enqueue_advance(s, &mut op.next, &a.logits, args)? };
            mark("argmax + advance")
        }
        (StepEnd::Greedy, Some(p)) => {
            p.reader.enqueue(s, &mut op.next, &mut p.words)?;
            mark("argmax from picks")
        }
        (StepEnd::Greedy, None) => {
            op.argmax.enqueue(s, &mut op.next, &a.logits)?;
            mark("argmax")
        }
        (StepEnd::Sample(sampling), _) => {
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
    /// How the step ends: a greedy one's LM head makes the picks where the plan has it do so.
    end: StepEnd,
}

impl Step<'_> {
    /// Linear `which` of block `l` on the step's activations (the GEMV's fused tail where it has one).
    fn linear(&mut self, s: &Arc<CudaStream>, which: BlockLinear, Layer { w: l, index: layer }: Layer) -> Result<()> {
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
        let folded = op.folds_ln && matches!(which, BlockLinear::Qkv | BlockLinear::Fc);
        let (weight, bias) = self.w.step_linear(Some((which, layer)), Some(l), folded);
        if let (Some(merge), BlockLinear::Proj) = (&op.proj_merge, which) {
            // The attention's split partials merged as the projection stages its input.
            let parts = op.attention.partials().ok_or_else(|| {
                Error::constraint("decode attention's partials for the merging projection", "an unsplit attention")
            })?;
            let weight = weight.bf16.ok_or_else(|| Error::constraint("bf16 weights for a GEMV plan", "none made"))?;
            let args = gemv::MergingArgs { out: &mut op.acts.x, o: parts.o, m: parts.m, l: parts.l, weight, bias };
            merge.enqueue_residual_in_place(s, args)?;
            return (self.mark)("linear proj + split merge");
        }
        if folded {
            // The LayerNorm folded in: the raw residual stream, W' and bias'.
            let a = &mut op.acts;
            let out = if which == BlockLinear::Qkv { &mut a.qkv } else { &mut a.gelu };
            linear.enqueue(s, out, Act::F32(&a.x), weight, bias)?;
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
        linear.enqueue(s, out, inp, weight, bias)?;
        (self.mark)(which.name())
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
        enqueue_layernorm(s, &op.layernorm, out, (&mut a.mean, &mut a.rstd), &a.x, (w, b))?;
        (self.mark)("layernorm")
    }

    fn qkv(&mut self, s: &Arc<CudaStream>, l: Layer) -> Result<()> {
        self.linear(s, BlockLinear::Qkv, l)
    }

    /// One kernel where the GEMV adds the residual in its tail; the plan's GEMM, then the add.
    fn linear_residual(&mut self, s: &Arc<CudaStream>, which: BlockLinear, l: Layer) -> Result<()> {
        self.linear(s, which, l)?;
        self.residual(s)
    }

    /// One kernel where the GEMV applies GELU in its tail; the plan's GEMM, then GELU.
    fn linear_gelu(&mut self, s: &Arc<CudaStream>, l: Layer) -> Result<()> {
        self.linear(s, BlockLinear::Fc, l)?;
        self.gelu(s)
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

    fn lm_head(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        let op = &mut *self.op;
        let (weight, bias) = self.w.step_linear(None, None, op.folds_ln);
        let a = &mut op.acts;
        let inp = match &op.ln16 {
            _ if op.folds_ln => Act::F32(&a.x),
            Some(ln) => Act::Bf16(ln),
            None => Act::F32(&a.ln),
        };
        let greedy = matches!(self.end, StepEnd::Greedy | StepEnd::GreedyOnDevice);
        if let (Some(p), true) = (&mut op.head_picks, greedy) {
            // Prepared only on a folding GEMV, whose LM head reads the fp32 residual stream.
            let (Act::F32(x), Some(w)) = (inp, weight.bf16) else {
                return Err(Error::constraint("the folded LM head's inputs for its picks", "another form"));
            };
            p.lm_head
                .enqueue(s, gemv::PickingArgs { out: &mut a.logits, picks: &mut p.words, inp: x, weight: w, bias })?;
            return (self.mark)("linear lm-head + picks");
        }
        op.lm_head.enqueue(s, &mut a.logits, inp, weight, bias)?;
        (self.mark)("linear lm-head")
    }
}
