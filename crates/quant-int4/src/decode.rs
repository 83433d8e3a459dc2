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
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{fill_uniform, rotation_copies, uniform, zeroed_bf16, Rotated};
use common::{
    require, require_len, Arg, Bound, Define, Error, Generator, Gpu, Launch, LaunchShape, LeaveOneOut, Limit, Op,
    Precision, Prepared as Current, PreparedStage, Problem, Requirements, ResourceUse, Result, Shape, Variant,
    Workload,
};
use half::bf16;
use rayon::prelude::*;

pub use attention::decode::{check_seq_lens, checked_seqs, SeqLens, MAX_CHECKED_SEQS};
use attention::decode::{lengths, Heads};

use crate::format::{check_int4, dequantize_row, fragment_cache_bytes, quantize, to_fragments, KvFormat, Layout, Role};
use crate::quantize::fill_cache_values;
use crate::{FAMILY, SOURCES};

const OP: &str = "decode";

common::declare_op! {
    pub struct Decode {
        name: OP,
        description: "GQA decode attention over a bf16 / INT4 (row-wise, group-wise) KV cache, split-K + merge",
        shape_keys: ["B", "Tmax", "seq", "ragged", "HQ", "HKV", "D", "fmt", "splits"],
        stages: stages,
    }
}

const KERNEL: &str = "decode/00_splitk.cu";
const FRAGMENTS_KERNEL: &str = "decode/22_fragments.cu";
const BF16_DEFINES: &[Define] = &[Define::on("QI4_KV_BF16")];

/// Query heads per KV head the kernel handles (one mma row block).
pub const MAX_GROUP: usize = 8;
/// Largest split count accepted.
pub const MAX_SPLITS: usize = 256;

/// The optimization switches (OPTS[i] is optimization i + 1): the reference's ten, then ours.
pub const OPTS: [&str; 13] =
    ["OPT1", "OPT2", "OPT3", "OPT4", "OPT5", "OPT6", "OPT7", "OPT8", "OPT9", "OPT10", "OPT11", "OPT12", "OPT13"];

const OPT_SUMMARY: [&str; 13] = [
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
    "+11 the tile's traffic in 16-byte instructions: ldmatrix fragments (V transposed by ldmatrix.trans) and 16-byte stores, rows padded by 8 bf16",
    "+12 codes into the tile as the exact bf16 128 + q (a shift and an AND-OR a pair); scale and shift applied to the scores and to P instead",
    "+13 at most 128 registers (__launch_bounds__ for 4 blocks an SM): a fourth block an SM for a few spilled registers",
];

/// Optimizations added one by one on the row-wise ladder (6 is the group-wise format).
const ROW_STEPS: [usize; 9] = [1, 2, 3, 4, 5, 7, 8, 9, 10];
/// The group-wise ladder starts from 1..6 and adds these.
const GROUP_STEPS: [usize; 4] = [7, 8, 9, 10];
/// Past the reference: added to each format's all-on stage, row-wise first.
const NEXT_STEPS: [usize; 3] = [11, 12, 13];

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

/// Warps per block of the split kernel (its pass layout is written for 4).
const WARPS: (&str, u32) = ("QI4_WARPS", 4);

/// What a stage reads: the cache format and where its rows live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagePlan {
    pub format: KvFormat,
    pub layout: Layout,
}

impl StagePlan {
    const fn rows(format: KvFormat) -> StagePlan {
        StagePlan { format, layout: Layout::Rows }
    }
}

fn int4_variant(stage: u32, name: String, opts: &[usize], summary: String) -> Variant {
    let format = if opts.contains(&6) { KvFormat::Int4 { groups: 4 } } else { KvFormat::Int4 { groups: 1 } };
    let mut v = Variant::kernel(FAMILY, OP, stage, "", KERNEL, Precision::Int4Bf16, "")
        .with_requirements(Requirements::SM80)
        .with_tunables(&[WARPS])
        .with_plan(StagePlan::rows(format));
    v.name = Cow::Owned(name);
    v.summary = Cow::Owned(summary);
    v.defines = Cow::Owned(opts.iter().map(|&o| Define::on(OPTS[o - 1])).collect());
    v
}

/// The decode ladder, generated from the toggle table: bf16 baseline, INT4 row-wise baseline, the
/// row-wise cumulative ladder (1, 1..2, …, 1..5, 1..5+7, …, 1..5+7..10), the group-wise one
/// (1..6, …, 1..10), then our rungs past the reference on each (row-wise 16-18, group-wise 19-21).
/// The two all-on stages carry their toggles for `--leave-one-out`.
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
        .with_tunables(&[WARPS])
        .with_plan(StagePlan::rows(KvFormat::Bf16))
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
    let row_opts = opts;
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
    for (label, mut opts) in [("row", row_opts), ("group", opts)] {
        for step in NEXT_STEPS {
            opts.push(step);
            let stage = v.len() as u32;
            v.push(int4_variant(
                stage,
                format!("int4-{label}+{}", range_label(&opts)),
                &opts,
                OPT_SUMMARY[step - 1].into(),
            ));
        }
        // The all-on stage carries its toggles for `--leave-one-out`: not OPT6 (the format) and
        // not OPT10 (OPT11's wider pad replaces its pad).
        v.last_mut().unwrap().toggles =
            Cow::Owned(opts.iter().filter(|&&o| o != 6 && o != 10).map(|&o| OPTS[o - 1]).collect());
    }
    for (groups, name, chunks, blocks) in [(1, "int4-row-fragments", 2, 3), (4, "int4-group-fragments", 1, 3)] {
        let stage = v.len() as u32;
        v.push(fragments_variant(stage, name, groups, chunks, blocks, false));
    }
    for (groups, name, chunks) in [(1, "int4-row-fragments+warp-merge", 2), (4, "int4-group-fragments+warp-merge", 1)] {
        let stage = v.len() as u32;
        v.push(fragments_variant(stage, name, groups, chunks, 3, true));
    }
    v
}

/// The fragment stages' switch: the splits merged by `qi4_frag_merge`, a warp a row.
const WARP_MERGE: &str = "QI4F_WARP_MERGE";

/// A fragment-direct stage (`22_fragments.cu`) over the `groups` format in the fragment layout, its
/// warps computing `chunks` chunks of 16 tokens a step.
fn fragments_variant(
    stage: u32,
    name: &'static str,
    groups: usize,
    chunks: u32,
    blocks: u32,
    warp_merge: bool,
) -> Variant {
    let summary = if warp_merge {
        "+ the split merge one warp a row: every split's max and sum loaded at once, four splits' partials \
         in flight a lane (attention's combine walks the splits a load at a time)"
    } else {
        "fragment layout: codes loaded straight into mma fragments (K rows = tokens, V^T with P^T by \
         movmatrix), per-warp online softmax, the next chunks' loads in flight, no shared tile"
    };
    let mut defines = vec![Define::new("QI4F_GROUPS", if groups == 4 { "4" } else { "1" })];
    // The merge's rows a block only where the merge is ours.
    let tunables = [("QI4F_WARPS", 4), ("QI4F_CHUNKS", chunks), ("QI4F_MIN_BLOCKS", blocks), ("QI4F_MERGE_WARPS", 4)];
    if warp_merge {
        defines.push(Define::on(WARP_MERGE));
    }
    Variant::kernel(FAMILY, OP, stage, name, FRAGMENTS_KERNEL, Precision::Int4Bf16, summary)
        .with_defines(defines)
        .with_tunables(&tunables[..3 + usize::from(warp_merge)])
        .with_plan(StagePlan { format: KvFormat::Int4 { groups }, layout: Layout::Fragments })
        .with_requirements(Requirements::SM80)
}

/// Which cache a stage reads: its plan (leave-one-out variants keep it; OPT6 is never left out).
pub fn stage_format(v: &Variant) -> Result<KvFormat> {
    Ok(v.plan::<StagePlan>()?.format)
}

/// Where the rows of the cache a stage reads live.
pub fn stage_layout(v: &Variant) -> Result<Layout> {
    Ok(v.plan::<StagePlan>()?.layout)
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

const HEAD_DIM: &str = "D in {64, 128}";
const GRID_B: &str = "B <= 65535";
const GRID_HKV: &str = "HKV <= 65535";
const GROUP: &str = "HQ / HKV <= 8";
const ROWS: &str = "B * Tmax * HKV < 2^31";
const SPLITS: &str = "splits <= 256";

/// The dimension constraints of every stage: what the stage header's `Limits:` line documents.
pub fn check_dims(d: &Dims) -> Result<()> {
    require(d.d == 64 || d.d == 128, HEAD_DIM, || format!("D = {}", d.d))?;
    require(d.b >= 1, "B >= 1", || format!("B = {}", d.b))?;
    require(d.b <= 65_535, GRID_B, || format!("B = {}", d.b))?;
    require(d.hkv >= 1, "HKV >= 1", || format!("HKV = {}", d.hkv))?;
    require(d.hkv <= 65_535, GRID_HKV, || format!("HKV = {}", d.hkv))?;
    require(d.hq >= 1 && d.hq.checked_rem(d.hkv) == Some(0), "HQ % HKV == 0", || {
        format!("HQ = {}, HKV = {}", d.hq, d.hkv)
    })?;
    require(d.group() <= MAX_GROUP, GROUP, || format!("HQ / HKV = {}", d.group()))?;
    require(d.tmax >= 1, "Tmax >= 1", || format!("Tmax = {}", d.tmax))?;
    let rows = d.b.checked_mul(d.tmax).and_then(|r| r.checked_mul(d.hkv));
    require(rows.is_some_and(|r| r < 1 << 31), ROWS, || format!("B = {}, Tmax = {}, HKV = {}", d.b, d.tmax, d.hkv))
}

/// The split count's limits.
fn check_splits(splits: usize) -> Result<()> {
    require(splits >= 1, "splits >= 1", || format!("splits = {splits}"))?;
    require(splits <= MAX_SPLITS, SPLITS, || format!("splits = {splits}"))
}

/// The split count when the shape leaves it at 0: whole waves of the stage's own residency
/// (`resident`: its blocks an SM times SMs) over the B·HKV (sequence, KV head) pairs
/// ([`common::launch::wave_splits`]), at most one split per 128 cached tokens and at most 128. A fixed
/// "four blocks an SM, rounded up" gave 17 splits at B = 32: 544 blocks for 528 places, and more than a
/// wave to every stage that its registers hold to 3 an SM.
pub fn default_splits(resident: usize, b: usize, hkv: usize, tmax: usize) -> usize {
    common::launch::wave_splits(b * hkv, resident, tmax.div_ceil(128).clamp(1, 128))
}

/// The per-split partial results in attention's split layout: O (unnormalized), running max and
/// sum per (seq, head, split); and the lse attention's combine writes (this op does not return it).
struct Workspace {
    o: CudaSlice<f32>,
    m: CudaSlice<f32>,
    l: CudaSlice<f32>,
    lse: CudaSlice<f32>,
}

impl Workspace {
    /// Room for `splits` partials of every (sequence, query head) of `dims`.
    fn new(gpu: &Gpu, dims: &Dims, splits: usize) -> Result<Workspace> {
        let rows = dims.b * dims.hq * splits;
        let (o, m, l) = (gpu.zeros(rows * dims.d)?, gpu.zeros(rows)?, gpu.zeros(rows)?);
        Ok(Workspace { o, m, l, lse: gpu.zeros(dims.b * dims.hq)? })
    }
}

/// One cache (K or V) as the kernels see it.
#[derive(Clone, Copy)]
pub enum Cache<'a> {
    /// `[B, Tmax, HKV, D]` bf16.
    Bf16(&'a CudaSlice<bf16>),
    /// INT4 with `groups` scale groups a row: `[B, Tmax, HKV]` rows of `4 * groups + D/2` bytes
    /// ([`Layout::Rows`]), or the same bytes in chunks of 16 tokens per (sequence, KV head)
    /// ([`Layout::Fragments`]).
    Int4 { data: &'a CudaSlice<u8>, groups: usize, layout: Layout },
}

impl Cache<'_> {
    fn plan(&self) -> StagePlan {
        match self {
            Cache::Bf16(_) => StagePlan::rows(KvFormat::Bf16),
            Cache::Int4 { groups, layout, .. } => {
                StagePlan { format: KvFormat::Int4 { groups: *groups }, layout: *layout }
            }
        }
    }
    fn bytes(&self) -> usize {
        match self {
            Cache::Bf16(s) => 2 * s.len(),
            Cache::Int4 { data, .. } => data.len(),
        }
    }
}

/// The bytes of a cache of `dims` in `plan`'s format and layout.
pub fn cache_bytes(plan: StagePlan, dims: &Dims) -> usize {
    match (plan.format, plan.layout) {
        (KvFormat::Int4 { groups }, Layout::Fragments) => {
            fragment_cache_bytes(dims.b, dims.tmax, dims.hkv, dims.d, groups)
        }
        (format, _) => dims.rows() * format.row_bytes(dims.d),
    }
}

/// A cache buffer against the stage: its format and layout must be the stage's and its length
/// [`cache_bytes`] (`B * Tmax * HKV * 68` for row-wise INT4 rows at D = 128, 80 group-wise).
pub fn check_cache(name: &str, stage: &str, want: StagePlan, got: StagePlan, bytes: usize, dims: &Dims) -> Result<()> {
    if let KvFormat::Int4 { groups } = got.format {
        check_int4(dims.d, groups)?;
    }
    require(
        got.format == want.format,
        &format!("{name} cache format == {} (stage {stage})", want.format.label()),
        || got.format.label().to_string(),
    )?;
    require(got.layout == want.layout, &format!("{name} cache layout == {:?} (stage {stage})", want.layout), || {
        format!("{:?}", got.layout)
    })?;
    let n = cache_bytes(want, dims);
    require(bytes == n, &format!("{name} cache bytes == {n} ({:?} layout)", want.layout), || format!("{bytes} bytes"))
}

/// A decode stage prepared for one size, cache format and split count: the split kernel, the merge
/// and the per-split workspace.
pub struct Prepared {
    split: Launch,
    combine: Launch,
    ws: Workspace,
    dims: Dims,
    splits: usize,
    plan: StagePlan,
    /// The merge is `qi4_frag_merge` (rows, splits) rather than attention's combine (splits, D).
    warp_merge: bool,
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
}

/// Prepares stage `var` for `dims` with `splits` splits (0: [`default_splits`] from this stage's
/// residency): checks the dimensions, the split count and the stage's format, configures both
/// kernels and allocates the workspace.
pub fn prepare(gpu: &Gpu, var: &Variant, dims: Dims, splits: usize) -> Result<Prepared> {
    check_dims(&dims)?;
    let plan = var.plan::<StagePlan>()?;
    if let KvFormat::Int4 { groups } = plan.format {
        check_int4(dims.d, groups)?;
    }
    let (entry, warps) = match (plan.layout, dims.d) {
        (Layout::Rows, 64) => ("qi4_decode_d64", "QI4_WARPS"),
        (Layout::Rows, _) => ("qi4_decode_d128", "QI4_WARPS"),
        (Layout::Fragments, 64) => ("qi4_frag_decode_d64", "QI4F_WARPS"),
        (Layout::Fragments, _) => ("qi4_frag_decode_d128", "QI4F_WARPS"),
    };
    let threads = 32 * var.tunable(warps)?;
    let block = (threads, 1, 1);
    let splits = if splits == 0 {
        let probe =
            gpu.prepare_launch(&SOURCES, var, entry, LaunchShape::new((1, dims.hkv as u32, dims.b as u32), block))?;
        let resident = probe.resources().blocks_per_sm as usize * gpu.info().sm_count as usize;
        default_splits(resident, dims.b, dims.hkv, dims.tmax)
    } else {
        splits
    };
    check_splits(splits)?;
    let grid = (splits as u32, dims.hkv as u32, dims.b as u32);
    let split = gpu.prepare_launch(&SOURCES, var, entry, LaunchShape::new(grid, block))?;
    let rows = (dims.b * dims.hq) as u32;
    let warp_merge = var.has(WARP_MERGE);
    let (merge_entry, merge_shape) = if warp_merge {
        let warps = var.tunable("QI4F_MERGE_WARPS")?;
        let entry = if dims.d == 64 { "qi4_frag_merge_d64" } else { "qi4_frag_merge_d128" };
        (entry, LaunchShape::linear(rows.div_ceil(warps), 32 * warps))
    } else {
        ("decode_combine_bf16", LaunchShape::new((dims.hq as u32, dims.b as u32, 1), (dims.d as u32, 1, 1)))
    };
    let combine = gpu.prepare_launch(&SOURCES, var, merge_entry, merge_shape)?;
    Ok(Prepared { split, combine, ws: Workspace::new(gpu, &dims, splits)?, dims, splits, plan, warp_merge })
}

impl Prepared {
    /// Enqueues the split kernel and the merge on `stream` after checking the cache formats against
    /// the stage, every buffer length and the sequence lengths.
    pub fn enqueue(&self, stream: &CudaStream, a: DecodeArgs) -> Result<()> {
        let (dims, plan) = (self.dims, self.plan);
        for (name, c) in [("K", &a.k), ("V", &a.v)] {
            check_cache(name, plan.format.label(), plan, c.plan(), c.bytes(), &dims)?;
        }
        let qo = dims.b * dims.hq * dims.d;
        require_len("q", a.q.len(), qo)?;
        require_len("out", a.out.len(), qo)?;
        check_seq_lens(a.seq_lens.host(), dims.b, dims.tmax)?;
        let cache = |c: &Cache| match c {
            Cache::Bf16(s) => Arg::buf(s),
            Cache::Int4 { data, .. } => Arg::buf(data),
        };
        let (hkv, nh, sp) = (Arg::int(dims.hkv), Arg::int(dims.group()), Arg::int(self.splits));
        let scale = Arg::F32((std::f64::consts::LOG2_E / (dims.d as f64).sqrt()) as f32);
        let (o, m, l) = (Arg::buf(&self.ws.o), Arg::buf(&self.ws.m), Arg::buf(&self.ws.l));
        let inputs = [
            Arg::buf(a.q),
            cache(&a.k),
            cache(&a.v),
            Arg::buf(a.seq_lens.device()),
            Arg::int(dims.tmax),
            hkv,
            nh,
            sp,
            scale,
        ];
        // SAFETY: the argument lists match the kernel signatures; every length was checked above and
        // at prepare (the workspace holds B*HQ*splits rows), and the kernel reads only tokens below
        // seq_lens[b] <= Tmax.
        unsafe {
            self.split.enqueue(stream, &[&[o, m, l][..], &inputs].concat())?;
            let lse = Arg::buf(&self.ws.lse);
            if self.warp_merge {
                self.combine.enqueue(stream, &[Arg::buf(a.out), lse, o, m, l, Arg::int(dims.b * dims.hq), sp])
            } else {
                self.combine.enqueue(stream, &[Arg::buf(a.out), lse, o, m, l, sp, Arg::int(dims.d)])
            }
        }
    }

    pub fn splits(&self) -> usize {
        self.splits
    }
}

impl PreparedStage for Prepared {
    fn resources(&self) -> Vec<ResourceUse> {
        vec![self.split.resources().clone(), self.combine.resources().clone()]
    }
}

/// f64 reference for the sequences `seqs`: `[seqs.len(), HQ, D]` (attention's decode reference,
/// without ALiBi). `k_row(b, t, kvh, out)` and `v_row` write one cached row as f64 (from the bf16
/// cache or dequantized).
pub fn reference<K, V>(dims: &Dims, q: &[f32], lens: &[usize], seqs: &[usize], k_row: K, v_row: V) -> Vec<f64>
where
    K: Fn(usize, usize, usize, &mut [f64]) + Sync,
    V: Fn(usize, usize, usize, &mut [f64]) + Sync,
{
    let heads = Heads { hq: dims.hq, hkv: dims.hkv, d: dims.d };
    attention::decode::reference(heads, q, lens, seqs, None, k_row, v_row).0
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
        require(splits >= 0, "splits >= 0 (0 = heuristic)", || format!("splits = {splits}"))?;
        require(splits <= MAX_SPLITS as i64, SPLITS, || format!("splits = {splits}"))?;
        let fmt = KvFormat::from_key(s.req("fmt")?)?;
        if let KvFormat::Int4 { groups } = fmt {
            check_int4(dims.d, groups)?;
        }
        Ok(DecodeShape { dims, seq: seq as usize, ragged: ragged == 1, fmt, splits: splits as usize })
    }

    /// Per-sequence lengths: `seq`, or uniform in `[ceil(seq/2), seq]` when ragged.
    pub fn lens(&self, seed: u64) -> Vec<usize> {
        lengths(self.dims.b, self.seq, self.ragged, seed)
    }
}

/// Whether a stage can run on a problem holding the `shape_fmt` quantized cache.
fn stage_runs_on(stage: KvFormat, shape_fmt: KvFormat) -> bool {
    stage == KvFormat::Bf16 || stage == shape_fmt
}

impl Op for Decode {
    fn leave_one_out(&self) -> Vec<Variant> {
        // Both ladders have an all-on stage: their derived rows are named by ladder.
        stages()
            .iter()
            .flat_map(|all| {
                let prefix = if all.has("OPT6") { "group" } else { "row" };
                LeaveOneOut.derive(all).into_iter().map(move |mut v| {
                    v.name = Cow::Owned(format!("{prefix}-{}", v.name));
                    v
                })
            })
            .collect()
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
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        let fmt = stage_format(v).unwrap_or(KvFormat::Bf16);
        let at = |b, tmax, hq, hkv, d, splits| shape(b, tmax, tmax.min(64), false, hq, hkv, d, fmt, splits);
        vec![
            Limit { constraint: HEAD_DIM, past: at(2, 64, 8, 1, 96, 0), inside: Some(at(2, 64, 8, 1, 64, 0)) },
            Limit { constraint: GRID_B, past: at(65536, 1, 8, 1, 64, 1), inside: Some(at(65535, 1, 8, 1, 64, 1)) },
            Limit {
                constraint: GRID_HKV,
                past: at(1, 1, 65536, 65536, 64, 1),
                inside: Some(at(1, 1, 65535, 65535, 64, 1)),
            },
            Limit { constraint: GROUP, past: at(2, 64, 9, 1, 64, 0), inside: Some(at(2, 64, 8, 1, 64, 0)) },
            Limit { constraint: ROWS, past: at(2, 1 << 30, 8, 1, 64, 0), inside: None },
            Limit { constraint: SPLITS, past: at(2, 64, 8, 1, 64, 257), inside: Some(at(2, 300, 8, 1, 64, 256)) },
        ]
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let s = DecodeShape::parse(shape)?;
        let dims = s.dims;
        let lens = s.lens(seed ^ 0x5EED);
        // 0 stays 0: each stage sizes its own split count at prepare.
        let splits = s.splits;
        let q_bf: Vec<bf16> =
            uniform(dims.b * dims.hq * dims.d, -2.0, 2.0, seed ^ 1).into_iter().map(bf16::from_f32).collect();
        let q: Vec<f32> = q_bf.iter().map(|x| x.to_f32()).collect();
        let k = cache(&dims, &lens, seed ^ 2, true);
        let v = cache(&dims, &lens, seed ^ 3, false);
        let quantized = match s.fmt {
            KvFormat::Int4 { groups } => Some((quantize(&k, dims.d, groups), quantize(&v, dims.d, groups), groups)),
            KvFormat::Bf16 => None,
        };
        let checked = checked_seqs(dims.b, seed ^ 4);
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
        // The same quantized bytes in the fragment layout, for the fragment-direct stages.
        let fragments = quantized.as_ref().map(|(kq, vq, groups)| {
            let frag = |c: &[u8], role| to_fragments(c, dims.b, dims.tmax, dims.hkv, d, *groups, role);
            (frag(kq, Role::K), frag(vq, Role::V))
        });
        let qbytes = dims.b * dims.hq * d * 2;
        let int4_bytes = |c: &Option<(Vec<u8>, Vec<u8>, usize)>| c.as_ref().map_or(0, |(k, v, _)| k.len() + v.len());
        let frag_bytes = fragments.as_ref().map_or(0, |(k, v)| k.len() + v.len());
        let per_copy = 2 * k.len() * 2 + int4_bytes(&quantized) + frag_bytes + 2 * qbytes;
        let copies = rotation_copies(gpu, per_copy as u64);
        let upload = |c: &[u8]| Rotated::upload(gpu, c, copies);
        let int4 = match (&quantized, &fragments) {
            (Some((kq, vq, _)), Some((kf, vf))) => {
                Some(Int4Caches { rows: (upload(kq)?, upload(vq)?), fragments: (upload(kf)?, upload(vf)?) })
            }
            _ => None,
        };
        Ok(Box::new(DecodeProblem {
            s,
            splits,
            seq_lens: SeqLens::new(gpu, &lens, dims.tmax)?,
            q: Rotated::upload(gpu, &q_bf, copies)?,
            kb: Rotated::upload(gpu, &k, copies)?,
            vb: Rotated::upload(gpu, &v, copies)?,
            int4,
            out: Rotated::outputs(gpu, dims.b * dims.hq * d, copies)?,
            checked,
            ref_bf16,
            ref_deq,
            copies,
            prepared: Current::default(),
        }))
    }
}

/// A `[B, Tmax, HKV, D]` cache for `lens`: uniform values (with the outlier channel of
/// [`crate::quantize::cache_values`] for K) below each sequence's length, NaN past it, so a kernel
/// that reads past `seq_lens[b]` fails verification.
pub fn cache(dims: &Dims, lens: &[usize], seed: u64, outlier: bool) -> Vec<bf16> {
    let per = dims.tmax * dims.hkv * dims.d;
    // Every value written once, on every core, straight into the cache (no NaN fill on one core
    // first, no per-sequence vectors): a cache at B = 512 is 537M values.
    let mut c = zeroed_bf16(dims.b * per);
    c.par_chunks_mut(per).enumerate().for_each(|(b, chunk)| {
        let n = lens[b] * dims.hkv * dims.d;
        let s = seed ^ (b as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let (vals, past) = chunk.split_at_mut(n);
        if outlier {
            fill_cache_values(vals, dims.d, s);
        } else {
            fill_uniform(vals, -1.0, 1.0, s, |_, x| bf16::from_f32(x));
        }
        past.fill(bf16::NAN);
    });
    c
}

/// A problem's quantized K and V caches, in both layouts.
struct Int4Caches {
    rows: (Rotated<u8>, Rotated<u8>),
    fragments: (Rotated<u8>, Rotated<u8>),
}

struct DecodeProblem {
    s: DecodeShape,
    splits: usize,
    seq_lens: SeqLens,
    q: Rotated<bf16>,
    kb: Rotated<bf16>,
    vb: Rotated<bf16>,
    int4: Option<Int4Caches>,
    out: Rotated<bf16>,
    checked: Vec<usize>,
    ref_bf16: Vec<f64>,
    ref_deq: Option<Vec<f64>>,
    copies: usize,
    prepared: Current<Prepared>,
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
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        let fmt = stage_format(v)?;
        require(
            fmt == KvFormat::Bf16 || self.s.fmt == fmt,
            &format!("stage {} needs a fmt={} problem", v.name, fmt.key()),
            || format!("fmt = {}", self.s.fmt.key()),
        )?;
        Ok(self.prepared.set(v, prepare(gpu, v, self.s.dims, self.splits)?))
    }
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let (k, vv) = match (p.plan.format, &self.int4) {
            (KvFormat::Bf16, _) => (Cache::Bf16(self.kb.get(copy)), Cache::Bf16(self.vb.get(copy))),
            (KvFormat::Int4 { groups }, Some(int4)) => {
                let layout = p.plan.layout;
                let (kc, vc) = match layout {
                    Layout::Rows => &int4.rows,
                    Layout::Fragments => &int4.fragments,
                };
                (Cache::Int4 { data: kc.get(copy), groups, layout }, Cache::Int4 { data: vc.get(copy), groups, layout })
            }
            (KvFormat::Int4 { .. }, None) => return Err(Error::NotPrepared),
        };
        let args = DecodeArgs { out: self.out.get_mut(copy), q: self.q.get(copy), k, v: vv, seq_lens: &self.seq_lens };
        p.enqueue(stream, args)
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, p) = self.prepared.get()?;
        let splits = p.splits;
        let d = self.s.dims;
        let row = d.hq * d.d;
        let out = gpu.download(self.out.get(copy))?;
        let got: Vec<bf16> = self.checked.iter().flat_map(|&b| out[b * row..(b + 1) * row].iter().copied()).collect();
        let fmt = stage_format(v)?;
        let mut notes = vec![format!("splits = {splits}")];
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
