//! How far GPT-2's logits move when every linear's operands are rounded, by format and scale
//! granularity: the f64 forward on the CPU with each linear's input and weight rounded as a plan's
//! kernels would read them, against the same forward exact. It asks, without a GPU, which FP8
//! scheme could meet the `fp8` plan's criterion (`check::FP8_FACTOR` times Hugging Face bf16's own
//! error; docs/notes/gpt2.md §3): bf16 operands stand in for Hugging Face bf16.
//!
//!   cargo run --release -p gpt2 --example fp8_granularity [-- TOKENS SEED]

use gpt2::config::Config;
use gpt2::reference::{forward_rounded, LinearOperands, FP8_OPERANDS};
use gpt2::weights::Weights;
use matmul::fp8::{e4m3, e4m3_value, group_scale};

fn bf16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect()
}

/// `x` `[rows, cols]` in e4m3 with one scale per `gr` x `gc` block, dequantized.
fn e4m3_blocks(x: &[f32], rows: usize, cols: usize, gr: usize, gc: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for r0 in (0..rows).step_by(gr) {
        for c0 in (0..cols).step_by(gc) {
            let (r1, c1) = ((r0 + gr).min(rows), (c0 + gc).min(cols));
            let (scale, mul) = group_scale((r0..r1).flat_map(|r| x[r * cols + c0..r * cols + c1].iter().copied()));
            for r in r0..r1 {
                for c in c0..c1 {
                    out[r * cols + c] = e4m3_value(e4m3(x[r * cols + c] * mul)) * scale;
                }
            }
        }
    }
    out
}

fn rel_l2(a: &[f64], exact: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(exact).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = exact.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("TOKENS SEED")).collect();
    let (t, seed) = (args.first().copied().unwrap_or(64), args.get(1).copied().unwrap_or(1) as u64);
    let cfg = Config::by_name("gpt2").expect("gpt2's config");
    let w = Weights::random(&cfg, seed);
    let tokens = vec![(0..t).map(|i| ((i as u64 * 7919 + seed * 104729) % cfg.vocab as u64) as i32).collect()];
    let exact = forward_rounded(&cfg, &w, &tokens, None);
    let plan = |blocks, head| LinearOperands { blocks, head, ..FP8_OPERANDS };
    let exact_inputs: fn(&[f32], usize, usize) -> Vec<f32> = |x, _, _| x.to_vec();
    let inputs_32: fn(&[f32], usize, usize) -> Vec<f32> = |x, m, k| e4m3_blocks(x, m, k, 1, 32);
    let bf16_operands =
        LinearOperands { input: |x, _, _| bf16(x), weight: |w, _, _| bf16(w), blocks: true, head: true };
    let variants: [(&str, LinearOperands); 9] = [
        ("bf16 inputs and weights (Hugging Face bf16's stand-in)", bf16_operands),
        ("e4m3, inputs 1 x 128, weights 128 x 128 (the fp8 plan)", FP8_OPERANDS),
        ("the fp8 plan's weights only (inputs exact)", LinearOperands { input: exact_inputs, ..FP8_OPERANDS }),
        ("the fp8 plan's inputs only (weights exact)", LinearOperands { weight: |w, _, _| w.to_vec(), ..FP8_OPERANDS }),
        ("the fp8 plan with the LM head exact", plan(true, false)),
        ("the fp8 plan's LM head only", plan(false, true)),
        ("e4m3, inputs 1 x 32, weights 128 x 128", LinearOperands { input: inputs_32, ..FP8_OPERANDS }),
        (
            "e4m3, inputs 1 x 32, weights 32 x 32",
            LinearOperands { input: inputs_32, weight: |w, n, k| e4m3_blocks(w, n, k, 32, 32), ..FP8_OPERANDS },
        ),
        (
            "e4m3, inputs and weights 1 x 32 (MX-like)",
            LinearOperands { input: inputs_32, weight: |w, n, k| e4m3_blocks(w, n, k, 1, 32), ..FP8_OPERANDS },
        ),
    ];
    println!("GPT-2 124M, random weights (seed {seed}), {t} tokens: logits' relative L2 against the exact f64 forward");
    let mut bf16_error = None;
    for (name, operands) in &variants {
        let e = rel_l2(&forward_rounded(&cfg, &w, &tokens, Some(operands)), &exact);
        let base = *bf16_error.get_or_insert(e);
        println!("{e:.3e}  {:5.2}x bf16's  {name}", e / base);
    }
}
