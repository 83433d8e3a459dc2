//! Verification against f64 CPU references: relative L2 error, max abs error, and NaN/Inf, which
//! always fail.
//!
//! Large outputs are verified on a sample ([`sample_rows`], [`Verification::add_rows`]): an output
//! of more than [`SAMPLED_ROWS`] rows has every element checked finite (written, not the NaN
//! poison) and [`SAMPLED_ROWS`] of its rows, the first, the last and the rest drawn at random from
//! the problem's fresh seed, compared with the f64 reference.

use cudarc::driver::{CudaView, DeviceRepr};
use rand::seq::index;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::launch::{Arg, LaunchShape};

/// An element type a kernel may write, read back as f64 for comparison.
pub trait Element: Copy + DeviceRepr + Default + Send + Sync {
    /// The exponent bits: all set is NaN or ±Inf (the device-side check, [`device_non_finite`]).
    const EXPONENT_BITS: u64;
    fn to_f64(self) -> f64;
}

impl Element for f32 {
    const EXPONENT_BITS: u64 = 0x7f80_0000;
    fn to_f64(self) -> f64 {
        self as f64
    }
}
impl Element for f64 {
    const EXPONENT_BITS: u64 = 0x7ff0_0000_0000_0000;
    fn to_f64(self) -> f64 {
        self
    }
}
impl Element for half::f16 {
    const EXPONENT_BITS: u64 = 0x7c00;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
}
impl Element for half::bf16 {
    const EXPONENT_BITS: u64 = 0x7f80;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
}

/// How far one output is from its reference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorStats {
    /// What was compared (`out`, `mean`, `lse`, ...).
    pub output: String,
    /// ‖out − ref‖₂ / ‖ref‖₂ (‖out − ref‖₂ when the reference is all zeros); from
    /// [`compare_scaled`], ‖out − ref‖₂ / ‖magnitude‖₂.
    pub rel_l2: f64,
    pub max_abs: f64,
    /// Elements that are NaN or ±Inf (an unwritten, poisoned element reads as NaN).
    pub non_finite: usize,
    /// Index of the first non-finite element, for the failure message.
    pub first_non_finite: Option<usize>,
    pub count: usize,
}

impl ErrorStats {
    pub fn passes(&self, tolerance: f64) -> bool {
        self.non_finite == 0 && self.rel_l2.is_finite() && self.rel_l2 <= tolerance
    }

    /// Only whether every element of `out` is finite (and `out` has `len` elements): the check of
    /// the elements a sampled reference does not cover.
    pub fn finite<T: Element>(output: &str, out: &[T], len: usize) -> ErrorStats {
        let first_bad = out.iter().position(|x| !x.to_f64().is_finite());
        let count = out.iter().filter(|x| !x.to_f64().is_finite()).count();
        ErrorStats::counted(output, NonFinite { count, first: first_bad }, out.len(), len)
    }

    /// [`ErrorStats::finite`] from a count made elsewhere (on the device) over the `have` elements
    /// an output has of the `len` it should.
    fn counted(output: &str, found: NonFinite, have: usize, len: usize) -> ErrorStats {
        let short = (have != len).then_some(have.min(len));
        ErrorStats {
            output: output.to_string(),
            rel_l2: 0.0,
            max_abs: 0.0,
            non_finite: found.count + have.abs_diff(len),
            first_non_finite: found.first.or(short),
            count: len,
        }
    }
}

/// The NaN/±Inf elements of an output: how many, and the index of the first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NonFinite {
    pub count: usize,
    pub first: Option<usize>,
}

/// Rows of an output compared with the f64 reference when it has more than this many.
pub const SAMPLED_ROWS: usize = 64;

/// Counts the NaN/±Inf elements of `dev` on the device (`harness/02_non_finite.cu`): the
/// finiteness check of an output too large to copy to the host for it.
pub fn device_non_finite<T: Element>(gpu: &Gpu, dev: &CudaView<T>) -> Result<NonFinite> {
    use cudarc::driver::DevicePtr;
    const THREADS: u32 = 256;
    let n = dev.len() as u64;
    let blocks = n.div_ceil(THREADS as u64).clamp(1, 8 * gpu.info().sm_count as u64) as u32;
    let entry = match std::mem::size_of::<T>() {
        2 => "ladder_non_finite_b16",
        4 => "ladder_non_finite_b32",
        8 => "ladder_non_finite_b64",
        size => {
            return Err(Error::Constraint {
                constraint: "an element of 2, 4 or 8 bytes".into(),
                got: format!("{size} bytes"),
            })
        }
    };
    let stage = crate::harness::non_finite();
    let launch = gpu.prepare_launch(&crate::harness::SOURCES, &stage, entry, LaunchShape::linear(blocks, THREADS))?;
    let result = gpu.upload(&[0u64, u64::MAX])?;
    let (bits64, bits32) = (T::EXPONENT_BITS, T::EXPONENT_BITS as u32);
    let exponent = if entry.ends_with("b64") { Arg::value(&bits64) } else { Arg::U32(bits32) };
    let (ptr, _guard) = dev.device_ptr(gpu.stream());
    // SAFETY: the kernel reads the `n` elements of `dev` and writes the two u64 of `result`.
    unsafe { launch.enqueue(gpu.stream(), &[Arg::Ptr(ptr), Arg::value(&n), exponent, Arg::buf(&result)]) }?;
    let r = gpu.download(&result)?;
    Ok(NonFinite { count: r[0] as usize, first: (r[1] != u64::MAX).then_some(r[1] as usize) })
}

/// The rows of a `rows`-row output to compare with the reference, ascending: every row when there
/// are at most `budget`, else `budget` distinct rows: the first and the last (where edge tiles and
/// ragged tails go wrong) and `budget - 2` drawn at random from `seed`. Drawn from the problem's
/// fresh seed, the sample differs from run to run, so no row is exempt from checking for good,
/// and a failure's printed seed draws the same rows again.
pub fn sample_rows(rows: usize, budget: usize, seed: u64) -> Vec<usize> {
    if rows <= budget.max(2) {
        return (0..rows).collect();
    }
    let inner = index::sample(&mut crate::data::rng(seed), rows - 2, budget.max(2) - 2);
    let mut picked: Vec<usize> = std::iter::once(0).chain(inner.iter().map(|i| i + 1)).chain([rows - 1]).collect();
    picked.sort_unstable();
    picked
}

/// Outputs of more elements than this are compared on a sample of their rows ([`checked_rows`]):
/// at 2^24 f32 (64 MB) a full copy to the host and an f64 comparison start to cost a second a check.
pub const FULL_CHECK_ELEMENTS: usize = 1 << 24;

/// The rows of a `rows` × `row_len` output to compare with the f64 reference: every row up to
/// [`FULL_CHECK_ELEMENTS`] elements, else [`sample_rows`]`(rows, SAMPLED_ROWS, seed)`.
pub fn checked_rows(rows: usize, row_len: usize, seed: u64) -> Vec<usize> {
    if rows.saturating_mul(row_len) <= FULL_CHECK_ELEMENTS {
        (0..rows).collect()
    } else {
        sample_rows(rows, SAMPLED_ROWS, seed)
    }
}

/// The rows `rows` of `x` (rows of `row_len`), packed: the inputs a sampled reference reads.
pub fn gather_rows<T: Copy>(x: &[T], row_len: usize, rows: &[usize]) -> Vec<T> {
    rows.iter().flat_map(|&r| &x[r * row_len..(r + 1) * row_len]).copied().collect()
}

/// The relative L2 error of `out` against `reference` as one number: NaN when any element of `out`
/// is not finite (so no tolerance passes it). What a model-level comparison reports.
pub fn rel_l2<T: Element>(out: &[T], reference: &[f64]) -> f64 {
    let e = compare("out", out, reference);
    if e.non_finite > 0 {
        f64::NAN
    } else {
        e.rel_l2
    }
}

/// Elements a comparison sums on one core at a time. Each stretch is summed in order and then the
/// stretches' sums in order, so the result does not depend on the threads; an output of at most
/// this many elements is summed exactly as one loop over it would.
pub const COMPARE_CHUNK: usize = 1 << 16;

/// What a comparison sums over one stretch of elements.
#[derive(Clone, Copy, Debug, Default)]
struct Sums {
    diff2: f64,
    ref2: f64,
    max_abs: f64,
    non_finite: usize,
    /// Inside the stretch.
    first_non_finite: Option<usize>,
}

impl Sums {
    fn of<T: Element>(out: &[T], reference: &[f64]) -> Sums {
        let mut s = Sums::default();
        for (i, (o, r)) in out.iter().zip(reference).enumerate() {
            let o = o.to_f64();
            if !o.is_finite() {
                s.non_finite += 1;
                s.first_non_finite.get_or_insert(i);
                continue;
            }
            let d = o - r;
            s.diff2 += d * d;
            s.ref2 += r * r;
            s.max_abs = s.max_abs.max(d.abs());
        }
        s
    }

    /// The stretches of [`COMPARE_CHUNK`] elements of an `out` and a `reference` of these lengths,
    /// summed in order. A length mismatch counts every missing element as non-finite (and the
    /// first of them as the first non-finite element).
    fn stats(output: &str, stretches: Vec<Sums>, (out_len, ref_len): (usize, usize)) -> ErrorStats {
        let mut all = Sums::default();
        for (c, s) in stretches.into_iter().enumerate() {
            all.diff2 += s.diff2;
            all.ref2 += s.ref2;
            all.max_abs = all.max_abs.max(s.max_abs);
            all.non_finite += s.non_finite;
            all.first_non_finite = all.first_non_finite.or(s.first_non_finite.map(|i| c * COMPARE_CHUNK + i));
        }
        let short = (out_len != ref_len).then_some(out_len.min(ref_len));
        let rel_l2 = if all.ref2 > 0.0 { (all.diff2 / all.ref2).sqrt() } else { all.diff2.sqrt() };
        ErrorStats {
            output: output.to_string(),
            rel_l2,
            max_abs: all.max_abs,
            non_finite: all.non_finite + out_len.abs_diff(ref_len),
            first_non_finite: short.or(all.first_non_finite),
            count: ref_len,
        }
    }
}

/// Compares `out` with `reference` element by element, [`COMPARE_CHUNK`] elements a core at a time
/// (a quantizer's output is 2^27 values). A length mismatch counts every missing element as
/// non-finite.
pub fn compare<T: Element>(output: &str, out: &[T], reference: &[f64]) -> ErrorStats {
    let (out_len, ref_len) = (out.len(), reference.len());
    let n = out_len.min(ref_len);
    let (out, reference) = (&out[..n], &reference[..n]);
    // One stretch stays on the calling thread (no round trip through the pool for small outputs).
    let stretches = if n <= COMPARE_CHUNK {
        vec![Sums::of(out, reference)]
    } else {
        out.par_chunks(COMPARE_CHUNK).zip(reference.par_chunks(COMPARE_CHUNK)).map(|(o, r)| Sums::of(o, r)).collect()
    };
    Sums::stats(output, stretches, (out_len, ref_len))
}

/// [`compare`] of an output and a reference of `len` elements each that are made a stretch at a
/// time and never whole: `fill(first, out, reference)` writes the elements from `first` on into
/// both (buffers of [`COMPARE_CHUNK`] elements, the last one shorter). The same statistics as
/// `compare` over the whole arrays, bit for bit, without holding them: an INT4 cache of 2^27 values
/// dequantized is a gigabyte of f64 on each side.
pub fn compare_by<T: Element>(
    output: &str,
    len: usize,
    fill: impl Fn(usize, &mut [T], &mut [f64]) + Sync,
) -> ErrorStats {
    let stretches = (0..len.div_ceil(COMPARE_CHUNK)).into_par_iter().map_init(
        || (vec![T::default(); COMPARE_CHUNK], vec![0f64; COMPARE_CHUNK]),
        |(out, reference), c| {
            let first = c * COMPARE_CHUNK;
            let n = COMPARE_CHUNK.min(len - first);
            fill(first, &mut out[..n], &mut reference[..n]);
            Sums::of(&out[..n], &reference[..n])
        },
    );
    Sums::stats(output, stretches.collect(), (len, len))
}

/// Like [`compare`], but the L2 error is taken relative to `magnitude` (one value per element, the
/// scale of the error the element's inputs allow) instead of to the reference itself: for outputs
/// whose value can sit near zero while their rounding error is set by the size of their inputs. A
/// logsumexp is one: at a single key it is the score q.k * scale, ~0 for near-orthogonal q and k,
/// while rounding q and k to bf16 moves it by ~2^-9 * scale * sum |q_i k_i|; relative to itself
/// that error is unbounded. (FlashAttention-style tests check lse with an absolute tolerance for
/// the same reason; this is that tolerance, scaled to the scores.)
pub fn compare_scaled<T: Element>(output: &str, out: &[T], reference: &[f64], magnitude: &[f64]) -> ErrorStats {
    assert_eq!(reference.len(), magnitude.len(), "{output}: one magnitude per reference element");
    let mut stats = compare(output, out, reference);
    let diff2: f64 =
        out.iter().zip(reference).map(|(o, r)| o.to_f64() - r).filter(|d| d.is_finite()).map(|d| d * d).sum();
    let mag2: f64 = magnitude.iter().map(|m| m * m).sum();
    stats.rel_l2 = if mag2 > 0.0 { (diff2 / mag2).sqrt() } else { diff2.sqrt() };
    stats
}

/// What a sampled check compares a `[total, row_len]` output with: the rows it copies back, the
/// f64 reference on them, and where the output's value may cancel while its rounding error does
/// not (a product plus a residual), the scale of each reference element's error (as
/// [`compare_scaled`]).
pub struct SampledRows {
    pub rows: Vec<usize>,
    pub reference: Vec<f64>,
    pub magnitude: Option<Vec<f64>>,
}

/// The outcome of checking every output of one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Verification {
    pub outputs: Vec<ErrorStats>,
    pub tolerance: f64,
    /// Extra information shown beside the error (e.g. a windowed stage's error against full
    /// attention); it does not decide pass or fail.
    pub note: Option<String>,
}

impl Verification {
    pub fn new(tolerance: f64) -> Verification {
        Verification { outputs: Vec::new(), tolerance, note: None }
    }

    pub fn add<T: Element>(mut self, output: &str, out: &[T], reference: &[f64]) -> Verification {
        self.outputs.push(compare(output, out, reference));
        self
    }

    /// An output's statistics computed elsewhere ([`compare_by`], or a count of its own).
    pub fn add_stats(mut self, stats: ErrorStats) -> Verification {
        self.outputs.push(stats);
        self
    }

    /// Compares the rows `rows` of `out`, an output of `total` rows of `row_len` elements, with
    /// `reference`, their f64 reference one after another. When `rows` is a sample (see
    /// [`sample_rows`]), every element of `out` is also checked finite, as a second output, and
    /// `out` must have all `total * row_len` of them.
    pub fn add_rows<T: Element>(
        mut self,
        output: &str,
        out: &[T],
        (total, row_len): (usize, usize),
        rows: &[usize],
        reference: &[f64],
    ) -> Verification {
        if rows.len() == total && rows.iter().enumerate().all(|(i, &r)| i == r) {
            return self.add(output, out, reference);
        }
        // A row past the end of `out` is missing elements: the comparison counts them non-finite.
        let sampled: Vec<T> = rows.iter().flat_map(|&r| out.iter().skip(r * row_len).take(row_len).copied()).collect();
        self.outputs.push(compare(&format!("{output} ({} of {total} rows)", rows.len()), &sampled, reference));
        self.outputs.push(ErrorStats::finite(&format!("{output} (every row finite)"), out, total * row_len));
        self
    }

    /// [`Verification::add_rows`] for an output left on the device: only `rows` cross to the host
    /// to be compared, and when they are a sample every element is checked finite on the device
    /// ([`device_non_finite`]), so a large output (an LM head's 800 MB) costs milliseconds to check,
    /// not a copy of the whole.
    pub fn add_device_rows<T: Element>(
        self,
        gpu: &Gpu,
        output: &str,
        out: &CudaView<T>,
        dims: (usize, usize),
        rows: &[usize],
        reference: &[f64],
    ) -> Result<Verification> {
        self.device_rows(gpu, output, out, dims, rows, reference, None)
    }

    /// [`Verification::add_device_rows`] on a [`SampledRows`], its error relative to the sample's
    /// magnitudes where it has them.
    pub fn add_sampled<T: Element>(
        self,
        gpu: &Gpu,
        output: &str,
        out: &CudaView<T>,
        dims: (usize, usize),
        sample: &SampledRows,
    ) -> Result<Verification> {
        self.device_rows(gpu, output, out, dims, &sample.rows, &sample.reference, sample.magnitude.as_deref())
    }

    #[allow(clippy::too_many_arguments)]
    fn device_rows<T: Element>(
        mut self,
        gpu: &Gpu,
        output: &str,
        out: &CudaView<T>,
        (total, row_len): (usize, usize),
        rows: &[usize],
        reference: &[f64],
        magnitude: Option<&[f64]>,
    ) -> Result<Verification> {
        let compared = gpu.download_row_set(out, row_len, rows)?;
        let whole = rows.len() == total && rows.iter().enumerate().all(|(i, &r)| i == r);
        let name = if whole { output.to_string() } else { format!("{output} ({} of {total} rows)", rows.len()) };
        self.outputs.push(match magnitude {
            Some(m) => compare_scaled(&name, &compared, reference, m),
            None => compare(&name, &compared, reference),
        });
        if !whole {
            let have = out.len().min(total * row_len);
            let found = device_non_finite(gpu, &out.slice(..have))?;
            self.outputs.push(ErrorStats::counted(
                &format!("{output} (every row finite)"),
                found,
                have,
                total * row_len,
            ));
        }
        Ok(self)
    }

    pub fn with_note(mut self, note: String) -> Verification {
        self.note = Some(note);
        self
    }

    pub fn passed(&self) -> bool {
        !self.outputs.is_empty() && self.outputs.iter().all(|s| s.passes(self.tolerance))
    }

    /// The output with the largest relative error (non-finite first).
    pub fn worst(&self) -> Option<&ErrorStats> {
        self.outputs.iter().max_by(|a, b| {
            (a.non_finite > 0)
                .cmp(&(b.non_finite > 0))
                .then(a.rel_l2.partial_cmp(&b.rel_l2).unwrap_or(std::cmp::Ordering::Equal))
        })
    }

    /// One line: the worst output's error, or why it failed.
    pub fn summary(&self) -> String {
        let Some(w) = self.worst() else { return "no outputs checked".into() };
        if w.non_finite > 0 {
            format!(
                "{}: {} of {} elements NaN/Inf (first at {})",
                w.output,
                w.non_finite,
                w.count,
                w.first_non_finite.unwrap_or(0)
            )
        } else {
            format!("{}: rel L2 {:.2e} (tol {:.0e}), max abs {:.2e}", w.output, w.rel_l2, self.tolerance, w.max_abs)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nan_never_passes() {
        let r = [1.0, 2.0, 3.0];
        let s = compare("x", &[1.0f32, f32::NAN, 3.0], &r);
        assert_eq!(s.non_finite, 1);
        assert_eq!(s.first_non_finite, Some(1));
        assert!(!s.passes(f64::INFINITY));
        let s = compare("x", &[1.0f32, f32::INFINITY, 3.0], &r);
        assert!(!s.passes(1.0));
    }

    #[test]
    fn stretched_comparisons_agree() {
        // Three and a half stretches, a NaN in the third: `compare` and `compare_by` see the same
        // elements, the first NaN at its index in the whole, and the L2 error of the serial sum.
        let n = 3 * COMPARE_CHUNK + COMPARE_CHUNK / 2;
        let reference: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 / 100.0 - 5.0).collect();
        let mut out: Vec<f32> = reference.iter().enumerate().map(|(i, r)| (r + (i % 3) as f64 * 1e-3) as f32).collect();
        let nan = 2 * COMPARE_CHUNK + 5;
        out[nan] = f32::NAN;
        let whole = compare("x", &out, &reference);
        let by = compare_by("x", n, |first, o: &mut [f32], r| {
            o.copy_from_slice(&out[first..first + o.len()]);
            r.copy_from_slice(&reference[first..first + r.len()]);
        });
        assert_eq!(whole, by);
        assert_eq!((whole.non_finite, whole.first_non_finite, whole.count), (1, Some(nan), n));
        let (mut diff2, mut ref2) = (0.0, 0.0);
        for (o, r) in out.iter().zip(&reference).filter(|(o, _)| o.is_finite()) {
            diff2 += (*o as f64 - r) * (*o as f64 - r);
            ref2 += r * r;
        }
        approx::assert_relative_eq!(whole.rel_l2, (diff2 / ref2).sqrt(), max_relative = 1e-12);
        // A short output: every missing element non-finite, the first of them first.
        let short = compare("x", &out[..n - 10], &reference);
        assert_eq!((short.non_finite, short.first_non_finite), (11, Some(n - 10)));
    }

    #[test]
    fn length_mismatch_fails() {
        let s = compare("x", &[1.0f32, 2.0], &[1.0, 2.0, 3.0]);
        assert!(!s.passes(1.0));
    }

    #[test]
    fn tolerance_presets() {
        use crate::variant::Precision;
        assert_eq!(Precision::Fp32.tolerance(), 1e-5);
        assert_eq!(Precision::Tf32.tolerance(), 1e-3);
        assert_eq!(Precision::Bf16.tolerance(), 1e-2);
        assert_eq!(Precision::Fp16.tolerance(), 1e-2);
    }

    #[test]
    fn empty_verification_fails() {
        assert!(!Verification::new(1.0).passed());
    }

    #[test]
    fn relative_error_is_exact_for_scaled_reference() {
        let r = vec![3.0f64, 4.0];
        let out = [3.3f32, 4.4];
        let s = compare("x", &out, &r);
        approx::assert_relative_eq!(s.rel_l2, 0.1, max_relative = 1e-6);
    }

    #[test]
    fn large_outputs_are_checked_on_a_sample() {
        assert_eq!(checked_rows(4096, 768, 1), (0..4096).collect::<Vec<_>>(), "3.1M elements: every row");
        let rows = checked_rows(32768, 4096, 1);
        assert_eq!((rows.len(), rows[0], rows[SAMPLED_ROWS - 1]), (SAMPLED_ROWS, 0, 32767));
        assert_eq!(gather_rows(&[0, 1, 2, 3, 4, 5], 2, &[0, 2]), [0, 1, 4, 5]);
    }

    #[test]
    fn sampled_rows_are_distinct_in_range_with_the_ends() {
        for (rows, seed) in [(65, 1), (4096, 2), (50257, 3), (1 << 20, 4)] {
            let picked = sample_rows(rows, SAMPLED_ROWS, seed);
            assert_eq!(picked.len(), SAMPLED_ROWS, "{rows}");
            assert!(picked.windows(2).all(|w| w[0] < w[1]), "ascending and distinct: {picked:?}");
            assert_eq!((picked[0], picked[SAMPLED_ROWS - 1]), (0, rows - 1), "the first and the last row");
            assert_eq!(picked, sample_rows(rows, SAMPLED_ROWS, seed), "a seed draws the same rows again");
        }
        assert_ne!(sample_rows(4096, SAMPLED_ROWS, 1), sample_rows(4096, SAMPLED_ROWS, 2), "a fresh seed, fresh rows");
        assert_eq!(sample_rows(64, SAMPLED_ROWS, 1), (0..64).collect::<Vec<_>>(), "small outputs: every row");
        assert_eq!(sample_rows(1, SAMPLED_ROWS, 1), vec![0]);
        assert!(sample_rows(0, SAMPLED_ROWS, 1).is_empty());
    }

    #[test]
    fn sampled_rows_reach_every_row_over_seeds() {
        let mut seen = [false; 200];
        for seed in 0..1000 {
            sample_rows(200, 8, seed).into_iter().for_each(|r| seen[r] = true);
        }
        assert!(seen.iter().all(|&s| s), "no row is exempt for good");
    }

    /// A 6-row output of 2 columns with row r = [r, -r]; its reference for `rows`.
    fn rows_case(rows: &[usize]) -> (Vec<f32>, Vec<f64>) {
        let out: Vec<f32> = (0..6).flat_map(|r| [r as f32, -(r as f32)]).collect();
        let reference = rows.iter().flat_map(|&r| [r as f64, -(r as f64)]).collect();
        (out, reference)
    }

    #[test]
    fn a_sample_checks_its_rows_and_every_element_finite() {
        let rows = [0, 2, 5];
        let (mut out, reference) = rows_case(&rows);
        let v = Verification::new(1e-6).add_rows("out", &out, (6, 2), &rows, &reference);
        assert!(v.passed(), "{}", v.summary());
        assert_eq!(v.outputs.len(), 2);
        assert_eq!(v.outputs[0].output, "out (3 of 6 rows)");
        assert_eq!((v.outputs[0].count, v.outputs[1].count), (6, 12));
        // An unwritten (poisoned) element outside the sample fails.
        out[7] = f32::NAN;
        let v = Verification::new(1e-6).add_rows("out", &out, (6, 2), &rows, &reference);
        assert!(!v.passed());
        assert_eq!(v.worst().unwrap().first_non_finite, Some(7), "{}", v.summary());
        // A wrong value inside the sample fails.
        let (mut out, reference) = rows_case(&rows);
        out[4] += 1.0;
        assert!(!Verification::new(1e-6).add_rows("out", &out, (6, 2), &rows, &reference).passed());
        // A short output misses sampled rows and fails.
        let (out, reference) = rows_case(&rows);
        assert!(!Verification::new(1.0).add_rows("out", &out[..8], (6, 2), &rows, &reference).passed());
    }

    #[test]
    fn every_row_is_a_plain_comparison() {
        let rows: Vec<usize> = (0..6).collect();
        let (out, reference) = rows_case(&rows);
        let v = Verification::new(1e-6).add_rows("out", &out, (6, 2), &rows, &reference);
        assert_eq!(v.outputs, Verification::new(1e-6).add("out", &out, &reference).outputs);
    }

    proptest! {
        #[test]
        fn identical_outputs_have_zero_error(v in proptest::collection::vec(-1e6f32..1e6, 1..200)) {
            let r: Vec<f64> = v.iter().map(|x| *x as f64).collect();
            let s = compare("x", &v, &r);
            prop_assert_eq!(s.rel_l2, 0.0);
            prop_assert!(s.passes(1e-12));
        }

        #[test]
        fn perturbation_is_detected(v in proptest::collection::vec(1.0f32..10.0, 1..200), i in 0usize..200) {
            let r: Vec<f64> = v.iter().map(|x| *x as f64).collect();
            let mut out = v.clone();
            let i = i % out.len();
            out[i] += 0.5;
            let s = compare("x", &out, &r);
            prop_assert!(s.rel_l2 > 1e-5);
            prop_assert!(!s.passes(1e-5));
        }
    }
}
