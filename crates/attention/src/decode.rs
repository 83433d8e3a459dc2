//! Decode attention: one query token per sequence against a KV cache.
//!
//! `O[b, hq] = softmax(scale · Q[b, hq] · K[b, :L_b, kvh]ᵀ [+ ALiBi]) · V[b, :L_b, kvh]`, with
//! `kvh = hq / (HQ/HKV)` (MHA, GQA, MQA) and the natural logsumexp of the scores per (sequence, head)
//! so partial results can be merged. The cache is bf16 or fp16 and all arithmetic is fp32. There
//! are two layouts of the same logical cache:
//!
//! - contiguous: `[B, Tmax, HKV, D]` for K and for V;
//! - paged (vLLM's): a pool of blocks of `bs` tokens reached through a block table `[B, max_blocks]`.
//!   K is `[num_blocks, HKV, D/x, bs, x]` with x = 16 bytes / element size, and V is
//!   `[num_blocks, HKV, D, bs]`.
//!
//! The shared machinery also lives here: sequence lengths, ALiBi slopes, the f64 reference and the
//! choice of checked sequences. `quant-int4`'s INT4 decode builds on these.
//!
//! Shape keys: `B`, `HQ`, `HKV`, `D`, `seq` (the cache capacity Tmax, and every length unless
//! `ragged=1`, which draws each length in `[ceil(seq/2), seq]`), `bs` (the paged block size),
//! `dtype` (0 bf16, 1 fp16), `alibi` (0/1) and `splits` (0 = the heuristic).

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, CudaStream, PinnedHostSlice};
use common::data::{fill_uniform, rng, rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, Define, DriverContext, Error, Gpu, Launch, LaunchShape, Limit, Op, Precision,
    Prepared as Current, PreparedStage, Problem, Requirements, ResourceUse, Result, Shape, Variant, Workload,
};
use half::{bf16, f16};
use rand::seq::SliceRandom;
use rayon::prelude::*;

use crate::{FAMILY, SOURCES};

const OP: &str = "decode";

common::declare_op! {
    pub struct Decode {
        name: OP,
        description: "decode attention (one query token) over a bf16/fp16 KV cache, contiguous [B,Tmax,HKV,D] and \
                      paged (vLLM layout); MHA/GQA/MQA, ALiBi (alibi=1), lse; seq = Tmax, ragged=1 draws lengths in \
                      [seq/2, seq]",
        shape_keys: ["B", "HQ", "HKV", "D", "seq", "ragged", "bs", "dtype", "alibi", "splits", "warps"],
        stages: stages,
    }
}

/// Sequences verified at most per problem; larger batches check an evenly spaced subset (and that
/// every other output is finite).
pub const MAX_CHECKED_SEQS: usize = 64;
/// Largest split count accepted.
pub const MAX_SPLITS: usize = 256;
/// Scores a block keeps in shared memory (128 KiB of fp32).
const MAX_SCORES: usize = 32768;
/// The scores per block the packed stage's split heuristic aims at (8 KiB).
const PACKED_SCORES: usize = 2048;

pub(crate) const HEAD_DIM: &str = "D in {64, 128}";
pub(crate) const GROUPS: &str = "HQ % HKV == 0";
pub(crate) const GRID_B: &str = "B <= 65535";
pub(crate) const ELEMS: &str = "B * HQ * Tmax < 2^31";
const SCORES_1: &str = "Tmax <= 32768";
const SPLITS: &str = "splits <= 256";
/// Stage 10's splits are one thread-block cluster: at most the portable cluster size.
pub const MAX_CLUSTER_SPLITS: usize = 8;
const CLUSTER_SPLITS: &str = "splits <= 8";
const SCORES_SPLIT: &str = "Tmax / splits <= 32768";
const PACKED_GROUP: &str = "HQ / HKV in {1, 2, 4, 8}";
pub(crate) const MMA_GROUP: &str = "HQ / HKV <= 16";
const SCORES_PACKED: &str = "G * Tmax / splits <= 32768";
const BLOCK_SIZE: &str = "block_size in {16, 32}";
const SCORES_PAGED: &str = "max_blocks * block_size <= 32768";

// ---------------------------------------------------------------- shared machinery

/// Validated sequence lengths, on the host and the device.
pub struct SeqLens {
    host: Vec<usize>,
    dev: CudaSlice<i32>,
    tmax: usize,
}

/// Every length in `1..=tmax`, one per sequence.
pub fn check_seq_lens(lens: &[usize], b: usize, tmax: usize) -> Result<()> {
    require(lens.len() == b, "len(seq_lens) == B", || format!("len(seq_lens) = {}, B = {b}", lens.len()))?;
    if let Some((i, &l)) = lens.iter().enumerate().find(|(_, &l)| l == 0 || l > tmax) {
        return Err(Error::constraint("1 <= seq_lens[b] <= Tmax", format!("seq_lens[{i}] = {l}, Tmax = {tmax}")));
    }
    Ok(())
}

impl SeqLens {
    /// Checks every length against `tmax` and uploads them.
    pub fn new(gpu: &Gpu, lens: &[usize], tmax: usize) -> Result<SeqLens> {
        check_seq_lens(lens, lens.len(), tmax)?;
        require(tmax < i32::MAX as usize, "Tmax < 2^31", || format!("Tmax = {tmax}"))?;
        let dev = gpu.upload(&lens.iter().map(|&l| l as i32).collect::<Vec<i32>>())?;
        Ok(SeqLens { host: lens.to_vec(), dev, tmax })
    }

    /// New lengths for the same sequences, checked as in [`SeqLens::new`] and copied into the same
    /// device buffer on the harness stream (so a captured graph that reads it sees them).
    pub fn set(&mut self, gpu: &Gpu, lens: &[usize]) -> Result<()> {
        check_seq_lens(lens, self.host.len(), self.tmax)?;
        let v: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
        gpu.stream().memcpy_htod(&v, &mut self.dev).ctx("copy lengths")?;
        self.host.copy_from_slice(lens);
        Ok(())
    }

    pub fn host(&self) -> &[usize] {
        &self.host
    }

    pub fn device(&self) -> &CudaSlice<i32> {
        &self.dev
    }

    /// The lengths on the device, for a kernel that moves them on itself (the decode step's greedy
    /// loop): it must keep each in `1..=Tmax`. The host copy is then stale until the next [`SeqLens::set`].
    pub fn device_mut(&mut self) -> &mut CudaSlice<i32> {
        &mut self.dev
    }
}

/// The sequences checked against the reference: all of them up to [`MAX_CHECKED_SEQS`], else the
/// harness's sample drawn from `seed` ([`common::check::sample_rows`]: the first, the last and the
/// rest at random); every other sequence's output is still checked finite.
pub fn checked_seqs(b: usize, seed: u64) -> Vec<usize> {
    common::check::sample_rows(b, MAX_CHECKED_SEQS, seed)
}

/// Per-sequence lengths: `seq`, or uniform in `[ceil(seq/2), seq]` when ragged.
pub fn lengths(b: usize, seq: usize, ragged: bool, seed: u64) -> Vec<usize> {
    if !ragged {
        return vec![seq; b];
    }
    let lo = seq.div_ceil(2);
    let span = seq - lo + 1;
    uniform(b, 0.0, 1.0, seed).into_iter().map(|u| lo + ((u * span as f32) as usize).min(span - 1)).collect()
}

/// The ALiBi slopes of the paper (Press et al.) for `n` heads: `2^(-8 i / n)` for i = 1..n when n
/// is a power of two; otherwise those of the nearest lower power of two, then every other slope of
/// twice that many heads.
pub fn alibi_slopes(n: usize) -> Vec<f64> {
    let pow2 = |n: usize| (1..=n).map(|i| 2f64.powf(-8.0 * i as f64 / n as f64)).collect::<Vec<f64>>();
    if n.is_power_of_two() {
        return pow2(n);
    }
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let mut s = pow2(p);
    s.extend(pow2(2 * p).into_iter().step_by(2).take(n - p));
    s
}

/// The head layout of a decode call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
}

/// f64 reference for the sequences `seqs`: (out `[seqs.len(), HQ, D]`, lse `[seqs.len(), HQ]`).
/// `k_row(b, t, kvh, out)` and `v_row` write one cached row as f64; `slopes` adds ALiBi.
pub fn reference<K, V>(
    heads: Heads,
    q: &[f32],
    lens: &[usize],
    seqs: &[usize],
    slopes: Option<&[f64]>,
    k_row: K,
    v_row: V,
) -> (Vec<f64>, Vec<f64>)
where
    K: Fn(usize, usize, usize, &mut [f64]) + Sync,
    V: Fn(usize, usize, usize, &mut [f64]) + Sync,
{
    let Heads { hq, hkv, d } = heads;
    let nh = hq / hkv;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0f64; seqs.len() * hq * d];
    let mut lse = vec![0f64; seqs.len() * hq];
    out.par_chunks_mut(nh * d).zip(lse.par_chunks_mut(nh)).enumerate().for_each(|(i, (o, ls))| {
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
            let head = kvh * nh + h;
            let qr = &q[(b * hq + head) * d..][..d];
            for t in 0..l {
                let dot = k[t * d..(t + 1) * d].iter().zip(qr).map(|(a, b)| a * *b as f64).sum::<f64>();
                s[t] = dot * scale + slopes.map_or(0.0, |sl| sl[head] * (t as f64 - (l - 1) as f64));
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
            ls[h] = m + sum.ln();
        }
    });
    (out, lse)
}

// ---------------------------------------------------------------- the element type

/// The cache element type; caches, q and out are stored as its 16-bit patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    Bf16,
    Fp16,
}

impl Dtype {
    pub fn from_key(k: i64) -> Result<Dtype> {
        match k {
            0 => Ok(Dtype::Bf16),
            1 => Ok(Dtype::Fp16),
            _ => Err(Error::constraint("dtype in {0 (bf16), 1 (fp16)}", format!("dtype = {k}"))),
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "f16",
        }
    }

    /// The 16-bit pattern of `x` rounded to this type.
    pub fn bits(self, x: f32) -> u16 {
        match self {
            Dtype::Bf16 => bf16::from_f32(x).to_bits(),
            Dtype::Fp16 => f16::from_f32(x).to_bits(),
        }
    }

    pub fn value(self, bits: u16) -> f32 {
        match self {
            Dtype::Bf16 => bf16::from_bits(bits).to_f32(),
            Dtype::Fp16 => f16::from_bits(bits).to_f32(),
        }
    }

    /// The NaN pattern (for slots a kernel must never read as data).
    fn nan(self) -> u16 {
        self.bits(f32::NAN)
    }
}

// ---------------------------------------------------------------- stages

/// Which cache layout a stage reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Contiguous,
    Paged,
}

/// How a stage runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Scores, softmax and P.V as three simple kernels through a scores buffer.
    Naive,
    /// One block per (query head, sequence), thread groups, scores in shared memory.
    DecodingAttention,
    /// Stage 1 split across blocks along the sequence, then a combine.
    FlashDecoding,
    /// vLLM's v1 on the paged cache.
    PagedV1,
    /// vLLM's v2: partitions of `PA_PARTITION` tokens and a reduce.
    PagedV2,
    /// Flash-decoding with the query heads of one KV head in one block.
    GqaPacked,
    /// The query heads of one KV head as the rows of `mma.sync` tiles, per-warp online softmax.
    TensorCore,
    /// Stage 6 in one launch: splits to fill the SMs once, the combine in the split kernel.
    FusedCombine,
    /// [`Plan::FusedCombine`] with a (sequence, KV head)'s splits as one cluster, merged through
    /// distributed shared memory.
    ClusterMerge,
}

impl Plan {
    /// The most splits the plan takes and the constraint that says so (a cluster's blocks at
    /// stage 10).
    fn splits_limit(self) -> (usize, &'static str) {
        if self == Plan::ClusterMerge {
            (MAX_CLUSTER_SPLITS, CLUSTER_SPLITS)
        } else {
            (MAX_SPLITS, SPLITS)
        }
    }

    fn layout(self) -> Layout {
        match self {
            Plan::PagedV1 | Plan::PagedV2 => Layout::Paged,
            _ => Layout::Contiguous,
        }
    }
}

/// Which cache layout stage `v` of this op reads (a plan that holds one layout picks by this).
pub fn layout_of(v: &Variant) -> Result<Layout> {
    Ok(v.plan::<Plan>()?.layout())
}

fn stages() -> Vec<Variant> {
    let k = |stage, name, file, plan: Plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Bf16, summary)
            .with_plan(plan)
            .with_requirements(Requirements::SM80)
    };
    let threads = [("DA_THREADS", 128)];
    vec![
        k(
            0,
            "naive",
            "decode/00_naive.cu",
            Plan::Naive,
            "S = q.K^T, softmax, P.V as three kernels, a thread per element",
        ),
        k(
            1,
            "decoding-attention",
            "decode/01_decoding_attention.cu",
            Plan::DecodingAttention,
            "block per (head, sequence): thread groups, 16-byte loads, shuffles, scores in shared memory",
        )
        .with_tunables(&threads),
        k(
            2,
            "flash-decoding",
            "decode/02_flash_decoding.cu",
            Plan::FlashDecoding,
            "stage 1 split along the sequence across blocks, logsumexp combine",
        )
        .with_tunables(&threads),
        k(
            3,
            "paged-v1",
            "decode/03_paged_v1.cu",
            Plan::PagedV1,
            "vLLM v1 on the paged cache: a warp per KV block, q in registers, block-table indirection",
        )
        .with_tunables(&[("PA_THREADS", 128)]),
        k(
            4,
            "paged-v2",
            "decode/04_paged_v2.cu",
            Plan::PagedV2,
            "vLLM v2: partitions of 512 tokens, per-partition max and exp-sum, reduce kernel",
        )
        .with_tunables(&[("PA_THREADS", 128), ("PA_PARTITION", 512)]),
        k(
            5,
            "gqa-packed",
            "decode/05_gqa_packed.cu",
            Plan::GqaPacked,
            "flash-decoding with a KV head's query heads in one block (each K/V row read once per group), max(1, 4/G) rows in flight",
        )
        .with_tunables(&[("DA_THREADS", 128), ("DA_ROWS", 4)]),
        k(
            6,
            "tensor-core",
            "decode/06_tensor_core.cu",
            Plan::TensorCore,
            "a KV head's query heads as the rows of mma.sync m16n8k16 tiles, K/V by cp.async into swizzled per-warp rings, online softmax per warp",
        )
        .with_tunables(&[("TC_WARPS", 4), ("TC_STAGES", 3)]),
        k(
            7,
            "fused-combine",
            "decode/07_fused_combine.cu",
            Plan::FusedCombine,
            "stage 6 in one launch: splits only to fill the SMs once; one split writes O itself, several merge in the last block (ticket)",
        )
        .with_tunables(&[("TC_WARPS", 4), ("TC_STAGES", 3)]),
        k(
            8,
            "batched-merge",
            "decode/07_fused_combine.cu",
            Plan::FusedCombine,
            "stage 7 with the last block's merge requesting every split's max, sum and output at once (16 splits a round trip to L2)",
        )
        .with_tunables(&[("TC_WARPS", 4), ("TC_STAGES", 3)])
        .with_defines(vec![Define::on("DECODE_BATCHED_MERGE")]),
        k(
            9,
            "early-cache",
            "decode/07_fused_combine.cu",
            Plan::FusedCombine,
            "stage 8 with each block's first K/V tiles requested before its dependent wait (the cached rows; q and the step's own row after it)",
        )
        .with_tunables(&[("TC_WARPS", 4), ("TC_STAGES", 3)])
        .with_defines(vec![Define::on("DECODE_BATCHED_MERGE"), Define::on("DECODE_EARLY_CACHE")]),
        k(
            10,
            "cluster-merge",
            "decode/10_cluster_merge.cu",
            Plan::ClusterMerge,
            "stage 9 with a (sequence, KV head)'s splits (at most 8) as one thread-block cluster: partials left in shared memory, merged through distributed shared memory after a cluster barrier (no fence, ticket or last block)",
        )
        .with_tunables(&[("TC_WARPS", 4), ("TC_STAGES", 3)])
        .with_requirements(Requirements::SM90),
        k(
            11,
            "warps-by-shape",
            "decode/07_fused_combine.cu",
            Plan::FusedCombine,
            "stage 9 with 8 or 16 warps a block where each warp keeps two tiles of its split and every block stays resident: 2-4x the K/V bytes in flight where few blocks run (GPT-2's B = 8)",
        )
        .with_tunables(&[("TC_WARPS", 4), ("TC_STAGES", 3)])
        .with_defines(vec![
            Define::on("DECODE_BATCHED_MERGE"),
            Define::on("DECODE_EARLY_CACHE"),
            Define::on("DECODE_WARPS_BY_SHAPE"),
        ]),
    ]
}

/// The layout a stage reads.
pub fn stage_layout(v: &Variant) -> Result<Layout> {
    Ok(v.plan::<Plan>()?.layout())
}

/// The sizes of one decode call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeDims {
    pub b: usize,
    pub heads: Heads,
    /// Cache capacity per sequence (contiguous: its second dimension; paged: max_blocks * bs).
    pub tmax: usize,
    pub dtype: Dtype,
    /// Paged block size (ignored by the contiguous stages).
    pub block_size: usize,
    /// Split count of the split stages; 0 = the heuristic.
    pub splits: usize,
    /// Stage 11's warps a block, one of 4, 8 and 16 (16 only at D = 64); 0 = its choice by shape.
    pub warps: usize,
}

impl DecodeDims {
    fn group(&self) -> usize {
        self.heads.hq / self.heads.hkv
    }

    /// Blocks per sequence in the paged layout.
    pub fn max_blocks(&self) -> usize {
        self.tmax.div_ceil(self.block_size.max(1))
    }
}

/// The split count when none is given: enough blocks for about four per SM, at most one split per
/// 128 cached tokens, at most [`MAX_SPLITS`].
pub fn default_splits(sm_count: usize, blocks: usize, tmax: usize) -> usize {
    let want = (4 * sm_count.max(1)).div_ceil(blocks.max(1));
    want.clamp(1, tmax.div_ceil(128).clamp(1, MAX_SPLITS))
}

/// The split count that fills the SMs at most once: as many splits of `pairs` blocks each as fit
/// one block per SM (at least one), at most one split per 128 cached tokens and at most
/// [`MAX_SPLITS`].
pub fn fill_splits(sm_count: usize, pairs: usize, tmax: usize) -> usize {
    (sm_count / pairs.max(1)).clamp(1, tmax.div_ceil(128).clamp(1, MAX_SPLITS))
}

/// The most splits stage `v` takes (a cluster's blocks at stage 10).
pub fn max_splits(v: &Variant) -> Result<usize> {
    Ok(v.plan::<Plan>()?.splits_limit().0)
}

/// Shape constraints of `v` at `d`: what its header's `Limits:` line documents. With `splits = 0`
/// the split limits are checked at prepare, once the heuristic has chosen.
pub fn check_shape(v: &Variant, d: DecodeDims) -> Result<()> {
    let plan = v.plan::<Plan>()?;
    let Heads { hq, hkv, d: dim } = d.heads;
    require(dim == 64 || dim == 128, HEAD_DIM, || format!("D = {dim}"))?;
    if d.warps != 0 {
        require(v.has(WARPS_BY_SHAPE), WARPS_STAGE, || format!("warps = {}", d.warps))?;
        let built = WARP_CHOICES.contains(&(d.warps as u32)) && (dim == 64 || d.warps <= 8);
        require(built, WARPS_BUILT, || format!("warps = {}, D = {dim}", d.warps))?;
    }
    require(hq >= 1 && hkv >= 1 && hq.is_multiple_of(hkv), GROUPS, || format!("HQ = {hq}, HKV = {hkv}"))?;
    require(d.b >= 1 && d.tmax >= 1, "B >= 1 and Tmax >= 1", || format!("B = {}, Tmax = {}", d.b, d.tmax))?;
    require(d.b <= 65535, GRID_B, || format!("B = {}", d.b))?;
    if plan.layout() == Layout::Paged {
        let bs = d.block_size;
        require(bs == 16 || bs == 32, BLOCK_SIZE, || format!("block_size = {bs}"))?;
        if plan == Plan::PagedV1 {
            let n = d.max_blocks() * bs;
            require(n <= MAX_SCORES, SCORES_PAGED, || format!("max_blocks * block_size = {n}"))?;
        }
        return Ok(());
    }
    let n = d.b.checked_mul(hq).and_then(|x| x.checked_mul(d.tmax));
    require(n.is_some_and(|n| n < 1 << 31), ELEMS, || format!("B = {}, HQ = {hq}, Tmax = {}", d.b, d.tmax))?;
    match plan {
        Plan::DecodingAttention => require(d.tmax <= MAX_SCORES, SCORES_1, || format!("Tmax = {}", d.tmax))?,
        Plan::TensorCore | Plan::FusedCombine | Plan::ClusterMerge => {
            let (most, constraint) = plan.splits_limit();
            require(d.splits <= most, constraint, || format!("splits = {}", d.splits))?;
            require(d.group() <= 16, MMA_GROUP, || format!("HQ / HKV = {}", d.group()))?;
        }
        Plan::FlashDecoding | Plan::GqaPacked => {
            require(d.splits <= MAX_SPLITS, SPLITS, || format!("splits = {}", d.splits))?;
            if plan == Plan::GqaPacked {
                let g = d.group();
                require([1, 2, 4, 8].contains(&g), PACKED_GROUP, || format!("HQ / HKV = {g}"))?;
            }
            if d.splits > 0 {
                let (g, constraint) =
                    if plan == Plan::GqaPacked { (d.group(), SCORES_PACKED) } else { (1, SCORES_SPLIT) };
                let n = g * d.tmax.div_ceil(d.splits);
                require(n <= MAX_SCORES, constraint, || format!("{n} scores per block"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// A paged KV cache: the K and V block pools and the block table, checked on the host when made.
pub struct PagedCache {
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    tables: CudaSlice<i32>,
    tables_host: Vec<i32>,
    b: usize,
    num_blocks: usize,
    block_size: usize,
    max_blocks: usize,
    heads: Heads,
}

impl PagedCache {
    /// Uploads the pools (`num_blocks` blocks each, in the layouts of the module docs) and the
    /// table `[B, max_blocks]` after checking every entry lies in the pool.
    pub fn new(
        gpu: &Gpu,
        k: &[u16],
        v: &[u16],
        tables: &[i32],
        b: usize,
        block_size: usize,
        heads: Heads,
    ) -> Result<PagedCache> {
        require_len("V pool", v.len(), k.len())?;
        PagedCache::from_pools(gpu, gpu.upload(k)?, gpu.upload(v)?, tables, b, block_size, heads)
    }

    /// Zeroed pools of `num_blocks` blocks under the table `[B, max_blocks]` (checked as in
    /// [`PagedCache::new`]): the cache a model fills as it runs.
    pub fn zeroed(
        gpu: &Gpu,
        num_blocks: usize,
        tables: &[i32],
        b: usize,
        block_size: usize,
        heads: Heads,
    ) -> Result<PagedCache> {
        let n = num_blocks.checked_mul(heads.hkv * heads.d * block_size);
        let n = n.ok_or_else(|| Error::constraint("num_blocks * HKV * D * block_size fits", "overflow"))?;
        PagedCache::from_pools(gpu, gpu.zeros(n)?, gpu.zeros(n)?, tables, b, block_size, heads)
    }

    fn from_pools(
        gpu: &Gpu,
        k: CudaSlice<u16>,
        v: CudaSlice<u16>,
        tables: &[i32],
        b: usize,
        block_size: usize,
        heads: Heads,
    ) -> Result<PagedCache> {
        require(block_size == 16 || block_size == 32, BLOCK_SIZE, || format!("block_size = {block_size}"))?;
        let block = heads.hkv * heads.d * block_size;
        require(
            !k.is_empty() && k.len().is_multiple_of(block),
            "len(K pool) is a multiple of HKV*D*block_size",
            || format!("len = {}, block = {block}", k.len()),
        )?;
        require_len("V pool", v.len(), k.len())?;
        let num_blocks = k.len() / block;
        require(b >= 1 && tables.len().is_multiple_of(b), "len(block_tables) is a multiple of B", || {
            format!("len = {}, B = {b}", tables.len())
        })?;
        if let Some((i, &e)) = tables.iter().enumerate().find(|(_, &e)| e < 0 || e as usize >= num_blocks) {
            return Err(Error::constraint(
                format!("0 <= block_tables[i] < num_blocks = {num_blocks}"),
                format!("block_tables[{i}] = {e}"),
            ));
        }
        Ok(PagedCache {
            k,
            v,
            tables: gpu.upload(tables)?,
            tables_host: tables.to_vec(),
            b,
            num_blocks,
            block_size,
            max_blocks: tables.len() / b,
            heads,
        })
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn max_blocks(&self) -> usize {
        self.max_blocks
    }

    pub fn batch(&self) -> usize {
        self.b
    }

    pub fn heads(&self) -> Heads {
        self.heads
    }

    /// The block table `[B, max_blocks]`, as checked.
    pub fn tables_host(&self) -> &[i32] {
        &self.tables_host
    }

    /// The K and V pools and the block table, for a kernel that writes into the cache.
    pub(crate) fn buffers(&mut self) -> (&mut CudaSlice<u16>, &mut CudaSlice<u16>, &CudaSlice<i32>) {
        (&mut self.k, &mut self.v, &self.tables)
    }

    /// Downloads the K and V pools (for checks).
    pub fn download_pools(&self, gpu: &Gpu) -> Result<(Vec<u16>, Vec<u16>)> {
        Ok((gpu.download(&self.k)?, gpu.download(&self.v)?))
    }
}

/// Where element `e` of head `h` of the token in slot `slot` of pool block `phys` lives in the
/// paged K pool and in the V pool (the layouts of the module docs, 16-bit elements).
pub fn paged_offsets(heads: Heads, block_size: usize, phys: usize, slot: usize, h: usize, e: usize) -> (usize, usize) {
    let (bs, dim, x) = (block_size, heads.d, 8);
    let base = (phys * heads.hkv + h) * dim * bs;
    (base + ((e / x) * bs + slot) * x + e % x, base + e * bs + slot)
}

/// A contiguous `[B, Tmax, HKV, D]` cache pair in page-locked host memory mapped into the device's
/// address space: a contiguous stage reads it in place, over the host link.
pub struct HostCache {
    k: PinnedHostSlice<u16>,
    v: PinnedHostSlice<u16>,
    k_dev: u64,
    v_dev: u64,
}

impl HostCache {
    pub fn new(gpu: &Gpu, k: &[u16], v: &[u16]) -> Result<HostCache> {
        require_len("V cache", v.len(), k.len())?;
        let (k, v) = (gpu.pinned(k)?, gpu.pinned(v)?);
        Ok(HostCache { k_dev: gpu.mapped_ptr(&k)?, v_dev: gpu.mapped_ptr(&v)?, k, v })
    }

    /// The K and V caches (for copies to the device).
    pub fn host(&self) -> (&PinnedHostSlice<u16>, &PinnedHostSlice<u16>) {
        (&self.k, &self.v)
    }
}

/// The cache one call reads, in the stage's layout.
pub enum KvCache<'a> {
    /// `[B, Tmax, HKV, D]` each.
    Contiguous {
        k: &'a CudaSlice<u16>,
        v: &'a CudaSlice<u16>,
    },
    /// The contiguous layout, in mapped host memory.
    HostMapped(&'a HostCache),
    Paged(&'a PagedCache),
}

/// The buffers of one decode call.
pub struct DecodeArgs<'a> {
    /// `[B, HQ, D]` of the cache's type.
    pub out: &'a mut CudaSlice<u16>,
    /// `[B, HQ]` natural logsumexp of the scores.
    pub lse: &'a mut CudaSlice<f32>,
    /// `[B, HQ, D]` of the cache's type.
    pub q: &'a CudaSlice<u16>,
    pub cache: KvCache<'a>,
    pub seq_lens: &'a SeqLens,
    /// `[HQ]` ALiBi slopes, or none.
    pub alibi: Option<&'a CudaSlice<f32>>,
}

/// How a prepared stage runs.
enum Stage {
    Naive {
        scores: Launch,
        softmax: Launch,
        pv: Launch,
        s: CudaSlice<f32>,
    },
    Fused(Launch),
    Split {
        split: Launch,
        combine: Launch,
        o: CudaSlice<f32>,
        m: CudaSlice<f32>,
        l: CudaSlice<f32>,
        parts: usize,
    },
    /// A split kernel that leaves its partials for the next kernel to merge ([`PARTIALS_OUT`]).
    Partials {
        kernel: Launch,
        o: CudaSlice<f32>,
        m: CudaSlice<f32>,
        l: CudaSlice<f32>,
        parts: usize,
    },
    /// A split kernel whose last block per (sequence, KV head) merges; `tickets` count the splits done.
    SplitFused {
        kernel: Launch,
        o: CudaSlice<f32>,
        m: CudaSlice<f32>,
        l: CudaSlice<f32>,
        tickets: CudaSlice<i32>,
        parts: usize,
    },
}

/// The host switch of stages 7-9 that makes a split launch leave its partials unmerged (the
/// `decode_tc_partials_*` entries): the decode step's attention projection merges them
/// ([`Prepared::partials`]). With one split the stage writes its output as without it.
pub const PARTIALS_OUT: &str = "DECODE_PARTIALS_OUT";

/// The switch of stage 11: entries at 4, 8 and 16 warps a block, the launch at the most warps that
/// leave each warp two tiles of its split and every block resident at once (else TC_WARPS).
pub const WARPS_BY_SHAPE: &str = "DECODE_WARPS_BY_SHAPE";
/// Stage 11's warp counts, most first; the last is the stage's TC_WARPS.
const WARP_CHOICES: [u32; 3] = [16, 8, 4];
const WARPS_STAGE: &str = "warps = 0 except on stage 11 (warps-by-shape)";
const WARPS_BUILT: &str = "warps in {4, 8, 16}, 16 only at D = 64";
/// Tokens a warp's tile holds (`TC_TILE` in attention_decode_mma.cuh).
const TC_TILE: usize = 16;

/// A split launch's unmerged partials ([`Prepared::partials`]).
pub struct SplitPartials<'a> {
    pub o: &'a CudaSlice<f32>,
    pub m: &'a CudaSlice<f32>,
    pub l: &'a CudaSlice<f32>,
    pub splits: usize,
}

/// A decode stage prepared for one size: its kernels, the split count it resolved, its workspace.
pub struct Prepared {
    stage: Stage,
    plan: Plan,
    d: DecodeDims,
}

/// Prepares stage `v` for `d`: resolves the split count, checks the limits, configures the kernels
/// and allocates the workspace (scores, or the split partials).
pub fn prepare(gpu: &Gpu, v: &Variant, d: DecodeDims) -> Result<Prepared> {
    let plan = v.plan::<Plan>()?;
    let mut d = d;
    if matches!(
        plan,
        Plan::FlashDecoding | Plan::GqaPacked | Plan::TensorCore | Plan::FusedCombine | Plan::ClusterMerge
    ) {
        let blocks = d.b * if plan == Plan::FlashDecoding { d.heads.hq } else { d.heads.hkv };
        if d.splits == 0 {
            let sms = gpu.info().sm_count as usize;
            d.splits = match plan {
                Plan::FusedCombine => fill_splits(sms, blocks, d.tmax),
                Plan::ClusterMerge => fill_splits(sms, blocks, d.tmax).min(plan.splits_limit().0),
                _ => default_splits(sms, blocks, d.tmax),
            };
            if plan == Plan::GqaPacked {
                // Keep a block's scores small, so shared memory does not cap the blocks per SM.
                let cap = (d.group() * d.tmax).div_ceil(PACKED_SCORES);
                d.splits = d.splits.max(cap).min(MAX_SPLITS);
            }
        }
        require(d.splits >= 1, "splits >= 1", || format!("splits = {}", d.splits))?;
    }
    check_shape(v, d)?;
    let Heads { hq, hkv, d: dim } = d.heads;
    let (b, t, ty) = (d.b as u32, d.tmax, d.dtype.suffix());
    let launch = |entry: &str, shape: LaunchShape| gpu.prepare_launch(&SOURCES, v, entry, shape);
    let combine_shape = LaunchShape::new((hq as u32, b, 1), (dim as u32, 1, 1));
    // A split stage: its kernel writes `parts` partials per (sequence, query head) that `combine`
    // merges.
    let split_stage = |entry: &str, shape: LaunchShape, combine: &str, parts: usize| -> Result<Stage> {
        let rows = d.b * hq * parts;
        Ok(Stage::Split {
            split: launch(entry, shape)?,
            combine: launch(&format!("{combine}_{ty}"), combine_shape)?,
            o: gpu.zeros(rows * dim)?,
            m: gpu.zeros(rows)?,
            l: gpu.zeros(rows)?,
            parts,
        })
    };
    let stage = match plan {
        Plan::Naive => {
            let lin = |n: usize| LaunchShape::linear((n as u32).div_ceil(256), 256);
            Stage::Naive {
                scores: launch(&format!("decode_naive_scores_{ty}"), lin(d.b * hq * t))?,
                softmax: launch("decode_naive_softmax", lin(d.b * hq))?,
                pv: launch(&format!("decode_naive_pv_{ty}"), lin(d.b * hq * dim))?,
                s: gpu.zeros(d.b * hq * t)?,
            }
        }
        Plan::DecodingAttention => {
            let shape = LaunchShape::new((hq as u32, b, 1), (v.tunable("DA_THREADS")?, 1, 1)).with_shared(4 * t as u32);
            Stage::Fused(launch(&format!("decode_attention_{ty}_d{dim}"), shape)?)
        }
        Plan::FlashDecoding | Plan::GqaPacked => {
            let threads = v.tunable("DA_THREADS")?;
            let (entry, grid_y, g) = if plan == Plan::GqaPacked {
                (format!("decode_gqa_{ty}_d{dim}_g{}", d.group()), hkv, d.group())
            } else {
                (format!("decode_flash_{ty}_d{dim}"), hq, 1)
            };
            let smem = 4 * g * t.div_ceil(d.splits);
            let shape = LaunchShape::new((d.splits as u32, grid_y as u32, b), (threads, 1, 1)).with_shared(smem as u32);
            split_stage(&entry, shape, "decode_combine", d.splits)?
        }
        Plan::TensorCore => {
            let (warps, stages) = (v.tunable("TC_WARPS")?, v.tunable("TC_STAGES")?);
            // Per warp, a ring of `stages` K and V tiles of 16 rows of D 16-bit elements.
            let smem = warps * stages * 2 * 16 * dim as u32 * 2;
            let shape = LaunchShape::new((d.splits as u32, hkv as u32, b), (32 * warps, 1, 1)).with_shared(smem);
            split_stage(&format!("decode_tc_{ty}_d{dim}"), shape, "decode_combine", d.splits)?
        }
        Plan::FusedCombine | Plan::ClusterMerge => {
            let (warps, stages) = (v.tunable("TC_WARPS")?, v.tunable("TC_STAGES")?);
            let shape_at = |warps: u32| {
                let smem = warps * stages * 2 * 16 * dim as u32 * 2;
                LaunchShape::new((d.splits as u32, hkv as u32, b), (32 * warps, 1, 1)).with_shared(smem)
            };
            let shape = shape_at(warps);
            // Stage 11: the entry at the warp count the shape takes (`_w4`, `_w8`, `_w16`).
            let at_warps = |entry: &str| -> Result<Launch> {
                if !v.has(WARPS_BY_SHAPE) {
                    return launch(entry, shape);
                }
                let keys = d.tmax.div_ceil(d.splits);
                let blocks = d.splits * hkv * d.b;
                if d.warps != 0 {
                    return launch(&format!("{entry}_w{}", d.warps), shape_at(d.warps as u32));
                }
                let optin = gpu.info().shared_memory_per_block_optin;
                // At D = 128 a 16-warp ring is 384 KB: no such entry.
                for w in WARP_CHOICES.into_iter().filter(|&w| shape_at(w).dynamic_shared_bytes <= optin) {
                    let at = launch(&format!("{entry}_w{w}"), shape_at(w))?;
                    let resident = gpu.info().sm_count as usize * at.resources().blocks_per_sm as usize;
                    if w == warps || (keys >= 2 * TC_TILE * w as usize && blocks <= resident) {
                        return Ok(at);
                    }
                }
                Err(Error::constraint("stage 11's fewest warps equal to TC_WARPS", format!("TC_WARPS = {warps}")))
            };
            if d.splits == 1 {
                Stage::Fused(at_warps(&format!("decode_tc_single_{ty}_d{dim}"))?)
            } else if plan == Plan::ClusterMerge {
                // A (sequence, KV head)'s splits are one cluster; the entry takes the single split's
                // arguments.
                let shape = shape.with_cluster((d.splits as u32, 1, 1));
                Stage::Fused(launch(&format!("decode_tc_cluster_{ty}_d{dim}"), shape)?)
            } else {
                let rows = d.b * hq * d.splits;
                let (o, m, l, parts) = (gpu.zeros(rows * dim)?, gpu.zeros(rows)?, gpu.zeros(rows)?, d.splits);
                if v.has(PARTIALS_OUT) {
                    Stage::Partials { kernel: at_warps(&format!("decode_tc_partials_{ty}_d{dim}"))?, o, m, l, parts }
                } else {
                    let kernel = at_warps(&format!("decode_tc_fused_{ty}_d{dim}"))?;
                    Stage::SplitFused { kernel, o, m, l, tickets: gpu.zeros(d.b * hkv)?, parts }
                }
            }
        }
        Plan::PagedV1 => {
            let bs = d.block_size;
            let shape = LaunchShape::new((hq as u32, b, 1), (v.tunable("PA_THREADS")?, 1, 1))
                .with_shared((4 * d.max_blocks() * bs) as u32);
            Stage::Fused(launch(&format!("decode_paged_v1_{ty}_d{dim}_bs{bs}"), shape)?)
        }
        Plan::PagedV2 => {
            let (bs, part) = (d.block_size, v.tunable("PA_PARTITION")? as usize);
            require(part.is_multiple_of(bs), "block_size divides PA_PARTITION", || format!("{part} % {bs}"))?;
            let parts = (d.max_blocks() * bs).div_ceil(part);
            let shape = LaunchShape::new((hq as u32, b, parts as u32), (v.tunable("PA_THREADS")?, 1, 1))
                .with_shared(4 * part as u32);
            split_stage(&format!("decode_paged_v2_{ty}_d{dim}_bs{bs}"), shape, "decode_paged_reduce", parts)?
        }
    };
    Ok(Prepared { stage, plan, d })
}

impl Prepared {
    /// The split (or partition) count the stage runs with; 1 for the single-pass stages.
    pub fn splits(&self) -> usize {
        match &self.stage {
            Stage::Split { parts, .. } | Stage::SplitFused { parts, .. } | Stage::Partials { parts, .. } => *parts,
            _ => 1,
        }
    }

    /// The split kernel's launch (the one kernel of stages 7-11), for a caller that reports or
    /// checks what ran; none where a stage runs several kernels.
    pub fn split_launch(&self) -> Option<&Launch> {
        match &self.stage {
            Stage::Fused(l) | Stage::Partials { kernel: l, .. } | Stage::SplitFused { kernel: l, .. } => Some(l),
            _ => None,
        }
    }

    /// The split partials a [`PARTIALS_OUT`] build leaves unmerged (o `[B, HQ, splits, D]`, m and l
    /// `[B, HQ, splits]`, ladder_split_merge.cuh's `SplitArrays`), for the kernel after it to merge;
    /// none where the stage writes the output itself (one split, or the switch off).
    pub fn partials(&self) -> Option<SplitPartials<'_>> {
        match &self.stage {
            Stage::Partials { o, m, l, parts, .. } => Some(SplitPartials { o, m, l, splits: *parts }),
            _ => None,
        }
    }

    /// Enqueues the stage on `stream` after checking the cache layout and sizes, every buffer length
    /// and the sequence lengths against the cache.
    pub fn enqueue(&self, stream: &CudaStream, a: DecodeArgs) -> Result<()> {
        let d = self.d;
        let Heads { hq, hkv, d: dim } = d.heads;
        let qo = d.b * hq * dim;
        require_len("q", a.q.len(), qo)?;
        require_len("out", a.out.len(), qo)?;
        require_len("lse", a.lse.len(), d.b * hq)?;
        if let Some(s) = a.alibi {
            require_len("alibi slopes", s.len(), hq)?;
        }
        check_seq_lens(a.seq_lens.host(), d.b, d.tmax)?;
        let (kc, vc, table) = match (&a.cache, self.plan.layout()) {
            (KvCache::Contiguous { k, v }, Layout::Contiguous) => {
                let n = d.b * d.tmax * hkv * dim;
                require_len("K cache", k.len(), n)?;
                require_len("V cache", v.len(), n)?;
                (Arg::buf(k), Arg::buf(v), None)
            }
            (KvCache::HostMapped(h), Layout::Contiguous) => {
                let n = d.b * d.tmax * hkv * dim;
                require_len("K cache", h.k.len(), n)?;
                require_len("V cache", h.v.len(), n)?;
                (Arg::Ptr(h.k_dev), Arg::Ptr(h.v_dev), None)
            }
            (KvCache::Paged(p), Layout::Paged) => {
                let want = (d.b, d.block_size, d.max_blocks(), d.heads);
                require(
                    (p.b, p.block_size, p.max_blocks, p.heads) == want,
                    "paged cache of the prepared B, block_size, max_blocks and heads",
                    || format!("B {}, block_size {}, max_blocks {}, {:?}", p.b, p.block_size, p.max_blocks, p.heads),
                )?;
                (Arg::buf(&p.k), Arg::buf(&p.v), Some(Arg::buf(&p.tables)))
            }
            (_, layout) => {
                return Err(Error::constraint(format!("a {layout:?} cache for this stage"), "the other layout"))
            }
        };
        let (out, lse, q, lens) = (Arg::buf(a.out), Arg::buf(a.lse), Arg::buf(a.q), Arg::buf(a.seq_lens.device()));
        let slopes = Arg::Ptr(a.alibi.map_or(0, common::device_ptr));
        let scale = Arg::F32(1.0 / (dim as f32).sqrt());
        let (tmax, hkv_a) = (Arg::int(d.tmax), Arg::int(hkv));
        // SAFETY: each entry's arguments are listed in its signature's order; every buffer's length
        // was checked above against the prepared sizes, the paged pool's table entries were checked
        // when the cache was made, and every length is at most the cache's capacity.
        unsafe {
            match (&self.stage, table) {
                (Stage::Naive { scores, softmax, pv, s }, _) => {
                    let (sc, b, hq_a, d_a) = (Arg::buf(s), Arg::int(d.b), Arg::int(hq), Arg::int(dim));
                    scores.enqueue(stream, &[sc, q, kc, lens, slopes, b, tmax, hq_a, hkv_a, d_a, scale])?;
                    softmax.enqueue(stream, &[sc, lse, lens, b, tmax, hq_a])?;
                    pv.enqueue(stream, &[out, sc, vc, lens, b, tmax, hq_a, hkv_a, d_a])
                }
                // Stage 7's single-split entry takes the group size where the others take HKV.
                (Stage::Fused(l), None) if matches!(self.plan, Plan::FusedCombine | Plan::ClusterMerge) => {
                    l.enqueue(stream, &[out, lse, q, kc, vc, lens, slopes, tmax, Arg::int(d.group()), scale])
                }
                (Stage::Fused(l), None) => l.enqueue(stream, &[out, lse, q, kc, vc, lens, slopes, tmax, hkv_a, scale]),
                (Stage::Partials { kernel, o, m, l, .. }, _) => {
                    let (o, m, l, g) = (Arg::buf(o), Arg::buf(m), Arg::buf(l), Arg::int(d.group()));
                    kernel.enqueue(stream, &[o, m, l, q, kc, vc, lens, slopes, tmax, g, scale])
                }
                (Stage::SplitFused { kernel, o, m, l, tickets, .. }, _) => {
                    let (o, m, l, t, g) =
                        (Arg::buf(o), Arg::buf(m), Arg::buf(l), Arg::buf(tickets), Arg::int(d.group()));
                    kernel.enqueue(stream, &[out, lse, o, m, l, t, q, kc, vc, lens, slopes, tmax, g, scale])
                }
                (Stage::Fused(l), Some(t)) => {
                    l.enqueue(stream, &[out, lse, q, kc, vc, t, lens, slopes, hkv_a, Arg::int(d.max_blocks()), scale])
                }
                (Stage::Split { split, combine, o, m, l, parts }, table) => {
                    let (o, m, l) = (Arg::buf(o), Arg::buf(m), Arg::buf(l));
                    match (self.plan, table) {
                        (Plan::GqaPacked, _) => {
                            split.enqueue(stream, &[o, m, l, q, kc, vc, lens, slopes, tmax, scale])?
                        }
                        (Plan::TensorCore, _) => split
                            .enqueue(stream, &[o, m, l, q, kc, vc, lens, slopes, tmax, Arg::int(d.group()), scale])?,
                        (_, Some(t)) => split.enqueue(
                            stream,
                            &[o, m, l, q, kc, vc, t, lens, slopes, hkv_a, Arg::int(d.max_blocks()), scale],
                        )?,
                        (_, None) => split.enqueue(stream, &[o, m, l, q, kc, vc, lens, slopes, tmax, hkv_a, scale])?,
                    }
                    combine.enqueue(stream, &[out, lse, o, m, l, Arg::int(*parts), Arg::int(dim)])
                }
            }
        }
    }
}

impl PreparedStage for Prepared {
    fn resources(&self) -> Vec<ResourceUse> {
        let launches = match &self.stage {
            Stage::Naive { scores, softmax, pv, .. } => vec![scores, softmax, pv],
            Stage::Fused(l) => vec![l],
            Stage::Split { split, combine, .. } => vec![split, combine],
            Stage::SplitFused { kernel, .. } | Stage::Partials { kernel, .. } => vec![kernel],
        };
        launches.into_iter().map(|l| l.resources().clone()).collect()
    }
}

// ---------------------------------------------------------------- the op

/// A parsed decode shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    pub dims: DecodeDims,
    pub ragged: bool,
    pub alibi: bool,
}

#[allow(clippy::too_many_arguments)]
pub fn shape(b: i64, hq: i64, hkv: i64, d: i64, seq: i64, ragged: i64, bs: i64, alibi: i64, splits: i64) -> Shape {
    Shape::new(&[
        ("B", b),
        ("HQ", hq),
        ("HKV", hkv),
        ("D", d),
        ("seq", seq),
        ("ragged", ragged),
        ("bs", bs),
        ("dtype", 0),
        ("alibi", alibi),
        ("splits", splits),
    ])
}

impl DecodeShape {
    pub fn parse(s: &Shape) -> Result<DecodeShape> {
        let big = i32::MAX as i64;
        let flag = |k: &str| -> Result<bool> {
            let v = s.get(k).unwrap_or(0);
            require(v == 0 || v == 1, &format!("{k} in {{0, 1}}"), || format!("{k} = {v}"))?;
            Ok(v == 1)
        };
        let splits = s.get("splits").unwrap_or(0);
        require(splits >= 0, "splits >= 0 (0 = heuristic)", || format!("splits = {splits}"))?;
        let warps = s.get("warps").unwrap_or(0);
        require((0..=16).contains(&warps), "warps in 0..=16 (0 = by shape)", || format!("warps = {warps}"))?;
        let dims = DecodeDims {
            b: s.dim("B", big)?,
            heads: Heads { hq: s.dim("HQ", big)?, hkv: s.dim("HKV", big)?, d: s.dim("D", big)? },
            tmax: s.dim("seq", big)?,
            dtype: Dtype::from_key(s.get("dtype").unwrap_or(0))?,
            block_size: s.dim("bs", big)?,
            splits: splits as usize,
            warps: warps as usize,
        };
        Ok(DecodeShape { dims, ragged: flag("ragged")?, alibi: flag("alibi")? })
    }
}

impl Op for Decode {
    fn default_shapes(&self) -> Vec<Shape> {
        vec![
            // GPT-2 124M decode with a 1024-token cache.
            shape(1, 12, 12, 64, 1024, 0, 16, 0, 0),
            shape(8, 12, 12, 64, 1024, 0, 16, 0, 0),
            shape(64, 12, 12, 64, 1024, 0, 16, 0, 0),
            // Long-context MHA.
            shape(16, 32, 32, 128, 8192, 0, 16, 0, 0),
            // GQA 8:1.
            shape(32, 32, 4, 128, 8192, 0, 16, 0, 0),
            shape(128, 32, 4, 128, 8192, 0, 16, 0, 0),
            // Ragged lengths on 32-token blocks.
            shape(16, 32, 8, 128, 3000, 1, 32, 0, 0),
        ]
    }
    fn validate(&self, v: &Variant, s: &Shape) -> Result<()> {
        check_shape(v, DecodeShape::parse(s)?.dims)
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        let Ok(plan) = v.plan::<Plan>() else { return Vec::new() };
        let at = |b, hq, hkv, d, seq, bs, splits| shape(b, hq, hkv, d, seq, 0, bs, 0, splits);
        let mut l = vec![
            Limit { constraint: HEAD_DIM, past: at(2, 4, 2, 96, 40, 16, 0), inside: Some(at(2, 4, 2, 128, 40, 16, 0)) },
            Limit { constraint: GROUPS, past: at(2, 6, 4, 64, 40, 16, 0), inside: Some(at(2, 8, 4, 64, 40, 16, 0)) },
            Limit {
                constraint: GRID_B,
                past: at(65536, 1, 1, 64, 1, 16, 1),
                inside: Some(at(65535, 1, 1, 64, 1, 16, 1)),
            },
        ];
        if plan.layout() == Layout::Paged {
            l.push(Limit {
                constraint: BLOCK_SIZE,
                past: at(2, 4, 2, 64, 40, 8, 0),
                inside: Some(at(2, 4, 2, 64, 40, 32, 0)),
            });
            if plan == Plan::PagedV1 {
                let (past, inside) = (at(1, 1, 1, 64, 32769, 16, 0), at(1, 1, 1, 64, 32768, 16, 0));
                l.push(Limit { constraint: SCORES_PAGED, past, inside: Some(inside) });
            }
            return l;
        }
        l.push(Limit { constraint: ELEMS, past: at(1024, 64, 64, 64, 32768, 16, 1), inside: None });
        match plan {
            Plan::DecodingAttention => {
                let (past, inside) = (at(1, 1, 1, 64, 32769, 16, 0), at(1, 1, 1, 64, 32768, 16, 0));
                l.push(Limit { constraint: SCORES_1, past, inside: Some(inside) });
            }
            Plan::TensorCore | Plan::FusedCombine | Plan::ClusterMerge => {
                let (most, constraint) = plan.splits_limit();
                let (past, inside) = (at(2, 4, 2, 64, 300, 16, most as i64 + 1), at(2, 4, 2, 64, 300, 16, most as i64));
                l.push(Limit { constraint, past, inside: Some(inside) });
                let (past, inside) = (at(2, 17, 1, 64, 40, 16, 0), at(2, 16, 1, 64, 40, 16, 0));
                l.push(Limit { constraint: MMA_GROUP, past, inside: Some(inside) });
            }
            Plan::FlashDecoding | Plan::GqaPacked => {
                let (past, inside) = (at(2, 4, 2, 64, 300, 16, 257), at(2, 4, 2, 64, 300, 16, 256));
                l.push(Limit { constraint: SPLITS, past, inside: Some(inside) });
                let scores = if plan == Plan::GqaPacked { SCORES_PACKED } else { SCORES_SPLIT };
                let (past, inside) = (at(1, 1, 1, 64, 65537, 16, 2), at(1, 1, 1, 64, 65536, 16, 2));
                l.push(Limit { constraint: scores, past, inside: Some(inside) });
                if plan == Plan::GqaPacked {
                    let (past, inside) = (at(2, 3, 1, 64, 40, 16, 0), at(2, 8, 1, 64, 40, 16, 0));
                    l.push(Limit { constraint: PACKED_GROUP, past, inside: Some(inside) });
                }
            }
            _ => {}
        }
        l
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        DecodeProblem::new(gpu, DecodeShape::parse(shape)?, seed).map(|p| Box::new(p) as Box<dyn Problem>)
    }
}

/// A `[B, Tmax, HKV, D]` cache of `dtype` values for `lens`: uniform in [-1, 1) below each
/// sequence's length, NaN past it, so a kernel that reads past `seq_lens[b]` fails verification.
pub fn contiguous_cache(d: &DecodeDims, lens: &[usize], seed: u64) -> Vec<u16> {
    let Heads { hkv, d: dim, .. } = d.heads;
    let per = d.tmax * hkv * dim;
    // Every value written once, on every core, straight into the cache (no NaN fill on one core
    // first, no per-sequence vector of draws): a cache at B = 128, HKV = 4 is 537M values.
    let mut c = vec![0u16; d.b * per];
    c.par_chunks_mut(per).enumerate().for_each(|(b, chunk)| {
        let n = lens[b] * hkv * dim;
        let s = seed ^ (b as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let (vals, past) = chunk.split_at_mut(n);
        fill_uniform(vals, -1.0, 1.0, s, |_, x| d.dtype.bits(x));
        past.fill(d.dtype.nan());
    });
    c
}

/// The paged copy of a contiguous cache pair: a pool of `extra` more blocks than the sequences
/// need, blocks assigned in a shuffled order, unused blocks and tail slots NaN. Returns
/// (K pool, V pool, block table).
pub fn paged_from_contiguous(
    d: &DecodeDims,
    k: &[u16],
    v: &[u16],
    lens: &[usize],
    extra: usize,
    seed: u64,
) -> (Vec<u16>, Vec<u16>, Vec<i32>) {
    let Heads { hkv, d: dim, .. } = d.heads;
    let (bs, max_blocks) = (d.block_size, d.max_blocks());
    let used: usize = lens.iter().map(|l| l.div_ceil(bs)).sum();
    let num_blocks = used + extra;
    let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
    ids.shuffle(&mut rng(seed));
    let mut tables = vec![0i32; d.b * max_blocks];
    let mut next = 0;
    for b in 0..d.b {
        for i in 0..max_blocks {
            // Blocks past a sequence's length still name a pool block (never read).
            tables[b * max_blocks + i] = if i < lens[b].div_ceil(bs) {
                next += 1;
                ids[next - 1]
            } else {
                ids[(b + i) % num_blocks]
            };
        }
    }
    // The (sequence, block of it) each pool block holds: the table's entries below the lengths,
    // each a distinct pool block (the entries past a length name blocks they never read).
    let mut owner = vec![None; num_blocks];
    for b in 0..d.b {
        for i in 0..lens[b].div_ceil(bs) {
            owner[tables[b * max_blocks + i] as usize] = Some((b, i));
        }
    }
    let block = hkv * dim * bs;
    let nan = d.dtype.nan();
    let (mut kp, mut vp) = (vec![0u16; num_blocks * block], vec![0u16; num_blocks * block]);
    // Pool block by pool block on every core (two caches of 537M values at the long-context
    // shapes): NaN, then its sequence's tokens.
    kp.par_chunks_mut(block).zip(vp.par_chunks_mut(block)).enumerate().for_each(|(phys, (kb, vb))| {
        kb.fill(nan);
        vb.fill(nan);
        let Some((b, i)) = owner[phys] else { return };
        for (slot, t) in (i * bs..lens[b].min((i + 1) * bs)).enumerate() {
            for h in 0..hkv {
                let src = ((b * d.tmax + t) * hkv + h) * dim;
                for e in 0..dim {
                    let (ki, vi) = paged_offsets(d.heads, bs, phys, slot, h, e);
                    kb[ki - phys * block] = k[src + e];
                    vb[vi - phys * block] = v[src + e];
                }
            }
        }
    });
    (kp, vp, tables)
}

/// A decode problem's inputs over a contiguous cache `[B, Tmax, HKV, D]`, drawn from `seed`: q, K and
/// V (NaN past each length), the ALiBi slopes when asked for, the checked sequences and the f64
/// reference for them.
pub struct ContiguousInputs {
    pub q: Vec<u16>,
    pub k: Vec<u16>,
    pub v: Vec<u16>,
    pub slopes: Option<Vec<f64>>,
    pub checked: Vec<usize>,
    pub reference: (Vec<f64>, Vec<f64>),
}

impl ContiguousInputs {
    pub fn new(d: &DecodeDims, lens: &[usize], alibi: bool, seed: u64) -> ContiguousInputs {
        let Heads { hq, hkv, d: dim } = d.heads;
        let q: Vec<u16> = uniform(d.b * hq * dim, -2.0, 2.0, seed ^ 1).into_iter().map(|x| d.dtype.bits(x)).collect();
        let k = contiguous_cache(d, lens, seed ^ 2);
        let v = contiguous_cache(d, lens, seed ^ 3);
        let slopes = alibi.then(|| alibi_slopes(hq));
        let checked = checked_seqs(d.b, seed ^ 4);
        let qf: Vec<f32> = q.iter().map(|&x| d.dtype.value(x)).collect();
        let row = |c: &[u16], b: usize, t: usize, kvh: usize, out: &mut [f64]| {
            let i = ((b * d.tmax + t) * hkv + kvh) * dim;
            out.iter_mut().zip(&c[i..i + dim]).for_each(|(o, &x)| *o = d.dtype.value(x) as f64);
        };
        let reference = reference(
            d.heads,
            &qf,
            lens,
            &checked,
            slopes.as_deref(),
            |b, t, h, o| row(&k, b, t, h, o),
            |b, t, h, o| row(&v, b, t, h, o),
        );
        ContiguousInputs { q, k, v, slopes, checked, reference }
    }
}

/// The ALiBi slopes as the kernels take them (`[HQ]` f32), or none.
pub fn upload_slopes(gpu: &Gpu, slopes: Option<&[f64]>) -> Result<Option<CudaSlice<f32>>> {
    slopes.map(|sl| gpu.upload(&sl.iter().map(|&x| x as f32).collect::<Vec<f32>>())).transpose()
}

struct DecodeProblem {
    s: DecodeShape,
    lens: SeqLens,
    q: Rotated<u16>,
    k: Rotated<u16>,
    v: Rotated<u16>,
    paged: Vec<PagedCache>,
    alibi: Option<CudaSlice<f32>>,
    out: Rotated<u16>,
    lse: Rotated<f32>,
    checked: Vec<usize>,
    reference: (Vec<f64>, Vec<f64>),
    copies: usize,
    prepared: Current<Prepared>,
}

impl DecodeProblem {
    fn new(gpu: &Gpu, s: DecodeShape, seed: u64) -> Result<DecodeProblem> {
        let d = s.dims;
        let Heads { hq, hkv, d: dim } = d.heads;
        require(dim == 64 || dim == 128, HEAD_DIM, || format!("D = {dim}"))?;
        require(hq.is_multiple_of(hkv), GROUPS, || format!("HQ = {hq}, HKV = {hkv}"))?;
        require(d.block_size == 16 || d.block_size == 32, BLOCK_SIZE, || format!("block_size = {}", d.block_size))?;
        let n = d.b.checked_mul(d.tmax).and_then(|x| x.checked_mul(hkv * dim));
        require(n.is_some_and(|n| n < 1 << 33), "B * Tmax * HKV * D < 2^33 (the problem's host memory)", || {
            format!("B = {}, Tmax = {}", d.b, d.tmax)
        })?;
        let lens = lengths(d.b, d.tmax, s.ragged, seed ^ 0x5EED);
        let ContiguousInputs { q, k, v, slopes, checked, reference } = ContiguousInputs::new(&d, &lens, s.alibi, seed);
        let (kp, vp, tables) = paged_from_contiguous(&d, &k, &v, &lens, 3 + d.b / 4, seed ^ 4);
        let per_copy = 2 * 2 * (k.len() + kp.len()) + 2 * 2 * q.len();
        let copies = rotation_copies(gpu, per_copy as u64);
        let paged = (0..copies)
            .map(|_| PagedCache::new(gpu, &kp, &vp, &tables, d.b, d.block_size, d.heads))
            .collect::<Result<_>>()?;
        let alibi = upload_slopes(gpu, slopes.as_deref())?;
        Ok(DecodeProblem {
            s,
            lens: SeqLens::new(gpu, &lens, d.tmax)?,
            q: Rotated::upload(gpu, &q, copies)?,
            k: Rotated::upload(gpu, &k, copies)?,
            v: Rotated::upload(gpu, &v, copies)?,
            paged,
            alibi,
            out: Rotated::outputs(gpu, d.b * hq * dim, copies)?,
            lse: Rotated::outputs(gpu, d.b * hq, copies)?,
            checked,
            reference,
            copies,
            prepared: Current::default(),
        })
    }
}

impl Problem for DecodeProblem {
    fn workload(&self) -> Workload {
        let d = self.s.dims;
        let Heads { hq, hkv, d: dim } = d.heads;
        let tokens: usize = self.lens.host().iter().sum();
        // K and V read once (each KV head's rows once, whatever the group size), q read, out and lse
        // written; 4 flops per (query head, token, dim).
        let kv = 2 * 2 * tokens * hkv * dim;
        let qo = 2 * 2 * d.b * hq * dim + 4 * d.b * hq;
        Workload { bytes: (kv + qo) as u64, flops: (4 * tokens * hq * dim) as u64, bound: Bound::Memory }
    }
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)?;
        self.lse.poison(gpu)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        Ok(self.prepared.set(v, prepare(gpu, v, self.s.dims)?))
    }
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let cache = match p.plan.layout() {
            Layout::Contiguous => KvCache::Contiguous { k: self.k.get(copy), v: self.v.get(copy) },
            Layout::Paged => KvCache::Paged(&self.paged[copy % self.paged.len()]),
        };
        let args = DecodeArgs {
            out: self.out.get_mut(copy),
            lse: self.lse.get_mut(copy),
            q: self.q.get(copy),
            cache,
            seq_lens: &self.lens,
            alibi: self.alibi.as_ref(),
        };
        p.enqueue(stream, args)
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, p) = self.prepared.get()?;
        let d = self.s.dims;
        let Heads { hq, d: dim, .. } = d.heads;
        let row = hq * dim;
        let out = gpu.download(self.out.get(copy))?;
        let lse = gpu.download(self.lse.get(copy))?;
        let got: Vec<f32> =
            self.checked.iter().flat_map(|&b| out[b * row..(b + 1) * row].iter().map(|&x| d.dtype.value(x))).collect();
        let got_lse: Vec<f32> = self.checked.iter().flat_map(|&b| lse[b * hq..(b + 1) * hq].iter().copied()).collect();
        let mut ver = Verification::new(v.tolerance()).add("out", &got, &self.reference.0).add(
            "lse",
            &got_lse,
            &self.reference.1,
        );
        let mut notes = Vec::new();
        if p.splits() > 1 {
            notes.push(format!("{} = {}", if p.plan == Plan::PagedV2 { "partitions" } else { "splits" }, p.splits()));
        }
        if self.checked.len() < d.b {
            let unchecked: Vec<f32> = (0..d.b)
                .filter(|b| !self.checked.contains(b))
                .flat_map(|b| out[b * row..(b + 1) * row].iter().map(|&x| d.dtype.value(x)))
                .map(|x| if x.is_finite() { 0.0 } else { f32::NAN })
                .collect();
            ver = ver.add("out (unchecked sequences) finite", &unchecked, &vec![0.0; unchecked.len()]);
            notes.push(format!("{} of {} sequences checked", self.checked.len(), d.b));
        }
        Ok(if notes.is_empty() { ver } else { ver.with_note(notes.join("; ")) })
    }
}
