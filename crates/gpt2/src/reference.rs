//! The forward pass in f64 on the CPU: the reference the model's tests compare against.

use matmul::fp8;
use rayon::prelude::*;

use crate::config::{Config, LN_EPS};
use crate::pointwise;
use crate::weights::Weights;

/// The forward pass in f64 on the CPU: logits `[B, T, V]`.
pub fn forward(cfg: &Config, w: &Weights, tokens: &[Vec<i32>]) -> Vec<f64> {
    forward_with(cfg, w, tokens, false)
}

/// [`forward`] with the linears' operands as an fp8 plan's whole-sequence pass reads them: each
/// linear's input quantized a row's 128 channels at a time and its weight in 128 x 128 blocks
/// (`matmul::fp8`), dequantized; the rest exact. What the plan's kernels compute, so its error
/// against this is theirs, not the format's.
pub fn forward_fp8(cfg: &Config, w: &Weights, tokens: &[Vec<i32>]) -> Vec<f64> {
    forward_with(cfg, w, tokens, true)
}

/// `fp8`: the linears on quantized operands ([`forward_fp8`]).
fn forward_with(cfg: &Config, w: &Weights, tokens: &[Vec<i32>], fp8: bool) -> Vec<f64> {
    let (c, nh, hs) = (cfg.c, cfg.heads, cfg.head_size());
    // The LM head is the tied embedding; the embedding itself stays exact.
    let (weights, head) = if fp8 { dequantized_linears(w, cfg) } else { (w.clone(), w.wte.clone()) };
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
        // out[t, n] = inp[t, :] . W[n, :] + bias[n]
        let lin = |inp: &[f64], wt: &[f32], bias: Option<&[f32]>, k: usize, n: usize| -> Vec<f64> {
            let quantized: Vec<f64>;
            let inp = if fp8 {
                let x: Vec<f32> = inp.iter().map(|&v| v as f32).collect();
                quantized = fp8::quantize_rows(&x, inp.len() / k, k).dequantize().into_iter().map(f64::from).collect();
                &quantized
            } else {
                inp
            };
            inp.chunks(k).flat_map(|r| linear_row(r, wt, bias, n)).collect()
        };
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
        logits.extend(lin(&h, &head, None, c, cfg.vocab));
    }
    logits
}

/// `w` with every block's linear weights quantized in 128 x 128 blocks and dequantized, and the LM
/// head (the embedding) so quantized.
fn dequantized_linears(w: &Weights, cfg: &Config) -> (Weights, Vec<f32>) {
    let c = cfg.c;
    let blocks = |x: &[f32], n: usize| fp8::quantize_blocks(x, n, x.len() / n).dequantize();
    let mut q = w.clone();
    for (qb, b) in q.blocks.iter_mut().zip(&w.blocks) {
        qb.qkv_w = blocks(&b.qkv_w, 3 * c);
        qb.proj_w = blocks(&b.proj_w, c);
        qb.fc_w = blocks(&b.fc_w, 4 * c);
        qb.fcproj_w = blocks(&b.fcproj_w, c);
    }
    (q, blocks(&w.wte, cfg.vocab))
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
