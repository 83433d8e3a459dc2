//! `gpt2/decode-step`: one greedy decode step of the whole model (embedding, the blocks, the final
//! LayerNorm, the LM head and the argmax) for B sequences over the bf16 KV cache, as a ladder from
//! the composed step replayed as a CUDA graph (stage 0, the model's own path under the `bf16` plan)
//! to one persistent kernel (the megakernel stages, `decode-step/02_megakernel.cu`).
//!
//! Shape keys: `B` sequences, `len` cached positions before the step (the new token goes to
//! position `len`), `ragged` (1: each sequence's length drawn in [len/2, len]), the model's `L`
//! layers, `C` channels and `H` heads (GPT-2's vocabulary and context), `grid` (blocks of a
//! megakernel launch; 0: the SMs times its blocks per SM), `splits` (a composed step's decode
//! attention splits per sequence and head; 0 or absent: the attention stage's heuristic) and `warps`
//! (warps a block of a composed step's decode attention where that is stage 11; 0 or absent: by
//! shape).
//!
//! The check: random weights and a random cache, the step's logits, each layer's appended k and v,
//! and the picked ids against the model in f64 on the CPU ([`reference`]); an id passes when its
//! reference logit is within the logits' measured error of the reference maximum (bf16 weights
//! move near-ties).

use std::sync::Arc;

use common::check::{compare, Verification};
use common::cudarc::driver::CudaStream;
use common::{require, ActType, Bound, Error, Gpu, Limit, Op, Problem, ResourceUse, Result, Shape, Variant, Workload};
use matmul::gemv::GemvDims;
use matmul::linear_bf16::Tail;
use rayon::prelude::*;

use crate::config::Config;
pub use crate::megakernel::OP;
use crate::megakernel::{check_megakernel, stages, Plan, B_LIMIT, C_LIMIT, C_MULTIPLE, HEAD_LIMIT};
use crate::model::{splitmix, HostCache, Model, StepLaunch};
use crate::plan::Plan as ModelPlan;
use crate::weights::Weights;
use crate::{pointwise, SOURCES};

common::declare_op! {
    pub struct DecodeStep {
        name: OP,
        description: "one greedy decode step of the whole model over the bf16 KV cache (ids in, logits and next ids out)",
        shape_keys: ["B", "len", "ragged", "L", "C", "H", "grid", "splits", "warps"],
        stages: stages,
    }
}

/// The builds dependent composed step `step` makes at C = `c` beyond the stage lists' own (its model
/// plan's stages with the host switches the model turns on: the dependent chain, kv-append in the
/// QKV epilogue, the argmax that advances the inputs, the split merge in the projection, the picks
/// in the LM head; and the
/// folded GEMVs as the engine builds them per shape): [`Op::extra_builds`] of those stages, so that a run compiles them with the family's
/// modules and `kernels_compile` compiles them too.
fn host_switched_builds(step: Plan, c: usize) -> Result<Vec<(&'static common::Sources, Variant)>> {
    let spec = step.model_plan().ok_or_else(|| Error::constraint("a composed step's model plan", "none"))?;
    let plan = ModelPlan::parse(spec)?;
    let with = |v: &Variant, switches: &[&str]| {
        let mut v = v.clone();
        switches.iter().for_each(|s| v.switch_on(s));
        v
    };
    let dep = common::DEPENDENT_LAUNCH;
    let gemv = plan.gemv.as_ref().ok_or_else(|| Error::constraint("a GEMV in the pdl plan", "none"))?;
    let gemv = with(gemv, &[dep]);
    let mut builds = vec![(&matmul::SOURCES, gemv.clone())];
    if matmul::gemv::folds_layernorm(&gemv) {
        // The folded GEMVs as the engine prepares them (K = C, the LayerNorm folded in), and the QKV
        // with the append.
        let ln = GemvDims { m: 1, n: 3 * c, k: c, bias: true, tail: Tail::None, input: ActType::F32, ln: true };
        let folded = matmul::gemv::for_shape(&crate::model::folded_gemv(&gemv, step)?, ln)?;
        if step.append_in_qkv() {
            builds.push((&matmul::SOURCES, with(&folded, &[matmul::gemv::QKV_APPEND])));
        }
        if step.picks_in_lm_head() {
            // Stage 16's on resident blocks (gemv 9's switch), as the engine prepares it.
            let resident: &[&str] = if step.resident_lm_head() { &[matmul::gemv::RESIDENT_TILES] } else { &[] };
            builds.push((&matmul::SOURCES, with(&folded, &[&[matmul::gemv::PICKS], resident].concat())));
        }
        builds.push((&matmul::SOURCES, folded));
    }
    if step.merges_in_projection() {
        // Decode attention leaving its partials, and the projection merging them.
        builds.push((&attention::SOURCES, with(&plan.decode, &[dep, attention::decode::PARTIALS_OUT])));
        builds.push((&matmul::SOURCES, with(&gemv, &[matmul::gemv::MERGE_SPLITS])));
    }
    if step.picks_in_lm_head() {
        let picks = crate::argmax::FROM_PICKS;
        builds.push((&SOURCES, with(&plan.argmax, &[dep, picks])));
        builds.push((&SOURCES, with(&plan.argmax, &[dep, picks, crate::argmax::ADVANCE])));
    }
    builds.extend([
        (&attention::SOURCES, with(&plan.kv_append, &[dep])),
        (&attention::SOURCES, with(&plan.decode, &[dep])),
        (&SOURCES, with(&plan.argmax, &[dep])),
        (&SOURCES, with(&plan.argmax, &[dep, crate::argmax::ADVANCE])),
        (&SOURCES, with(&plan.argmax, &[crate::argmax::ADVANCE])),
    ]);
    Ok(builds)
}

/// The sizes of one problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StepDims {
    cfg: Config,
    b: usize,
    len: usize,
    ragged: bool,
    launch: StepLaunch,
}

impl StepDims {
    fn of(s: &Shape) -> Result<StepDims> {
        let get = |k: &str, max: i64, default: i64| -> Result<usize> {
            match s.get(k) {
                None => Ok(default as usize),
                Some(_) => s.dim(k, max),
            }
        };
        let cfg =
            Config { layers: get("L", 96, 12)?, heads: get("H", 64, 12)?, c: get("C", 8192, 768)?, ..Config::GPT2 };
        let (b, len) = (get("B", 4096, 1)?, get("len", 1 << 20, 1000)?);
        require(b >= 1 && cfg.layers >= 1 && cfg.heads >= 1, "B, L, H >= 1", || format!("{s}"))?;
        require(cfg.c.is_multiple_of(cfg.heads), "C % H == 0", || format!("C = {}, H = {}", cfg.c, cfg.heads))?;
        require(len >= 1 && len < cfg.max_t, &format!("1 <= len < context {}", cfg.max_t), || format!("len = {len}"))?;
        // A launch setting: absent or 0 leaves the stage's own choice.
        let setting = |k: &str, max: i64| -> Result<Option<usize>> {
            match s.get(k) {
                None | Some(0) => Ok(None),
                Some(_) => s.dim(k, max).map(Some),
            }
        };
        let launch = StepLaunch {
            grid: setting("grid", 1 << 16)?.map(|g| g as u32),
            splits: setting("splits", attention::decode::MAX_SPLITS as i64)?,
            attention_warps: setting("warps", 16)?,
        };
        let ragged = s.get("ragged").unwrap_or(0);
        require((0..=1).contains(&ragged), "ragged in {0, 1}", || format!("ragged = {ragged}"))?;
        Ok(StepDims { cfg, b, len, ragged: ragged == 1, launch })
    }

    /// Each sequence's cached length: `len`, or ragged in [len/2, len].
    fn lens(&self) -> Vec<usize> {
        (0..self.b).map(|i| if self.ragged { self.len - (i * 7919) % (self.len / 2 + 1) } else { self.len }).collect()
    }
}

fn check(v: &Variant, d: &StepDims) -> Result<()> {
    let Some(spec) = v.plan::<Plan>()?.model_plan() else {
        check_megakernel(&d.cfg, d.b)?;
        // A megakernel's attention phase splits by its own grid, not by decode attention's.
        require(d.launch.splits.is_none(), SPLITS_COMPOSED, || format!("splits = {:?}", d.launch.splits))?;
        return require(d.launch.attention_warps.is_none(), WARPS_STAGE, || format!("{:?}", d.launch.attention_warps));
    };
    if let Some(warps) = d.launch.attention_warps {
        let decode = ModelPlan::parse(spec)?.decode;
        require(decode.has(attention::decode::WARPS_BY_SHAPE), WARPS_STAGE, || {
            format!("warps = {warps}, decode attention {}", decode.stage)
        })?;
    }
    Ok(())
}

const SPLITS_COMPOSED: &str = "splits = 0 except on a composed step (a megakernel splits by its grid)";
const WARPS_STAGE: &str = "warps = 0 except on a composed step whose decode attention is stage 11 (warps-by-shape)";

fn shape(b: i64, len: i64, l: i64, c: i64, h: i64) -> Shape {
    Shape::new(&[("B", b), ("len", len), ("ragged", 0), ("L", l), ("C", c), ("H", h), ("grid", 0)])
}

impl Op for DecodeStep {
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2 124M, a 1024-token context filled to 1000, at the model table's decode batches.
        vec![shape(1, 1000, 12, 768, 12), shape(8, 1000, 12, 768, 12), shape(32, 1000, 12, 768, 12)]
    }
    fn validate(&self, v: &Variant, s: &Shape) -> Result<()> {
        check(v, &StepDims::of(s)?)
    }
    fn extra_builds(&self, v: &Variant, shape: &Shape) -> Vec<(&'static common::Sources, Variant)> {
        // A composed step prepares other ladders' stages with host switches on: compiled with the
        // family's modules, not one after another at the first table's composed stages.
        match v.plan::<Plan>() {
            Ok(p) if p.dependent() => {
                StepDims::of(shape).and_then(|d| host_switched_builds(p, d.cfg.c)).unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        if v.plan::<Plan>().is_ok_and(|p| p.model_plan().is_some()) {
            return Vec::new();
        }
        vec![
            Limit { constraint: B_LIMIT, past: shape(33, 100, 1, 768, 12), inside: Some(shape(32, 100, 1, 768, 12)) },
            Limit { constraint: HEAD_LIMIT, past: shape(1, 100, 1, 768, 6), inside: Some(shape(1, 100, 1, 768, 12)) },
            Limit { constraint: C_MULTIPLE, past: shape(1, 100, 1, 640, 10), inside: Some(shape(1, 100, 1, 512, 8)) },
            Limit { constraint: C_LIMIT, past: shape(1, 100, 1, 1280, 20), inside: Some(shape(1, 100, 1, 1024, 16)) },
        ]
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let d = StepDims::of(s)?;
        Ok(Box::new(StepProblem::new(gpu, d, seed)?))
    }
}

/// One decode step in f64: each sequence's logits `[B, V]` and each layer's new k and v `[L, B, C]`
/// (for one sequence: `[V]`, `[L, C]`).
pub struct StepReference {
    pub logits: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
}

/// The step of `tokens` at positions `lens` over `cache` (rows below each length), in f64 from the
/// fp32 weights.
pub(crate) fn reference(cfg: &Config, w: &Weights, cache: &HostCache, lens: &[usize], tokens: &[i32]) -> StepReference {
    let (c, hs, nh) = (cfg.c, cfg.head_size(), cfg.heads);
    let bf = |x: u16| half::bf16::from_bits(x).to_f64();
    let (ln, lin) = (crate::reference::layernorm_row, crate::reference::linear_row);
    let per_seq: Vec<StepReference> = (0..lens.len())
        .into_par_iter()
        .map(|b| {
            let (pos, tok) = (lens[b], tokens[b] as usize);
            let mut x: Vec<f64> = (0..c).map(|i| w.wte[tok * c + i] as f64 + w.wpe[pos * c + i] as f64).collect();
            let (mut ks, mut vs) = (Vec::new(), Vec::new());
            for (l, blk) in w.blocks.iter().enumerate() {
                let qkv = lin(&ln(&x, &blk.ln1_w, &blk.ln1_b), &blk.qkv_w, Some(&blk.qkv_b), 3 * c);
                let (q, kn, vn) = (&qkv[..c], &qkv[c..2 * c], &qkv[2 * c..]);
                let row = |t: usize| (b * cfg.max_t + t) * c;
                let mut att = vec![0f64; c];
                for h in 0..nh {
                    let d = h * hs..(h + 1) * hs;
                    let key = |t: usize, j: usize| if t == pos { kn[j] } else { bf(cache.k[l][row(t) + j]) };
                    let val = |t: usize, j: usize| if t == pos { vn[j] } else { bf(cache.v[l][row(t) + j]) };
                    let s: Vec<f64> = (0..=pos)
                        .map(|t| d.clone().map(|j| q[j] * key(t, j)).sum::<f64>() / (hs as f64).sqrt())
                        .collect();
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (t, p) in e.iter().enumerate() {
                        for j in d.clone() {
                            att[j] += p / z * val(t, j);
                        }
                    }
                }
                ks.extend_from_slice(kn);
                vs.extend_from_slice(vn);
                let proj = lin(&att, &blk.proj_w, Some(&blk.proj_b), c);
                x.iter_mut().zip(&proj).for_each(|(a, p)| *a += p);
                let fc: Vec<f64> = lin(&ln(&x, &blk.ln2_w, &blk.ln2_b), &blk.fc_w, Some(&blk.fc_b), 4 * c)
                    .into_iter()
                    .map(pointwise::gelu)
                    .collect();
                let proj = lin(&fc, &blk.fcproj_w, Some(&blk.fcproj_b), c);
                x.iter_mut().zip(&proj).for_each(|(a, p)| *a += p);
            }
            StepReference { logits: lin(&ln(&x, &w.lnf_w, &w.lnf_b), &w.wte, None, cfg.vocab), k: ks, v: vs }
        })
        .collect();
    let (b, l) = (lens.len(), cfg.layers);
    // [L, B, C] from each sequence's [L, C].
    let by_layer = |pick: fn(&StepReference) -> &Vec<f64>| -> Vec<f64> {
        let mut out = vec![0f64; l * b * c];
        for (bi, s) in per_seq.iter().enumerate() {
            for li in 0..l {
                out[(li * b + bi) * c..][..c].copy_from_slice(&pick(s)[li * c..][..c]);
            }
        }
        out
    };
    StepReference {
        logits: per_seq.iter().flat_map(|s| s.logits.iter().copied()).collect(),
        k: by_layer(|s| &s.k),
        v: by_layer(|s| &s.v),
    }
}

/// A model with random weights and a random cache, the step's inputs and its f64 reference.
struct StepProblem {
    d: StepDims,
    model: Model,
    cache: crate::cache::KvCache,
    tokens: Vec<i32>,
    lens: Vec<usize>,
    reference: StepReference,
    /// The harness stream, which the step's graph replays on.
    stream: Arc<CudaStream>,
}

impl StepProblem {
    fn new(gpu: &Gpu, d: StepDims, seed: u64) -> Result<StepProblem> {
        let cfg = d.cfg;
        let weights = Weights::random(&cfg, seed);
        let lens = d.lens();
        let host = HostCache::random(&cfg, &lens, seed ^ 0xCAC4E);
        let tokens: Vec<i32> =
            (0..d.b).map(|i| (splitmix(seed.wrapping_add(i as u64)) % cfg.vocab as u64) as i32).collect();
        let reference = reference(&cfg, &weights, &host, &lens, &tokens);
        let mut model = Model::new(gpu, cfg, &weights, ModelPlan::named("bf16")?)?;
        let cache = model.cache_from_host(gpu, &host, &lens)?;
        model.set_graph(true);
        Ok(StepProblem { d, model, cache, tokens, lens, reference, stream: gpu.stream().clone() })
    }
}

impl Problem for StepProblem {
    fn workload(&self) -> Workload {
        let cfg = self.d.cfg;
        let (c, l) = (cfg.c as u64, cfg.layers as u64);
        let weights = l * 12 * c * c + cfg.padded_vocab() as u64 * c;
        let cached: u64 = self.lens.iter().map(|&n| n as u64 + 1).sum::<u64>() * l;
        let b = self.d.b as u64;
        Workload {
            bytes: 2 * weights + 4 * cached * c + 8 * b * c,
            flops: 2 * b * weights + 4 * cached * c,
            bound: Bound::Memory,
        }
    }
    fn copies(&self) -> usize {
        // The weights (247 MB at GPT-2 124M) and the cache pass through L2 once a step.
        1
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.model.poison_step(gpu, &mut self.cache, &self.lens)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        check(v, &self.d)?;
        // A composed stage runs its model plan's ops; a megakernel stage replaces them.
        let plan = v.plan::<Plan>()?.model_plan().unwrap_or("bf16");
        self.model.set_plan(ModelPlan::parse(plan)?)?;
        self.model.set_step_stage(v.clone(), self.d.launch);
        self.model.prepare_step(gpu, &self.cache, &self.tokens)
    }
    fn enqueue(&mut self, _: &CudaStream, _: usize) -> Result<()> {
        self.model.replay_step(&self.stream, &mut self.cache)
    }
    fn verify(&mut self, gpu: &Gpu, _: usize) -> Result<Verification> {
        self.model.check_step(gpu)?;
        let crate::model::StepOutputs { logits, ids, k, v } = self.model.step_outputs(gpu, &self.cache, &self.lens)?;
        let r = &self.reference;
        let vocab = self.d.cfg.vocab;
        let err = compare("logits", &logits, &r.logits);
        // Per sequence: the pick's reference logit within the logits' error (its rms) of the maximum.
        let slack = err.rel_l2 * (r.logits.iter().map(|x| x * x).sum::<f64>() / r.logits.len() as f64).sqrt() * 4.0;
        let picks: Vec<f32> = ids
            .iter()
            .enumerate()
            .map(|(b, &id)| {
                let row = &r.logits[b * vocab..(b + 1) * vocab];
                let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let ok = (0..vocab as i32).contains(&id) && row[id as usize] >= max - slack;
                if ok {
                    1.0
                } else {
                    0.0
                }
            })
            .collect();
        // And exactly: each id is the argmax of the logits the step itself wrote (the lowest index
        // among equals), whichever kernel picked it (one miss in 32 rows is a relative error of 0.18).
        let own: Vec<f32> = logits
            .chunks(vocab)
            .zip(&ids)
            .map(|(row, &id)| if crate::sampling::argmax(row) == id { 1.0 } else { 0.0 })
            .collect();
        Ok(Verification::new(self.model.plan.step.tolerance())
            .add("logits", &logits, &r.logits)
            .add("ids (the argmax of the step's own logits)", &own, &vec![1.0; ids.len()])
            .add("k appended", &k, &r.k)
            .add("v appended", &v, &r.v)
            .add("ids (reference logit within the error of the max)", &picks, &vec![1.0; ids.len()]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;

    /// The step reference, run token by token from an empty cache (each step's k and v appended in
    /// bf16), ends where the whole-sequence reference does: the two f64 references agree up to the
    /// cache's bf16 rounding.
    #[test]
    fn step_reference_matches_the_sequence_reference() {
        let cfg = Config { layers: 2, heads: 2, c: 128, vocab: 101, max_t: 16 };
        let w = Weights::random(&cfg, 3);
        let tokens = [5, 17, 99, 0, 42, 7];
        let mut cache = HostCache {
            k: vec![vec![0u16; cfg.max_t * cfg.c]; cfg.layers],
            v: vec![vec![0u16; cfg.max_t * cfg.c]; cfg.layers],
        };
        let bits = |x: f64| half::bf16::from_f64(x).to_bits();
        let mut last = Vec::new();
        for (t, &tok) in tokens.iter().enumerate() {
            let r = reference(&cfg, &w, &cache, &[t], &[tok]);
            for l in 0..cfg.layers {
                let row = t * cfg.c..(t + 1) * cfg.c;
                for (dst, &x) in cache.k[l][row.clone()].iter_mut().zip(&r.k[l * cfg.c..(l + 1) * cfg.c]) {
                    *dst = bits(x);
                }
                for (dst, &x) in cache.v[l][row].iter_mut().zip(&r.v[l * cfg.c..(l + 1) * cfg.c]) {
                    *dst = bits(x);
                }
            }
            last = r.logits;
        }
        let whole = reference::forward(&cfg, &w, &[tokens.to_vec()]);
        let want = &whole[(tokens.len() - 1) * cfg.vocab..];
        let err = (last.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum::<f64>()
            / want.iter().map(|b| b * b).sum::<f64>())
        .sqrt();
        assert!(err < 5e-3, "rel L2 {err:e} (measured 7.2e-4)");
        assert!(err > 0.0, "the cache is rounded to bf16: the two cannot agree exactly");
    }
}
