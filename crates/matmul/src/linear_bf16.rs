//! The tensor-core ladder past the report (issue 12, curated in issue 32): `out[M,N] = inp[M,K] ·
//! W[N,K]ᵀ (+ bias[N])` with bf16 operands in llm.c's layout (both K-major, the weights prepared
//! once by the caller), fp32 accumulation and fp32 or bf16 output. Stages continue `linear`'s
//! numbering (its stage 4, WMMA M3, is where the report stopped): 5-8 are one kernel each (mma.sync,
//! swizzle, wgmma + TMA, warp specialization); 9-16 are recipes of one persistent kernel's typed
//! parts (`matmul_wgmma_persistent.cuh`: tile order, launch, consumers, epilogue), each rung swapping
//! a part for its successor. The stage list also sets each part's switch from [`SWITCHES`] (the
//! kernel checks its recipe against them), and the last rung picks its parts by them, so its switches
//! are its leave-one-out toggles. The library row is cuBLASLt on the same bf16
//! operands, with its BIAS epilogue when the shape has a bias and the bare GEMM when it does not.
//!
//! Shape keys: `M`, `N`, `K`, `bias` (0/1), `epi` (the layer's element-wise tail: 0 none, 1 GELU
//! of the biased product, 2 the biased product plus a residual `[M, N]`; 1 and 2 need the bias),
//! `out` (the output's bits: 32, the default, or 16 for bf16; the bias and a residual then are bf16
//! too, as cuBLASLt requires of a 16-bit output's bias and as llm.c keeps its parameters).
//! Stage 10, every later stage and the library row fuse a tail; stages 5-9 are `n/a` at `epi` > 0.
//! Stage 12 on (the lean stores) and the library row store bf16; stages 5-11 are `n/a` at `out=16`.

use common::check::{Element, SampledRows, Verification};
use common::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, Define, Error, Gpu, Launch, LaunchShape, Limit, Op, Precision,
    Prepared as Current, PreparedStage, Problem, Requirements, ResourceUse, Result, Shape, Variant, Workload,
};
use half::bf16;

use crate::gemm::{check_dims, Dims, ELEMS_MK, ELEMS_MN, ELEMS_NK};
use crate::linear::{inputs, verify_sample};
use crate::reference::{gelu_tanh, linear_rows, magnitude_rows, sampled_rows};
use crate::{FAMILY, SOURCES};
pub use common::lt::Output;
use common::lt::{Lt, LtEpilogue, LtOperands};

const OP: &str = "linear-bf16";

common::declare_op! {
    pub struct LinearBf16 {
        name: OP,
        description:
            "out[M,N] = inp[M,K] . W[N,K]^T + bias[N], bf16 operands (weights prepared once), fp32 accumulate, fp32 or bf16 out",
        shape_keys: ["M", "N", "K", "bias", "epi", "out"],
        stages: stages,
    }
}

/// The block tile of the mma.sync stages (rows of out along M and N, and the K step), and the rows
/// of every TMA stage's tile.
const TILE_M: usize = 128;
const TILE_N: u32 = 128;
const TILE_K: u32 = 32;
const GRID_M: &str = "M <= 65535 * 128";
/// The TMA's global row stride (K bf16) must be a multiple of 16 bytes.
const TMA_K: &str = "K % 8 == 0";
/// The wgmma stages' K step (the TMA box is 64 bf16 = 128 bytes wide, the swizzle's span).
const WG_BK: u32 = common::tma::BOX_COLS;
/// The staged store's buffer per consumer warp (`EPI_STAGED`): 16 rows x 32 fp32 columns.
const EPI_STAGING_BYTES: u32 = 16 * 32 * 4;
/// The bias copies (`EPI_BIAS_SMEM`) are cp.async copies of 16 bytes from 16-byte aligned addresses.
const BIAS_ALIGNED: &str = "the bias 16-byte aligned";
/// A ping-pong consumer holds two 64-row accumulator sets (the kernel's `static_assert`).
const TWO_SETS_BN: &str = "WS_BN <= 192 with two accumulator sets a consumer (WS_PINGPONG)";
/// The widths [`wave_fit_width`] picks from for the cooperative consumers.
const ONE_SET_WIDTHS: [u32; 3] = [256, 192, 128];
/// The tile order's group (`WS_GROUP_M`) the persistent stages declare, and what [`group_fit`]
/// keeps where the weights fit in L2.
const DECLARED_GROUP_M: u32 = 8;
/// The header's `#error` on the group.
const GROUP_M: &str = "WS_GROUP_M >= 1";

/// The persistent kernel's switches in the order the rungs add them: stage 12 adds the first two,
/// 13 the next two, 14 three, 15 one and 16 the last. The stage list sets them as `-D` defines;
/// [`Switches::of`] reads them from there; stage 16 carries them all as its leave-one-out toggles.
/// `WS_GROUP_FIT` is the host's alone: it fits `WS_GROUP_M` per shape ([`group_fit`]).
pub const SWITCHES: [&str; 9] = [
    "EPI_PREFETCH",
    "EPI_LEAN",
    "EPI_BIAS_SMEM",
    "EPI_STAGED",
    "WS_PDL",
    "WS_WEIGHTS_EARLY",
    "WS_PDL_LAST_TILE",
    "WS_PINGPONG",
    "WS_GROUP_FIT",
];
/// Which switch builds on which (each names a part that builds on its base's; the last rung picks
/// its parts by them, and the kernel refuses a builder without its base): leaving out a base leaves
/// out its builders.
const SWITCH_BASES: [(&str, &str); 5] = [
    ("EPI_LEAN", "EPI_PREFETCH"),
    ("EPI_BIAS_SMEM", "EPI_LEAN"),
    ("EPI_STAGED", "EPI_BIAS_SMEM"),
    ("WS_WEIGHTS_EARLY", "WS_PDL"),
    ("WS_PDL_LAST_TILE", "WS_PDL"),
];

/// How a stage computes the GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// `matmul_mma.cuh`: mma.sync on ldmatrix fragments, a cp.async ring of `MMA_STAGES`.
    Mma,
    /// `07_wgmma_tma.cu`: wgmma on TMA-loaded, 128-byte swizzled tiles, a ring of `WG_STAGES`.
    Wgmma,
    /// `08_warp_specialized.cu`: a producer warpgroup and two consumers, 128 x 256 tiles.
    WarpSpecialized,
    /// Stages 9-16, `matmul_wgmma_persistent.cuh`: one block per SM walking the tiles. Each rung's
    /// file states its recipe of parts, and its stage-list switches ([`Switches::of`]) name the same
    /// parts for the host; the plan says what the host decides: the entry, how the tail is passed
    /// and how the tile width is chosen.
    Persistent { entry: &'static str, tail: TailArgs, width: Width },
    /// cuBLASLt on the bf16 operands.
    Lt,
}

/// How a persistent stage's tile width (`WS_BN`) is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Width {
    /// The `WS_BN` tunable (a sweep axis): stages 9 and 10.
    Tunable,
    /// Per shape (stage 11 on): [`wave_fit_width`] for cooperative consumers, compiled in as the
    /// `WS_BN` define or tunable; with `WS_PINGPONG`, the `WS_BN` tunable (192 declared, 128
    /// swept), 128 for the residual tail ([`two_sets_width`]).
    PerShape,
}

impl Plan {
    /// Whether the stage loads its operands with the TMA (and so needs `TMA_K`).
    fn tma(self) -> bool {
        !matches!(self, Plan::Mma | Plan::Lt)
    }
    /// Whether the kernel applies the GELU and residual tails in its store (the library row too).
    fn fuses_tail(self) -> bool {
        matches!(self, Plan::Persistent { tail, .. } if tail != TailArgs::None) || self == Plan::Lt
    }
}

/// The persistent kernel's switches that shape its launch and its limits, by axis (the header
/// describes each): the stage list's defines, nothing else.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Switches {
    /// Epilogue store: `EPI_LEAN`, the lean store paths, the ones that also store bf16 (`OUT_BF16`).
    lean: bool,
    /// Epilogue store: `EPI_BIAS_SMEM`, each consumer copies its tile's bias with 16-byte cp.async.
    copies_bias: bool,
    /// Epilogue store: `EPI_STAGED`, each consumer warp stages its interior stores in shared memory.
    stages_store: bool,
    /// Launch: `WS_PDL`, the kernel waits for the previous grid and is launched as its dependent.
    dependent_launch: bool,
    /// Launch: `WS_WEIGHTS_EARLY`, the kernel reads `weight` before the kernel before it finishes.
    weights_early: bool,
    /// Consumer schedule: `WS_PINGPONG`, the consumers take turns, each on a tile of its own.
    ping_pong: bool,
    /// Tile order: `WS_GROUP_FIT`, the host fits `WS_GROUP_M` to the shape and the L2.
    group_fit: bool,
}

impl Switches {
    fn of(v: &Variant) -> Switches {
        Switches {
            lean: v.has("EPI_LEAN"),
            copies_bias: v.has("EPI_BIAS_SMEM"),
            stages_store: v.has("EPI_STAGED"),
            dependent_launch: v.has("WS_PDL"),
            weights_early: v.has("WS_WEIGHTS_EARLY"),
            ping_pong: v.has("WS_PINGPONG"),
            group_fit: v.has("WS_GROUP_FIT"),
        }
    }
}

/// The dynamic shared memory of a persistent stage (the header's layout, in one place): 1 KiB to
/// align the ring for the 128-byte swizzle; per ring stage a 128 x 64 bf16 tile of inp, a
/// `tile_n` x 64 one of W and its full and empty mbarriers; the ping-pong turn mbarriers; each
/// consumer's bias copy; each consumer warp's staging buffer.
fn persistent_shared_bytes(sw: Switches, tile_n: u32, ring: u32) -> u32 {
    let stage = (TILE_M as u32 + tile_n) * WG_BK * 2 + 2 * 8;
    let turns = if sw.ping_pong { 2 * 8 } else { 0 };
    let bias_copies = if sw.copies_bias { 2 * tile_n * 4 } else { 0 };
    let staging = if sw.stages_store { 2 * 4 * EPI_STAGING_BYTES } else { 0 };
    1024 + ring * stage + turns + bias_copies + staging
}

/// A persistent stage: its switches the first `switches` of [`SWITCHES`], its tunables the ring
/// depth and the tile order's group (stage 16: a define the host fits).
fn persistent(
    stage: u32,
    name: &'static str,
    file: &'static str,
    entry: (&'static str, TailArgs),
    width: Width,
    switches: usize,
    summary: &'static str,
) -> Variant {
    let plan = Plan::Persistent { entry: entry.0, tail: entry.1, width };
    let mut defines: Vec<Define> = SWITCHES[..switches].iter().map(|&s| Define::on(s)).collect();
    let group_fitted = SWITCHES[..switches].contains(&"WS_GROUP_FIT");
    let ping_pong = SWITCHES[..switches].contains(&"WS_PINGPONG");
    let mut tunables = vec![("WG_STAGES", 4)];
    if group_fitted {
        // A define, not a tunable, so a sweep cannot set it behind the fit's back; the compile
        // check builds the declared group.
        defines.push(Define::new("WS_GROUP_M", "8"));
    } else {
        tunables.push(("WS_GROUP_M", DECLARED_GROUP_M));
    }
    match width {
        Width::Tunable => tunables.push(("WS_BN", 256)),
        Width::PerShape if ping_pong => tunables.push(("WS_BN", 192)),
        // The wave model's width is a define the host sets per shape, so a sweep cannot set it
        // behind the model's back; 256 is what the compile check builds.
        Width::PerShape => defines.push(Define::new("WS_BN", "256")),
    }
    let v = Variant::kernel(FAMILY, OP, stage, name, file, Precision::Bf16, summary)
        .with_plan(plan)
        .with_tunables(&tunables)
        .with_defines(defines)
        .with_requirements(Requirements::SM90A)
        .with_sweep("WG_STAGES", &[3, 4, 5]);
    match (width, ping_pong) {
        (Width::Tunable, _) => v.with_sweep("WS_BN", &[128, 192, 256]),
        (Width::PerShape, true) => v.with_sweep("WS_BN", &[128, 192]),
        (Width::PerShape, false) => v,
    }
}

fn stages() -> Vec<Variant> {
    let k = |stage, name, file, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Bf16, summary)
            .with_plan(Plan::Mma)
            .with_tunables(&[("MMA_STAGES", 4)])
            .with_requirements(Requirements::SM80)
    };
    // Stages 7 and 8: wgmma (hence sm_90a) fed by a TMA ring WG_STAGES deep.
    let wgmma = |stage, name, file, plan: Plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Bf16, summary)
            .with_plan(plan)
            .with_tunables(&[("WG_STAGES", 4)])
            .with_requirements(Requirements::SM90A)
    };
    let lean = |base: &'static str| (base, TailArgs::Residual);
    vec![
        k(
            5,
            "mma-sync",
            "linear-bf16/05_mma_sync.cu",
            "mma.sync m16n8k16 bf16 on ldmatrix fragments, 128x128x32 block tile of 8 warps, cp.async 4-stage ring",
        ),
        k(
            6,
            "swizzle",
            "linear-bf16/06_swizzle.cu",
            "stage 5 with XOR-swizzled shared-memory tiles: ldmatrix and cp.async free of bank conflicts",
        ),
        wgmma(
            7,
            "wgmma-tma",
            "linear-bf16/07_wgmma_tma.cu",
            Plan::Wgmma,
            "wgmma.m64n128k16 from 128-byte swizzled tiles the TMA loads (mbarrier ring), 2 warpgroups a 128x128 tile",
        ),
        wgmma(
            8,
            "warp-specialized",
            "linear-bf16/08_warp_specialized.cu",
            Plan::WarpSpecialized,
            "a TMA producer warpgroup and two wgmma.m64n256k16 consumers, full/empty mbarriers, setmaxnreg, 128x256 tile",
        ),
        persistent(
            9,
            "persistent",
            "linear-bf16/09_persistent.cu",
            ("linear_bf16_persistent", TailArgs::None),
            Width::Tunable,
            0,
            "stage 8 on one block per SM looping over tiles in groups of 8 row panels (L2 reuse), loads running into the next tile",
        ),
        persistent(
            10,
            "epilogue",
            "linear-bf16/10_epilogue.cu",
            ("linear_bf16_epilogue", TailArgs::ResidualAndCode),
            Width::Tunable,
            0,
            "stage 9 with bias + GELU or bias + residual applied to the accumulators before the store",
        ),
        persistent(
            11,
            "wave-fit",
            "linear-bf16/11_wave_fit.cu",
            ("linear_bf16_wave_fit", TailArgs::ResidualAndCode),
            Width::PerShape,
            0,
            "stage 10 with the tile width (128, 192 or 256) picked per shape by a wave-quantization model",
        ),
        persistent(
            12,
            "lean-epilogue",
            "linear-bf16/12_lean_epilogue.cu",
            lean("linear_bf16_lean"),
            Width::PerShape,
            2,
            "stage 11 with batched bias/residual loads, one entry per tail, unchecked interior stores, tanh.approx GELU, bf16 out",
        ),
        persistent(
            13,
            "staged-store",
            "linear-bf16/13_staged_store.cu",
            lean("linear_bf16_staged_store"),
            Width::PerShape,
            4,
            "stage 12 with the bias copied to shared memory under the MMAs and interior tiles stored as whole 128-byte lines",
        ),
        persistent(
            14,
            "dependent-launch",
            "linear-bf16/14_dependent_launch.cu",
            lean("linear_bf16_dependent_launch"),
            Width::PerShape,
            7,
            "stage 13 as a programmatic dependent launch: W tiles before the wait, the next kernel let in at the last tile",
        ),
        persistent(
            15,
            "ping-pong",
            "linear-bf16/15_ping_pong.cu",
            lean("linear_bf16_ping_pong"),
            Width::PerShape,
            8,
            "stage 14 with each consumer on every other 128 x 192 tile whole, one's store under the other's MMAs",
        ),
        persistent(
            16,
            "group-fit",
            "linear-bf16/16_group_fit.cu",
            lean("linear_bf16_group_fit"),
            Width::PerShape,
            9,
            "stage 15 with the tile order's group of row panels fitted to L2: where W overflows it, W read from DRAM once",
        )
        .with_toggles(&SWITCHES[..])
        .with_toggle_bases(&SWITCH_BASES[..]),
        Variant::library(
            FAMILY,
            OP,
            90,
            "cublaslt-bf16",
            "cublasLtMatmul bf16 (BIAS / GELU_BIAS epilogue, the residual as C with beta = 1)",
            Precision::Bf16,
            "cuBLASLt on the same bf16 operands, no conversion pass; its BIAS or GELU_BIAS epilogue, a residual as C",
        )
        .with_plan(Plan::Lt),
    ]
}

/// Stage 11's tile width for an M x N output of `tile_m`-row tiles on `sms` SMs: of `widths`
/// (widest first), the one with the fewest rounds x width, where a round is one tile on every SM
/// (`ceil(tiles / sms)` rounds run one after another); ties go to the wider tile, which loads fewer
/// bytes per flop.
pub fn wave_fit_width(m: usize, n: usize, sms: u32, tile_m: u32, widths: &[u32]) -> u32 {
    let cost = |w: u32| {
        let tiles = m.div_ceil(tile_m as usize) * n.div_ceil(w as usize);
        tiles.div_ceil(sms.max(1) as usize) * w as usize
    };
    widths.iter().copied().min_by_key(|&w| cost(w)).unwrap_or(128)
}

/// Stage 37's tile-order group for an M x N x K GEMM of `tile_m`-row tiles on a GPU of `l2_bytes`
/// of L2: the row panels the walk takes at a time, column by column. Each pass of the walk over the
/// columns fetches W from DRAM again, `ceil(tiles_m / group)` passes, unless W stays in L2 between
/// them. Where W (N x K bf16) fits in the L2, the declared group stands (at 4096^3, W 64% of the
/// L2, a group of 25 measured 2-6% slower than 8). Where it does not, the group is the most row
/// panels whose A rows (group x tile_m x K bf16, read again for every column) fit in half the L2,
/// all of them where they fit: W then comes from DRAM once.
pub fn group_fit(m: usize, n: usize, k: usize, tile_m: u32, l2_bytes: u64) -> u32 {
    if n * k * 2 <= l2_bytes as usize {
        return DECLARED_GROUP_M;
    }
    let panels = l2_bytes as usize / 2 / (tile_m as usize * k * 2).max(1);
    panels.clamp(1, m.div_ceil(tile_m as usize).max(1)) as u32
}

/// The tile width for a tail where a consumer holds two accumulator sets (`WS_PINGPONG`): `width`,
/// except that the residual entry runs 128 wide, since beside two
/// 64 x 192 sets its residual loads spill (ptxas: 456-1488 bytes).
fn two_sets_width(width: u32, tail: Tail) -> u32 {
    if tail == Tail::Residual {
        width.min(128)
    } else {
        width
    }
}

/// The name of a TMA stage's entry point; with one entry per tail, the tail-free one's (the others
/// add `_gelu` and `_residual`).
fn entry_base(plan: Plan) -> &'static str {
    match plan {
        Plan::Wgmma => "linear_bf16_wgmma",
        Plan::WarpSpecialized => "linear_bf16_ws",
        Plan::Persistent { entry, .. } => entry,
        // Not TMA stages: their entries are chosen in `prepare`'s own arms.
        Plan::Mma | Plan::Lt => "",
    }
}

/// The element-wise tail after the biased product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    None,
    /// GELU (tanh form) of the biased product.
    Gelu,
    /// The biased product plus a residual `[M, N]`.
    Residual,
}

/// The tail a shape's `epi` key names: 0 none (the default), 1 GELU, 2 residual.
pub(crate) fn tail_of(s: &Shape) -> Result<Tail> {
    Ok(match s.get("epi").unwrap_or(0) {
        0 => Tail::None,
        1 => Tail::Gelu,
        2 => Tail::Residual,
        e => return Err(Error::constraint("epi in {0, 1, 2}", format!("epi = {e}"))),
    })
}

/// The output type a shape's `out` key names: 32 fp32 (the default), 16 bf16.
pub(crate) fn output_of(s: &Shape) -> Result<Output> {
    Ok(match s.get("out").unwrap_or(32) {
        32 => Output::F32,
        16 => Output::Bf16,
        8 => Output::E4m3,
        o => return Err(Error::constraint("out in {32, 16, 8}", format!("out = {o}"))),
    })
}

impl Tail {
    /// The residual tail's input of a check at `seed`, in out's type `T` (the reference adds
    /// exactly those values); `None` for the other tails.
    pub(crate) fn residual<T: OutElement>(self, m: usize, n: usize, seed: u64) -> Option<Vec<T>> {
        (self == Tail::Residual).then(|| uniform(m * n, -1.0, 1.0, seed ^ 3).into_iter().map(T::from_f32).collect())
    }

    /// The tail on the reference `values` of `rows` (n columns each): GELU, or plus `residual`.
    pub(crate) fn apply<T: OutElement>(self, values: &mut [f64], residual: Option<&[T]>, rows: &[usize], n: usize) {
        match (self, residual) {
            (Tail::Gelu, _) => values.iter_mut().for_each(|x| *x = gelu_tanh(*x)),
            (Tail::Residual, Some(r)) => {
                for (o, &row) in values.chunks_mut(n).zip(rows) {
                    o.iter_mut().zip(&r[row * n..(row + 1) * n]).for_each(|(x, &y)| *x += y.to_f32() as f64);
                }
            }
            _ => {}
        }
    }

    /// With a tail, the scale of each reference element's error ([`magnitude_rows`]): a tailed
    /// output may cancel (a product plus a residual), so its error is measured against the
    /// magnitude of its terms.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn magnitude<T: OutElement>(
        self,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        residual: Option<&[T]>,
        n: usize,
        k: usize,
        rows: &[usize],
    ) -> Option<Vec<f64>> {
        (self != Tail::None).then(|| {
            let r: Option<Vec<f32>> = residual.map(|r| r.iter().map(|&y| y.to_f32()).collect());
            magnitude_rows(x, w, bias, r.as_deref(), n, k, rows)
        })
    }

    /// The code the kernels take (matmul_tail.cuh's MM_TAIL_*).
    pub(crate) fn code(self) -> i32 {
        match self {
            Tail::None => 0,
            Tail::Gelu => 1,
            Tail::Residual => 2,
        }
    }
}

/// The element types `out` (and the bias and residual) may have: `f32`, or `u16` holding bf16 bits.
pub trait OutElement: DeviceRepr + ValidAsZeroBits + Copy + Default + Unpin + 'static {
    const OUTPUT: Output;
    /// The element type the check reads `out` as (`u16` holds bf16 bits: read as `bf16`).
    type Checked: Element;
    /// `x` rounded to this type (nearest even).
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl OutElement for f32 {
    const OUTPUT: Output = Output::F32;
    type Checked = f32;
    fn from_f32(x: f32) -> f32 {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl OutElement for u16 {
    const OUTPUT: Output = Output::Bf16;
    type Checked = bf16;
    fn from_f32(x: f32) -> u16 {
        bf16::from_f32(x).to_bits()
    }
    fn to_f32(self) -> f32 {
        bf16::from_bits(self).to_f32()
    }
}

/// Checks `out` (on the device, read as [`OutElement::Checked`]) against `sample` as
/// [`verify_sample`] does: a linear's problem's check, for `linear-bf16` and `linear-fp8` alike.
pub(crate) fn verify_out<T: OutElement>(
    gpu: &Gpu,
    v: &Variant,
    out: &CudaSlice<T>,
    sample: &SampledRows,
    d: Dims,
) -> Result<Verification> {
    // SAFETY: `Checked` has `T`'s size and layout (f32 as f32, bf16 bits as bf16).
    let checked = unsafe { out.transmute::<T::Checked>(out.len()) }.ok_or_else(|| Error::Constraint {
        constraint: "out's checked element type has its size".into(),
        got: std::any::type_name::<T::Checked>().into(),
    })?;
    verify_sample(gpu, v, &checked, sample, d)
}

/// The sizes of one call, whether it adds a bias, its tail, and its output's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearBf16Dims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub bias: bool,
    pub tail: Tail,
    pub out: Output,
}

impl LinearBf16Dims {
    /// The sizes a shape names (`bias`, `epi` and `out` optional: 1, none, fp32).
    pub(crate) fn of(s: &Shape) -> Result<LinearBf16Dims> {
        let max = i32::MAX as i64;
        let b = s.get("bias").unwrap_or(1);
        require(b == 0 || b == 1, "bias is 0 or 1", || format!("bias = {b}"))?;
        let (tail, out) = (tail_of(s)?, output_of(s)?);
        Ok(LinearBf16Dims { m: s.dim("M", max)?, n: s.dim("N", max)?, k: s.dim("K", max)?, bias: b == 1, tail, out })
    }

    pub(crate) fn gemm(self) -> Dims {
        Dims { m: self.m, n: self.n, k: self.k }
    }
}

const TAIL_BIAS: &str = "a bias with a GELU or residual tail (epi > 0 needs bias = 1)";
const TAIL_FUSED: &str = "epi = 0 (this stage fuses no tail; stage 10 and every later one do)";
/// `OUT_BF16` is written for the lean store paths only (the kernel's `static_assert`).
/// e4m3 with row scales is `linear-fp8` stage 7's out, not this op's.
const OUT_WIDE: &str = "out = 32 or 16";
const OUT_STORES: &str = "out = 32 (this stage stores fp32; stage 12 on and the library row store bf16 too)";

pub fn check_shape(v: &Variant, d: LinearBf16Dims) -> Result<()> {
    check_dims(d.gemm())?;
    let plan = v.plan::<Plan>()?;
    require(d.tail == Tail::None || d.bias, TAIL_BIAS, || format!("{:?} without a bias", d.tail))?;
    let fuses = plan.fuses_tail();
    require(d.tail == Tail::None || fuses, TAIL_FUSED, || format!("{:?}", d.tail))?;
    require(d.out != Output::E4m3, OUT_WIDE, || "out = 8".to_string())?;
    let stores_bf16 = plan == Plan::Lt || (matches!(plan, Plan::Persistent { .. }) && Switches::of(v).lean);
    require(d.out == Output::F32 || stores_bf16, OUT_STORES, || "out = 16".to_string())?;
    if matches!(plan, Plan::Mma | Plan::Wgmma | Plan::WarpSpecialized) {
        require(d.m <= 65535 * TILE_M, GRID_M, || format!("M = {}", d.m))?;
    }
    if plan.tma() {
        require(d.k.is_multiple_of(8), TMA_K, || format!("K = {}", d.k))?;
    }
    Ok(())
}

enum Stage {
    Mma(Launch),
    /// A TMA stage, the rows of its B boxes (its tile's width), the tail's arguments its entry takes,
    /// and whether it copies the bias with cp.async (`EPI_BIAS_SMEM`: the bias address must then be
    /// 16-byte aligned).
    Tma {
        launch: Launch,
        b_rows: u32,
        tail: TailArgs,
        bias_aligned: bool,
    },
    Lt(Lt),
}

/// The tail's arguments a TMA stage's entry takes after the bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TailArgs {
    /// None (stages 7-9).
    None,
    /// The residual pointer and the tail's code (stages 10 and 11).
    ResidualAndCode,
    /// The residual pointer; the tail is the entry's (stage 12 on).
    Residual,
}

/// A stage prepared for one size.
pub struct Prepared {
    stage: Stage,
    d: LinearBf16Dims,
    weight_early: bool,
}

pub fn prepare(gpu: &Gpu, v: &Variant, d: LinearBf16Dims) -> Result<Prepared> {
    gpu.supports(v)?;
    check_shape(v, d)?;
    let plan = v.plan::<Plan>()?;
    let sw = Switches::of(v);
    let tiles_m = (d.m as u32).div_ceil(TILE_M as u32);
    let stage = match plan {
        Plan::Mma => {
            // cp.async copies 16-byte pieces: rows of K bf16 are 16-byte aligned only when K % 8 == 0.
            let entry = if d.k.is_multiple_of(8) { "linear_bf16" } else { "linear_bf16_unaligned" };
            let stages = v.tunable("MMA_STAGES")?;
            require(stages >= 2, "MMA_STAGES >= 2", || format!("MMA_STAGES = {stages}"))?;
            let grid = ((d.n as u32).div_ceil(TILE_N), tiles_m, 1);
            // Each stage holds a 128 x 32 bf16 tile of inp and one of W.
            let smem = stages * 2 * TILE_N * TILE_K * 2;
            Stage::Mma(gpu.prepare_launch(&SOURCES, v, entry, LaunchShape::new(grid, (256, 1, 1)).with_shared(smem))?)
        }
        Plan::Lt => {
            let epi = match (d.bias, d.tail) {
                (false, _) => LtEpilogue::None,
                (true, Tail::Gelu) => LtEpilogue::GeluBias,
                (true, _) => LtEpilogue::Bias,
            };
            Stage::Lt(Lt::prepare(gpu, LtOperands::Bf16, d.out, epi, d.gemm().lt())?)
        }
        Plan::Wgmma | Plan::WarpSpecialized => {
            // Stage 7: two warpgroups on a 128 x 128 tile, one mbarrier a stage; stage 8: a producer
            // and two consumers on 128 x 256, a full and an empty mbarrier a stage. Per ring stage a
            // 128 x 64 bf16 tile of inp, a tile_n x 64 one of W and its mbarriers; 1 KiB to align.
            let (tile_n, threads, bars) = if plan == Plan::Wgmma { (128, 256, 1) } else { (256, 384, 2) };
            let stages = v.tunable("WG_STAGES")?;
            require(stages >= 1, "WG_STAGES >= 1", || format!("WG_STAGES = {stages}"))?;
            let smem = 1024 + stages * ((TILE_M as u32 + tile_n) * WG_BK * 2 + 8 * bars);
            let grid = ((d.n as u32).div_ceil(tile_n), tiles_m, 1);
            let shape = LaunchShape::new(grid, (threads, 1, 1)).with_shared(smem);
            let launch = gpu.prepare_launch(&SOURCES, v, entry_base(plan), shape)?;
            Stage::Tma { launch, b_rows: tile_n, tail: TailArgs::None, bias_aligned: false }
        }
        Plan::Persistent { entry, tail, width } => prepare_persistent(gpu, v, d, sw, (entry, tail), width)?,
    };
    Ok(Prepared { stage, d, weight_early: sw.weights_early })
}

/// The host's decisions for a persistent stage (9-16) at one size, and the variant compiled with
/// them: the tile width (the wave model's in place of the WS_BN define, or of the tunable where a
/// row derived from a ping-pong stage is cooperative), the fitted group in place of the WS_GROUP_M
/// define, OUT_BF16 for a bf16 output. `prepare` launches it; [`LinearBf16`]'s `compiled_variants`
/// names it so that a run compiles it with the others, ahead of time.
fn persistent_compiled(gpu: &Gpu, v: &Variant, d: LinearBf16Dims, width: Width) -> Result<(Variant, u32)> {
    let sw = Switches::of(v);
    let tile_n = match width {
        Width::PerShape if !sw.ping_pong => {
            wave_fit_width(d.m, d.n, gpu.info().sm_count, TILE_M as u32, &ONE_SET_WIDTHS)
        }
        Width::PerShape => two_sets_width(v.tunable("WS_BN")?, d.tail),
        Width::Tunable => v.tunable("WS_BN")?,
    };
    require([128, 192, 256].contains(&tile_n), "WS_BN in {128, 192, 256}", || format!("WS_BN = {tile_n}"))?;
    require(!sw.ping_pong || tile_n <= 192, TWO_SETS_BN, || format!("WS_BN = {tile_n}"))?;
    let mut compiled = v.clone();
    if v.define("WS_BN").is_some() {
        compiled.set_define("WS_BN", tile_n)?;
    } else if v.tunable("WS_BN")? != tile_n {
        compiled.set_tunable("WS_BN", tile_n)?;
    }
    let group = if sw.group_fit {
        let g = group_fit(d.m, d.n, d.k, TILE_M as u32, gpu.info().l2_bytes);
        compiled.set_define("WS_GROUP_M", g)?;
        g
    } else {
        match v.define("WS_GROUP_M") {
            Some(g) => g.parse().map_err(|_| Error::constraint("WS_GROUP_M a number", g.to_string()))?,
            None => v.tunable("WS_GROUP_M")?,
        }
    };
    require(group >= 1, GROUP_M, || format!("WS_GROUP_M = {group}"))?;
    if d.out == Output::Bf16 {
        compiled.switch_on("OUT_BF16");
    }
    Ok((compiled, tile_n))
}

/// A persistent stage (9-16) for one size: compiled as [`persistent_compiled`] decides, one block
/// per SM, at most one per tile.
fn prepare_persistent(
    gpu: &Gpu,
    v: &Variant,
    d: LinearBf16Dims,
    sw: Switches,
    (entry, tail): (&'static str, TailArgs),
    width: Width,
) -> Result<Stage> {
    let ring = v.tunable("WG_STAGES")?;
    require(ring >= 1, "WG_STAGES >= 1", || format!("WG_STAGES = {ring}"))?;
    let (compiled, tile_n) = persistent_compiled(gpu, v, d, width)?;
    // Stage 12 on: the entry of the shape's tail.
    let entry = match (tail, d.tail) {
        (TailArgs::Residual, Tail::Gelu) => format!("{entry}_gelu"),
        (TailArgs::Residual, Tail::Residual) => format!("{entry}_residual"),
        _ => entry.to_string(),
    };
    let tiles = (d.m as u32).div_ceil(TILE_M as u32) * (d.n as u32).div_ceil(tile_n);
    let blocks = tiles.min(gpu.info().sm_count);
    let shape = LaunchShape::new((blocks, 1, 1), (384, 1, 1)).with_shared(persistent_shared_bytes(sw, tile_n, ring));
    let shape = if sw.dependent_launch { shape.with_dependent_launch() } else { shape };
    let launch = gpu.prepare_launch(&SOURCES, &compiled, &entry, shape)?;
    Ok(Stage::Tma { launch, b_rows: tile_n, tail, bias_aligned: sw.copies_bias })
}

/// The buffers of one call (row-major): `out` M·N of the prepared output type `T` (`f32`, or `u16`
/// bf16 bits), `inp` M·K and `weight` N·K bf16 bit patterns, `bias` N of `T` (present exactly when
/// prepared with one), `residual` M·N of `T` (present exactly with the residual tail). Stages with
/// `WS_WEIGHTS_EARLY` (14 on) read `weight` while the kernel before them in the stream may still
/// run ([`Prepared::reads_weight_early`]): it must not be that kernel's output (prepared weights
/// never are).
pub struct LinearBf16Args<'a, T: OutElement = f32> {
    pub out: &'a mut CudaSlice<T>,
    pub inp: &'a CudaSlice<u16>,
    pub weight: &'a CudaSlice<u16>,
    pub bias: Option<&'a CudaSlice<T>>,
    pub residual: Option<&'a CudaSlice<T>>,
}

impl Prepared {
    /// Whether the call is launched as a programmatic dependent of the kernel before it in the
    /// stream (`WS_PDL`, stage 14 on): it may start under that kernel's tail.
    pub fn dependent_launch(&self) -> bool {
        matches!(&self.stage, Stage::Tma { launch, .. } if launch.shape().dependent)
    }

    /// Whether the call reads `weight` before the kernel before it in the stream has finished
    /// (`WS_WEIGHTS_EARLY`, stage 14 on): `weight` must not be written by that kernel.
    pub fn reads_weight_early(&self) -> bool {
        self.weight_early
    }

    pub fn enqueue<T: OutElement>(&self, stream: &CudaStream, a: LinearBf16Args<T>) -> Result<()> {
        let d = self.d;
        match a.residual {
            Some(r) if d.tail == Tail::Residual => require_len("residual", r.len(), d.m * d.n)?,
            None if d.tail != Tail::Residual => {}
            _ => return Err(Error::constraint("a residual exactly with the residual tail", format!("{:?}", d.tail))),
        }
        let residual = a.residual.map_or(0, common::device_ptr);
        self.launch(stream, a, residual)
    }

    /// The residual tail with `out` as its own residual: `out += inp · Wᵀ + bias` (a model's
    /// residual stream). Every stage that fuses the tail reads each residual element in the thread
    /// that then writes it (and cuBLASLt takes C = D).
    pub fn enqueue_residual_in_place<T: OutElement>(
        &self,
        stream: &CudaStream,
        out: &mut CudaSlice<T>,
        inp: &CudaSlice<u16>,
        weight: &CudaSlice<u16>,
        bias: Option<&CudaSlice<T>>,
    ) -> Result<()> {
        require(self.d.tail == Tail::Residual, "a stage prepared with epi = 2", || format!("{:?}", self.d.tail))?;
        let residual = common::device_ptr(out);
        self.launch(stream, LinearBf16Args { out, inp, weight, bias, residual: None }, residual)
    }

    /// The call with the residual at `residual` (0: none), `a.residual` already checked and folded
    /// into it.
    fn launch<T: OutElement>(&self, stream: &CudaStream, a: LinearBf16Args<T>, residual: u64) -> Result<()> {
        let LinearBf16Args { out, inp, weight, bias, .. } = a;
        let d = self.d;
        require(T::OUTPUT == d.out, "out of the type prepared (out = 32: f32, out = 16: u16 bf16 bits)", || {
            format!("{:?} buffers for {:?}", T::OUTPUT, d.out)
        })?;
        require_len("inp", inp.len(), d.m * d.k)?;
        require_len("weight", weight.len(), d.n * d.k)?;
        require_len("out", out.len(), d.m * d.n)?;
        match bias {
            Some(b) if d.bias => require_len("bias", b.len(), d.n)?,
            None if !d.bias => {}
            _ => {
                return Err(Error::constraint(format!("a bias exactly when prepared with bias = {}", d.bias), "other"))
            }
        }
        let bias = bias.map_or(0, common::device_ptr);
        if matches!(self.stage, Stage::Tma { bias_aligned: true, .. }) {
            require(bias.is_multiple_of(16), BIAS_ALIGNED, || format!("bias at {bias:#x}"))?;
        }
        // SAFETY: every buffer's length was checked against the prepared sizes, which satisfy the
        // stage's limits; the mma entries take (out, inp, w, bias, M, N, K) and read bias only when
        // it is non-null; cuBLASLt reads the bias only with its BIAS epilogue (prepared with one).
        unsafe {
            match &self.stage {
                Stage::Mma(l) => l.enqueue(
                    stream,
                    &[
                        Arg::buf(out),
                        Arg::buf(inp),
                        Arg::buf(weight),
                        Arg::Ptr(bias),
                        Arg::int(d.m),
                        Arg::int(d.n),
                        Arg::int(d.k),
                    ],
                ),
                Stage::Tma { launch, b_rows, tail, .. } => {
                    let map_a = common::tma::bf16_map(common::device_ptr(inp), d.m, d.k, TILE_M as u32)?;
                    let map_b = common::tma::bf16_map(common::device_ptr(weight), d.n, d.k, *b_rows)?;
                    // (map_a, map_b, out, bias[, residual], M, N, K[, tail code])
                    let mut args = vec![Arg::value(&map_a), Arg::value(&map_b), Arg::buf(out), Arg::Ptr(bias)];
                    if *tail != TailArgs::None {
                        args.push(Arg::Ptr(residual));
                    }
                    args.extend([Arg::int(d.m), Arg::int(d.n), Arg::int(d.k)]);
                    if *tail == TailArgs::ResidualAndCode {
                        args.push(Arg::I32(d.tail.code()));
                    }
                    launch.enqueue(stream, &args)
                }
                Stage::Lt(lt) => {
                    let (inp, w, out) = (common::device_ptr(inp), common::device_ptr(weight), common::device_ptr(out));
                    lt.enqueue(stream, inp, w, bias, residual, out, None)
                }
            }
        }
    }
}

impl PreparedStage for Prepared {
    fn resources(&self) -> Vec<ResourceUse> {
        match &self.stage {
            Stage::Mma(l) | Stage::Tma { launch: l, .. } => vec![l.resources().clone()],
            Stage::Lt(_) => Vec::new(),
        }
    }
}

pub fn shape(m: i64, n: i64, k: i64, bias: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("bias", bias), ("epi", 0)])
}

/// A shape with a tail (`epi` 1: GELU, 2: residual), with a bias.
pub fn shape_with_tail(m: i64, n: i64, k: i64, epi: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("bias", 1), ("epi", epi)])
}

/// `s` with a bf16 output (`out = 16`).
pub fn bf16_out(mut s: Shape) -> Shape {
    s.set("out", 16);
    s
}

impl Op for LinearBf16 {
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2 124M at B·T = 4096 (QKV, attention projection, MLP up, MLP down, the LM head at
        // 50257 and padded to 50304, no bias), then 4096³ and 8192³ (bare GEMMs).
        let mut s: Vec<Shape> =
            [(2304, 768), (768, 768), (3072, 768), (768, 3072)].iter().map(|&(n, k)| shape(4096, n, k, 1)).collect();
        s.extend([shape(4096, 50257, 768, 0), shape(4096, 50304, 768, 0), shape(4096, 4096, 4096, 0)]);
        s.push(shape(8192, 8192, 8192, 0));
        // The layer's tails: MLP up with GELU, the two projections into the residual stream.
        s.extend([
            shape_with_tail(4096, 3072, 768, 1),
            shape_with_tail(4096, 768, 768, 2),
            shape_with_tail(4096, 768, 3072, 2),
        ]);
        // The four projections and MLP up with GELU storing bf16 (llm.c's activations): half the
        // output's bytes, against cuBLASLt storing bf16.
        let bf16: Vec<Shape> = s[..4].iter().chain(&s[8..9]).cloned().map(bf16_out).collect();
        s.extend(bf16);
        s
    }
    fn validate(&self, v: &Variant, s: &Shape) -> Result<()> {
        check_shape(v, LinearBf16Dims::of(s)?)
    }
    fn compiled_variants(&self, gpu: &Gpu, v: &Variant, s: &Shape) -> Vec<Variant> {
        let compiled = match (v.plan::<Plan>(), LinearBf16Dims::of(s)) {
            (Ok(Plan::Persistent { width, .. }), Ok(d)) => persistent_compiled(gpu, v, d, width).map(|(c, _)| c),
            _ => Err(Error::constraint("a persistent stage", v.id())),
        };
        vec![compiled.unwrap_or_else(|_| v.clone())]
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        let mut l = vec![
            Limit { constraint: ELEMS_MK, past: shape(1 << 16, 1, 1 << 15, 1), inside: None },
            Limit { constraint: ELEMS_NK, past: shape(1, 1 << 16, 1 << 15, 1), inside: None },
            Limit { constraint: ELEMS_MN, past: shape(1 << 16, 1 << 15, 1, 1), inside: None },
        ];
        let plan = v.plan::<Plan>().ok();
        if matches!(plan, Some(Plan::Mma | Plan::Wgmma | Plan::WarpSpecialized)) {
            let max = 65535 * TILE_M as i64;
            l.push(Limit { constraint: GRID_M, past: shape(max + 1, 1, 1, 1), inside: Some(shape(max, 3, 8, 1)) });
        }
        if plan.is_some_and(Plan::tma) {
            l.push(Limit { constraint: TMA_K, past: shape(3, 8, 12, 1), inside: Some(shape(3, 8, 16, 1)) });
        }
        l
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let d = LinearBf16Dims::of(s)?;
        check_dims(d.gemm())?;
        match d.out {
            Output::F32 => problem::<f32>(gpu, d, seed),
            Output::Bf16 => problem::<u16>(gpu, d, seed),
            Output::E4m3 => Err(Error::constraint(OUT_WIDE, "out = 8")),
        }
    }
}

/// A call's inputs, output copies and f64 reference, with `out` and the residual of type `T`.
fn problem<T: OutElement>(gpu: &Gpu, d: LinearBf16Dims, seed: u64) -> Result<Box<dyn Problem>> {
    // The operands rounded to bf16 once, here (what a caller's weight preparation does); the
    // reference runs in f64 on exactly those values.
    let (x, w, b) = inputs(d.gemm(), seed);
    let round = |v: Vec<f32>| -> (Vec<f32>, Vec<u16>) {
        let bits: Vec<u16> = v.iter().map(|&f| bf16::from_f32(f).to_bits()).collect();
        (bits.iter().map(|&u| bf16::from_bits(u).to_f32()).collect(), bits)
    };
    let ((x, x16), (w, w16)) = (round(x), round(w));
    let rows = sampled_rows(d.m, d.n, d.k, seed ^ 4);
    // The bias in the output's type, rounded once; the reference adds exactly those values.
    let b: Vec<T> = b.into_iter().map(T::from_f32).collect();
    let b_wide: Vec<f32> = b.iter().map(|&x| x.to_f32()).collect();
    let mut reference = linear_rows(&x, &w, d.bias.then_some(&b_wide[..]), d.n, d.k, &rows);
    let residual: Option<Vec<T>> = d.tail.residual(d.m, d.n, seed);
    d.tail.apply(&mut reference, residual.as_deref(), &rows, d.n);
    let magnitude = d.tail.magnitude(&x, &w, d.bias.then_some(&b_wide[..]), residual.as_deref(), d.n, d.k, &rows);
    let out_bytes = d.out.bytes() as usize;
    let copies = rotation_copies(gpu, (2 * (d.m * d.k + d.n * d.k) + out_bytes * d.m * d.n) as u64);
    Ok(Box::new(LinearBf16Problem::<T> {
        d,
        inp: Rotated::upload(gpu, &x16, copies)?,
        w: Rotated::upload(gpu, &w16, copies)?,
        bias: if d.bias { Some(gpu.upload(&b)?) } else { None },
        residual: residual.map(|r| gpu.upload(&r)).transpose()?,
        out: Rotated::outputs(gpu, d.m * d.n, copies)?,
        sample: SampledRows { rows, reference, magnitude },
        copies,
        prepared: Current::default(),
    }))
}

struct LinearBf16Problem<T: OutElement> {
    d: LinearBf16Dims,
    inp: Rotated<u16>,
    w: Rotated<u16>,
    bias: Option<CudaSlice<T>>,
    residual: Option<CudaSlice<T>>,
    out: Rotated<T>,
    /// With a tail, the scale of each reference element's error ([`magnitude_rows`]).
    sample: SampledRows,
    copies: usize,
    prepared: Current<Prepared>,
}

impl<T: OutElement> Problem for LinearBf16Problem<T> {
    fn workload(&self) -> Workload {
        let (m, n, k) = (self.d.m as u64, self.d.n as u64, self.d.k as u64);
        let nb = if self.d.bias { n } else { 0 };
        let residual = if self.d.tail == Tail::Residual { m * n } else { 0 };
        Workload {
            bytes: 2 * (m * k + n * k) + self.d.out.bytes() * (m * n + nb + residual),
            flops: 2 * m * n * k + if self.d.bias { m * n } else { 0 },
            bound: Bound::Compute(Precision::Bf16),
        }
    }
    common::problem_plumbing!(out);
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let args = LinearBf16Args {
            out: self.out.get_mut(copy),
            inp: self.inp.get(copy),
            weight: self.w.get(copy),
            bias: self.bias.as_ref(),
            residual: self.residual.as_ref(),
        };
        p.enqueue(stream, args)
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        let out = self.out.get(copy);
        verify_out(gpu, v, out, &self.sample, self.d.gemm())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(n: u32) -> Variant {
        LinearBf16.variants().into_iter().find(|v| v.stage == n).unwrap()
    }

    /// Every TMA stage's entry points, one per tail where the stage has one each, are defined in
    /// the stage's own file (the name `prepare` asks the module for).
    #[test]
    fn every_entry_is_in_its_stage_file() {
        let mut checked = 0;
        for v in LinearBf16.variants() {
            let plan = v.plan::<Plan>().unwrap();
            if !plan.tma() {
                continue;
            }
            let common::Source::Kernel(path) = v.source else { panic!("{}: a TMA stage without a file", v.id()) };
            let file = SOURCES.files.iter().find(|f| f.path == path).unwrap_or_else(|| panic!("{path}"));
            let base = entry_base(plan);
            let entries = if matches!(plan, Plan::Persistent { tail: TailArgs::Residual, .. }) {
                vec![base.to_string(), format!("{base}_gelu"), format!("{base}_residual")]
            } else {
                vec![base.to_string()]
            };
            for entry in entries {
                let defined = file.text.contains(&format!("{entry}(")) || file.text.contains(&format!("({entry},"));
                assert!(defined, "{}: no entry {entry} in {path}", v.id());
                checked += 1;
            }
        }
        assert_eq!(checked, 5 + 5 * 3, "stages 7-11 have one entry each, 12-16 three");
    }

    /// The host learns a persistent stage's switches from the stage list alone: the stage files set
    /// none, and each rung adds its switches to the one before, in [`SWITCHES`]' order.
    #[test]
    fn each_rung_adds_its_switches_from_the_stage_list() {
        for v in LinearBf16.variants() {
            let (Ok(Plan::Persistent { .. }), common::Source::Kernel(path)) = (v.plan::<Plan>(), v.source) else {
                continue;
            };
            let file = SOURCES.files.iter().find(|f| f.path == path).unwrap_or_else(|| panic!("{path}"));
            assert!(!file.text.lines().any(|l| l.trim_start().starts_with("#define")), "{path} sets a switch");
        }
        let adds = [(9, 0), (10, 0), (11, 0), (12, 2), (13, 4), (14, 7), (15, 8), (16, 9)];
        for (n, count) in adds {
            let v = stage(n);
            let on: Vec<&str> = SWITCHES.iter().copied().filter(|s| v.has(s)).collect();
            assert_eq!(on, SWITCHES[..count], "stage {n}");
        }
        let none = Switches::default();
        let staged = Switches { lean: true, copies_bias: true, stages_store: true, ..none };
        assert_eq!(Switches::of(&stage(13)), staged);
        let dependent = Switches { dependent_launch: true, weights_early: true, ..staged };
        assert_eq!(Switches::of(&stage(14)), dependent);
        assert_eq!(Switches::of(&stage(16)), Switches { ping_pong: true, group_fit: true, ..dependent });
        let dependents: Vec<u32> =
            LinearBf16.variants().iter().filter(|v| Switches::of(v).dependent_launch).map(|v| v.stage).collect();
        assert_eq!(dependents, [14, 15, 16]);
    }

    /// The last rung's leave-one-out rows: one per switch, each without the switches that build on
    /// it, and each launched as its switches say (a kernel without `WS_PDL` never waits for the one
    /// before it, so it must not be launched as its dependent).
    #[test]
    fn the_last_rung_leaves_out_each_switch_and_what_builds_on_it() {
        let on = Switches::of(&stage(16));
        let rows = LinearBf16.leave_one_out();
        let names: Vec<&str> = rows.iter().map(|v| v.name.as_ref()).collect();
        let want: Vec<String> = SWITCHES.iter().map(|s| format!("all-{s}")).collect();
        assert_eq!(names, want, "stage 16 is the one stage with toggles");
        let off = |name: &str| Switches::of(rows.iter().find(|v| v.name == name).unwrap());
        let no_pdl = Switches { dependent_launch: false, weights_early: false, ..on };
        assert_eq!(off("all-WS_PDL"), no_pdl);
        assert_eq!(off("all-WS_WEIGHTS_EARLY"), Switches { weights_early: false, ..on });
        assert_eq!(off("all-WS_PDL_LAST_TILE"), on, "the trigger's place changes nothing in the launch");
        assert_eq!(off("all-WS_PINGPONG"), Switches { ping_pong: false, ..on });
        assert_eq!(off("all-WS_GROUP_FIT"), Switches { group_fit: false, ..on });
        assert_eq!(off("all-EPI_STAGED"), Switches { stages_store: false, ..on });
        let no_copy = Switches { copies_bias: false, stages_store: false, ..on };
        assert_eq!(off("all-EPI_BIAS_SMEM"), no_copy);
        assert_eq!(off("all-EPI_LEAN"), Switches { lean: false, ..no_copy });
        assert_eq!(off("all-EPI_PREFETCH"), Switches { lean: false, ..no_copy });
        let prefetch = rows.iter().find(|v| v.name == "all-EPI_PREFETCH").unwrap();
        assert!(!prefetch.has("EPI_LEAN") && !prefetch.has("EPI_STAGED"));
        assert!(rows.iter().all(|v| v.compared_with.as_deref() == Some("group-fit")));
    }

    /// The shared memory of the persistent stages, against the header's layout at the widths and
    /// depths they run.
    #[test]
    fn persistent_shared_memory_adds_up() {
        let sw = |n| Switches::of(&stage(n));
        assert_eq!(persistent_shared_bytes(sw(9), 256, 4), 1024 + 4 * (384 * 128 + 16));
        let staged = 1024 + 4 * (320 * 128 + 16) + 2 * 192 * 4 + 8 * 2048;
        assert_eq!(persistent_shared_bytes(sw(14), 192, 4), staged);
        assert_eq!(persistent_shared_bytes(sw(16), 192, 4), staged + 16, "the two turn mbarriers");
        // The widest tile fits in the H100's 227 KiB with the staging buffers at the declared depth.
        assert!(persistent_shared_bytes(sw(14), 256, 4) <= 227 * 1024);
    }

    /// A bf16 output is stored by the lean stores (`EPI_LEAN`, stage 12 on; the kernel's
    /// `static_assert` refuses it elsewhere) and the library row: the others, and the last rung's rows without the
    /// lean store, refuse `out = 16` with the typed error; `out` takes 32 or 16 only.
    #[test]
    fn bf16_output_is_the_lean_stores_and_the_library() {
        let s = bf16_out(shape(129, 132, 136, 1));
        let accepts = |v: &Variant| LinearBf16.validate(v, &s).is_ok();
        let (yes, no): (Vec<Variant>, Vec<Variant>) = LinearBf16.variants().into_iter().partition(accepts);
        let stages = |vs: &[Variant]| vs.iter().map(|v| v.stage).collect::<Vec<_>>();
        assert_eq!(stages(&yes), (12..=16).chain([90]).collect::<Vec<_>>());
        assert_eq!(stages(&no), (5..=11).collect::<Vec<_>>());
        for v in &no {
            let e = LinearBf16.validate(v, &s).unwrap_err();
            assert!(matches!(&e, Error::Constraint { constraint, .. } if constraint == OUT_STORES), "{}: {e}", v.id());
        }
        let lean: Vec<String> =
            LinearBf16.leave_one_out().into_iter().filter(accepts).map(|v| v.name.to_string()).collect();
        let kept: Vec<String> = SWITCHES[2..].iter().map(|s| format!("all-{s}")).collect();
        assert_eq!(lean, kept, "without EPI_PREFETCH or EPI_LEAN the store is fp32 only");
        let mut odd = shape(129, 132, 136, 1);
        odd.set("out", 12);
        assert!(matches!(LinearBf16Dims::of(&odd), Err(Error::Constraint { .. })));
        // e4m3 (out = 8) parses, and is linear-fp8 stage 7's: every stage here refuses it.
        odd.set("out", 8);
        for v in LinearBf16.variants() {
            let e = LinearBf16.validate(&v, &odd).unwrap_err();
            assert!(matches!(&e, Error::Constraint { constraint, .. } if constraint == OUT_WIDE), "{}: {e}", v.id());
        }
        assert_eq!(LinearBf16Dims::of(&shape(1, 2, 8, 0)).unwrap().out, Output::F32, "fp32 without the key");
    }

    #[test]
    fn wave_fit_picks_the_sweeps_best_width() {
        // On 132 SMs at M = 4096: the widths the sweep of stages 9 and 10 measured fastest.
        let sms = 132;
        let fit = |m, n| wave_fit_width(m, n, sms, 128, &ONE_SET_WIDTHS);
        assert_eq!(fit(4096, 768), 192, "attn proj, MLP down: 128 tiles, one wave");
        assert_eq!(fit(4096, 2304), 192, "QKV");
        assert_eq!(fit(4096, 4096), 256, "4096^3");
        assert_eq!(fit(4096, 50304), 256, "the padded LM head: a tie, the wider tile");
        assert_eq!(fit(1, 1), 128, "one tile at any width: the narrowest computes least");
        assert_eq!(two_sets_width(192, Tail::Residual), 128, "the ping-pong residual entry spills at 192");
        assert_eq!(two_sets_width(192, Tail::Gelu), 192);
    }

    /// Stage 16's group on the H100's 50 MiB of L2: every row panel at the LM heads, as many 2 MiB
    /// panels as fit in half the L2 at 8192^3, and the declared 8 where W fits in the L2.
    #[test]
    fn group_fit_at_the_default_shapes() {
        let l2 = 50 << 20;
        let fit = |m, n, k| group_fit(m, n, k, 128, l2);
        assert_eq!(fit(4096, 50304, 768), 32, "the padded LM head: W 77 MB, A 6.3 MB: every row panel");
        assert_eq!(fit(4096, 50257, 768), 32, "the odd LM head");
        assert_eq!(fit(8192, 8192, 8192), 12, "8192^3: W 128 MiB; 12 panels of 2 MiB");
        for (n, k) in [(2304, 768), (768, 768), (3072, 768), (768, 3072), (4096, 4096)] {
            assert_eq!(
                fit(4096, n, k),
                DECLARED_GROUP_M,
                "GPT-2's block shapes and 4096^3: W fits, the declared group"
            );
        }
        assert_eq!(fit(100, 50304, 768), 1, "one row panel");
        assert_eq!(group_fit(4096, 8192, 65536, 128, l2), 1, "a panel of 16 MiB: one at a time");
        assert_eq!(
            stage(16).define("WS_GROUP_M"),
            Some(DECLARED_GROUP_M.to_string().as_str()),
            "the compile check's group"
        );
    }
}
