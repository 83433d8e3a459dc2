//! Decode-phase GQA attention over a KV cache: `O[b, hq] = softmax(Q[b, hq] . K[b, :L_b, kvh]^T / sqrt(D))
//! . V[b, :L_b, kvh]` with `kvh = hq / (HQ/HKV)`, bf16 products, fp32 accumulation and softmax. The
//! cache is bf16 or INT4 (row-wise or group-wise, [`crate::format`]); every stage is one split-K
//! kernel file (`kernels/decode/00_splitk.cu`) under a set of defines, plus a merge of the splits.
//!
//! Shape keys: `B`, `Tmax`, `seq` (sequence length; with `ragged=1` each sequence's length is
//! drawn in `[ceil(seq/2), seq]`), `HQ`, `HKV`, `D`, `fmt` (0 bf16, 1 INT4 row-wise, 4 INT4
//! group-wise: which quantized cache the problem holds; the bf16 cache is always there for the
//! bf16 stage and for the quantization-cost note) and `splits` (0 = [`default_splits`]). The split
//! sweep of the reference (2..128) is a loop over `splits=` values.

use std::borrow::Cow;

use common::check::{compare, Verification};
use common::cudarc::driver::{CudaSlice, PushKernelArg};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, Bound, Define, DriverContext, Error, Gpu, LaunchShape, Op, Precision, Problem, Requirements, Result,
    Shape, Source, Variant, Workload,
};
use half::bf16;
use rayon::prelude::*;

use crate::format::{check_int4, dequantize_row, quantize, KvFormat};
use crate::quantize::cache_values;
use crate::FAMILY;

const OP: &str = "decode";
const KERNEL: &str = "decode/00_splitk.cu";
const BF16_DEFINES: &[Define] = &[Define::on("QI4_KV_BF16")];

/// Query heads per KV head the kernel handles (one mma row block).
pub const MAX_GROUP: usize = 8;
/// Largest split count accepted.
pub const MAX_SPLITS: usize = 256;
/// Sequences verified at most per problem; larger batches check an evenly spaced subset (and
/// that every other output is finite).
pub const MAX_CHECKED_SEQS: usize = 64;

/// The optimization switches in the reference's numbering (OPTS[i] is optimization i + 1).
pub const OPTS: [&str; 10] = ["OPT1", "OPT2", "OPT3", "OPT4", "OPT5", "OPT6", "OPT7", "OPT8", "OPT9", "OPT10"];

const OPT_SUMMARY: [&str; 10] = [
    "+1 unrolled K loads: all of a lane's code words in flight before dequantizing",
    "+2 in-place fp32->bf16 conversion of P by all threads, 2 per thread, one barrier",
    "+3 per-head max in one register per thread (no runtime-indexed local array)",
    "+4 per-head row sum in one register per thread",
    "+5 prefetch of the next V tile into registers during the mma and the softmax",
    "+6 group-wise INT4 (4 groups, 80-byte rows) with 8-byte vector loads",
    "+7 max of Q.K^T from the accumulator fragment (no shared-memory pass)",
    "+8 P packed into the A fragment straight from fp32 (no bf16 pass, no barrier)",
    "+9 swizzled P layout (column ^ 8*head): conflict-free fragment loads and stores",
    "+10 K/V tile rows padded by 2 bf16 against bank conflicts",
];

/// Optimizations added one by one on the row-wise ladder (6 is the group-wise format).
const ROW_STEPS: [usize; 9] = [1, 2, 3, 4, 5, 7, 8, 9, 10];
/// The group-wise ladder starts from 1..6 and adds these.
const GROUP_STEPS: [usize; 4] = [7, 8, 9, 10];

/// "1..5,7..8" for [1, 2, 3, 4, 5, 7, 8].
fn range_label(opts: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < opts.len() {
        let mut j = i;
        while j + 1 < opts.len() && opts[j + 1] == opts[j] + 1 {
            j += 1;
        }
        parts.push(if j == i { opts[i].to_string() } else { format!("{}..{}", opts[i], opts[j]) });
        i = j + 1;
    }
    parts.join(",")
}

fn int4_variant(stage: u32, name: String, opts: &[usize], summary: String) -> Variant {
    let mut v =
        Variant::kernel(FAMILY, OP, stage, "", KERNEL, Precision::Int4Bf16, "").with_requirements(Requirements::SM80);
    v.name = Cow::Owned(name);
    v.summary = Cow::Owned(summary);
    v.defines = Cow::Owned(opts.iter().map(|&o| Define::on(OPTS[o - 1])).collect());
    v
}

/// The decode ladder, generated from the toggle table: bf16 baseline, INT4 row-wise baseline, the
/// row-wise cumulative ladder (1, 1..2, …, 1..5, 1..5+7, …, 1..5+7..10), then the group-wise one
/// (1..6, …, 1..10). The two all-on stages carry their toggles for `--leave-one-out`.
pub fn stages() -> Vec<Variant> {
    let mut v = vec![
        Variant::kernel(
            FAMILY,
            OP,
            0,
            "bf16-splitk",
            KERNEL,
            Precision::Bf16,
            "BF16 cache: split-K over tokens, block per (seq, KV head, split), 4 warps, mma.sync, merge pass",
        )
        .with_defines(BF16_DEFINES)
        .with_requirements(Requirements::SM80),
        int4_variant(
            1,
            "int4-splitk".into(),
            &[],
            "INT4 row-wise cache dequantized in the kernel (the INT4 baseline); all switches off".into(),
        ),
    ];
    let mut opts = Vec::new();
    for step in ROW_STEPS {
        opts.push(step);
        let stage = v.len() as u32;
        let summary = if step == 7 {
            format!("{} (6 is the group format: off row-wise)", OPT_SUMMARY[step - 1])
        } else {
            OPT_SUMMARY[step - 1].to_string()
        };
        v.push(int4_variant(stage, format!("int4-row+{}", range_label(&opts)), &opts, summary));
    }
    v.last_mut().unwrap().toggles = Cow::Owned(opts.iter().map(|&o| OPTS[o - 1]).collect());
    let mut opts: Vec<usize> = (1..=6).collect();
    let stage = v.len() as u32;
    v.push(int4_variant(
        stage,
        format!("int4-group+{}", range_label(&opts)),
        &opts,
        format!("{} (row ladder 1..5 on the group format)", OPT_SUMMARY[5]),
    ));
    for step in GROUP_STEPS {
        opts.push(step);
        let stage = v.len() as u32;
        v.push(int4_variant(stage, format!("int4-group+{}", range_label(&opts)), &opts, OPT_SUMMARY[step - 1].into()));
    }
    // OPT6 is the format, not a switch of the group-wise kernel: leaving it out is not a stage.
    v.last_mut().unwrap().toggles = Cow::Owned(opts.iter().filter(|&&o| o != 6).map(|&o| OPTS[o - 1]).collect());
    v
}

/// Which cache a stage reads, from its defines (so leave-one-out variants resolve too).
pub fn stage_format(v: &Variant) -> Result<KvFormat> {
    match v.source {
        Source::Kernel(KERNEL) if v.define("QI4_KV_BF16").is_some() => Ok(KvFormat::Bf16),
        Source::Kernel(KERNEL) if v.define("OPT6").is_some() => Ok(KvFormat::Int4 { groups: 4 }),
        Source::Kernel(KERNEL) => Ok(KvFormat::Int4 { groups: 1 }),
        _ => Err(Error::Unknown { what: "decode stage", name: v.id(), known: KERNEL.into() }),
    }
}

/// Problem dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub b: usize,
    pub tmax: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
}

impl Dims {
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.hq / self.hkv
    }
    /// Cached rows per cache: B * Tmax * HKV.
    pub fn rows(&self) -> usize {
        self.b * self.tmax * self.hkv
    }
}

/// The dimension constraints of every stage.
pub fn check_dims(d: &Dims) -> Result<()> {
    require(d.d == 64 || d.d == 128, "D in {64, 128}", || format!("D = {}", d.d))?;
    require(d.b >= 1 && d.b <= 65_535, "1 <= B <= 65535", || format!("B = {}", d.b))?;
    require(d.hkv >= 1 && d.hkv <= 65_535, "1 <= HKV <= 65535", || format!("HKV = {}", d.hkv))?;
    require(d.hq >= 1 && d.hq.checked_rem(d.hkv) == Some(0), "HQ % HKV == 0", || {
        format!("HQ = {}, HKV = {}", d.hq, d.hkv)
    })?;
    require(d.group() <= MAX_GROUP, "HQ / HKV <= 8", || format!("HQ / HKV = {}", d.group()))?;
    require(d.tmax >= 1, "Tmax >= 1", || format!("Tmax = {}", d.tmax))?;
    let rows = d.b.checked_mul(d.tmax).and_then(|r| r.checked_mul(d.hkv));
    require(rows.is_some_and(|r| r < i32::MAX as usize), "B * Tmax * HKV < 2^31", || {
        format!("B = {}, Tmax = {}, HKV = {}", d.b, d.tmax, d.hkv)
    })
}

/// Every length in `1..=tmax`, one per sequence.
pub fn check_seq_lens(lens: &[usize], b: usize, tmax: usize) -> Result<()> {
    require(lens.len() == b, "len(seq_lens) == B", || format!("len(seq_lens) = {}, B = {b}", lens.len()))?;
    if let Some((i, &l)) = lens.iter().enumerate().find(|(_, &l)| l == 0 || l > tmax) {
        return Err(Error::constraint("1 <= seq_lens[b] <= Tmax", format!("seq_lens[{i}] = {l}, Tmax = {tmax}")));
    }
    Ok(())
}

/// The split count when the shape leaves it at 0: enough blocks for about four per SM, at most
/// one split per 128 cached tokens and at most 128 splits.
pub fn default_splits(sm_count: usize, b: usize, hkv: usize, tmax: usize) -> usize {
    let want = (4 * sm_count.max(1)).div_ceil(b.max(1) * hkv.max(1));
    want.clamp(1, tmax.div_ceil(128).clamp(1, 128))
}

/// Validated sequence lengths, on the host and the device.
pub struct SeqLens {
    host: Vec<usize>,
    dev: CudaSlice<i32>,
}

impl SeqLens {
    /// Checks every length against `tmax` and uploads them.
    pub fn new(gpu: &Gpu, lens: &[usize], tmax: usize) -> Result<SeqLens> {
        check_seq_lens(lens, lens.len(), tmax)?;
        require(tmax < i32::MAX as usize, "Tmax < 2^31", || format!("Tmax = {tmax}"))?;
        let dev = gpu.upload(&lens.iter().map(|&l| l as i32).collect::<Vec<i32>>())?;
        Ok(SeqLens { host: lens.to_vec(), dev })
    }

    pub fn host(&self) -> &[usize] {
        &self.host
    }
}

/// The per-split partial results: O (unnormalized), running max and sum per (seq, head, split).
pub struct Workspace {
    o: CudaSlice<f32>,
    m: CudaSlice<f32>,
    l: CudaSlice<f32>,
    rows: usize,
    d: usize,
}

impl Workspace {
    /// Room for `splits` partials of every (sequence, query head) of `dims`.
    pub fn new(gpu: &Gpu, dims: &Dims, splits: usize) -> Result<Workspace> {
        let rows = dims.b * dims.hq * splits;
        Ok(Workspace { o: gpu.zeros(rows * dims.d)?, m: gpu.zeros(rows)?, l: gpu.zeros(rows)?, rows, d: dims.d })
    }
}

/// One cache (K or V) as the kernels see it.
#[derive(Clone, Copy)]
pub enum Cache<'a> {
    /// `[B, Tmax, HKV, D]` bf16.
    Bf16(&'a CudaSlice<bf16>),
    /// `[B, Tmax, HKV]` rows of `4 * groups + D/2` bytes.
    Int4 { data: &'a CudaSlice<u8>, groups: usize },
}

impl Cache<'_> {
    fn format(&self) -> KvFormat {
        match self {
            Cache::Bf16(_) => KvFormat::Bf16,
            Cache::Int4 { groups, .. } => KvFormat::Int4 { groups: *groups },
        }
    }
    fn bytes(&self) -> usize {
        match self {
            Cache::Bf16(s) => 2 * s.len(),
            Cache::Int4 { data, .. } => data.len(),
        }
    }
}

/// A cache buffer against the stage: its format must be the stage's and its length
/// `B * Tmax * HKV * row_bytes` (68 bytes a row for row-wise INT4 at D = 128, 80 group-wise).
pub fn check_cache(name: &str, stage: &str, want: KvFormat, got: KvFormat, bytes: usize, dims: &Dims) -> Result<()> {
    if let KvFormat::Int4 { groups } = got {
        check_int4(dims.d, groups)?;
    }
    require(got == want, &format!("{name} cache format == {} (stage {stage})", want.label()), || {
        got.label().to_string()
    })?;
    let rb = want.row_bytes(dims.d);
    let n = dims.rows() * rb;
    require(bytes == n, &format!("{name} cache bytes == B*Tmax*HKV*{rb} = {n}"), || format!("{bytes} bytes"))
}

/// The buffers of one decode call.
pub struct DecodeArgs<'a> {
    /// `[B, HQ, D]` bf16.
    pub out: &'a mut CudaSlice<bf16>,
    /// `[B, HQ, D]` bf16.
    pub q: &'a CudaSlice<bf16>,
    pub k: Cache<'a>,
    pub v: Cache<'a>,
    pub seq_lens: &'a SeqLens,
    pub ws: &'a mut Workspace,
    pub dims: Dims,
    pub splits: usize,
}

/// Launches stage `var` (the split kernel and the merge) after checking the dimensions, the
/// cache formats against the stage, every buffer length, the sequence lengths and the split count.
pub fn forward(gpu: &Gpu, var: &Variant, a: DecodeArgs) -> Result<()> {
    let dims = a.dims;
    check_dims(&dims)?;
    let fmt = stage_format(var)?;
    if let KvFormat::Int4 { groups } = fmt {
        check_int4(dims.d, groups)?;
    }
    for (name, c) in [("K", &a.k), ("V", &a.v)] {
        check_cache(name, &var.name, fmt, c.format(), c.bytes(), &dims)?;
    }
    let qo = dims.b * dims.hq * dims.d;
    require(a.q.len() == qo, &format!("len(q) == B*HQ*D = {qo}"), || format!("len(q) = {}", a.q.len()))?;
    require(a.out.len() == qo, &format!("len(out) == B*HQ*D = {qo}"), || format!("len(out) = {}", a.out.len()))?;
    check_seq_lens(a.seq_lens.host(), dims.b, dims.tmax)?;
    let splits = a.splits;
    require((1..=MAX_SPLITS).contains(&splits), "1 <= splits <= 256", || format!("splits = {splits}"))?;
    let rows = dims.b * dims.hq * splits;
    require(a.ws.rows >= rows && a.ws.d == dims.d, "workspace sized for B*HQ*splits rows of D", || {
        format!("workspace {} rows of {}, need {rows} of {}", a.ws.rows, a.ws.d, dims.d)
    })?;

    let entry = if dims.d == 64 { "qi4_decode_d64" } else { "qi4_decode_d128" };
    let kernel = gpu.kernel(crate::sources(), var, entry)?;
    let combine = gpu.kernel(crate::sources(), var, "qi4_combine")?;
    let cfg = kernel.config(
        gpu,
        LaunchShape {
            grid: (splits as u32, dims.hkv as u32, dims.b as u32),
            block: (128, 1, 1),
            dynamic_shared_bytes: 0,
        },
    )?;
    let ccfg = combine.config(
        gpu,
        LaunchShape { grid: (dims.hq as u32, dims.b as u32, 1), block: (dims.d as u32, 1, 1), dynamic_shared_bytes: 0 },
    )?;
    let (tmax, hkv, nh, sp, d) = (dims.tmax as i32, dims.hkv as i32, dims.group() as i32, splits as i32, dims.d as i32);
    let scale = (std::f64::consts::LOG2_E / (dims.d as f64).sqrt()) as f32;
    {
        let mut b = gpu.stream().launch_builder(kernel.function());
        b.arg(&mut a.ws.o).arg(&mut a.ws.m).arg(&mut a.ws.l).arg(a.q);
        for c in [&a.k, &a.v] {
            match c {
                Cache::Bf16(s) => b.arg(*s),
                Cache::Int4 { data, .. } => b.arg(*data),
            };
        }
        b.arg(&a.seq_lens.dev).arg(&tmax).arg(&hkv).arg(&nh).arg(&sp).arg(&scale);
        // SAFETY: the argument list matches the kernel signature; every length was checked above
        // and the kernel reads only tokens below seq_lens[b] <= Tmax.
        unsafe { b.launch(cfg) }.map(|_| ()).ctx("launch the split-K decode kernel")?;
    }
    let mut b = gpu.stream().launch_builder(combine.function());
    b.arg(a.out).arg(&a.ws.o).arg(&a.ws.m).arg(&a.ws.l).arg(&hkv).arg(&nh).arg(&sp).arg(&d);
    // SAFETY: as above; the workspace holds B*HQ*splits rows.
    unsafe { b.launch(ccfg) }.map(|_| ()).ctx("launch qi4_combine")
}

/// f64 reference for the sequences `seqs`: `[seqs.len(), HQ, D]`. `k_row(b, t, kvh, out)` and
/// `v_row` write one cached row as f64 (from the bf16 cache or dequantized).
pub fn reference<K, V>(dims: &Dims, q: &[f32], lens: &[usize], seqs: &[usize], k_row: K, v_row: V) -> Vec<f64>
where
    K: Fn(usize, usize, usize, &mut [f64]) + Sync,
    V: Fn(usize, usize, usize, &mut [f64]) + Sync,
{
    let (d, nh, hkv) = (dims.d, dims.group(), dims.hkv);
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0f64; seqs.len() * dims.hq * d];
    out.par_chunks_mut(nh * d).enumerate().for_each(|(i, o)| {
        let (b, kvh) = (seqs[i / hkv], i % hkv);
        let l = lens[b];
        let mut k = vec![0f64; l * d];
        let mut v = vec![0f64; l * d];
        for t in 0..l {
            k_row(b, t, kvh, &mut k[t * d..(t + 1) * d]);
            v_row(b, t, kvh, &mut v[t * d..(t + 1) * d]);
        }
        let mut s = vec![0f64; l];
        for h in 0..nh {
            let qr = &q[(b * dims.hq + kvh * nh + h) * d..][..d];
            for t in 0..l {
                s[t] = k[t * d..(t + 1) * d].iter().zip(qr).map(|(a, b)| a * *b as f64).sum::<f64>() * scale;
            }
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0.0;
            let orow = &mut o[h * d..(h + 1) * d];
            orow.fill(0.0);
            for t in 0..l {
                let p = (s[t] - m).exp();
                sum += p;
                for (od, vd) in orow.iter_mut().zip(&v[t * d..(t + 1) * d]) {
                    *od += p * vd;
                }
            }
            orow.iter_mut().for_each(|x| *x /= sum);
        }
    });
    out
}

/// The sequences checked against the reference: all of them up to [`MAX_CHECKED_SEQS`], else an
/// evenly spaced subset that always includes the first and the last.
pub fn checked_seqs(b: usize) -> Vec<usize> {
    if b <= MAX_CHECKED_SEQS {
        return (0..b).collect();
    }
    let mut v: Vec<usize> = (0..MAX_CHECKED_SEQS - 1).map(|i| i * (b - 1) / (MAX_CHECKED_SEQS - 1)).collect();
    v.push(b - 1);
    v.dedup();
    v
}

/// A decode shape with all keys.
#[allow(clippy::too_many_arguments)]
pub fn shape(
    b: usize,
    tmax: usize,
    seq: usize,
    ragged: bool,
    hq: usize,
    hkv: usize,
    d: usize,
    fmt: KvFormat,
    splits: usize,
) -> Shape {
    Shape::new(&[
        ("B", b as i64),
        ("Tmax", tmax as i64),
        ("seq", seq as i64),
        ("ragged", ragged as i64),
        ("HQ", hq as i64),
        ("HKV", hkv as i64),
        ("D", d as i64),
        ("fmt", fmt.key()),
        ("splits", splits as i64),
    ])
}

/// A parsed decode shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    pub dims: Dims,
    pub seq: usize,
    pub ragged: bool,
    pub fmt: KvFormat,
    /// 0 = the heuristic.
    pub splits: usize,
}

impl DecodeShape {
    pub fn parse(s: &Shape) -> Result<DecodeShape> {
        let big = i32::MAX as i64;
        let dims = Dims {
            b: s.dim("B", big)?,
            tmax: s.dim("Tmax", big)?,
            hq: s.dim("HQ", big)?,
            hkv: s.dim("HKV", big)?,
            d: s.dim("D", big)?,
        };
        check_dims(&dims)?;
        let seq = s.req("seq")?;
        require(seq >= 1 && seq as usize <= dims.tmax, "1 <= seq <= Tmax", || {
            format!("seq = {seq}, Tmax = {}", dims.tmax)
        })?;
        let ragged = s.req("ragged")?;
        require(ragged == 0 || ragged == 1, "ragged in {0, 1}", || format!("ragged = {ragged}"))?;
        let splits = s.req("splits")?;
        require((0..=MAX_SPLITS as i64).contains(&splits), "0 <= splits <= 256 (0 = heuristic)", || {
            format!("splits = {splits}")
        })?;
        let fmt = KvFormat::from_key(s.req("fmt")?)?;
        if let KvFormat::Int4 { groups } = fmt {
            check_int4(dims.d, groups)?;
        }
        Ok(DecodeShape { dims, seq: seq as usize, ragged: ragged == 1, fmt, splits: splits as usize })
    }

    /// Per-sequence lengths: `seq`, or uniform in `[ceil(seq/2), seq]` when ragged.
    pub fn lens(&self, seed: u64) -> Vec<usize> {
        if !self.ragged {
            return vec![self.seq; self.dims.b];
        }
        let lo = self.seq.div_ceil(2);
        let span = self.seq - lo + 1;
        uniform(self.dims.b, 0.0, 1.0, seed)
            .into_iter()
            .map(|u| lo + ((u * span as f32) as usize).min(span - 1))
            .collect()
    }
}

/// Whether a stage can run on a problem holding the `shape_fmt` quantized cache.
fn stage_runs_on(stage: KvFormat, shape_fmt: KvFormat) -> bool {
    stage == KvFormat::Bf16 || stage == shape_fmt
}

pub struct Decode;

impl Op for Decode {
    fn family(&self) -> &'static str {
        FAMILY
    }
    fn name(&self) -> &'static str {
        OP
    }
    fn description(&self) -> &'static str {
        "GQA decode attention over a bf16 / INT4 (row-wise, group-wise) KV cache, split-K + merge"
    }
    fn sources(&self) -> &'static [common::KernelSource] {
        crate::sources()
    }
    fn variants(&self) -> Vec<Variant> {
        stages()
    }
    fn leave_one_out(&self) -> Vec<Variant> {
        stages()
            .iter()
            .filter(|v| !v.toggles.is_empty())
            .flat_map(|all| {
                let prefix = if all.define("OPT6").is_some() { "group" } else { "row" };
                all.leave_one_out().into_iter().map(move |mut v| {
                    v.name = Cow::Owned(format!("{prefix}-{}", v.name));
                    v
                })
            })
            .collect()
    }
    fn shape_keys(&self) -> &'static [&'static str] {
        &["B", "Tmax", "seq", "ragged", "HQ", "HKV", "D", "fmt", "splits"]
    }
    fn default_shapes(&self) -> Vec<Shape> {
        let mut v = Vec::new();
        for b in [32, 128, 512] {
            for fmt in [KvFormat::Int4 { groups: 1 }, KvFormat::Int4 { groups: 4 }] {
                v.push(shape(b, 8192, 8192, false, 8, 1, 128, fmt, 0));
            }
        }
        v
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        let s = DecodeShape::parse(shape)?;
        let stage = stage_format(v)?;
        require(stage_runs_on(stage, s.fmt), &format!("stage {} reads the {} cache", v.name, stage.label()), || {
            format!("fmt = {} ({})", s.fmt.key(), s.fmt.label())
        })
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let s = DecodeShape::parse(shape)?;
        let dims = s.dims;
        let lens = s.lens(seed ^ 0x5EED);
        let splits = if s.splits == 0 {
            default_splits(gpu.info().sm_count as usize, dims.b, dims.hkv, dims.tmax)
        } else {
            s.splits
        };
        let q_bf: Vec<bf16> =
            uniform(dims.b * dims.hq * dims.d, -2.0, 2.0, seed ^ 1).into_iter().map(bf16::from_f32).collect();
        let q: Vec<f32> = q_bf.iter().map(|x| x.to_f32()).collect();
        let k = cache(&dims, &lens, seed ^ 2, true);
        let v = cache(&dims, &lens, seed ^ 3, false);
        let quantized = match s.fmt {
            KvFormat::Int4 { groups } => Some((quantize(&k, dims.d, groups), quantize(&v, dims.d, groups), groups)),
            KvFormat::Bf16 => None,
        };
        let checked = checked_seqs(dims.b);
        let d = dims.d;
        let row = |c: &[bf16], b: usize, t: usize, kvh: usize, out: &mut [f64]| {
            let i = ((b * dims.tmax + t) * dims.hkv + kvh) * d;
            out.iter_mut().zip(&c[i..i + d]).for_each(|(o, x)| *o = x.to_f64());
        };
        let ref_bf16 =
            reference(&dims, &q, &lens, &checked, |b, t, h, o| row(&k, b, t, h, o), |b, t, h, o| row(&v, b, t, h, o));
        let ref_deq = quantized.as_ref().map(|(kq, vq, groups)| {
            let rb = s.fmt.row_bytes(d);
            let deq = |c: &[u8], b: usize, t: usize, kvh: usize, out: &mut [f64]| {
                let i = ((b * dims.tmax + t) * dims.hkv + kvh) * rb;
                dequantize_row(&c[i..i + rb], d, *groups, out);
            };
            reference(&dims, &q, &lens, &checked, |b, t, h, o| deq(kq, b, t, h, o), |b, t, h, o| deq(vq, b, t, h, o))
        });
        let qbytes = dims.b * dims.hq * d * 2;
        let per_copy = 2 * k.len() * 2 + quantized.as_ref().map_or(0, |(kq, vq, _)| kq.len() + vq.len()) + 2 * qbytes;
        let copies = rotation_copies(gpu, per_copy as u64);
        let (kq, vq) = match &quantized {
            Some((kq, vq, _)) => (Some(Rotated::upload(gpu, kq, copies)?), Some(Rotated::upload(gpu, vq, copies)?)),
            None => (None, None),
        };
        Ok(Box::new(DecodeProblem {
            s,
            splits,
            seq_lens: SeqLens::new(gpu, &lens, dims.tmax)?,
            ws: Workspace::new(gpu, &dims, splits)?,
            q: Rotated::upload(gpu, &q_bf, copies)?,
            kb: Rotated::upload(gpu, &k, copies)?,
            vb: Rotated::upload(gpu, &v, copies)?,
            kq,
            vq,
            out: Rotated::outputs(gpu, dims.b * dims.hq * d, copies)?,
            checked,
            ref_bf16,
            ref_deq,
            copies,
        }))
    }
}

/// A `[B, Tmax, HKV, D]` cache for `lens`: uniform values (with the outlier channel of
/// [`cache_values`] for K) below each sequence's length, NaN past it, so a kernel that reads past
/// `seq_lens[b]` fails verification.
pub fn cache(dims: &Dims, lens: &[usize], seed: u64, outlier: bool) -> Vec<bf16> {
    let per = dims.tmax * dims.hkv * dims.d;
    let mut c = vec![bf16::NAN; dims.b * per];
    c.par_chunks_mut(per).enumerate().for_each(|(b, chunk)| {
        let n = lens[b] * dims.hkv * dims.d;
        let s = seed ^ (b as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let vals = if outlier {
            cache_values(n, dims.d, s)
        } else {
            uniform(n, -1.0, 1.0, s).into_iter().map(bf16::from_f32).collect()
        };
        chunk[..n].copy_from_slice(&vals);
    });
    c
}

struct DecodeProblem {
    s: DecodeShape,
    splits: usize,
    seq_lens: SeqLens,
    ws: Workspace,
    q: Rotated<bf16>,
    kb: Rotated<bf16>,
    vb: Rotated<bf16>,
    kq: Option<Rotated<u8>>,
    vq: Option<Rotated<u8>>,
    out: Rotated<bf16>,
    checked: Vec<usize>,
    ref_bf16: Vec<f64>,
    ref_deq: Option<Vec<f64>>,
    copies: usize,
}

impl Problem for DecodeProblem {
    fn workload(&self) -> Workload {
        let d = self.s.dims;
        let tokens: usize = self.seq_lens.host().iter().sum();
        // The reference's effective bandwidth: K, V and their scales read once; plus Q and O.
        let kv = 2 * tokens * d.hkv * self.s.fmt.row_bytes(d.d);
        let qo = 2 * d.b * d.hq * d.d * 2;
        Workload { bytes: (kv + qo) as u64, flops: (4 * tokens * d.hq * d.d) as u64, bound: Bound::Memory }
    }
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)
    }
    fn launch(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<()> {
        let fmt = stage_format(v)?;
        let (k, vv) = match fmt {
            KvFormat::Bf16 => (Cache::Bf16(self.kb.get(copy)), Cache::Bf16(self.vb.get(copy))),
            KvFormat::Int4 { groups } => match (&self.kq, &self.vq) {
                (Some(kq), Some(vq)) if self.s.fmt == fmt => {
                    (Cache::Int4 { data: kq.get(copy), groups }, Cache::Int4 { data: vq.get(copy), groups })
                }
                _ => {
                    return Err(Error::constraint(
                        format!("stage {} needs a fmt={} problem", v.name, fmt.key()),
                        format!("fmt = {}", self.s.fmt.key()),
                    ))
                }
            },
        };
        forward(
            gpu,
            v,
            DecodeArgs {
                out: self.out.get_mut(copy),
                q: self.q.get(copy),
                k,
                v: vv,
                seq_lens: &self.seq_lens,
                ws: &mut self.ws,
                dims: self.s.dims,
                splits: self.splits,
            },
        )
    }
    fn verify(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<Verification> {
        let d = self.s.dims;
        let row = d.hq * d.d;
        let out = gpu.download(self.out.get(copy))?;
        let got: Vec<bf16> = self.checked.iter().flat_map(|&b| out[b * row..(b + 1) * row].iter().copied()).collect();
        let fmt = stage_format(v)?;
        let mut notes = vec![format!("splits = {}", self.splits)];
        let reference = match fmt {
            KvFormat::Bf16 => &self.ref_bf16,
            KvFormat::Int4 { .. } => {
                let r = self.ref_deq.as_ref().ok_or_else(|| {
                    Error::constraint("an INT4 stage runs on a problem with an INT4 cache", "fmt = 0".to_string())
                })?;
                let cost = compare("out", &got, &self.ref_bf16);
                notes.push(format!("{} vs the unquantized cache: rel L2 {:.2e}", fmt.label(), cost.rel_l2));
                r
            }
        };
        let mut ver = Verification::new(v.tolerance()).add("out", &got, reference);
        if self.checked.len() < d.b {
            let mut is_checked = vec![false; d.b];
            self.checked.iter().for_each(|&b| is_checked[b] = true);
            let mask: Vec<f32> = (0..d.b)
                .filter(|&b| !is_checked[b])
                .flat_map(|b| out[b * row..(b + 1) * row].iter().map(|x| if x.is_finite() { 0.0 } else { f32::NAN }))
                .collect();
            ver = ver.add("out (unchecked sequences) finite", &mask, &vec![0.0; mask.len()]);
            notes.push(format!("{} of {} sequences checked", self.checked.len(), d.b));
        }
        Ok(ver.with_note(notes.join("; ")))
    }
}
