//! Text in, text out: GPT-2's BPE tokenizer (`tiktoken-rs`'s `r50k_base`, GPT-2's ranks, shipped in
//! the crate), sampling (greedy, temperature, top-k, top-p, seeded), and generation.
//!
//! Generation runs with the KV cache (each prompt prefilled into its slot, then one decode step per
//! token for the whole batch) or without it (the report's "without a KV cache" row: the whole prefix
//! recomputed for every token, sequences of equal length sharing a pass).

use std::time::Instant;

use common::{require, Error, Gpu, Result};

use crate::model::Model;
use crate::sampling::{Sampler, Sampling};

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
    /// Compiling and loading the kernels before anything is timed (with the KV cache; without it
    /// each new length's pass is prepared when it first runs, inside the steps' times).
    pub compile_ms: f64,
    /// Greedy steps ran as the loop on the device ([`Model::decode_greedy_on_device`], chunks of
    /// [`DEVICE_LOOP_CHUNK`] steps) instead of one host round trip a step.
    pub device_loop: bool,
}

/// Greedy steps the loop on the device runs between two looks at the tokens (for `<|endoftext|>`):
/// tokens a finished sequence makes past its end in the last chunk are dropped.
pub const DEVICE_LOOP_CHUNK: usize = 16;

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
    Ok(Generation { tokens: out, prefill_ms, decode_ms, decode_tokens, compile_ms: 0.0, device_loop: false })
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
    let device_loop = sampler.is_greedy() && model.has_device_loop()?;
    let start = Instant::now();
    let mut lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    lens.sort_unstable();
    lens.dedup();
    model.prepare_generation(gpu, b, &lens)?;
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    if max_new == 0 {
        let (prefill_ms, decode_ms, decode_tokens) = (0.0, 0.0, 0);
        return Ok(Generation { tokens: out, prefill_ms, decode_ms, decode_tokens, compile_ms, device_loop });
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
        // back instead of B x V logits; greedy steps where it can as a loop on the device, each
        // sequence's picks of a chunk at once.
        let picks: Vec<Vec<i32>> = if device_loop {
            let left = out.iter().filter(|o| !finished(o)).map(|o| max_new - o.len()).max().unwrap_or(1);
            let room = model.cfg.max_t - cache.lens.iter().copied().max().unwrap_or(0);
            let n = left.min(DEVICE_LOOP_CHUNK).min(room).max(1);
            model.decode_greedy_on_device(gpu, &mut cache, &last, n)?
        } else if sampler.is_greedy() {
            model.decode_step_greedy(gpu, &mut cache, &last)?.into_iter().map(|id| vec![id]).collect()
        } else {
            let draws = sampler.uniforms(b);
            let ids = model.decode_step_sampled(gpu, &mut cache, &last, sampler.sampling(), &draws)?;
            ids.into_iter().map(|id| vec![id]).collect()
        };
        for (i, row) in picks.iter().enumerate() {
            for &id in row {
                if !finished(&out[i]) {
                    out[i].push(id);
                    decode_tokens += 1;
                }
            }
            // The next step's token: the device loop goes on from its own last pick.
            last[i] = *row.last().expect("at least one step");
        }
        on_step(out.iter().map(|o| o.len()).max().unwrap_or(0));
    }
    let decode_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(Generation { tokens: out, prefill_ms, decode_ms, decode_tokens, compile_ms, device_loop })
}
