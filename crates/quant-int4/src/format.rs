//! The KV-cache formats and the CPU quantizer/dequantizer (the reference the GPU quantizer must
//! match byte for byte). The layout is documented in `kernels/qi4_format.cuh`:
//!
//! * a row of `D` values in `G` groups (`G = 1` row-wise, `G = 4` group-wise) is `4G` bytes of
//!   fp16 (scale, shift) pairs followed by `D/2` bytes of 4-bit codes;
//! * value `2k` of each 8-value little-endian word sits at bits `4k..4k+3`, value `2k+1` at bits
//!   `16+4k..16+4k+3` (so the kernel turns a pair into bf16 with one shift and one mask);
//! * `shift` = fp16 rounded down of the group minimum, `scale` = fp16 rounded up of
//!   `(max - shift) / 15`, `q = clamp(rint((x - shift) / scale), 0, 15)`, value = `q * scale + shift`.

use common::{require, Error, Result};
use half::{bf16, f16};
use rayon::prelude::*;

/// How the K and V caches are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvFormat {
    Bf16,
    /// INT4 with `groups` (scale, shift) pairs per row: 1 (row-wise) or 4 (group-wise).
    Int4 {
        groups: usize,
    },
}

impl KvFormat {
    /// The `fmt` shape key: 0 = bf16, 1 = INT4 row-wise, 4 = INT4 group-wise.
    pub fn from_key(fmt: i64) -> Result<KvFormat> {
        match fmt {
            0 => Ok(KvFormat::Bf16),
            1 => Ok(KvFormat::Int4 { groups: 1 }),
            4 => Ok(KvFormat::Int4 { groups: 4 }),
            _ => Err(Error::constraint(
                "fmt in {0 (bf16), 1 (int4 row-wise), 4 (int4 group-wise)}",
                format!("fmt = {fmt}"),
            )),
        }
    }

    pub fn key(self) -> i64 {
        match self {
            KvFormat::Bf16 => 0,
            KvFormat::Int4 { groups } => groups as i64,
        }
    }

    /// Bytes of one cached row of `d` values.
    pub fn row_bytes(self, d: usize) -> usize {
        match self {
            KvFormat::Bf16 => 2 * d,
            KvFormat::Int4 { groups } => int4_row_bytes(d, groups),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            KvFormat::Bf16 => "bf16",
            KvFormat::Int4 { groups: 1 } => "int4 row-wise",
            KvFormat::Int4 { .. } => "int4 group-wise",
        }
    }
}

/// Bytes of one INT4 row: `groups` fp16 pairs, then `d/2` bytes of codes.
pub fn int4_row_bytes(d: usize, groups: usize) -> usize {
    4 * groups + d / 2
}

/// The head dimensions and group counts the kernels implement.
pub fn check_int4(d: usize, groups: usize) -> Result<()> {
    require(d == 64 || d == 128, "D in {64, 128}", || format!("D = {d}"))?;
    require(groups == 1 || groups == 4, "groups in {1 (row-wise), 4 (group-wise)}", || format!("groups = {groups}"))
}

/// The bit offset of value `i` of a row inside its 32-bit word.
pub fn nibble_shift(i: usize) -> u32 {
    let k = (i % 8) as u32;
    if k % 2 == 1 {
        16 + 4 * (k / 2)
    } else {
        4 * (k / 2)
    }
}

/// The fp16 next to `h` toward +∞ (`up`) or −∞; NaN and the infinity it moves toward stay, and
/// a zero steps to the smallest subnormal of that sign.
fn f16_next(h: f16, up: bool) -> f16 {
    let b = h.to_bits();
    let (infinity, zero, smallest) = if up { (0x7C00, 0x8000, 0x0001) } else { (0xFC00, 0x0000, 0x8001) };
    if h.is_nan() || b == infinity {
        return h;
    }
    if b == zero {
        return f16::from_bits(smallest);
    }
    // Sign and magnitude: away from zero is +1 in the bits, whichever the sign.
    let away = (b & 0x8000 == 0) == up;
    f16::from_bits(if away { b + 1 } else { b - 1 })
}

/// `x` in fp16 rounded toward +∞ (`up`) or −∞.
fn f16_directed(x: f32, up: bool) -> f16 {
    let h = f16::from_f32(x);
    let rounded_past = if up { h.to_f32() < x } else { h.to_f32() > x };
    if rounded_past {
        f16_next(h, up)
    } else {
        h
    }
}

/// fp16 rounded toward −∞ (CUDA's `__float2half_rd`).
pub fn f16_round_down(x: f32) -> f16 {
    f16_directed(x, false)
}

/// fp16 rounded toward +∞ (CUDA's `__float2half_ru`).
pub fn f16_round_up(x: f32) -> f16 {
    f16_directed(x, true)
}

/// The 4-bit code at bit `shift` of the little-endian 32-bit word at byte `at`.
fn code_at(bytes: &[u8], at: usize, shift: u32) -> u32 {
    (u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) >> shift) & 0xF
}

/// ORs code `q` into the little-endian 32-bit word at byte `at`, bit `shift` (that nibble is zero).
fn put_code(bytes: &mut [u8], at: usize, shift: u32, q: u32) {
    let word = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) | (q << shift);
    bytes[at..at + 4].copy_from_slice(&word.to_le_bytes());
}

/// Byte offset, in a row of `groups` pairs, of the word holding value `i`'s code.
fn row_code_word(i: usize, groups: usize) -> usize {
    4 * groups + 4 * (i / 8)
}

/// (scale, shift) of one group, as stored.
pub fn group_params(x: &[f32]) -> (f16, f16) {
    // `+ 0.0` maps -0 to +0, as the kernel does: the sign of a zero extreme never reaches the bytes.
    let mn = x.iter().copied().fold(f32::INFINITY, f32::min) + 0.0;
    let mx = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) + 0.0;
    let shift = f16_round_down(mn);
    let scale = f16_round_up((mx - shift.to_f32()) / 15.0);
    (scale, shift)
}

/// The 4-bit code of `x` under (scale, shift).
pub fn code(x: f32, scale: f16, shift: f16) -> u32 {
    code_f32(x, scale.to_f32(), shift.to_f32())
}

/// [`code`] with the scale and shift already widened to f32 (once a group, not once a value).
fn code_f32(x: f32, s: f32, z: f32) -> u32 {
    let q = if s > 0.0 { ((x - z) / s).round_ties_even() } else { 0.0 };
    q.clamp(0.0, 15.0) as u32
}

/// Quantizes one row of `x.len()` values into `out` (`int4_row_bytes(x.len(), groups)` bytes).
pub fn quantize_row(x: &[f32], groups: usize, out: &mut [u8]) {
    let d = x.len();
    let gs = d / groups;
    debug_assert_eq!(out.len(), int4_row_bytes(d, groups));
    out.fill(0);
    for g in 0..groups {
        let xs = &x[g * gs..(g + 1) * gs];
        let (scale, shift) = group_params(xs);
        out[4 * g..4 * g + 2].copy_from_slice(&scale.to_bits().to_le_bytes());
        out[4 * g + 2..4 * g + 4].copy_from_slice(&shift.to_bits().to_le_bytes());
        let (s, z) = (scale.to_f32(), shift.to_f32());
        for (j, &v) in xs.iter().enumerate() {
            let i = g * gs + j;
            put_code(out, row_code_word(i, groups), nibble_shift(i), code_f32(v, s, z));
        }
    }
}

/// The (scale, shift) pair of group `g` of a quantized row, as f32.
fn group_pair(row: &[u8], g: usize) -> (f32, f32) {
    let s = f16::from_bits(u16::from_le_bytes([row[4 * g], row[4 * g + 1]]));
    let z = f16::from_bits(u16::from_le_bytes([row[4 * g + 2], row[4 * g + 3]]));
    (s.to_f32(), z.to_f32())
}

/// The (scale, shift) pairs of a quantized row, as f32.
pub fn row_params(row: &[u8], groups: usize) -> Vec<(f32, f32)> {
    (0..groups).map(|g| group_pair(row, g)).collect()
}

/// Dequantizes one row of `d` values (exactly, in f64) into `out`. A group at a time, its pair read
/// once (no vector of pairs a row: a check dequantizes 2^21 rows).
pub fn dequantize_row(row: &[u8], d: usize, groups: usize, out: &mut [f64]) {
    let gs = d / groups;
    let n = out.len().min(d);
    for (g, values) in out[..n].chunks_mut(gs).enumerate() {
        let (s, z) = group_pair(row, g);
        let (s, z) = (s as f64, z as f64);
        for (j, o) in values.iter_mut().enumerate() {
            let i = g * gs + j;
            *o = code_at(row, row_code_word(i, groups), nibble_shift(i)) as f64 * s + z;
        }
    }
}

/// Quantizes `rows` rows of `d` bf16 values. A row whose first value is NaN (the padding past a
/// sequence's length in the test caches) becomes all 0xFF bytes: NaN scales, so any read of it
/// poisons the result.
pub fn quantize(x: &[bf16], d: usize, groups: usize) -> Vec<u8> {
    let rb = int4_row_bytes(d, groups);
    let rows = x.len() / d;
    let mut out = vec![0u8; rows * rb];
    out.par_chunks_mut(rb).zip(x.par_chunks(d)).for_each_init(
        || vec![0f32; d],
        |buf, (o, row)| {
            if row[0].is_nan() {
                o.fill(0xFF);
                return;
            }
            for (b, v) in buf.iter_mut().zip(row) {
                *b = v.to_f32();
            }
            quantize_row(buf, groups, o);
        },
    );
    out
}

/// Dequantizes every row of an INT4 buffer to f64.
pub fn dequantize(q: &[u8], d: usize, groups: usize) -> Vec<f64> {
    let rb = int4_row_bytes(d, groups);
    let rows = q.len() / rb;
    let mut out = vec![0f64; rows * d];
    out.par_chunks_mut(d).zip(q.par_chunks(rb)).for_each(|(o, row)| dequantize_row(row, d, groups, o));
    out
}

/// Where a cache's rows live in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `[B, Tmax, HKV]` rows of `row_bytes` each (the format above): stages 1-21.
    Rows,
    /// The fragment layout of `kernels/decode/22_fragments.cu`: per (sequence, KV head), chunks of
    /// [`CHUNK`] tokens whose bytes are exactly the mma fragments a warp's lanes load. K and V differ
    /// ([`Role`]).
    Fragments,
}

/// Which operand a fragment-layout cache feeds: K is the A operand of `K·Qᵀ` (rows = tokens), V the
/// A operand of `Vᵀ·Pᵀ` (rows = dims, two consecutive tokens in one register).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    K,
    V,
}

/// Tokens in one chunk of the fragment layout.
pub const CHUNK: usize = 16;

/// Bytes of one chunk: the 16 rows' parameters, then their codes (the same bytes as 16 rows).
pub fn chunk_bytes(d: usize, groups: usize) -> usize {
    CHUNK * int4_row_bytes(d, groups)
}

/// Bytes of a `[B, Tmax, HKV]` cache in the fragment layout (`Tmax` rounded up to whole chunks).
pub fn fragment_cache_bytes(b: usize, tmax: usize, hkv: usize, d: usize, groups: usize) -> usize {
    b * hkv * tmax.div_ceil(CHUNK) * chunk_bytes(d, groups)
}

/// Byte offset, inside its chunk, of the `groups` parameter pairs of token `t` (0..16): slot
/// `2 (t % 8) + t / 8`, so a lane's tokens g and g + 8 are one 8G-byte load.
pub fn fragment_param_offset(t: usize, groups: usize) -> usize {
    4 * groups * (2 * (t % 8) + t / 8)
}

/// (byte offset of the 32-bit word inside its chunk, bit shift) of the code of value `dim` of token
/// `t` (0..16) in a fragment-layout chunk (the map `22_fragments.cu` documents).
pub fn fragment_code_position(role: Role, d: usize, groups: usize, t: usize, dim: usize) -> (usize, u32) {
    let codes = CHUNK * 4 * groups;
    let (s, r) = (dim / 16, dim % 16);
    match role {
        Role::K => {
            // Lane 4 (t % 8) + c holds dims 16s + 2c + {0, 1, 8, 9} of token t; word s / 2, pair
            // 2 (s % 2) + (r >= 8), element r % 2.
            let (g, half) = (t % 8, t / 8);
            let c = (r % 8) / 2;
            let lane = 4 * g + c;
            let pair = 2 * (s % 2) + r / 8;
            (codes + half * 4 * d + lane * (d / 8) + 4 * (s / 2), (4 * pair + 16 * (r % 2)) as u32)
        }
        Role::V => {
            // Lane 4 (dim % 8) + (t % 8) / 2 holds m-tile s's word: dims 16s + g (+8) x tokens 2c, 2c + 1
            // (+8); pair (r >= 8) + 2 (t >= 8), element t % 2.
            let g = r % 8;
            let c = (t % 8) / 2;
            let lane = 4 * g + c;
            let pair = r / 8 + 2 * (t / 8);
            (codes + (s / 4) * 512 + lane * 16 + 4 * (s % 4), (4 * pair + 16 * (t % 2)) as u32)
        }
    }
}

/// A `[B, Tmax, HKV]` row-layout cache rearranged into the fragment layout for `role` (byte for byte
/// the same parameters and codes; the tokens past `Tmax` in the last chunk are zero).
pub fn to_fragments(rows: &[u8], b: usize, tmax: usize, hkv: usize, d: usize, groups: usize, role: Role) -> Vec<u8> {
    let rb = int4_row_bytes(d, groups);
    let cb = chunk_bytes(d, groups);
    let chunks = tmax.div_ceil(CHUNK);
    let mut out = vec![0u8; fragment_cache_bytes(b, tmax, hkv, d, groups)];
    out.par_chunks_mut(cb).enumerate().for_each(|(i, chunk)| {
        let (seq_head, ch) = (i / chunks, i % chunks);
        let (bi, kvh) = (seq_head / hkv, seq_head % hkv);
        for t in 0..CHUNK.min(tmax - ch * CHUNK) {
            let tok = ch * CHUNK + t;
            let row = &rows[((bi * tmax + tok) * hkv + kvh) * rb..][..rb];
            let po = fragment_param_offset(t, groups);
            chunk[po..po + 4 * groups].copy_from_slice(&row[..4 * groups]);
            for dim in 0..d {
                let (w, shift) = fragment_code_position(role, d, groups, t, dim);
                put_code(chunk, w, shift, code_at(row, row_code_word(dim, groups), nibble_shift(dim)));
            }
        }
    });
    out
}

/// A fragment-layout cache back in the `[B, Tmax, HKV]` row layout (the inverse of
/// [`to_fragments`]).
pub fn from_fragments(frag: &[u8], b: usize, tmax: usize, hkv: usize, d: usize, groups: usize, role: Role) -> Vec<u8> {
    let rb = int4_row_bytes(d, groups);
    let cb = chunk_bytes(d, groups);
    let chunks = tmax.div_ceil(CHUNK);
    let mut rows = vec![0u8; b * tmax * hkv * rb];
    rows.par_chunks_mut(rb).enumerate().for_each(|(i, row)| {
        let (bi, t, kvh) = (i / (tmax * hkv), (i / hkv) % tmax, i % hkv);
        let chunk = &frag[((bi * hkv + kvh) * chunks + t / CHUNK) * cb..][..cb];
        let tc = t % CHUNK;
        let po = fragment_param_offset(tc, groups);
        row[..4 * groups].copy_from_slice(&chunk[po..po + 4 * groups]);
        for dim in 0..d {
            let (w, shift) = fragment_code_position(role, d, groups, tc, dim);
            put_code(row, row_code_word(dim, groups), nibble_shift(dim), code_at(chunk, w, shift));
        }
    });
    rows
}
