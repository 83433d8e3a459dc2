//! Drawing the next token from a row of logits on the host: greedy (argmax), or temperature, top-k
//! and top-p under a seeded stream of draws. The device's argmax and sampling stages keep the same
//! sets (their references are here), and generation uses the [`Sampler`].

use common::{require, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
