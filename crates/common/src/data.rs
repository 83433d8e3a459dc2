//! Inputs: seeded random data (never zeros), fresh seeds per check, and copies of the inputs and
//! outputs rotated through during timing so the working set exceeds L2.

use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use rayon::prelude::*;

use crate::error::Result;
use crate::gpu::Gpu;

/// A new seed for every call: `$LADDER_SEED` plus a counter when set (reproducible runs), else the
/// clock plus a counter. Print it with any failure so the inputs can be drawn again.
pub fn fresh_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let base = std::env::var("LADDER_SEED").ok().and_then(|s| s.parse::<u64>().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7)
    });
    base.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` values uniform in `[lo, hi)`: those [`rng`]`(seed)` draws one after another.
pub fn uniform(n: usize, lo: f32, hi: f32, seed: u64) -> Vec<f32> {
    let mut out = vec![0f32; n];
    fill_uniform(&mut out, lo, hi, seed, |_, x| x);
    out
}

/// Draws [`fill_uniform`] takes on one core at a time.
const DRAW_CHUNK: usize = 1 << 16;

/// `out[i] = f(i, x[i])` for `x` = [`uniform`]`(out.len(), lo, hi, seed)`, drawn on every core: the
/// inputs of the large tables are hundreds of millions of values (a second or more drawn in turn).
///
/// The values are bit for bit those of one generator: [`rng`] is rand's `StdRng`, ChaCha12, and a
/// draw in `[lo, hi)` takes exactly one 32-bit word of its stream, so draw `i` is word `i`; each
/// stretch of [`DRAW_CHUNK`] draws seeds its own ChaCha12 alike and enters the stream at its first
/// word. The test `parallel_draws_are_one_stream` holds this against `StdRng` itself.
pub fn fill_uniform<T: Send>(out: &mut [T], lo: f32, hi: f32, seed: u64, f: impl Fn(usize, f32) -> T + Sync) {
    let draw = |c: usize, chunk: &mut [T]| {
        let first = c * DRAW_CHUNK;
        let mut r = ChaCha12Rng::seed_from_u64(seed);
        r.set_word_pos(first as u128);
        for (i, o) in chunk.iter_mut().enumerate() {
            *o = f(first + i, r.random_range(lo..hi));
        }
        debug_assert_eq!(r.get_word_pos(), (first + chunk.len()) as u128, "one word a draw");
    };
    // One stretch stays on the calling thread (the many small draws: biases, gains, test cases).
    if out.len() <= DRAW_CHUNK {
        draw(0, out);
    } else {
        out.par_chunks_mut(DRAW_CHUNK).enumerate().for_each(|(c, chunk)| draw(c, chunk));
    }
}

/// `n` zero bf16 values, allocated zeroed (as `vec![0u16; n]` is) for a filler on every core to
/// write: `vec![bf16::ZERO; n]` writes each one first, on one core (a gigabyte cache takes a
/// quarter of a second).
pub fn zeroed_bf16(n: usize) -> Vec<half::bf16> {
    half::vec::HalfBitsVecExt::reinterpret_into(vec![0u16; n])
}

/// How many copies of a problem whose inputs and outputs take `bytes_per_copy` bytes make the
/// rotated working set at least three times the L2 cache (at most 64 copies, and at most a quarter
/// of the device memory in all).
pub fn rotation_copies(gpu: &Gpu, bytes_per_copy: u64) -> usize {
    let info = gpu.info();
    let target = 3 * info.l2_bytes;
    let want = target.div_ceil(bytes_per_copy.max(1)).clamp(1, 64);
    let fit = (info.total_memory_bytes / 4 / bytes_per_copy.max(1)).max(1);
    want.min(fit) as usize
}

/// The same buffer contents at `copies` addresses. Inputs are uploaded once and copied on the device;
/// outputs are allocated poisoned.
pub struct Rotated<T> {
    copies: Vec<CudaSlice<T>>,
}

impl<T: DeviceRepr + ValidAsZeroBits> Rotated<T> {
    pub fn upload(gpu: &Gpu, host: &[T], copies: usize) -> Result<Rotated<T>> {
        let first = gpu.upload(host)?;
        let mut all = Vec::with_capacity(copies);
        for _ in 1..copies {
            all.push(crate::error::DriverContext::ctx(gpu.stream().clone_dtod(&first), "copy input")?);
        }
        all.insert(0, first);
        Ok(Rotated { copies: all })
    }

    pub fn outputs(gpu: &Gpu, len: usize, copies: usize) -> Result<Rotated<T>> {
        Ok(Rotated { copies: (0..copies).map(|_| gpu.alloc_poisoned(len)).collect::<Result<_>>()? })
    }

    pub fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.copies.iter_mut().try_for_each(|c| gpu.poison(c))
    }

    pub fn get(&self, copy: usize) -> &CudaSlice<T> {
        &self.copies[copy % self.copies.len()]
    }

    pub fn get_mut(&mut self, copy: usize) -> &mut CudaSlice<T> {
        let n = self.copies.len();
        &mut self.copies[copy % n]
    }

    pub fn len(&self) -> usize {
        self.copies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.copies.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_draws_are_one_stream() {
        // Across stretch boundaries, at the ranges the problems draw from.
        for (n, lo, hi, seed) in [
            (3 * DRAW_CHUNK + 17, -1.0, 1.0, 5),
            (DRAW_CHUNK + 1, -2.0, 2.0, 1 << 40),
            (70_000, 0.8, 1.2, 7),
            (5, 0.0, 1.0, 9),
        ] {
            let mut r = rng(seed);
            let serial: Vec<f32> = (0..n).map(|_| r.random_range(lo..hi)).collect();
            let parallel = uniform(n, lo, hi, seed);
            assert!(serial.iter().zip(&parallel).all(|(a, b)| a.to_bits() == b.to_bits()), "n = {n}, [{lo}, {hi})");
            assert_eq!(serial.len(), parallel.len());
        }
        let mut mapped = vec![(0usize, 0f32); 2 * DRAW_CHUNK + 3];
        fill_uniform(&mut mapped, -1.0, 1.0, 3, |i, x| (i, x));
        let plain = uniform(mapped.len(), -1.0, 1.0, 3);
        assert!(mapped.iter().enumerate().all(|(i, &(j, x))| i == j && x == plain[i]));
    }
}
