//! The FP8 format of issue 48's stages (`quantize-fp8`, `linear-fp8`, `gemv-fp8`; not built yet) and
//! its CPU reference, which a device quantizer must match byte for byte: e4m3 codes with fine-grained
//! fp32 scales, DeepGEMM's scheme. Activations carry one scale per row per 128 channels (1 × 128),
//! weights one per 128 × 128 block; a last group or block narrower than 128 (K or N not a multiple
//! of 128) has a scale of its own like any other.
//!
//! A group's scale is `amax / 448` over its finite magnitudes (448: e4m3's largest finite value, so
//! the group's largest element lands on it), and each element's code is `e4m3(x · (448 / amax))`:
//! two fp32 operations, a correctly rounded division and a multiplication, then the conversion
//! rounding to nearest even and saturating at ±448 (`cvt.rn.satfinite.e4m3x2.f32` on the device,
//! CUDA's `cuda_fp8.hpp` on the host through the `float8` crate). `amax` is at least
//! [`AMAX_FLOOR`], which keeps `448 / amax` finite, so a group of zeros has codes 0. A non-finite
//! element (NaN, ±Inf) gets the NaN code and stays out of its group's `amax`: a product with it is
//! NaN, as the bf16 paths carry NaN and Inf into non-finite outputs, and the finite elements of its
//! group keep their precision.
//!
//! Rounding: e4m3 keeps 3 mantissa bits, so a normal code is within 2^-4 of the scaled value,
//! relatively; below 2^-6 (the subnormals) the step is 2^-9, so within 2^-10 absolutely. Dequantized
//! (`code value · scale`), an element is within `max(|x| · 2^-4, scale · 2^-10)` of its input
//! ([`rounding_bound`]); the quantization error a stage's check reports apart from the kernel's.

use float8::F8E4M3;
use rayon::prelude::*;

/// e4m3's largest finite magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Channels a scale covers: a row's group of an activation, each side of a weight's block.
pub const GROUP: usize = 128;
/// The code of a non-finite element (e4m3 has no infinities; `S.1111.111` is NaN).
pub const NAN_CODE: u8 = 0x7F;
/// The smallest `amax` a scale is made from: `448 / amax` stays finite (an all-zero group included).
pub const AMAX_FLOOR: f32 = 1e-30;

/// The e4m3 code of `x`: round to nearest even, saturate to ±448; NaN and ±Inf to [`NAN_CODE`].
pub fn e4m3(x: f32) -> u8 {
    if x.is_finite() {
        F8E4M3::from_f32(x).to_bits()
    } else {
        NAN_CODE
    }
}

/// The value of e4m3 code `code` (NaN for `0x7F` and `0xFF`).
pub fn e4m3_value(code: u8) -> f32 {
    F8E4M3::from_bits(code).to_f32()
}

/// A group's `(scale, multiplier)` from the finite magnitudes `values`: `amax / 448` and `448 / amax`
/// with `amax` at least [`AMAX_FLOOR`].
pub fn group_scale(values: impl IntoIterator<Item = f32>) -> (f32, f32) {
    let amax = values.into_iter().filter(|x| x.is_finite()).fold(AMAX_FLOOR, |a, x| a.max(x.abs()));
    (amax / E4M3_MAX, E4M3_MAX / amax)
}

/// How far a dequantized element may be from its input `x` under a group scale `scale`.
pub fn rounding_bound(x: f32, scale: f32) -> f32 {
    (x.abs() / 16.0).max(scale / 1024.0)
}

/// Activations `[m, k]` quantized one row's 128 channels at a time.
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8Rows {
    pub m: usize,
    pub k: usize,
    /// `[m, k]` e4m3 codes.
    pub codes: Vec<u8>,
    /// `[m, ceil(k / 128)]`: row r's channels `128 g ..` are `code value · scales[r][g]`.
    pub scales: Vec<f32>,
}

/// Weights `[n, k]` quantized in 128 × 128 blocks.
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8Blocks {
    pub n: usize,
    pub k: usize,
    /// `[n, k]` e4m3 codes.
    pub codes: Vec<u8>,
    /// `[ceil(n / 128), ceil(k / 128)]`: element (r, c) is `code value · scales[r / 128][c / 128]`.
    pub scales: Vec<f32>,
}

/// Scale groups along `len` channels.
pub fn groups(len: usize) -> usize {
    len.div_ceil(GROUP)
}

/// Quantizes `x` (`[m, k]`, row-major) a row's 128 channels at a time.
pub fn quantize_rows(x: &[f32], m: usize, k: usize) -> Fp8Rows {
    assert_eq!(x.len(), m * k, "x is [m, k]");
    let g = groups(k);
    let mut codes = vec![0u8; m * k];
    let mut scales = vec![0f32; m * g];
    codes.par_chunks_mut(k.max(1)).zip(scales.par_chunks_mut(g.max(1))).zip(x.par_chunks(k.max(1))).for_each(
        |((codes, scales), row)| {
            for ((codes, scale), chunk) in codes.chunks_mut(GROUP).zip(scales.iter_mut()).zip(row.chunks(GROUP)) {
                let (s, mul) = group_scale(chunk.iter().copied());
                *scale = s;
                codes.iter_mut().zip(chunk).for_each(|(c, &v)| *c = e4m3(v * mul));
            }
        },
    );
    Fp8Rows { m, k, codes, scales }
}

/// Quantizes `w` (`[n, k]`, row-major) in 128 × 128 blocks.
pub fn quantize_blocks(w: &[f32], n: usize, k: usize) -> Fp8Blocks {
    assert_eq!(w.len(), n * k, "w is [n, k]");
    let (gn, gk) = (groups(n), groups(k));
    let scales: Vec<(f32, f32)> = (0..gn * gk)
        .into_par_iter()
        .map(|b| {
            let (br, bc) = (b / gk, b % gk);
            let rows = br * GROUP..((br + 1) * GROUP).min(n);
            let cols = bc * GROUP..((bc + 1) * GROUP).min(k);
            group_scale(rows.flat_map(|r| w[r * k + cols.start..r * k + cols.end].iter().copied()))
        })
        .collect();
    let mut codes = vec![0u8; n * k];
    codes.par_chunks_mut(k.max(1)).enumerate().for_each(|(r, row)| {
        for (c, code) in row.iter_mut().enumerate() {
            let (_, mul) = scales[(r / GROUP) * gk + c / GROUP];
            *code = e4m3(w[r * k + c] * mul);
        }
    });
    Fp8Blocks { n, k, codes, scales: scales.into_iter().map(|(s, _)| s).collect() }
}

impl Fp8Rows {
    /// Element (r, c) as the stages read it: code value times its group's scale.
    pub fn value(&self, r: usize, c: usize) -> f32 {
        e4m3_value(self.codes[r * self.k + c]) * self.scales[r * groups(self.k) + c / GROUP]
    }

    /// Every element dequantized, `[m, k]`: what an FP8 stage's f64 reference multiplies.
    pub fn dequantize(&self) -> Vec<f32> {
        (0..self.m * self.k).map(|i| self.value(i / self.k, i % self.k)).collect()
    }
}

impl Fp8Blocks {
    /// Element (r, c) as the stages read it: code value times its block's scale.
    pub fn value(&self, r: usize, c: usize) -> f32 {
        e4m3_value(self.codes[r * self.k + c]) * self.scales[(r / GROUP) * groups(self.k) + c / GROUP]
    }

    /// Every element dequantized, `[n, k]`.
    pub fn dequantize(&self) -> Vec<f32> {
        (0..self.n * self.k).map(|i| self.value(i / self.k, i % self.k)).collect()
    }
}
