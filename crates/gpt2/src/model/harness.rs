//! The decode step as `gpt2/decode-step` drives it: a stage set, a cache filled from the host, the
//! greedy step replayed without advancing, its outputs poisoned and read back.

use std::sync::Arc;

use common::cudarc::driver::CudaStream;
use common::{require, DriverContext, Error, Gpu, Result};

use super::decode_engine::{enqueue_step, StepEnd};
use super::{Model, StepLaunch};
use crate::cache::{KvCache, LayerCache};
use crate::config::Config;
use crate::megakernel::MegaStep;
use rayon::prelude::*;

/// The decode step as `gpt2/decode-step` drives it: a stage set, a cache filled from the host, the
/// greedy step replayed without advancing, its outputs read back.
impl Model {
    /// Runs the decode step with `decode-step` stage `v` (re-prepared at the next step) and the
    /// launch settings `launch`.
    pub fn set_step_stage(&mut self, v: common::Variant, launch: StepLaunch) {
        self.plan.step = v;
        self.step_launch = launch;
        self.decode = None;
    }

    /// A cache of `lens.len()` sequences holding `host`'s keys and values and claiming `lens`.
    pub(crate) fn cache_from_host(&self, gpu: &Gpu, host: &HostCache, lens: &[usize]) -> Result<KvCache> {
        let mut cache = self.new_cache(gpu, lens.len())?;
        for (l, layer) in cache.layers.iter_mut().enumerate() {
            let LayerCache::Contiguous { k, v } = layer else {
                return Err(Error::constraint("a contiguous cache to fill from the host", "a paged one"));
            };
            gpu.stream().memcpy_htod(&host.k[l], k).ctx("upload the keys")?;
            gpu.stream().memcpy_htod(&host.v[l], v).ctx("upload the values")?;
        }
        cache.lens = lens.to_vec();
        Ok(cache)
    }

    /// Writes a greedy step's inputs for `cache` (as a step does, without running it); returns the
    /// megakernel's resources, if the step runs one.
    pub fn prepare_step(&mut self, gpu: &Gpu, cache: &KvCache, tokens: &[i32]) -> Result<Vec<common::ResourceUse>> {
        self.begin_step(gpu, cache, tokens)?;
        let (_, op) = self.decode.as_ref().expect("prepared by begin_step");
        Ok(op.mega.iter().map(MegaStep::resources).collect())
    }

    /// Enqueues the greedy step prepared by [`Model::prepare_step`] on `s` as its CUDA graph
    /// (captured at the first call for this cache); the lengths do not advance, so every replay
    /// writes the same cells.
    pub fn replay_step(&mut self, s: &Arc<CudaStream>, cache: &mut KvCache) -> Result<()> {
        let (_, op) = self.decode.as_mut().ok_or(Error::NotPrepared)?;
        enqueue_step(true, s, &self.weights, op, cache, StepEnd::Greedy)
    }

    /// The logits `[B, V]` the last decode step left on the device (a greedy or sampled step keeps
    /// them there).
    pub fn last_logits(&self, gpu: &Gpu, b: usize) -> Result<Vec<f32>> {
        let (n, op) = self.decode.as_ref().ok_or(Error::NotPrepared)?;
        require(b == *n, "the batch of the last step", || format!("{b}, the step had {n}"))?;
        gpu.download_rows(&op.acts.logits, b, self.cfg.vocab, self.cfg.padded_vocab())
    }

    /// Fails with the megakernel's typed error when its last launch reported one.
    pub fn check_step(&mut self, gpu: &Gpu) -> Result<()> {
        match self.decode.as_mut().and_then(|(_, op)| op.mega.as_mut()) {
            Some(m) => m.check(gpu),
            None => Ok(()),
        }
    }

    /// NaN in the step's logits, -1 in its ids and NaN in the cells it appends to (at `lens`).
    pub(crate) fn poison_step(&mut self, gpu: &Gpu, cache: &mut KvCache, lens: &[usize]) -> Result<()> {
        let (_, op) = self.decode.as_mut().ok_or(Error::NotPrepared)?;
        gpu.poison(&mut op.acts.logits)?;
        gpu.stream().memcpy_htod(&vec![-1i32; lens.len()], &mut op.next).ctx("poison the ids")?;
        let (c, tmax) = (self.cfg.c, self.cfg.max_t);
        let nan = vec![0x7FC0u16; c];
        for layer in &mut cache.layers {
            let LayerCache::Contiguous { k, v } = layer else { continue };
            for (b, &p) in lens.iter().enumerate() {
                let cell = (b * tmax + p) * c;
                gpu.stream().memcpy_htod(&nan, &mut k.slice_mut(cell..cell + c)).ctx("poison a cell")?;
                gpu.stream().memcpy_htod(&nan, &mut v.slice_mut(cell..cell + c)).ctx("poison a cell")?;
            }
        }
        Ok(())
    }

    /// The last step's logits `[B, V]`, ids `[B]`, and the k and v it appended at `lens` in every
    /// layer, `[L, B, C]` each.
    pub(crate) fn step_outputs(&self, gpu: &Gpu, cache: &KvCache, lens: &[usize]) -> Result<StepOutputs> {
        let (_, op) = self.decode.as_ref().ok_or(Error::NotPrepared)?;
        let b = lens.len();
        let logits = gpu.download_rows(&op.acts.logits, b, self.cfg.vocab, self.cfg.padded_vocab())?;
        let ids = gpu.download(&op.next)?;
        let (c, tmax) = (self.cfg.c, self.cfg.max_t);
        let (mut k_out, mut v_out) = (Vec::new(), Vec::new());
        for layer in &cache.layers {
            let LayerCache::Contiguous { k, v } = layer else {
                return Err(Error::constraint("a contiguous cache to read back", "a paged one"));
            };
            for (b, &p) in lens.iter().enumerate() {
                let cell = (b * tmax + p) * c;
                for (src, out) in [(k, &mut k_out), (v, &mut v_out)] {
                    let bits: Vec<u16> = gpu.stream().clone_dtoh(&src.slice(cell..cell + c)).ctx("read a cell")?;
                    out.extend(bits.into_iter().map(|x| half::bf16::from_bits(x).to_f32()));
                }
            }
        }
        Ok(StepOutputs { logits, ids, k: k_out, v: v_out })
    }
}

/// What [`Model::step_outputs`] reads back: logits `[B, V]`, ids `[B]`, and the appended k and v of
/// every layer, `[L, B, C]` each.
pub struct StepOutputs {
    pub logits: Vec<f32>,
    pub ids: Vec<i32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// A random bf16 cache in [-1, 1): each layer's k and v, `[B, context, C]` bit patterns, rows past a
/// sequence's length zero.
pub(crate) struct HostCache {
    pub k: Vec<Vec<u16>>,
    pub v: Vec<Vec<u16>>,
}

impl HostCache {
    pub(crate) fn random(cfg: &Config, lens: &[usize], seed: u64) -> HostCache {
        let per = cfg.max_t * cfg.c;
        let fill = |salt: u64| -> Vec<u16> {
            let mut out = vec![0u16; lens.len() * per];
            out.par_chunks_mut(cfg.c).enumerate().for_each(|(row, r)| {
                let (b, t) = (row / cfg.max_t, row % cfg.max_t);
                if t < lens[b] {
                    for (i, x) in r.iter_mut().enumerate() {
                        let u = splitmix(seed ^ salt ^ ((row * cfg.c + i) as u64).wrapping_mul(0x9E37_79B9));
                        let f = (u >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                        *x = half::bf16::from_f32(f).to_bits();
                    }
                }
            });
            out
        };
        let layer = |l: usize, kv: u64| fill((l as u64 + 1) * 0x1000_0001 + kv);
        HostCache {
            k: (0..cfg.layers).map(|l| layer(l, 1)).collect(),
            v: (0..cfg.layers).map(|l| layer(l, 2)).collect(),
        }
    }
}

/// SplitMix64's output function: a well-mixed 64-bit value of `z`.
pub(crate) fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
