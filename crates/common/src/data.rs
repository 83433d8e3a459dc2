//! Inputs: seeded random data (never zeros), fresh seeds per check, and copies of the inputs and
//! outputs rotated through during timing so the working set exceeds L2.

use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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

/// `n` values uniform in `[lo, hi)`.
pub fn uniform(n: usize, lo: f32, hi: f32, seed: u64) -> Vec<f32> {
    let mut r = rng(seed);
    (0..n).map(|_| r.random_range(lo..hi)).collect()
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
