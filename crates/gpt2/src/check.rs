//! The model against an implementation nobody here wrote: the directory `scripts/gpt2_reference.py`
//! writes (PyTorch + Hugging Face `transformers`, a seeded random GPT-2) holds `model.safetensors`,
//! `meta.json` (model name, the prompt tokens and Hugging Face's 16 greedy tokens), the prefill
//! logits `prefill_logits.f32` `[B, T, V]` and each greedy step's last-position logits
//! `decode_logits.f32` `[steps, B, V]` (raw little-endian f32).
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
}

/// The tolerances a plan is held to: fp32 plans without tensor cores match to 1e-4 with every
/// greedy token the same; the others to 2e-2 with the first token the same.
pub fn tolerance(plan: &Plan) -> (f64, usize) {
    let exact = [&plan.encoder, &plan.layernorm, &plan.linear, &plan.attention, &plan.gelu, &plan.residual]
        .iter()
        .all(|v| v.precision == common::Precision::Fp32);
    if exact {
        (1e-4, usize::MAX)
    } else {
        (2e-2, 1)
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
    pub tolerance: f64,
    /// Greedy tokens that must agree (per sequence, from the first).
    pub must_agree: usize,
}

impl Report {
    pub fn passed(&self) -> bool {
        let agree = self.tokens.iter().zip(&self.reference_tokens).all(|(a, b)| {
            let n = self.must_agree.min(b.len());
            a.len() >= n && a[..n] == b[..n]
        });
        self.prefill_rel_l2 <= self.tolerance && self.decode_rel_l2 <= self.tolerance && agree
    }
}

fn read_f32(path: &Path, n: usize) -> Result<Vec<f32>> {
    let b = std::fs::read(path).map_err(|e| Error::Io { context: format!("read {}", path.display()), source: e })?;
    common::require(b.len() == 4 * n, &format!("{} holds {n} f32", path.display()), || format!("{} bytes", b.len()))?;
    Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Relative L2 error of `got` against `want` (common's comparison); NaN if any value is not finite.
fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let want: Vec<f64> = want.iter().map(|&x| x as f64).collect();
    let e = common::check::compare("logits", got, &want);
    if e.non_finite > 0 {
        f64::NAN
    } else {
        e.rel_l2
    }
}

/// Loads the reference directory's weights into the model of `plan` and compares. With `kv_cache`
/// the greedy steps run through the KV cache (bf16, the decode ladder's), held to 2e-2 and the
/// first token; without it each step recomputes the prefix at the plan's own tolerance.
/// With `graph` (and `kv_cache`) the decode steps replay a captured CUDA graph. `plan` is a spec for
/// [`fastest::resolve`] (`fastest` is chosen for the reference's config).
pub fn check(gpu: &Gpu, dir: &Path, plan: &str, kv_cache: bool, graph: bool) -> Result<Report> {
    let meta: Meta = serde_json::from_slice(
        &std::fs::read(dir.join("meta.json"))
            .map_err(|e| Error::Io { context: format!("read {}/meta.json", dir.display()), source: e })?,
    )
    .map_err(|e| Error::constraint("meta.json as scripts/gpt2_reference.py writes it", e.to_string()))?;
    let cfg = Config::by_name(&meta.model)?;
    let weights = Weights::load(&dir.join("model.safetensors"), &cfg)?;
    let plan = fastest::resolve(gpu, &cfg, plan, &mut |op| eprintln!("choosing the fastest stages: {op}"))?;
    let (tolerance, must_agree) = if kv_cache { (2e-2, 1) } else { tolerance(&plan) };
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
    let (b, t, v) = (meta.tokens.len(), meta.tokens[0].len(), cfg.vocab);
    let steps = meta.greedy.first().map_or(0, |g| g.len());
    let prefill_ref = read_f32(&dir.join("prefill_logits.f32"), b * t * v)?;
    let decode_ref = read_f32(&dir.join("decode_logits.f32"), steps * b * v)?;

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
        decode_rel_l2 = decode_rel_l2.max(rel_l2(&last, &decode_ref[step * b * v..][..b * v]));
        // Feed Hugging Face's token, so one flipped argmax does not change every later step's input.
        for i in 0..b {
            tokens[i].push(argmax(&last[i * v..][..v]));
            seqs[i].push(meta.greedy[i][step]);
        }
        if tt + 1 > cfg.max_t {
            break;
        }
    }
    Ok(Report {
        plan: name,
        prefill_rel_l2,
        decode_rel_l2,
        tokens,
        reference_tokens: meta.greedy,
        tolerance,
        must_agree,
    })
}
