//! f64 CPU references of causal self-attention over the llm.c `qkv[B, T, 3C]` layout, and the
//! sizes (`Dims`) the prefill ops and the references share, with the checks every prefill stage makes.

use common::{require, Error, Result, Shape};
use rayon::prelude::*;

/// The limit on qkv's indices every prefill stage has.
pub const ELEMS: &str = "B * T * 3C < 2^31";

/// The shape of one attention call: `C = NH * HS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub nh: usize,
}

impl Dims {
    /// The prefill ops' sizes from shape keys B, T, NH and HS (each in 1..2^31, C = NH * HS < 2^31).
    pub fn from_shape(shape: &Shape) -> Result<Dims> {
        const I32: i64 = i32::MAX as i64;
        let (b, t) = (shape.dim("B", I32)?, shape.dim("T", I32)?);
        let (nh, hs) = (shape.dim("NH", I32)?, shape.dim("HS", I32)?);
        let c = nh.checked_mul(hs).filter(|&c| c <= I32 as usize);
        let c = c.ok_or_else(|| Error::constraint("NH*HS < 2^31", format!("NH = {nh}, HS = {hs}")))?;
        Ok(Dims { b, t, c, nh })
    }

    /// The constraints every prefill stage shares: sizes at least 1, `C % NH == 0`, qkv's indices
    /// below 2^31 ([`ELEMS`]), and a head size in `head_sizes` (`head_size` names that constraint).
    pub fn check(&self, head_sizes: &[usize], head_size: &str) -> Result<()> {
        let Dims { b, t, c, nh } = *self;
        require(b >= 1, "B >= 1", || format!("B = {b}"))?;
        require(t >= 1, "T >= 1", || format!("T = {t}"))?;
        require(nh >= 1, "NH >= 1", || format!("NH = {nh}"))?;
        require(c >= 1 && c % nh == 0, "C % NH == 0", || format!("C = {c}, NH = {nh}"))?;
        let n = b.checked_mul(t).and_then(|x| x.checked_mul(c)).and_then(|x| x.checked_mul(3));
        require(n.is_some_and(|n| n <= i32::MAX as usize), ELEMS, || format!("B={b}, T={t}, C={c}"))?;
        let hs = c / nh;
        require(head_sizes.contains(&hs), head_size, || format!("HS = {hs}"))
    }

    /// Head size `C / NH` (callers check `C % NH == 0`).
    pub fn hs(&self) -> usize {
        self.c / self.nh.max(1)
    }
}

/// The keys a query at position t attends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mask {
    /// Keys `0..=t`; with `Some(W)`, only the W most recent of them (`t+1-W..=t`).
    Causal(Option<usize>),
    /// Every key `0..T`.
    Full,
}

impl Mask {
    fn keys(self, t: usize, tlen: usize) -> std::ops::Range<usize> {
        match self {
            Mask::Causal(window) => window.map_or(0, |w| (t + 1).saturating_sub(w))..t + 1,
            Mask::Full => 0..tlen,
        }
    }
}

/// The head size and the scale `1/sqrt(HS)` of a reference call, after checking its inputs: qkv
/// holds B * T rows of 3C, C = NH * HS, and a window is at least one key.
fn head_size_and_scale(qkv: &[f32], d: Dims, mask: Mask) -> (usize, f64) {
    let hs = d.hs();
    assert_eq!(qkv.len(), d.b * d.t * 3 * d.c, "qkv length");
    assert!(d.nh * hs == d.c && mask != Mask::Causal(Some(0)), "C = NH * HS and W >= 1");
    (hs, 1.0 / (hs as f64).sqrt())
}

/// Attention of the (batch, token) rows `rows` (each `b * T + t`), in f64: their `out` rows
/// (`rows.len() x C`) and the logsumexp of each row's scaled scores per head (`rows.len() x NH`,
/// natural log). The scale is `1/sqrt(HS)`.
pub fn attention_rows(qkv: &[f32], d: Dims, mask: Mask, rows: &[usize]) -> (Vec<f64>, Vec<f64>) {
    let (hs, scale) = head_size_and_scale(qkv, d, mask);
    let Dims { t: tlen, c, nh, .. } = d;
    let mut out = vec![0.0f64; rows.len() * c];
    let mut lse = vec![0.0f64; rows.len() * nh];
    out.par_chunks_mut(c).zip(lse.par_chunks_mut(nh)).zip(rows.par_iter()).for_each(|((orow, lrow), &bt)| {
        let (b, t) = (bt / tlen, bt % tlen);
        let row = |tok: usize| &qkv[(b * tlen + tok) * 3 * c..(b * tlen + tok + 1) * 3 * c];
        let keys = mask.keys(t, tlen);
        let mut scores = vec![0.0f64; keys.len()];
        for h in 0..nh {
            let q = &row(t)[h * hs..(h + 1) * hs];
            for (s, t2) in scores.iter_mut().zip(keys.clone()) {
                let k = &row(t2)[c + h * hs..c + (h + 1) * hs];
                *s = scale * q.iter().zip(k).map(|(&x, &y)| x as f64 * y as f64).sum::<f64>();
            }
            let max = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
            let o = &mut orow[h * hs..(h + 1) * hs];
            let mut sum = 0.0;
            for (&s, t2) in scores.iter().zip(keys.clone()) {
                let e = (s - max).exp();
                sum += e;
                let v = &row(t2)[2 * c + h * hs..2 * c + (h + 1) * hs];
                for (od, &vd) in o.iter_mut().zip(v) {
                    *od += e * vd as f64;
                }
            }
            o.iter_mut().for_each(|x| *x /= sum);
            lrow[h] = max + sum.ln();
        }
    });
    (out, lse)
}

/// Causal attention of every (batch, token, head), in f64: `out[B, T, C]` and the logsumexp of each
/// row's scaled scores, `lse[B, NH, T]` (natural log). With `window = Some(W)`, token t attends only
/// to keys `max(0, t-W+1)..=t` (its W most recent positions, itself included); `None` is full causal
/// attention. The scale is `1/sqrt(HS)`.
pub fn causal_attention(qkv: &[f32], d: Dims, window: Option<usize>) -> (Vec<f64>, Vec<f64>) {
    let all: Vec<usize> = (0..d.b * d.t).collect();
    let (out, lse_rows) = attention_rows(qkv, d, Mask::Causal(window), &all);
    (out, heads_major(&lse_rows, d))
}

/// Per-row, per-head values (`[B*T, NH]`) as `[B, NH, T]`, the kernels' lse layout.
fn heads_major(rows: &[f64], d: Dims) -> Vec<f64> {
    let mut out = vec![0.0f64; rows.len()];
    for (bt, row) in rows.chunks(d.nh.max(1)).enumerate() {
        let (b, t) = (bt / d.t, bt % d.t);
        for (h, &v) in row.iter().enumerate() {
            out[(b * d.nh + h) * d.t + t] = v;
        }
    }
    out
}

/// The magnitude of each row's scaled scores for the (batch, token) rows `rows`, per head
/// (`rows.len() x NH`): `max over keys j of scale * sum_i |q_i k_ji|` (over the keys `mask` gives).
/// It sets the absolute error a logsumexp can carry: lse is softmax-weighted in its scores
/// (d lse / d s_j = p_j, summing to 1), so rounding q and k (relative u) moves it by at most
/// `u * scale * sum_i |q_i k_ji|` for the worst key, whatever the lse's own value. An lse near zero
/// (at T = 1 it is the single score q.k * scale, which may be ~0) is therefore checked against this
/// magnitude, not against itself.
pub fn score_magnitude_rows(qkv: &[f32], d: Dims, mask: Mask, rows: &[usize]) -> Vec<f64> {
    let (hs, scale) = head_size_and_scale(qkv, d, mask);
    let Dims { t: tlen, c, nh, .. } = d;
    let mut mag = vec![0.0f64; rows.len() * nh];
    mag.par_chunks_mut(nh).zip(rows.par_iter()).for_each(|(mrow, &bt)| {
        let (b, t) = (bt / tlen, bt % tlen);
        let at = |tok: usize, part: usize, h: usize| {
            let base = (b * tlen + tok) * 3 * c + part * c + h * hs;
            &qkv[base..base + hs]
        };
        for (h, m) in mrow.iter_mut().enumerate() {
            let q = at(t, 0, h);
            *m = mask
                .keys(t, tlen)
                .map(|t2| scale * q.iter().zip(at(t2, 1, h)).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum::<f64>())
                .fold(0.0, f64::max);
        }
    });
    mag
}

/// [`score_magnitude_rows`] of every row under the causal mask (and window), as `[B, NH, T]`.
pub fn score_magnitude(qkv: &[f32], d: Dims, window: Option<usize>) -> Vec<f64> {
    let all: Vec<usize> = (0..d.b * d.t).collect();
    heads_major(&score_magnitude_rows(qkv, d, Mask::Causal(window), &all), d)
}
