//! The decode GEMV: `out[M, N] = inp[M, K] · W[N, K]ᵀ (+ bias[N])` for the small M of a decode step
//! (1..64 sequences), fp32 activations and bf16 weights (converted once, never per call), fp32
//! accumulation, then the layer's tail: GELU (GPT-2's MLP up) or plus a residual (its projections,
//! the residual stream updated in place), so the decode step needs no separate pass for either.
//! At M = 1 every weight is used once, so the floor is reading W: 2 bytes a weight.
//!
//! Shape keys: `M`, `N`, `K`, `bias` (0/1), `epi` (the tail: 0 none, 1 GELU, 2 residual), `in` (32:
//! fp32 activations, the default; 16: bf16, as the decode step's attention output lies), `ln` (1:
//! the LayerNorm before the linear folded in, stage 5: `inp` is the raw fp32 residual stream, the
//! weights and bias those [`fold_layernorm`] makes; needs `bias` = 1, the folded shift).

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Act, ActBuf, ActType, Arg, Bound, Define, Gpu, Launch, LaunchShape, Limit, Op, Precision,
    Prepared as Current, Problem, Requirements, Result, Shape, Variant, Workload, DEPENDENT_LAUNCH,
};
use half::bf16;
use rayon::prelude::*;

use crate::linear_bf16::{tail_of, Tail};
use crate::reference::gelu_tanh;
use crate::{fp8, FAMILY, SOURCES};

const OP: &str = "gemv";

common::declare_op! {
    pub struct Gemv {
        name: OP,
        description: "decode GEMV: out[M,N] = inp[M,K] . W[N,K]^T + bias, then GELU or + residual (fp32 activations, bf16 weights, M <= 64)",
        shape_keys: ["M", "N", "K", "bias", "epi", "in", "ln"],
        stages: stages,
    }
}

pub const MAX_M: usize = 64;
pub(crate) const ROWS_M: &str = "M <= 64";
pub(crate) const ELEMS: &str = "N * K < 2^31";
const K_ALIGN: &str = "K % 8 == 0";

/// How a stage maps rows of W to threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// One thread per output.
    Thread,
    /// One warp per row of W, `rows_per_warp` rows each.
    Warp { rows_per_warp: u32 },
    /// One block of `GEMV_SPLIT` warps per row of W, K split across them.
    SplitK,
    /// One block of warps per 16 rows of W on the tensor cores, all M rows at once; the warps per
    /// block chosen per shape ([`mma_split`]).
    Mma,
}

fn stages() -> Vec<Variant> {
    let k = |stage, name, file, plan: Plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Bf16, summary).with_plan(plan)
    };
    // Stages 6-8: stage 5 as a link of the decode step's dependent chain (its weights staged before
    // the wait), each with its own parts after those.
    let link = |stage, name, summary, parts: &[Define]| {
        let chain = [Define::on(LN_FOLD), Define::on(EARLY_WEIGHTS), Define::on(DEPENDENT_LAUNCH)];
        k(stage, name, "gemv/04_skinny_mma.cu", Plan::Mma, summary)
            .with_defines(chain.into_iter().chain(parts.iter().cloned()).collect::<Vec<_>>())
            .with_tunables(&[("GEMV_WARPS", 2048), ("GEMV_UNROLL", 4)])
            .with_requirements(Requirements::SM90)
    };
    vec![
        k(0, "naive", "gemv/00_naive.cu", Plan::Thread, "one thread per output, scalar loads of inp and bf16 W"),
        k(
            1,
            "warp-row",
            "gemv/01_warp_row.cu",
            Plan::Warp { rows_per_warp: 1 },
            "a warp per row of W, 16-byte loads (8 bf16), shuffle reduction",
        ),
        k(
            2,
            "multi-row",
            "gemv/02_multi_row.cu",
            Plan::Warp { rows_per_warp: 4 },
            "a warp per 4 rows of W, their loads issued together, inp loaded once per 4 rows",
        ),
        k(
            3,
            "split-k",
            "gemv/03_split_k.cu",
            Plan::SplitK,
            "a block of 4 warps per row of W, K split across the warps, partial sums met in shared memory",
        )
        .with_tunables(&[("GEMV_SPLIT", 4)]),
        k(
            4,
            "skinny-mma",
            "gemv/04_skinny_mma.cu",
            Plan::Mma,
            "mma.sync on 16 rows of W x all M rows of inp, fragments straight from global, W read once",
        )
        .with_tunables(&[("GEMV_WARPS", 2048), ("GEMV_UNROLL", 4)]),
        k(
            5,
            "layernorm-folded",
            "gemv/04_skinny_mma.cu",
            Plan::Mma,
            "stage 4 with the LayerNorm before it folded in: row stats in the block, gain and shift in W and bias",
        )
        .with_defines(vec![Define::on(LN_FOLD)])
        .with_tunables(&[("GEMV_WARPS", 2048), ("GEMV_UNROLL", 4)]),
        link(
            6,
            "dependent-launch",
            "stage 5 as a programmatic dependent launch: each warp's first pass of W copied into shared memory before the wait for the previous kernel",
            &[],
        ),
        link(
            7,
            "staged-rows",
            "stage 6 with a folded LayerNorm's rows read once: statistics from registers, the rows less their mean staged in shared memory as bf16 for the fragments",
            &[Define::new(STAGED_ROWS, STAGED_ROWS_MAX)],
        ),
        link(
            8,
            "early-operands",
            "stage 7 with the epilogue's bias and residual read right after the wait, before the products, by the threads that store",
            &[Define::new(STAGED_ROWS, STAGED_ROWS_MAX), Define::on(EARLY_OPERANDS)],
        ),
        link(
            9,
            "resident-tiles",
            "stage 8 with as many blocks as fit at once, each walking row tiles: the next tile's first pass of W copied under the current one's products and epilogue, the LayerNorm rows staged once a block, a picking store's words merged once a block",
            &[Define::new(STAGED_ROWS, STAGED_ROWS_MAX), Define::on(EARLY_OPERANDS), Define::on(RESIDENT_TILES)],
        ),
    ]
}

/// Stage 9's switch of stage 4's file: blocks resident over the row tiles, the grid as many as fit at
/// once ([`prepare_mma`]); the decode step's picking LM head turns it on over stage 8 (`decode-step`
/// 16), which makes stage 9's build.
pub const RESIDENT_TILES: &str = "GEMV_RESIDENT_TILES";

/// Stage 8's switch of stage 4's file: the epilogue's operands read right after the wait.
const EARLY_OPERANDS: &str = "GEMV_EARLY_OPERANDS";

/// Stage 7's define in stage 4's file: a folded LayerNorm's rows staged in shared memory, its value
/// the float4 a lane holds of a row, set to ceil(K / 128) per shape ([`for_shape`]): a short row
/// holds no idle registers, a long one more (past GPT-2 XL's 1600 they spill). The stage list's
/// value is GPT-2 XL's, what `kernels_compile` builds.
const STAGED_ROWS: &str = "GEMV_STAGED_ROWS";
const STAGED_ROWS_MAX: &str = "13";

/// Stage `v` as it is built for `d`: stage 7's row registers sized to a folded LayerNorm's K (what
/// `prepare` compiles, and what a composed step that prepares it names to be compiled ahead).
pub fn for_shape(v: &Variant, d: GemvDims) -> Result<Variant> {
    let mut v = v.clone();
    if d.ln && v.has(STAGED_ROWS) {
        v.set_define(STAGED_ROWS, d.k.div_ceil(128) as u32)?;
    }
    Ok(v)
}

/// Bytes of one staged row of K (`staged_row_pitch` of `matmul_gemv_mma.cuh`).
fn staged_row_bytes(k: usize) -> u32 {
    ((2 * k).div_ceil(128) * 128 + 64) as u32
}

/// Stage 6's switch of stage 4's file: the first pass of W staged in shared memory before the
/// dependent-launch wait.
const EARLY_WEIGHTS: &str = "GEMV_EARLY_WEIGHTS";

/// Stage 5's switch of stage 4's file: the `gemv_mma_ln_m*` entries.
const LN_FOLD: &str = "GEMV_LN_FOLD";
const LN_STAGE: &str = "ln = 1 on a stage that folds the LayerNorm (5-9)";
pub(crate) const LN_ARGS: &str = "ln = 1 with fp32 inp (the residual stream) and bias = 1 (the folded shift)";

/// Whether stage `v` can fold the LayerNorm before it (`ln` = 1).
pub fn folds_layernorm(v: &Variant) -> bool {
    v.define(LN_FOLD).is_some()
}

/// The LayerNorm before a linear folded into it, once at load, for an `ln` = 1 GEMV:
/// `LayerNorm(x) · Wᵀ + bias = rstd · ((x - mean) · W'ᵀ) + bias'` with `W' = bf16(W ⊙ gamma)` (each
/// row of W times the gain, element by element) and `bias' = W · beta + bias` (fp32, from the
/// unrounded W; `bias` may be absent). `w` is `[N, K]`; returns `(W' as bf16 bits, bias')`.
pub fn fold_layernorm(w: &[f32], bias: Option<&[f32]>, gamma: &[f32], beta: &[f32]) -> (Vec<u16>, Vec<f32>) {
    let (folded, shift) = fold_layernorm_f32(w, bias, gamma, beta);
    (folded.par_iter().map(|&v| bf16::from_f32(v).to_bits()).collect(), shift)
}

/// [`fold_layernorm`] before the weights' rounding: `W ⊙ gamma` in fp32 (what a format other than
/// bf16, `gemv-fp8`'s e4m3 blocks, quantizes) and `bias'`.
pub fn fold_layernorm_f32(w: &[f32], bias: Option<&[f32]>, gamma: &[f32], beta: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let k = gamma.len();
    let folded = w.par_chunks(k).flat_map_iter(|row| row.iter().zip(gamma).map(|(a, g)| a * g));
    let shift = w.par_chunks(k).enumerate().map(|(n, row)| {
        let dot: f64 = row.iter().zip(beta).map(|(a, b)| *a as f64 * *b as f64).sum();
        (dot + bias.map_or(0.0, |b| b[n] as f64)) as f32
    });
    (folded.collect(), shift.collect())
}

/// Warps per block of the tensor-core stage for `blocks` blocks of 16 rows and a tile of `mt`
/// columns: enough for about `target` warps in flight over the grid (a short N needs more warps per
/// block to keep bytes in flight), at least 8 (fewer lose at the LM head), at most 32, and at most 8
/// for mt >= 32, where each thread's accumulators take 70-110 registers (measured best there).
fn mma_split(blocks: u32, mt: u32, target: u32) -> u32 {
    let cap = if mt >= 32 { 8 } else { 32 };
    target.div_ceil(blocks).next_power_of_two().clamp(8, cap)
}

/// The sizes of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvDims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub bias: bool,
    pub tail: Tail,
    pub input: ActType,
    /// The LayerNorm before it folded in ([`fold_layernorm`]).
    pub ln: bool,
}

impl GemvDims {
    /// The shape checks of every GEMV format (`gemv`, `gemv-fp8`): with `ln` = 1 a stage that folds
    /// the LayerNorm (`folds`, else the constraint `ln_stage`), fp32 inp and a bias; then M, N, K >= 1,
    /// M <= 64 and N·K < 2^31.
    pub(crate) fn check_common(self, v: &Variant, folds: bool, ln_stage: &str) -> Result<()> {
        let d = self;
        if d.ln {
            require(folds, ln_stage, || format!("stage {}", v.stage))?;
            require(d.input == ActType::F32 && d.bias, LN_ARGS, || format!("{:?} inp, bias {}", d.input, d.bias))?;
        }
        for (key, x) in [("M", d.m), ("N", d.n), ("K", d.k)] {
            require(x >= 1, &format!("{key} >= 1"), || format!("{key} = {x}"))?;
        }
        require(d.m <= MAX_M, ROWS_M, || format!("M = {}", d.m))?;
        require(d.n.checked_mul(d.k).is_some_and(|x| x < 1 << 31), ELEMS, || format!("N = {}, K = {}", d.n, d.k))
    }

    /// A call's `residual`, given exactly with the residual tail and M·N long: its device address (0
    /// without one).
    pub(crate) fn residual_ptr(self, residual: Option<&CudaSlice<f32>>) -> Result<u64> {
        require(residual.is_some() == (self.tail == Tail::Residual), "residual given exactly with epi = 2", || {
            format!("residual given: {}, tail {:?}", residual.is_some(), self.tail)
        })?;
        if let Some(r) = residual {
            require_len("residual", r.len(), self.m * self.n)?;
        }
        Ok(residual.map_or(0, common::device_ptr))
    }

    /// What a call with `out` as its own residual needs: a stage prepared with the residual tail.
    pub(crate) fn require_residual_tail(self) -> Result<()> {
        require(self.tail == Tail::Residual, "a stage prepared with epi = 2", || format!("{:?}", self.tail))
    }

    /// A call's `inp` of the type the stage was prepared for.
    pub(crate) fn check_input(self, inp: &Act) -> Result<()> {
        require(inp.ty() == self.input, "inp of the type the stage was prepared for", || {
            format!("{:?} for a stage prepared for {:?}", inp.ty(), self.input)
        })
    }

    /// A call's `bias`, given exactly when the stage was prepared with one and N long: its device
    /// address (0 without one).
    pub(crate) fn bias_ptr(self, bias: Option<&CudaSlice<f32>>) -> Result<u64> {
        require(bias.is_some() == self.bias, "bias given exactly when prepared with one", || {
            format!("bias given: {}", bias.is_some())
        })?;
        if let Some(b) = bias {
            require_len("bias", b.len(), self.n)?;
        }
        Ok(bias.map_or(0, common::device_ptr))
    }

    /// The tensor-core and FMA entries' arguments after the weights: bias, residual (device
    /// addresses, 0 without), tail, M, N, K.
    pub(crate) fn epilogue_args(self, bias: u64, residual: u64) -> [Arg<'static>; 6] {
        [
            Arg::Ptr(bias),
            Arg::Ptr(residual),
            Arg::I32(self.tail.code()),
            Arg::int(self.m),
            Arg::int(self.n),
            Arg::int(self.k),
        ]
    }
}

/// The limits of every GEMV format: M <= 64 and N·K < 2^31.
pub(crate) fn common_limits() -> Vec<Limit> {
    vec![
        Limit { constraint: ROWS_M, past: shape(65, 64, 64, 1), inside: Some(shape(64, 64, 64, 1)) },
        Limit { constraint: ELEMS, past: shape(1, 1 << 16, 1 << 15, 1), inside: None },
    ]
}

pub fn check_shape(v: &Variant, d: GemvDims) -> Result<()> {
    d.check_common(v, folds_layernorm(v), LN_STAGE)?;
    if matches!(v.plan::<Plan>()?, Plan::Warp { .. } | Plan::SplitK | Plan::Mma) {
        require(d.k.is_multiple_of(8), K_ALIGN, || format!("K = {}", d.k))?;
    }
    Ok(())
}

/// A GEMV stage prepared for one size: a `gemv` stage, or a `gemv-fp8` one
/// ([`crate::gemv_fp8::prepare`]), taking weights of that format.
pub struct Prepared {
    pub(crate) launch: Launch,
    pub(crate) d: GemvDims,
    /// The weights' format: bf16 (`gemv`) or fp8 (`gemv-fp8`).
    pub(crate) weights: Precision,
}

pub fn prepare(gpu: &Gpu, v: &Variant, d: GemvDims) -> Result<Prepared> {
    check_shape(v, d)?;
    let plan = v.plan::<Plan>()?;
    // Rows of inp per pass: the FMA stages take up to 8 and loop; the tensor-core stage takes all
    // M at once, in a tile of 8 to 64 columns.
    let (entry, mt) = match (plan, d.input) {
        (Plan::Mma, _) if d.ln => ("gemv_mma_ln_m", d.m.next_power_of_two().max(8)),
        (Plan::Mma, ActType::F32) => ("gemv_mma_m", d.m.next_power_of_two().max(8)),
        (Plan::Mma, ActType::Bf16) => ("gemv_mma_bf16_m", d.m.next_power_of_two().max(8)),
        (_, ActType::F32) => ("gemv_m", d.m.next_power_of_two().min(8)),
        (_, ActType::Bf16) => ("gemv_bf16_m", d.m.next_power_of_two().min(8)),
    };
    if plan == Plan::SplitK {
        let split = v.tunable("GEMV_SPLIT")?;
        require((1..=32).contains(&split), "1 <= GEMV_SPLIT <= 32", || format!("GEMV_SPLIT = {split}"))?;
    }
    let v = for_shape(v, d)?;
    let fma = |shape| gpu.prepare_launch(&SOURCES, &v, &format!("{entry}{mt}"), shape);
    let launch = match plan {
        Plan::Thread => fma(LaunchShape::linear(((d.m * d.n) as u32).div_ceil(256), 256))?,
        Plan::Warp { rows_per_warp } => fma(LaunchShape::linear((d.n as u32).div_ceil(4 * rows_per_warp), 128))?,
        Plan::SplitK => fma(LaunchShape::linear(d.n as u32, 32 * v.tunable("GEMV_SPLIT")?))?,
        Plan::Mma => prepare_mma(gpu, &v, entry, d)?,
    };
    Ok(Prepared { launch, d, weights: Precision::Bf16 })
}

/// A tensor-core stage's entry `{entry}{MT}` prepared for `d` ([`mma_shape`]); with stage 9's resident
/// tiles the grid is as many blocks as fit on the GPU at once (the entry's blocks an SM, from the
/// driver, times the SMs), at most the tiles, and balanced: the fewest blocks that walk the tiles in
/// as many turns.
fn prepare_mma(gpu: &Gpu, v: &Variant, entry: &str, d: GemvDims) -> Result<Launch> {
    let (shape, mt) = mma_shape(v, d, 1)?;
    let entry = format!("{entry}{mt}");
    let launch = gpu.prepare_launch(&SOURCES, v, &entry, shape)?;
    let resident = |l: &Launch| gpu.info().sm_count * l.resources().blocks_per_sm;
    let tiles = shape.grid.0;
    if !v.has(RESIDENT_TILES) || tiles <= resident(&launch) {
        return Ok(launch);
    }
    // Blocks that walk more than one tile hold a second buffer of W's first pass.
    let (walking, _) = mma_shape(v, d, 2)?;
    let probe = gpu.prepare_launch(&SOURCES, v, &entry, walking)?;
    let turns = tiles.div_ceil(resident(&probe).max(1));
    gpu.prepare_launch(&SOURCES, v, &entry, LaunchShape { grid: (tiles.div_ceil(turns), 1, 1), ..walking })
}

/// The tensor-core stages' launch and tile width MT (M rounded up to a power of two, at least 8):
/// a block of `split` warps per 16 rows of W, with `buffers` of each warp's first pass (stage 9's
/// walk: 2).
fn mma_shape(v: &Variant, d: GemvDims, buffers: u32) -> Result<(LaunchShape, usize)> {
    let mt = d.m.next_power_of_two().max(8);
    let blocks = (d.n as u32).div_ceil(16);
    let split = mma_split(blocks, mt as u32, v.tunable("GEMV_WARPS")?);
    // Each warp's partial 16 x 8 tile in shared memory, and its staged first pass of W: the pieces
    // (32-wide steps of K, two rows, 16 bytes a lane) the first pass of a warp covers.
    let pieces = v.tunable("GEMV_UNROLL")?.min((d.k as u32).div_ceil(32).div_ceil(split));
    let staged = if v.has(EARLY_WEIGHTS) { buffers * pieces * 2 * 32 * 16 } else { 0 };
    // Stage 7: a folded LayerNorm's M rows after the pieces. The tile's padding rows (M .. MT - 1)
    // are never staged or read, so they take no shared memory: at M = 1 and K = 1600 (gpt2-xl) the
    // 7 padding rows were 23 KB a block, enough to hold the MLP up's 400 blocks to three an SM and
    // run 4 of them as a second wave.
    // A merging GEMV ([`MERGE_SPLITS`]) stages its merged rows in the same place.
    let staged_rows = (d.ln || v.has(MERGE_SPLITS)) && v.has(STAGED_ROWS);
    let rows = if staged_rows { d.m as u32 * staged_row_bytes(d.k) } else { 0 };
    Ok((LaunchShape::linear(blocks, 32 * split).with_shared(split * (16 * 8 * 4 + staged) + rows), mt))
}

/// The decode step's QKV linear with kv-append in its epilogue (`GEMV_QKV_APPEND`, a host switch of a
/// folding stage): `[q | k | v] = LayerNorm(x) · Wᵀ + bias` with q stored as a bf16 row and k and v
/// as bf16 into the cache cell of each row's sequence and position. `d` is the QKV linear's own size
/// (`ln` = 1, `N` = 3C).
pub struct QkvAppend {
    launch: Launch,
    d: GemvDims,
}

/// The host switch that adds the `gemv_mma_ln_qkv_m*` entries to a folding stage's file.
pub const QKV_APPEND: &str = "GEMV_QKV_APPEND";
const QKV_N: &str = "N % 3 == 0 for a QKV linear";
const QKV_LN: &str = "ln = 1 for a QKV append (the QKV linear with ln_1 folded in)";

pub fn prepare_qkv_append(gpu: &Gpu, v: &Variant, d: GemvDims) -> Result<QkvAppend> {
    check_shape(v, d)?;
    require(d.ln, QKV_LN, || "ln = 0".into())?;
    require(d.n.is_multiple_of(3), QKV_N, || format!("N = {}", d.n))?;
    let mut v = for_shape(v, d)?;
    v.switch_on(QKV_APPEND);
    Ok(QkvAppend { launch: prepare_mma(gpu, &v, "gemv_mma_ln_qkv_m", d)?, d })
}

/// One call of [`QkvAppend`]: `q_out` M·C bf16, the caches `[B, tmax, C]` bf16 each, `seq` and `pos`
/// one per row, `inp` the residual stream M·K, the folded weight and bias.
pub struct QkvAppendArgs<'a> {
    pub q_out: &'a mut CudaSlice<u16>,
    pub k_cache: &'a mut CudaSlice<u16>,
    pub v_cache: &'a mut CudaSlice<u16>,
    pub seq: &'a CudaSlice<i32>,
    pub pos: &'a CudaSlice<i32>,
    pub tmax: usize,
    pub inp: &'a CudaSlice<f32>,
    pub weight: &'a CudaSlice<u16>,
    pub bias: &'a CudaSlice<f32>,
}

impl QkvAppend {
    /// # Safety
    /// Every `seq[m]` must lie in `0..B` (B = the caches' length / (tmax·C)) and every `pos[m]` in
    /// `0..tmax` when the kernel runs: the kernel writes the cells they name. `attention`'s `Cells`
    /// hold exactly such pairs.
    pub unsafe fn enqueue(&self, stream: &CudaStream, a: QkvAppendArgs) -> Result<()> {
        let d = self.d;
        let c = d.n / 3;
        require_len("q_out", a.q_out.len(), d.m * c)?;
        require_len("inp", a.inp.len(), d.m * d.k)?;
        require_len("weight", a.weight.len(), d.n * d.k)?;
        require_len("bias", a.bias.len(), d.n)?;
        require_len("seq", a.seq.len(), d.m)?;
        require_len("pos", a.pos.len(), d.m)?;
        let cell_rows = a.tmax * c;
        require(
            a.tmax >= 1 && a.k_cache.len() == a.v_cache.len() && a.k_cache.len().is_multiple_of(cell_rows),
            "k and v caches of [B, tmax, C] each",
            || format!("{} and {} elements, tmax = {}, C = {c}", a.k_cache.len(), a.v_cache.len(), a.tmax),
        )?;
        let mut args = vec![Arg::buf(a.q_out), Arg::buf(a.k_cache), Arg::buf(a.v_cache), Arg::buf(a.seq)];
        args.extend([Arg::buf(a.pos), Arg::int(a.tmax), Arg::buf(a.inp), Arg::buf(a.weight), Arg::buf(a.bias)]);
        args.extend([Arg::int(d.m), Arg::int(d.n), Arg::int(d.k)]);
        // SAFETY: the arguments follow gemv_mma_ln_qkv_m*'s signature, lengths checked above; the
        // cells are the caller's promise.
        unsafe { self.launch.enqueue(stream, &args) }
    }
}

common::single_launch_stage!(QkvAppend);

/// The host switch that adds the `gemv_mma_merge_m*` entries to a staging stage's file (7-9).
pub const MERGE_SPLITS: &str = "GEMV_MERGE_SPLITS";
const MERGE_STAGE: &str = "a stage that stages its rows (gemv 7-9) for a merging GEMV";
const MERGE_HEADS: &str = "K = heads * D with D % 32 == 0 for a merging GEMV (a warp's columns in one head)";
/// A warp's lanes hold a row's splits' maxima and sums (`WarpSplits` of `04_skinny_mma.cu`).
const MERGE_SPLITS_MAX: usize = 32;
const MERGE_SPLITS_LIMIT: &str = "splits <= 32 for a merging GEMV";

/// The decode step's attention projection reading split-K decode attention's partials
/// ([`MERGE_SPLITS`]): `out = merge(partials) · Wᵀ + bias (+ out)`, the merge decode attention's
/// own (the same bf16 rows its last block would store), done by every block as it stages its rows.
/// `d` is the projection's own size (`K` = heads · D, the input bf16).
pub struct MergingGemv {
    launch: Launch,
    d: GemvDims,
    heads: usize,
    splits: usize,
}

pub fn prepare_merging(gpu: &Gpu, v: &Variant, d: GemvDims, heads: usize, splits: usize) -> Result<MergingGemv> {
    check_shape(v, d)?;
    require(v.has(STAGED_ROWS) && !d.ln, MERGE_STAGE, || format!("{}, ln = {}", v.id(), d.ln as u8))?;
    let head_dim_fits = heads >= 1 && d.k.is_multiple_of(heads) && (d.k / heads).is_multiple_of(32);
    require(head_dim_fits, MERGE_HEADS, || format!("K = {}, heads = {heads}", d.k))?;
    require(splits >= 1, "splits >= 1", || format!("splits = {splits}"))?;
    require(splits <= MERGE_SPLITS_MAX, MERGE_SPLITS_LIMIT, || format!("splits = {splits}"))?;
    let mut v = v.clone();
    v.switch_on(MERGE_SPLITS);
    Ok(MergingGemv { launch: prepare_mma(gpu, &v, "gemv_mma_merge_m", d)?, d, heads, splits })
}

/// One call of [`MergingGemv`] with the residual in place: `out` M·N fp32 (read as the residual,
/// then written), the partials o `[M, heads, splits, D]`, m and l `[M, heads, splits]`.
pub struct MergingArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub o: &'a CudaSlice<f32>,
    pub m: &'a CudaSlice<f32>,
    pub l: &'a CudaSlice<f32>,
    pub weight: &'a CudaSlice<u16>,
    pub bias: Option<&'a CudaSlice<f32>>,
}

impl MergingGemv {
    pub fn enqueue_residual_in_place(&self, stream: &CudaStream, a: MergingArgs) -> Result<()> {
        let d = self.d;
        d.require_residual_tail()?;
        let rows = d.m * self.heads * self.splits;
        require_len("out", a.out.len(), d.m * d.n)?;
        require_len("o partials", a.o.len(), rows * (d.k / self.heads))?;
        require_len("m partials", a.m.len(), rows)?;
        require_len("l partials", a.l.len(), rows)?;
        require_len("weight", a.weight.len(), d.n * d.k)?;
        let (bias, residual) = (d.bias_ptr(a.bias)?, common::device_ptr(a.out));
        let mut args = vec![Arg::buf(a.out), Arg::buf(a.o), Arg::buf(a.m), Arg::buf(a.l)];
        args.extend([Arg::int(self.splits), Arg::int(self.heads), Arg::buf(a.weight)]);
        args.extend(d.epilogue_args(bias, residual));
        // SAFETY: the arguments follow gemv_mma_merge_m*'s signature, every length checked above.
        unsafe { self.launch.enqueue(stream, &args) }
    }
}

common::single_launch_stage!(MergingGemv);

/// A row's pick words (`ladder_pick.cuh`: kPickSlots = 32 words, each on its own 128-byte line of
/// kPickStride = 16): a [`PickingGemv`]'s `picks` hold M rows of them.
pub const PICK_WORDS_PER_ROW: usize = 32 * 16;

/// The host switch that adds the `gemv_mma_ln_pick_m*` entries to a folding stage's file (5-9).
pub const PICKS: &str = "GEMV_PICKS";
const PICKS_LN: &str = "ln = 1 for a picking GEMV (the LM head with ln_f folded in)";
const PICKS_V: &str = "1 <= V <= N for a picking GEMV";
const PICKS_TAIL: &str = "no residual tail on a picking GEMV";

/// The decode step's LM head with the greedy picks in its epilogue ([`PICKS`]): `out = LayerNorm(x)
/// · Wᵀ + bias` as the folded GEMV's, and each row's argmax over its first `V` columns merged into a
/// 64-bit word of `picks` (`ladder_pick.cuh`: the larger value, the lower index among equals), which
/// the argmax after it reads and resets. `d` is the LM head's own size (`ln` = 1, `N` the padded
/// vocabulary).
pub struct PickingGemv {
    launch: Launch,
    d: GemvDims,
    vocab: usize,
}

pub fn prepare_picking(gpu: &Gpu, v: &Variant, d: GemvDims, vocab: usize) -> Result<PickingGemv> {
    check_shape(v, d)?;
    require(d.ln, PICKS_LN, || "ln = 0".into())?;
    require(vocab >= 1 && vocab <= d.n, PICKS_V, || format!("V = {vocab}, N = {}", d.n))?;
    require(d.tail != Tail::Residual, PICKS_TAIL, || "epi = 2".into())?;
    let mut v = for_shape(v, d)?;
    v.switch_on(PICKS);
    Ok(PickingGemv { launch: prepare_mma(gpu, &v, "gemv_mma_ln_pick_m", d)?, d, vocab })
}

/// One call of [`PickingGemv`]: `out` M·N fp32, `picks` M rows of [`PICK_WORDS_PER_ROW`] words
/// (zero, or left so by the reader of the last call), `inp` the residual stream M·K, the folded weight and bias.
pub struct PickingArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub picks: &'a mut CudaSlice<u64>,
    pub inp: &'a CudaSlice<f32>,
    pub weight: &'a CudaSlice<u16>,
    pub bias: Option<&'a CudaSlice<f32>>,
}

impl PickingGemv {
    pub fn enqueue(&self, stream: &CudaStream, a: PickingArgs) -> Result<()> {
        let d = self.d;
        require_len("out", a.out.len(), d.m * d.n)?;
        require_len("picks", a.picks.len(), d.m * PICK_WORDS_PER_ROW)?;
        require_len("inp", a.inp.len(), d.m * d.k)?;
        require_len("weight", a.weight.len(), d.n * d.k)?;
        let bias = d.bias_ptr(a.bias)?;
        let mut args = vec![Arg::buf(a.out), Arg::buf(a.picks), Arg::int(self.vocab), Arg::buf(a.inp)];
        args.push(Arg::buf(a.weight));
        args.extend(d.epilogue_args(bias, 0));
        // SAFETY: the arguments follow gemv_mma_ln_pick_m*'s signature, every length checked above
        // (no residual is read: the tail is not the residual one).
        unsafe { self.launch.enqueue(stream, &args) }
    }
}

common::single_launch_stage!(PickingGemv);

/// A GEMV's weights as its kernels take them, in the format its stage was prepared for.
#[derive(Clone, Copy)]
pub enum GemvWeight<'a> {
    /// `gemv`: N·K bf16 bit patterns.
    Bf16(&'a CudaSlice<u16>),
    /// `gemv-fp8`: N·K e4m3 codes and their fp32 scales, `[ceil(N / 128), ceil(K / 128)]`
    /// ([`crate::fp8::Fp8Blocks`]).
    Fp8 { codes: &'a CudaSlice<u8>, scales: &'a CudaSlice<f32> },
}

impl GemvWeight<'_> {
    fn precision(self) -> Precision {
        match self {
            GemvWeight::Bf16(_) => Precision::Bf16,
            GemvWeight::Fp8 { .. } => Precision::Fp8,
        }
    }

    /// Appends the kernels' weight arguments (between `inp` and `bias`) to `args`, their lengths
    /// checked against `d`.
    fn push_args(self, d: GemvDims, args: &mut Vec<Arg<'static>>) -> Result<()> {
        match self {
            GemvWeight::Bf16(w) => {
                require_len("weight", w.len(), d.n * d.k)?;
                args.push(Arg::buf(w));
            }
            GemvWeight::Fp8 { codes, scales } => {
                require_len("codes", codes.len(), d.n * d.k)?;
                require_len("scales", scales.len(), fp8::groups(d.n) * fp8::groups(d.k))?;
                args.extend([Arg::buf(codes), Arg::buf(scales)]);
            }
        }
        Ok(())
    }
}

/// The buffers of one call: `out` M·N, `inp` M·K, the weights, `bias` N, and with the residual tail
/// `residual` M·N (not `out`: see [`Prepared::enqueue_residual_in_place`]). With `ln` = 1, the
/// weights and `bias` are the folded ones ([`fold_layernorm`]).
pub struct GemvArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub inp: Act<'a>,
    pub weight: GemvWeight<'a>,
    pub bias: Option<&'a CudaSlice<f32>>,
    pub residual: Option<&'a CudaSlice<f32>>,
}

impl Prepared {
    /// The tail this stage was prepared with.
    pub fn tail(&self) -> Tail {
        self.d.tail
    }

    pub fn enqueue(&self, stream: &CudaStream, a: GemvArgs) -> Result<()> {
        let residual = self.d.residual_ptr(a.residual)?;
        self.launch(stream, a.out, a.inp, a.weight, a.bias, residual)
    }

    /// The residual tail with `out` as its own residual: `out += inp · Wᵀ + bias` (the decode step's
    /// residual stream). Each output element is read and then written by the same thread.
    pub fn enqueue_residual_in_place(
        &self,
        stream: &CudaStream,
        out: &mut CudaSlice<f32>,
        inp: Act,
        weight: GemvWeight,
        bias: Option<&CudaSlice<f32>>,
    ) -> Result<()> {
        self.d.require_residual_tail()?;
        let residual = common::device_ptr(out);
        self.launch(stream, out, inp, weight, bias, residual)
    }

    fn launch(
        &self,
        stream: &CudaStream,
        out: &mut CudaSlice<f32>,
        inp: Act,
        weight: GemvWeight,
        bias: Option<&CudaSlice<f32>>,
        residual: u64,
    ) -> Result<()> {
        let d = self.d;
        d.check_input(&inp)?;
        require(weight.precision() == self.weights, "weights of the format the stage was prepared for", || {
            format!("{:?} weights for a stage prepared for {:?}", weight.precision(), self.weights)
        })?;
        require_len("out", out.len(), d.m * d.n)?;
        require_len("inp", inp.len(), d.m * d.k)?;
        let mut args = vec![Arg::buf(out), Arg::Ptr(inp.ptr())];
        weight.push_args(d, &mut args)?;
        args.extend(d.epilogue_args(d.bias_ptr(bias)?, residual));
        // SAFETY: the arguments follow every entry's signature (out, inp, the weights: W, or codes
        // and scales, then bias, residual, tail, M, N, K) of the format the stage was prepared for;
        // lengths checked above (the residual's by the callers: M·N, or out itself); K is a multiple
        // of 8 (bf16, the 16-byte stages) or of 16 (fp8) (each op's check_shape in prepare), so
        // every row of W and inp starts 16-byte aligned.
        unsafe { self.launch.enqueue(stream, &args) }
    }
}

common::single_launch_stage!(Prepared);

pub fn shape(m: i64, n: i64, k: i64, bias: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("bias", bias)])
}

/// [`shape`] with the tail `epi` (1 GELU, 2 residual).
pub fn shape_with_tail(m: i64, n: i64, k: i64, bias: i64, epi: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("bias", bias), ("epi", epi)])
}

/// [`shape_with_tail`] with the LayerNorm before it folded in (`ln` = 1; a bias, the folded shift).
pub fn shape_ln(m: i64, n: i64, k: i64, epi: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("bias", 1), ("epi", epi), ("ln", 1)])
}

/// [`shape_with_tail`] on bf16 activations (`in` = 16).
pub fn shape_bf16_in(m: i64, n: i64, k: i64, bias: i64, epi: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("bias", bias), ("epi", epi), ("in", 16)])
}

pub(crate) fn dims(s: &Shape) -> Result<GemvDims> {
    let big = i32::MAX as i64;
    let bias = s.get("bias").unwrap_or(1);
    require(bias == 0 || bias == 1, "bias in {0, 1}", || format!("bias = {bias}"))?;
    let (m, n, k) = (s.dim("M", big)?, s.dim("N", big)?, s.dim("K", big)?);
    let input = ActType::from_key(s, "in")?;
    let ln = s.get("ln").unwrap_or(0);
    require(ln == 0 || ln == 1, "ln in {0, 1}", || format!("ln = {ln}"))?;
    Ok(GemvDims { m, n, k, bias: bias == 1, tail: tail_of(s)?, input, ln: ln == 1 })
}

/// GPT-2's LayerNorm eps, the kernels' GEMV_LN_EPS.
pub(crate) const LN_EPS: f64 = 1e-5;

/// The random inputs of one GEMV check (`gemv` and `gemv-fp8` alike): inp uploaded (bf16 inp rounded
/// once at upload, and `inp` holds exactly the uploaded values), W in fp32 before any rounding, a
/// bias, the residual with that tail, and with `ln` = 1 the LayerNorm's gain and shift.
pub(crate) struct GemvInputs {
    pub inp_dev: ActBuf,
    pub inp: Vec<f32>,
    pub w32: Vec<f32>,
    pub bias: Vec<f32>,
    pub residual: Option<Vec<f32>>,
    pub layernorm: Option<(Vec<f32>, Vec<f32>)>,
}

impl GemvInputs {
    pub fn new(gpu: &Gpu, d: GemvDims, seed: u64) -> Result<GemvInputs> {
        require(d.m >= 1 && d.n >= 1 && d.k >= 1 && d.m <= MAX_M, ROWS_M, || format!("M = {}", d.m))?;
        // A folded LayerNorm's input is a residual stream: a mean away from zero and a spread.
        let x = if d.ln { uniform(d.m * d.k, -2.0, 3.0, seed ^ 1) } else { uniform(d.m * d.k, -1.0, 1.0, seed ^ 1) };
        let (inp_dev, inp) = ActBuf::upload(gpu, d.input, &x)?;
        Ok(GemvInputs {
            inp_dev,
            inp,
            w32: uniform(d.n * d.k, -1.0, 1.0, seed ^ 2),
            bias: uniform(d.n, -1.0, 1.0, seed ^ 3),
            residual: (d.tail == Tail::Residual).then(|| uniform(d.m * d.n, -1.0, 1.0, seed ^ 4)),
            layernorm: d.ln.then(|| (uniform(d.k, 0.5, 1.5, seed ^ 5), uniform(d.k, -0.5, 0.5, seed ^ 6))),
        })
    }
}

/// The f64 reference of a GEMV of size `d`: `rows` `[M, K]` (inp, or a LayerNorm's output) times
/// `weights` `[N, K]`ᵀ, plus `bias` when `d.bias`, then `d`'s tail (`residual` `[M, N]` with the
/// residual tail).
pub(crate) fn reference(
    d: GemvDims,
    rows: &[f64],
    weights: &[f64],
    bias: &[f32],
    residual: Option<&[f32]>,
) -> Vec<f64> {
    let mut out = vec![0f64; d.m * d.n];
    out.par_chunks_mut(d.n).enumerate().for_each(|(m, row)| {
        let x = &rows[m * d.k..(m + 1) * d.k];
        for (n, o) in row.iter_mut().enumerate() {
            let wr = &weights[n * d.k..(n + 1) * d.k];
            let dot: f64 = x.iter().zip(wr).map(|(a, b)| a * b).sum();
            let v = dot + if d.bias { bias[n] as f64 } else { 0.0 };
            *o = match (d.tail, residual) {
                (Tail::Gelu, _) => gelu_tanh(v),
                (Tail::Residual, Some(r)) => v + r[m * d.n + n] as f64,
                _ => v,
            };
        }
    });
    out
}

impl Op for Gemv {
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2 124M's linears at one sequence: QKV, attention projection, MLP up, MLP down, LM head
        // (no bias); the MLP up at batches of 8 and 32; and the three with the tails the decode step
        // fuses: the MLP up with GELU, the projections plus the residual (the attention projection on
        // the bf16 attention output).
        vec![
            shape(1, 2304, 768, 1),
            shape(1, 768, 768, 1),
            shape(1, 3072, 768, 1),
            shape(1, 768, 3072, 1),
            shape(1, 50257, 768, 0),
            shape(8, 3072, 768, 1),
            shape(32, 3072, 768, 1),
            shape_with_tail(1, 3072, 768, 1, 1),
            shape_bf16_in(1, 768, 768, 1, 2),
            shape_with_tail(1, 768, 3072, 1, 2),
            // The LayerNorm folded in (stage 5): QKV and the MLP up with GELU at one and 32
            // sequences, the LM head (its folded shift is its bias).
            shape_ln(1, 2304, 768, 0),
            shape_ln(1, 3072, 768, 1),
            shape_ln(32, 3072, 768, 1),
            shape_ln(1, 50257, 768, 0),
            // The LM head at 32 sequences: where stage 9's blocks stage the rows once for their
            // tiles instead of once a tile (96 KB of rows against 24 KB of weights a tile).
            shape_ln(32, 50257, 768, 0),
        ]
    }
    fn validate(&self, v: &Variant, s: &Shape) -> Result<()> {
        check_shape(v, dims(s)?)
    }
    /// Stages 7-9 at a folded LayerNorm are built with their row registers sized to K
    /// ([`for_shape`]): the module `prepare` asks for, compiled with the family's others instead of
    /// at the first such table, one after another.
    fn compiled_variants(&self, _: &Gpu, v: &Variant, s: &Shape) -> Vec<Variant> {
        vec![dims(s).and_then(|d| for_shape(v, d)).unwrap_or_else(|_| v.clone())]
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        let mut l = common_limits();
        if matches!(v.plan::<Plan>(), Ok(Plan::Warp { .. } | Plan::SplitK | Plan::Mma)) {
            l.push(Limit { constraint: K_ALIGN, past: shape(3, 40, 36, 1), inside: Some(shape(3, 40, 40, 1)) });
        }
        l
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let d = dims(s)?;
        let GemvInputs { inp_dev, inp, w32, bias, residual, layernorm } = GemvInputs::new(gpu, d, seed)?;
        // The reference's input rows and weights: the LayerNorm's output in f64 and the unrounded W
        // (the folded bf16 W' is the stage's own rounding), or inp and the bf16 W as uploaded.
        let (w, bias_dev, rows, weights): (Vec<u16>, Vec<f32>, Vec<f64>, Vec<f64>) =
            if let Some((gamma, beta)) = layernorm {
                let (folded, shift) = fold_layernorm(&w32, Some(&bias), &gamma, &beta);
                let (rows, _, _) = norm::layernorm::reference(&inp, &gamma, &beta, d.m, d.k, LN_EPS);
                (folded, shift, rows, w32.iter().map(|&v| v as f64).collect())
            } else {
                let w: Vec<u16> = w32.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
                let weights = w.iter().map(|&b| bf16::from_bits(b).to_f64()).collect();
                (w, bias.clone(), inp.iter().map(|&v| v as f64).collect(), weights)
            };
        let reference = reference(d, &rows, &weights, &bias, residual.as_deref());
        // W rotates (it is what a decode step streams from memory); inp and out are small.
        let copies = rotation_copies(gpu, (2 * d.n * d.k) as u64);
        Ok(Box::new(GemvProblem {
            d,
            inp: inp_dev,
            w: Rotated::upload(gpu, &w, copies)?,
            bias: gpu.upload(&bias_dev)?,
            residual: residual.map(|r| gpu.upload(&r)).transpose()?,
            out: Rotated::outputs(gpu, d.m * d.n, copies)?,
            reference,
            copies,
            prepared: Current::default(),
        }))
    }
}

struct GemvProblem {
    d: GemvDims,
    inp: ActBuf,
    w: Rotated<u16>,
    bias: CudaSlice<f32>,
    residual: Option<CudaSlice<f32>>,
    out: Rotated<f32>,
    reference: Vec<f64>,
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for GemvProblem {
    fn workload(&self) -> Workload {
        let GemvDims { m, n, k, bias, tail, input, .. } = self.d;
        let residual = if tail == Tail::Residual { 4 * m * n } else { 0 };
        let inp = if input == ActType::Bf16 { 2 * m * k } else { 4 * m * k };
        let bytes = 2 * n * k + inp + 4 * m * n + if bias { 4 * n } else { 0 } + residual;
        Workload { bytes: bytes as u64, flops: (2 * m * n * k) as u64, bound: Bound::Memory }
    }
    common::problem_plumbing!(out);
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let bias = self.d.bias.then_some(&self.bias);
        let (out, weight, residual) = (self.out.get_mut(copy), self.w.get(copy), self.residual.as_ref());
        p.enqueue(stream, GemvArgs { out, inp: self.inp.act(), weight: GemvWeight::Bf16(weight), bias, residual })
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        Ok(Verification::new(v.tolerance()).add("out", &gpu.download(self.out.get(copy))?, &self.reference))
    }
}
