//! The forward pass in f64 on the CPU: the reference the model's tests compare against.

use matmul::fp8;
use rayon::prelude::*;

use crate::config::{Config, LN_EPS};
use crate::pointwise;
use crate::weights::Weights;

/// The forward pass in f64 on the CPU: logits `[B, T, V]`.
pub fn forward(cfg: &Config, w: &Weights, tokens: &[Vec<i32>]) -> Vec<f64> {
    forward_rounded(cfg, w, tokens, None)
}

/// [`forward`] with the linears' operands as an fp8 plan's whole-sequence pass reads them: each
/// linear's input quantized a row's 128 channels at a time and its weight in 128 x 128 blocks
/// (`matmul::fp8`), dequantized; the rest exact. What the plan's kernels compute, so its error
/// against this is theirs, not the format's.
pub fn forward_fp8(cfg: &Config, w: &Weights, tokens: &[Vec<i32>]) -> Vec<f64> {
    forward_rounded(cfg, w, tokens, Some(&FP8_OPERANDS))
}

/// How a forward pass rounds linears' operands before their exact products: `input` takes a
/// linear's input rows `[m, k]`, `weight` its weight `[n, k]`, each to the values a plan's kernels
/// would multiply; `blocks` and `head` say whether the blocks' linears and the LM head (the tied
/// embedding as its weight) are rounded.
pub struct LinearOperands {
    pub input: fn(&[f32], usize, usize) -> Vec<f32>,
    pub weight: fn(&[f32], usize, usize) -> Vec<f32>,
    pub blocks: bool,
    pub head: bool,
}

/// The fp8 plan's operands: `matmul::fp8`'s 1 x 128 row groups and 128 x 128 weight blocks.
pub const FP8_OPERANDS: LinearOperands = LinearOperands {
    input: |x, m, k| fp8::quantize_rows(x, m, k).dequantize(),
    weight: |w, n, k| fp8::quantize_blocks(w, n, k).dequantize(),
    blocks: true,
    head: true,
};

/// [`forward`] with every linear's operands rounded by `operands` (`None`: exact); the embedding,
/// the LayerNorms, attention and GELU stay exact.
pub fn forward_rounded(cfg: &Config, w: &Weights, tokens: &[Vec<i32>], operands: Option<&LinearOperands>) -> Vec<f64> {
    let (c, nh, hs) = (cfg.c, cfg.heads, cfg.head_size());
    // The LM head is the tied embedding; the embedding itself stays exact.
    let (weights, head) = match operands {
        Some(o) => rounded_linears(w, cfg, o),
        None => (w.clone(), w.wte.clone()),
    };
    let w = &weights;
    let mut logits = Vec::new();
    for row in tokens {
        let t = row.len();
        let mut x: Vec<f64> = (0..t * c)
            .map(|i| w.wte[row[i / c] as usize * c + i % c] as f64 + w.wpe[(i / c) * c + i % c] as f64)
            .collect();
        let ln = |x: &[f64], g: &[f32], bias: &[f32]| -> Vec<f64> {
            x.chunks(c).flat_map(|r| layernorm_row(r, g, bias)).collect()
        };
        // out[t, n] = inp[t, :] . W[n, :] + bias[n], the input rounded where `round` says.
        let linear = |inp: &[f64], wt: &[f32], bias: Option<&[f32]>, k: usize, n: usize, round: bool| -> Vec<f64> {
            let rounded: Vec<f64>;
            let inp = match operands.filter(|_| round) {
                Some(o) => {
                    let x: Vec<f32> = inp.iter().map(|&v| v as f32).collect();
                    rounded = (o.input)(&x, inp.len() / k, k).into_iter().map(f64::from).collect();
                    &rounded
                }
                None => inp,
            };
            inp.chunks(k).flat_map(|r| linear_row(r, wt, bias, n)).collect()
        };
        let blocks = operands.is_some_and(|o| o.blocks);
        let lin =
            |inp: &[f64], wt: &[f32], bias: Option<&[f32]>, k: usize, n: usize| linear(inp, wt, bias, k, n, blocks);
        for l in &w.blocks {
            let h = ln(&x, &l.ln1_w, &l.ln1_b);
            let qkv = lin(&h, &l.qkv_w, Some(&l.qkv_b), c, 3 * c);
            let mut att = vec![0f64; t * c];
            for head in 0..nh {
                for i in 0..t {
                    let q = &qkv[i * 3 * c + head * hs..][..hs];
                    let s: Vec<f64> = (0..=i)
                        .map(|j| {
                            let k = &qkv[j * 3 * c + c + head * hs..][..hs];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hs as f64).sqrt()
                        })
                        .collect();
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, p) in e.iter().enumerate() {
                        let v = &qkv[j * 3 * c + 2 * c + head * hs..][..hs];
                        for d in 0..hs {
                            att[i * c + head * hs + d] += p / z * v[d];
                        }
                    }
                }
            }
            let proj = lin(&att, &l.proj_w, Some(&l.proj_b), c, c);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
            let h = ln(&x, &l.ln2_w, &l.ln2_b);
            let fc: Vec<f64> = lin(&h, &l.fc_w, Some(&l.fc_b), c, 4 * c).into_iter().map(pointwise::gelu).collect();
            let proj = lin(&fc, &l.fcproj_w, Some(&l.fcproj_b), 4 * c, c);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
        }
        let h = ln(&x, &w.lnf_w, &w.lnf_b);
        let round_head = operands.is_some_and(|o| o.head);
        logits.extend(linear(&h, &head, None, c, cfg.vocab, round_head));
    }
    logits
}

/// `w` with the blocks' linear weights and the LM head's (the embedding's copy) rounded by `o` where
/// it says.
fn rounded_linears(w: &Weights, cfg: &Config, o: &LinearOperands) -> (Weights, Vec<f32>) {
    let c = cfg.c;
    let round = |x: &[f32], n: usize| (o.weight)(x, n, x.len() / n);
    let mut q = w.clone();
    if o.blocks {
        for (qb, b) in q.blocks.iter_mut().zip(&w.blocks) {
            qb.qkv_w = round(&b.qkv_w, 3 * c);
            qb.proj_w = round(&b.proj_w, c);
            qb.fc_w = round(&b.fc_w, 4 * c);
            qb.fcproj_w = round(&b.fcproj_w, c);
        }
    }
    (q, if o.head { round(&w.wte, cfg.vocab) } else { w.wte.clone() })
}

/// LayerNorm of one row in f64 (GPT-2's epsilon) with gain `g` and shift `bias`.
pub(crate) fn layernorm_row(x: &[f64], g: &[f32], bias: &[f32]) -> Vec<f64> {
    let c = x.len() as f64;
    let mean = x.iter().sum::<f64>() / c;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / c;
    let rstd = 1.0 / (var + LN_EPS as f64).sqrt();
    x.iter().enumerate().map(|(i, v)| (v - mean) * rstd * g[i] as f64 + bias[i] as f64).collect()
}

/// `out[n] = x . W[n, :] + bias[n]` for one row `x` of K = x.len(), W `[N, K]`; the outputs on
/// every core (a decode step's reference at batch 1 is one row through 124M weights).
pub(crate) fn linear_row(x: &[f64], wt: &[f32], bias: Option<&[f32]>, n: usize) -> Vec<f64> {
    let k = x.len();
    (0..n)
        .into_par_iter()
        .map(|o| {
            x.iter().zip(&wt[o * k..(o + 1) * k]).map(|(a, b)| a * *b as f64).sum::<f64>()
                + bias.map_or(0.0, |bb| bb[o] as f64)
        })
        .collect()
}
