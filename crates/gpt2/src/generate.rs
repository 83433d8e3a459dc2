//! Text in, text out: GPT-2's BPE tokenizer (`tiktoken-rs`'s `r50k_base`, GPT-2's ranks, shipped in
//! the crate), sampling (greedy, temperature, top-k, top-p, seeded), and generation.
//!
//! Generation runs with the KV cache (each prompt prefilled into its slot, then one decode step per
//! token for the whole batch) or without it (the report's "without a KV cache" row: the whole prefix
//! recomputed for every token, sequences of equal length sharing a pass).

use std::time::Instant;

use common::{require, Error, Gpu, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::model::Model;

/// `<|endoftext|>`.
pub const END_OF_TEXT: i32 = 50256;

/// GPT-2's tokenizer.
pub struct Tokenizer {
    bpe: tiktoken_rs::CoreBPE,
}

impl Tokenizer {
    pub fn new() -> Result<Tokenizer> {
        let bpe = tiktoken_rs::r50k_base().map_err(|e| Error::constraint("the r50k_base ranks", e.to_string()))?;
        Ok(Tokenizer { bpe })
    }

    /// Token ids of `text`; `<|endoftext|>` written in the text is the special token.
    pub fn encode(&self, text: &str) -> Vec<i32> {
        self.bpe.encode_with_special_tokens(text).into_iter().map(|t| t as i32).collect()
    }

    /// The text of `ids`. Bytes that are not UTF-8 on their own (a character split across a
    /// sequence's end, or a random model's output) become U+FFFD rather than an error.
    pub fn decode(&self, ids: &[i32]) -> Result<String> {
        require(ids.iter().all(|&t| (0..=END_OF_TEXT).contains(&t)), "token ids in [0, 50256]", || format!("{ids:?}"))?;
        let ranks: Vec<u32> = ids.iter().map(|&t| t as u32).collect();
        let bytes: Vec<u8> = self.bpe._decode_native_and_split(ranks).flatten().collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// The index of the largest logit (the first one on a tie): the greedy token.
pub fn argmax(row: &[f32]) -> i32 {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &x)| if x > best.1 { (i, x) } else { best }).0 as i32
}

/// How the next token is drawn from a row of logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 = greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens (None: all).
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches p, in (0, 1].
    pub top_p: f32,
    pub seed: u64,
}

impl Sampling {
    pub const GREEDY: Sampling = Sampling { temperature: 0.0, top_k: None, top_p: 1.0, seed: 0 };

    pub fn check(&self) -> Result<()> {
        require(self.temperature >= 0.0 && self.temperature.is_finite(), "temperature >= 0", || {
            format!("temperature = {}", self.temperature)
        })?;
        require(self.top_p > 0.0 && self.top_p <= 1.0, "top-p in (0, 1]", || format!("top-p = {}", self.top_p))?;
        require(self.top_k != Some(0), "top-k >= 1", || "top-k = 0".to_string())
    }
}

/// Draws tokens from rows of logits.
pub struct Sampler {
    s: Sampling,
    rng: StdRng,
}

impl Sampler {
    pub fn new(s: Sampling) -> Result<Sampler> {
        s.check()?;
        Ok(Sampler { s, rng: StdRng::seed_from_u64(s.seed) })
    }

    /// Greedy: the token is the argmax, which the device can pick without the logits crossing.
    pub fn is_greedy(&self) -> bool {
        self.s.temperature == 0.0
    }

    /// The next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> i32 {
        if self.is_greedy() {
            return argmax(logits);
        }
        draw(logits, &self.s, self.rng.random::<f64>())
    }

    /// One draw in [0, 1) per row, for sampling on the device ([`Model::decode_step_sampled`]); the
    /// same stream of draws the host's [`Sampler::sample`] uses.
    pub fn uniforms(&mut self, rows: usize) -> Vec<f32> {
        // f32 rounding may give 1.0: keep the draw below it.
        (0..rows).map(|_| (self.rng.random::<f64>() as f32).min(1.0 - f32::EPSILON)).collect()
    }

    pub fn sampling(&self) -> &Sampling {
        &self.s
    }
}

/// The tokens a non-greedy draw may pick from one row, in index order, with their running mass
/// normalized to 1: `(token, mass before it, mass through it)`. The weights are
/// `exp((x - max) / T)`; top-k keeps the tokens whose weight is at least the k-th largest, then top-p
/// the tokens whose weight is at least that of the token where the running mass (largest first)
/// reaches p of the kept mass. Ties at either threshold are all kept. The device's sampling stage
/// keeps the same set.
pub fn kept_intervals(logits: &[f32], s: &Sampling) -> Vec<(usize, f64, f64)> {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let w: Vec<f64> = logits.iter().map(|&x| ((x as f64 - m) / s.temperature as f64).exp()).collect();
    let mut sorted = w.clone();
    sorted.sort_unstable_by(|a, b| b.total_cmp(a));
    let mut threshold = 0.0;
    if let Some(k) = s.top_k.filter(|&k| k < sorted.len()) {
        threshold = sorted[k - 1];
    }
    if s.top_p < 1.0 {
        let kept: Vec<f64> = sorted.iter().copied().filter(|&x| x >= threshold).collect();
        let goal = s.top_p as f64 * kept.iter().sum::<f64>();
        let mut mass = 0.0;
        let reach = kept.iter().position(|&x| {
            mass += x;
            mass >= goal
        });
        threshold = kept[reach.unwrap_or(kept.len() - 1)];
    }
    let total: f64 = w.iter().filter(|&&x| x >= threshold).sum();
    let mut run = 0.0;
    w.iter()
        .enumerate()
        .filter(|(_, &x)| x >= threshold)
        .map(|(i, &x)| {
            let lo = run;
            run += x / total;
            (i, lo, run)
        })
        .collect()
}

/// The token a draw `u` in [0, 1) picks (non-greedy): the first kept token, in index order, whose
/// running mass exceeds u.
pub fn draw(logits: &[f32], s: &Sampling, u: f64) -> i32 {
    let kept = kept_intervals(logits, s);
    let last = kept.last().expect("the largest logit is always kept").0;
    kept.iter().find(|&&(_, _, hi)| hi > u).map_or(last, |&(i, _, _)| i) as i32
}

/// What one generation produced and how long it took.
#[derive(Debug)]
pub struct Generation {
    /// The new tokens of each prompt (up to `<|endoftext|>`, which is included, or the limit).
    pub tokens: Vec<Vec<i32>>,
    /// The first forward pass over the prompts.
    pub prefill_ms: f64,
    /// Every later step.
    pub decode_ms: f64,
    /// Tokens produced after the first (the decode steps' work).
    pub decode_tokens: usize,
}

/// Generates up to `max_new` tokens after each prompt, stopping a sequence at `<|endoftext|>` when
/// `stop_at_end`, with or without the KV cache. `on_step(n)` is told after each step how many
/// tokens the longest-running sequence has (a progress bar's position).
#[allow(clippy::too_many_arguments)]
pub fn generate(
    gpu: &Gpu,
    model: &mut Model,
    prompts: &[Vec<i32>],
    max_new: usize,
    sampling: Sampling,
    stop_at_end: bool,
    kv_cache: bool,
    on_step: &mut dyn FnMut(usize),
) -> Result<Generation> {
    require(!prompts.is_empty() && prompts.iter().all(|p| !p.is_empty()), "at least one non-empty prompt", || {
        format!("{} prompts", prompts.len())
    })?;
    let ctx = model.cfg.max_t;
    if let Some((i, p)) = prompts.iter().enumerate().find(|(_, p)| p.len() + max_new > ctx) {
        return Err(Error::constraint(
            format!("prompt + new tokens <= context {ctx}"),
            format!("prompt {i}: {} + {max_new}", p.len()),
        ));
    }
    let mut sampler = Sampler::new(sampling)?;
    if kv_cache {
        return generate_cached(gpu, model, prompts, max_new, &mut sampler, stop_at_end, on_step);
    }
    let mut seqs: Vec<Vec<i32>> = prompts.to_vec();
    let mut out = vec![Vec::new(); prompts.len()];
    let mut done = vec![max_new == 0; prompts.len()];
    let (mut prefill_ms, mut decode_ms, mut decode_tokens) = (0.0, 0.0, 0);
    for step in 0..max_new {
        let start = Instant::now();
        // Sequences of one length share a pass.
        let mut lengths: Vec<usize> = (0..seqs.len()).filter(|&i| !done[i]).map(|i| seqs[i].len()).collect();
        lengths.sort_unstable();
        lengths.dedup();
        for len in lengths {
            let group: Vec<usize> = (0..seqs.len()).filter(|&i| !done[i] && seqs[i].len() == len).collect();
            let batch: Vec<Vec<i32>> = group.iter().map(|&i| seqs[i].clone()).collect();
            let logits = model.forward_last(gpu, &batch)?;
            let v = model.cfg.vocab;
            for (j, &i) in group.iter().enumerate() {
                let tok = sampler.sample(&logits[j * v..][..v]);
                seqs[i].push(tok);
                out[i].push(tok);
                done[i] = out[i].len() == max_new || (stop_at_end && tok == END_OF_TEXT);
                if step > 0 {
                    decode_tokens += 1;
                }
            }
        }
        let ms = start.elapsed().as_secs_f64() * 1e3;
        on_step(step + 1);
        if step == 0 {
            prefill_ms = ms;
        } else {
            decode_ms += ms;
        }
        if done.iter().all(|&d| d) {
            break;
        }
    }
    Ok(Generation { tokens: out, prefill_ms, decode_ms, decode_tokens })
}

fn generate_cached(
    gpu: &Gpu,
    model: &mut Model,
    prompts: &[Vec<i32>],
    max_new: usize,
    sampler: &mut Sampler,
    stop_at_end: bool,
    on_step: &mut dyn FnMut(usize),
) -> Result<Generation> {
    let b = prompts.len();
    let mut out = vec![Vec::new(); b];
    if max_new == 0 {
        return Ok(Generation { tokens: out, prefill_ms: 0.0, decode_ms: 0.0, decode_tokens: 0 });
    }
    let mut cache = model.new_cache(gpu, b)?;
    let start = Instant::now();
    let mut last = vec![0; b];
    for (i, p) in prompts.iter().enumerate() {
        last[i] = sampler.sample(&model.prefill_into(gpu, &mut cache, i, p)?);
        out[i].push(last[i]);
    }
    let prefill_ms = start.elapsed().as_secs_f64() * 1e3;
    on_step(1);
    let finished = |o: &Vec<i32>| o.len() == max_new || (stop_at_end && o.last() == Some(&END_OF_TEXT));
    let start = Instant::now();
    let mut decode_tokens = 0;
    while !out.iter().all(finished) {
        // The device picks the tokens (argmax, or a draw with the host's uniforms) and B ids come
        // back instead of B x V logits.
        let ids = if sampler.is_greedy() {
            model.decode_step_greedy(gpu, &mut cache, &last)?
        } else {
            let draws = sampler.uniforms(b);
            model.decode_step_sampled(gpu, &mut cache, &last, sampler.sampling(), &draws)?
        };
        for i in 0..b {
            if !finished(&out[i]) {
                last[i] = ids[i];
                out[i].push(last[i]);
                decode_tokens += 1;
            }
        }
        on_step(out.iter().map(|o| o.len()).max().unwrap_or(0));
    }
    Ok(Generation { tokens: out, prefill_ms, decode_ms: start.elapsed().as_secs_f64() * 1e3, decode_tokens })
}
