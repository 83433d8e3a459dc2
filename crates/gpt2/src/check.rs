//! The model against an implementation nobody here wrote: the directory `scripts/gpt2_reference.py`
//! writes (PyTorch + Hugging Face `transformers`, a seeded random GPT-2) holds `model.safetensors`,
//! `meta.json` (model name, the prompt tokens and Hugging Face's 16 greedy tokens), the prefill
//! logits `prefill_logits.f32` `[B, T, V]` and each greedy step's last-position logits
//! `decode_logits.f32` `[steps, B, V]` (raw little-endian f32), and the same from Hugging Face's
//! model in bf16 on the same weights and the fp32 run's greedy tokens (`*_bf16.f32`, and its argmax
//! at each step, `greedy_bf16` in `meta.json`): the yardstick of a bf16 plan.
//!
//! Greedy decoding here recomputes the whole prefix each step (no KV cache yet).

use std::path::Path;

use common::{Error, Gpu, Result};
use serde::Deserialize;

use crate::config::Config;
use crate::fastest;
use crate::model::Model;
use crate::plan::Plan;
use crate::sampling::argmax;
use crate::weights::Weights;

#[derive(Deserialize)]
struct Meta {
    model: String,
    tokens: Vec<Vec<i32>>,
    greedy: Vec<Vec<i32>>,
    /// Hugging Face bf16's argmax at each greedy step (fed the fp32 run's tokens).
    greedy_bf16: Vec<Vec<i32>>,
}

/// How far a bf16 plan may be from Hugging Face fp32: this many times Hugging Face bf16's own error.
pub const HF_BF16_FACTOR: f64 = 1.5;

/// How far an fp8 plan may be from Hugging Face fp32: this many times Hugging Face bf16's own error.
///
/// Stated before any fp8 plan was measured, from e4m3's rounding: 3 mantissa bits against bf16's 7
/// give an element 16x bf16's relative rounding error, and `linear-fp8`'s check measures the format's
/// error of one linear (both operands quantized, uniform data) at 2.7-3.6e-2 relative L2. The plan
/// quantizes only the linears' operands; LayerNorm, attention, the residual stream and the softmax
/// stay bf16 / fp32 as in `bf16`, whose model-level error (6.7e-3) is ~2x its per-linear error. Four
/// times Hugging Face bf16's 1.2e-2 (~4.7e-2) is about 1.5x one linear's quantization error: the
/// errors of the 49 linears, independent and damped by the residual stream, must not compound.
pub const FP8_FACTOR: f64 = 4.0;

/// What a plan is held to against Hugging Face fp32.
#[derive(Clone, Debug)]
pub enum Criterion {
    /// Prefill and every greedy step's logits within `tolerance`, the first `must_agree` greedy
    /// tokens of each sequence equal.
    Fixed { tolerance: f64, must_agree: usize },
    /// A bf16 plan: the prefill's and the worst step's logits within [`HF_BF16_FACTOR`] times
    /// Hugging Face bf16's own errors (`prefill`, `decode`), and every greedy token equal to HF
    /// fp32's wherever HF bf16's is (`bf16_tokens`).
    HfBf16 { prefill: f64, decode: f64, bf16_tokens: Vec<Vec<i32>> },
    /// An fp8 plan: the prefill's and the worst step's logits within [`FP8_FACTOR`] times Hugging
    /// Face bf16's own errors, and each greedy token equal to HF fp32's wherever HF fp32's top-1 /
    /// top-2 gap exceeds twice the plan's RMS logit error on that row (`decided[i][j]`: sequence i,
    /// step j); a closer call may flip.
    Fp8 { prefill: f64, decode: f64, decided: Vec<Vec<bool>> },
}

/// The criterion of a plan without the bf16 pass: fp32 plans without tensor cores match to 1e-4 with
/// every greedy token the same; the others (or any plan through the bf16 KV cache) to 2e-2 with the
/// first token the same.
pub fn fixed_criterion(plan: &Plan, kv_cache: bool) -> Criterion {
    let exact = [&plan.encoder, &plan.layernorm, &plan.linear, &plan.attention, &plan.gelu, &plan.residual]
        .iter()
        .all(|v| v.precision == common::Precision::Fp32);
    if exact && !kv_cache {
        Criterion::Fixed { tolerance: 1e-4, must_agree: usize::MAX }
    } else {
        Criterion::Fixed { tolerance: 2e-2, must_agree: 1 }
    }
}

/// What one plan gave against the reference.
#[derive(Debug)]
pub struct Report {
    pub plan: String,
    pub prefill_rel_l2: f64,
    /// The worst greedy step's logits error.
    pub decode_rel_l2: f64,
    pub tokens: Vec<Vec<i32>>,
    pub reference_tokens: Vec<Vec<i32>>,
    pub criterion: Criterion,
}

impl Report {
    /// The prefill's and the steps' error limits.
    pub fn limits(&self) -> (f64, f64) {
        match &self.criterion {
            Criterion::Fixed { tolerance, .. } => (*tolerance, *tolerance),
            Criterion::HfBf16 { prefill, decode, .. } => (HF_BF16_FACTOR * prefill, HF_BF16_FACTOR * decode),
            Criterion::Fp8 { prefill, decode, .. } => (FP8_FACTOR * prefill, FP8_FACTOR * decode),
        }
    }

    /// Whether every greedy token the criterion names agrees with Hugging Face fp32's.
    pub fn tokens_agree(&self) -> bool {
        let pairs = self.tokens.iter().zip(&self.reference_tokens);
        match &self.criterion {
            Criterion::Fixed { must_agree, .. } => pairs.into_iter().all(|(a, b)| {
                let n = (*must_agree).min(b.len());
                a.len() >= n && a[..n] == b[..n]
            }),
            Criterion::HfBf16 { bf16_tokens, .. } => pairs
                .zip(bf16_tokens)
                .all(|((a, b), h)| b.iter().zip(h).enumerate().all(|(j, (bj, hj))| bj != hj || a.get(j) == Some(bj))),
            Criterion::Fp8 { decided, .. } => pairs
                .zip(decided)
                .all(|((a, b), d)| b.iter().zip(d).enumerate().all(|(j, (bj, &dj))| !dj || a.get(j) == Some(bj))),
        }
    }

    pub fn passed(&self) -> bool {
        let (prefill, decode) = self.limits();
        self.prefill_rel_l2 <= prefill && self.decode_rel_l2 <= decode && self.tokens_agree()
    }
}

fn read_f32(path: &Path, n: usize) -> Result<Vec<f32>> {
    let b = std::fs::read(path).map_err(|e| Error::Io { context: format!("read {}", path.display()), source: e })?;
    common::require(b.len() == 4 * n, &format!("{} holds {n} f32", path.display()), || format!("{} bytes", b.len()))?;
    Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Relative L2 error of `got` against `want` (common's, NaN if any value of `got` is not finite).
fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    common::check::rel_l2(got, &want.iter().map(|&x| x as f64).collect::<Vec<_>>())
}

/// Whether HF fp32's top-1 / top-2 gap in `want` exceeds twice the RMS error of `got` on that row.
fn decided(got: &[f32], want: &[f32]) -> bool {
    let (mut top1, mut top2) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in want {
        if x > top1 {
            (top1, top2) = (x, top1);
        } else if x > top2 {
            top2 = x;
        }
    }
    let sq: f64 = got.iter().zip(want).map(|(g, w)| (*g as f64 - *w as f64).powi(2)).sum();
    let rms = (sq / want.len() as f64).sqrt();
    (top1 - top2) as f64 > 2.0 * rms
}

/// Loads the reference directory's weights into the model of `plan` and compares. With `kv_cache`
/// the greedy steps run through the KV cache (bf16, the decode ladder's); without it each step
/// recomputes the prefix. A plan with the bf16 pass is held to Hugging Face bf16 ([`Criterion::HfBf16`]),
/// the others to [`fixed_criterion`].
/// With `graph` (and `kv_cache`) the decode steps replay a captured CUDA graph. `plan` is a spec for
/// [`fastest::resolve`] (`fastest` is chosen for the reference's config).
/// The files [`check`] reads from `scripts/gpt2_reference.py`'s folder are there (checked before a
/// device is opened).
pub fn check_reference_dir(dir: &Path) -> Result<()> {
    for name in ["meta.json", "model.safetensors", "prefill_logits.f32", "decode_logits.f32"] {
        let path = dir.join(name);
        if !path.is_file() {
            return Err(Error::constraint(
                "a reference folder written by scripts/gpt2_reference.py",
                format!("{} missing", path.display()),
            ));
        }
    }
    Ok(())
}

pub fn check(gpu: &Gpu, dir: &Path, plan: &str, kv_cache: bool, graph: bool) -> Result<Report> {
    let meta: Meta = serde_json::from_slice(
        &std::fs::read(dir.join("meta.json"))
            .map_err(|e| Error::Io { context: format!("read {}/meta.json", dir.display()), source: e })?,
    )
    .map_err(|e| Error::constraint("meta.json as scripts/gpt2_reference.py writes it", e.to_string()))?;
    let cfg = Config::by_name(&meta.model)?;
    let weights = Weights::load(&dir.join("model.safetensors"), &cfg)?;
    let plan = fastest::resolve(gpu, &cfg, plan, &mut |op| eprintln!("choosing the fastest stages: {op}"))?;
    let (b, t, v) = (meta.tokens.len(), meta.tokens[0].len(), cfg.vocab);
    let steps = meta.greedy.first().map_or(0, |g| g.len());
    let prefill_ref = read_f32(&dir.join("prefill_logits.f32"), b * t * v)?;
    let decode_ref = read_f32(&dir.join("decode_logits.f32"), steps * b * v)?;
    let mut criterion = if plan.bf16.is_some() {
        // Hugging Face bf16 against Hugging Face fp32: the prefill, and the worst step.
        let prefill16 = read_f32(&dir.join("prefill_logits_bf16.f32"), b * t * v)?;
        let decode16 = read_f32(&dir.join("decode_logits_bf16.f32"), steps * b * v)?;
        let worst = (0..steps).map(|j| rel_l2(&decode16[j * b * v..][..b * v], &decode_ref[j * b * v..][..b * v]));
        let (prefill, decode) = (rel_l2(&prefill16, &prefill_ref), worst.fold(0.0, f64::max));
        match plan.fp8 {
            Some(_) => Criterion::Fp8 { prefill, decode, decided: vec![Vec::new(); b] },
            None => Criterion::HfBf16 { prefill, decode, bf16_tokens: meta.greedy_bf16.clone() },
        }
    } else {
        fixed_criterion(&plan, kv_cache)
    };
    let name = format!(
        "{}{}",
        plan.name,
        match (kv_cache, graph) {
            (true, true) => " (KV cache, graph)",
            (true, false) => " (KV cache)",
            _ => "",
        }
    );
    let mut model = Model::new(gpu, cfg, &weights, plan)?;
    model.set_graph(graph);

    let mut seqs = meta.tokens.clone();
    let logits = model.forward(gpu, &seqs)?;
    let prefill_rel_l2 = rel_l2(&logits, &prefill_ref);
    let mut decode_rel_l2: f64 = 0.0;
    let mut tokens = vec![Vec::new(); b];
    let mut cache = if kv_cache { Some(model.new_cache(gpu, b)?) } else { None };
    for step in 0..steps {
        let tt = seqs[0].len();
        let last: Vec<f32> = match cache.as_mut() {
            Some(c) if step == 0 => {
                (0..b).map(|i| model.prefill_into(gpu, c, i, &seqs[i])).collect::<Result<Vec<_>>>()?.concat()
            }
            Some(c) => {
                let fed: Vec<i32> = (0..b).map(|i| meta.greedy[i][step - 1]).collect();
                model.decode_step(gpu, c, &fed)?
            }
            None => {
                let logits = if step == 0 { logits.clone() } else { model.forward(gpu, &seqs)? };
                (0..b).flat_map(|i| logits[((i * tt) + tt - 1) * v..][..v].to_vec()).collect()
            }
        };
        let want = &decode_ref[step * b * v..][..b * v];
        decode_rel_l2 = decode_rel_l2.max(rel_l2(&last, want));
        if let Criterion::Fp8 { decided: d, .. } = &mut criterion {
            (0..b).for_each(|i| d[i].push(decided(&last[i * v..][..v], &want[i * v..][..v])));
        }
        // Feed Hugging Face's token, so one flipped argmax does not change every later step's input.
        for i in 0..b {
            tokens[i].push(argmax(&last[i * v..][..v]));
            seqs[i].push(meta.greedy[i][step]);
        }
        if tt + 1 > cfg.max_t {
            break;
        }
    }
    Ok(Report { plan: name, prefill_rel_l2, decode_rel_l2, tokens, reference_tokens: meta.greedy, criterion })
}
