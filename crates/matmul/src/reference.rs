//! f64 CPU references and the row sampling used at large shapes.
//!
//! A full f64 reference of the biggest default shape (the LM head, 4096 × 50257 × 768 ≈ 1.6·10¹¹
//! multiply-adds) takes minutes on a CPU. Above [`FULL_REFERENCE_MACS`] the problems therefore
//! compute the reference for the harness's sample of rows ([`common::check::sample_rows`]: the first,
//! the last and the rest drawn from the problem's fresh seed) and verify those rows; every other
//! element is still checked to have been written (finite, not the NaN poison).

use common::check::{sample_rows, SAMPLED_ROWS};
use rayon::prelude::*;

/// Shapes with at most this many multiply-adds get a reference for every row.
pub const FULL_REFERENCE_MACS: u64 = 1 << 32;

/// The rows of an M × N output (K deep) that are checked against the reference: all of them for
/// small problems, else [`SAMPLED_ROWS`] rows drawn from `seed`, row 0 and row M−1 among them.
pub fn sampled_rows(m: usize, n: usize, k: usize, seed: u64) -> Vec<usize> {
    let macs = (m as u64).saturating_mul(n as u64).saturating_mul(k as u64);
    if macs <= FULL_REFERENCE_MACS {
        return (0..m).collect();
    }
    sample_rows(m, SAMPLED_ROWS, seed)
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    let mut s = [0.0f64; 4];
    let (ac, bc) = (a.chunks_exact(4), b.chunks_exact(4));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for j in 0..4 {
            s[j] += x[j] as f64 * y[j] as f64;
        }
    }
    let tail: f64 = ar.iter().zip(br).map(|(x, y)| *x as f64 * *y as f64).sum();
    (s[0] + s[1]) + (s[2] + s[3]) + tail
}

/// `inp · Wᵀ + bias` for the given rows only: `rows.len() × n` values, row after row. `inp` is
/// M × K, `w` N × K, both row-major.
pub fn linear_rows(inp: &[f32], w: &[f32], bias: Option<&[f32]>, n: usize, k: usize, rows: &[usize]) -> Vec<f64> {
    let mut out = vec![0.0f64; rows.len() * n];
    out.par_chunks_mut(n.max(1)).zip(rows.par_iter()).for_each(|(o, &m)| {
        let a = &inp[m * k..(m + 1) * k];
        for (j, oj) in o.iter_mut().enumerate() {
            let b = bias.map_or(0.0, |b| b[j] as f64);
            *oj = dot(a, &w[j * k..(j + 1) * k]) + b;
        }
    });
    out
}

/// The scale a tailed linear output's error is measured against, for the given rows: the sum of
/// the magnitudes of its terms, sum_k |x_k w_k| + |bias| (+ |residual|). The output itself may
/// cancel to near zero (a product plus a residual of the opposite sign) while its rounding error,
/// which comes from the terms, does not; GELU changes neither by more than a factor 1.13.
pub fn magnitude_rows(
    inp: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    n: usize,
    k: usize,
    rows: &[usize],
) -> Vec<f64> {
    let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
    let b = bias.map(abs);
    let mut m = linear_rows(&abs(inp), &abs(w), b.as_deref(), n, k, rows);
    if let Some(r) = residual {
        for (o, &row) in m.chunks_mut(n.max(1)).zip(rows) {
            o.iter_mut().zip(&r[row * n..(row + 1) * n]).for_each(|(x, y)| *x += y.abs() as f64);
        }
    }
    m
}

/// GELU, tanh form (GPT-2's), in f64.
pub fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}
