//! f64 CPU references of causal self-attention over the llm.c `qkv[B, T, 3C]` layout.

use rayon::prelude::*;

/// The shape of one attention call: `C = NH * HS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub nh: usize,
}

impl Dims {
    /// Head size `C / NH` (callers check `C % NH == 0`).
    pub fn hs(&self) -> usize {
        self.c / self.nh.max(1)
    }
}

/// Causal attention of every (batch, token, head), in f64: `out[B, T, C]` and the logsumexp of each
/// row's scaled scores, `lse[B, NH, T]` (natural log). With `window = Some(W)`, token t attends only
/// to keys `max(0, t-W+1)..=t` (its W most recent positions, itself included); `None` is full causal
/// attention. The scale is `1/sqrt(HS)`.
pub fn causal_attention(qkv: &[f32], d: Dims, window: Option<usize>) -> (Vec<f64>, Vec<f64>) {
    let Dims { b: bsz, t: tlen, c, nh } = d;
    let hs = d.hs();
    assert_eq!(qkv.len(), bsz * tlen * 3 * c, "qkv length");
    assert!(nh * hs == c && window != Some(0), "C = NH * HS and W >= 1");
    let scale = 1.0 / (hs as f64).sqrt();
    let mut out = vec![0.0f64; bsz * tlen * c];
    // One chunk per (batch, token) row of `out`; each returns its NH logsumexps.
    let lse_rows: Vec<Vec<f64>> = out
        .par_chunks_mut(c)
        .enumerate()
        .map(|(bt, orow)| {
            let (b, t) = (bt / tlen, bt % tlen);
            let row = |tok: usize| &qkv[(b * tlen + tok) * 3 * c..(b * tlen + tok + 1) * 3 * c];
            let start = window.map_or(0, |w| (t + 1).saturating_sub(w));
            let mut scores = vec![0.0f64; t + 1 - start];
            let mut lses = Vec::with_capacity(nh);
            for h in 0..nh {
                let q = &row(t)[h * hs..(h + 1) * hs];
                for (s, t2) in scores.iter_mut().zip(start..=t) {
                    let k = &row(t2)[c + h * hs..c + (h + 1) * hs];
                    *s = scale * q.iter().zip(k).map(|(&x, &y)| x as f64 * y as f64).sum::<f64>();
                }
                let max = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
                let o = &mut orow[h * hs..(h + 1) * hs];
                let mut sum = 0.0;
                for (&s, t2) in scores.iter().zip(start..=t) {
                    let e = (s - max).exp();
                    sum += e;
                    let v = &row(t2)[2 * c + h * hs..2 * c + (h + 1) * hs];
                    for (od, &vd) in o.iter_mut().zip(v) {
                        *od += e * vd as f64;
                    }
                }
                o.iter_mut().for_each(|x| *x /= sum);
                lses.push(max + sum.ln());
            }
            lses
        })
        .collect();
    let mut lse = vec![0.0f64; bsz * nh * tlen];
    for (bt, row) in lse_rows.iter().enumerate() {
        let (b, t) = (bt / tlen, bt % tlen);
        for (h, &v) in row.iter().enumerate() {
            lse[(b * nh + h) * tlen + t] = v;
        }
    }
    (out, lse)
}

/// The magnitude of each row's scaled scores, `[B, NH, T]`: `max over keys j of scale * sum_i |q_i k_ji|`
/// (over the same keys as [`causal_attention`]). It sets the absolute error a logsumexp can carry:
/// lse is softmax-weighted in its scores (d lse / d s_j = p_j, summing to 1), so rounding q and k
/// (relative u) moves it by at most `u * scale * sum_i |q_i k_ji|` for the worst key, whatever
/// the lse's own value. An lse near zero (at T = 1 it is the single score q.k * scale, which may be
/// ~0) is therefore checked against this magnitude, not against itself.
pub fn score_magnitude(qkv: &[f32], d: Dims, window: Option<usize>) -> Vec<f64> {
    let Dims { b: bsz, t: tlen, c, nh } = d;
    let hs = d.hs();
    assert_eq!(qkv.len(), bsz * tlen * 3 * c, "qkv length");
    assert!(nh * hs == c && window != Some(0), "C = NH * HS and W >= 1");
    let scale = 1.0 / (hs as f64).sqrt();
    let mut mag = vec![0.0f64; bsz * nh * tlen];
    // One chunk per (batch, head) row of `mag`.
    mag.par_chunks_mut(tlen).enumerate().for_each(|(bh, row)| {
        let (b, h) = (bh / nh, bh % nh);
        let at = |tok: usize, part: usize| {
            let base = (b * tlen + tok) * 3 * c + part * c + h * hs;
            &qkv[base..base + hs]
        };
        for (t, m) in row.iter_mut().enumerate() {
            let q = at(t, 0);
            let start = window.map_or(0, |w| (t + 1).saturating_sub(w));
            *m = (start..=t)
                .map(|t2| scale * q.iter().zip(at(t2, 1)).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum::<f64>())
                .fold(0.0, f64::max);
        }
    });
    mag
}
