//! The tensor-core ladder past the report (issue 12): `out[M,N] = inp[M,K] · W[N,K]ᵀ (+ bias[N])`
//! with bf16 operands in llm.c's layout (both K-major, the weights prepared once by the caller),
//! fp32 accumulation and fp32 or bf16 output. Stages continue `linear`'s numbering (its stage 4,
//! WMMA M3, is where the report stopped); the library row is cuBLASLt on the same bf16 operands,
//! with its BIAS epilogue when the shape has a bias and the bare GEMM when it does not.
//!
//! Shape keys: `M`, `N`, `K`, `bias` (0/1), `epi` (the layer's element-wise tail: 0 none, 1 GELU
//! of the biased product, 2 the biased product plus a residual `[M, N]`; 1 and 2 need the bias),
//! `out` (the output's bits: 32, the default, or 16 for bf16; the bias and a residual then are bf16
//! too, as cuBLASLt requires of a 16-bit output's bias and as llm.c keeps its parameters).
//! Stage 10, every later stage and the library row fuse a tail; stages 5-9 are `n/a` at `epi` > 0.
//! Stage 15 on (the lean stores) and the library row store bf16; stages 5-14 are `n/a` at `out=16`.

use common::check::Verification;
use common::cudarc::driver::{sys, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, Define, DriverContext, Error, Gpu, Launch, LaunchShape, Limit, Op, OpInfo,
    Precision, Prepared as Current, PreparedStage, Problem, Requirements, ResourceUse, Result, Shape, Variant,
    Workload,
};
use half::bf16;

use crate::gemm::{check_dims, Dims, ELEMS_MK, ELEMS_MN, ELEMS_NK};
use crate::linear::{inputs, verify_rows};
pub use crate::lt::Output;
use crate::lt::{Lt, LtEpilogue, LtOperands};
use crate::reference::{gelu_tanh, linear_rows, sampled_rows};
use crate::{FAMILY, SOURCES};

const OP: &str = "linear-bf16";
/// The block tile of the mma.sync stages (rows of out along M and N, and the K step).
const TILE_M: usize = 128;
const TILE_N: u32 = 128;
const TILE_K: u32 = 32;
const GRID_M: &str = "M <= 65535 * 128";
/// The TMA's global row stride (K bf16) must be a multiple of 16 bytes.
const TMA_K: &str = "K % 8 == 0";
/// The wgmma stage's K step (the TMA box is 64 bf16 = 128 bytes wide, the swizzle's span).
const WG_BK: u32 = 64;
/// Stage 13's output map: rows of N fp32 must be a multiple of 16 bytes apart.
const TMA_N: &str = "N % 4 == 0";
/// Stage 13's output boxes: 32 fp32 columns (128 bytes, the swizzle's span) by a consumer's 64 rows.
const OUT_BOX: (u32, u32) = (32, 64);
/// Stage 40's early W tiles (the header's `#error`).
const EARLY_TILES: &str = "1 <= WS_EARLY <= WG_STAGES";
/// Stage 39's ring holds the last tile's results (the header's static_assert).
const LAST_TILE_RING: &str = "WG_STAGES * (128 + WS_BN) * 128 >= 128 * WS_BN * sizeof(out)";
/// Stage 13's output slot: 64 rows x 64 fp32 columns (two boxes).
const EPI_SLOT_BYTES: u32 = 64 * 64 * 4;
/// The staged stores' buffer per consumer warp (`Switches::stages_store`): 16 rows x 32 fp32 columns.
const EPI_STAGING_BYTES: u32 = 16 * 32 * 4;
/// The bias copies (`Switches::copies_bias`) are cp.async copies of 16 bytes from 16-byte aligned addresses.
const BIAS_ALIGNED: &str = "the bias 16-byte aligned";
/// The tile width where a consumer holds two 64-row accumulator sets: the ping-pong stages
/// (`Switches::ping_pong`) and 256-row tiles (the header's `#error`s).
const TWO_SETS_BN: &str = "WS_BN <= 192 with two accumulator sets a consumer (WS_PINGPONG, WS_BM 256)";
/// The widths [`wave_fit_width`] picks from for 256-row tiles (two sets of 64 x WS_BN a consumer).
const TWO_SETS_WIDTHS: [u32; 2] = [192, 128];
/// The widths it picks from for 128-row tiles.
const ONE_SET_WIDTHS: [u32; 3] = [256, 192, 128];
/// The tile order's group (`WS_GROUP_M`) the persistent stages declare, and what [`group_fit`]
/// keeps where the weights fit in L2.
const DECLARED_GROUP_M: u32 = 8;
/// The header's `#error`s on the group.
const GROUP_M: &str = "WS_GROUP_M >= 1, a multiple of the blocks per cluster";
/// The widths [`stream_k_fit`] picks from: stream-K takes care of the last wave, so the narrowest
/// tile (the most bytes loaded per flop) is left out.
const STREAM_K_WIDTHS: [u32; 2] = [256, 192];

/// Stage 28's switches, set by the stage list rather than its `.cu`, so that leave-one-out can take
/// each away (`ladder run matmul --op linear-bf16 --leave-one-out`).
const STAGE_28_SWITCHES: [&str; 7] =
    ["EPI_PREFETCH", "EPI_LEAN", "WS_PINGPONG", "EPI_BIAS_SMEM", "EPI_STAGED", "WS_PDL", "WS_WEIGHTS_EARLY"];
/// Which of those builds on which (the `#error`s of `matmul_wgmma_persistent.cuh`).
const STAGE_28_SWITCH_BASES: [(&str, &str); 4] = [
    ("EPI_LEAN", "EPI_PREFETCH"),
    ("EPI_BIAS_SMEM", "EPI_LEAN"),
    ("EPI_STAGED", "EPI_BIAS_SMEM"),
    ("WS_WEIGHTS_EARLY", "WS_PDL"),
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
    /// Stages 9-37, `matmul_wgmma_persistent.cuh`: one block per SM walking the tiles. What each
    /// stage compiles in is read from its `.cu`'s `#define`s and the stage list's defines
    /// ([`Switches::of`]); the plan says what the host decides: the entry, how the tail is passed,
    /// the tile width, the ring depth and the tile order's group.
    Persistent { entry: &'static str, tail: TailArgs, width: Width, ring: Ring, group: Group },
    /// cuBLASLt on the bf16 operands.
    Lt,
}

/// How a persistent stage's tile width (`WS_BN`) is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Width {
    /// The `WS_BN` tunable (a sweep axis): stages 9 and 10 and the ping-pong stages.
    Tunable,
    /// [`wave_fit_width`] per shape, compiled in as the `WS_BN` define (stage 11 on, but for 16 and
    /// the ping-pong stages); the stage list's define is what the compile check builds.
    Fitted,
    /// The stage list's `WS_BN` define (stage 16).
    Defined,
}

/// How deep a persistent stage's ring of shared-memory stages is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ring {
    /// `WG_STAGES`.
    Tunable,
    /// As deep as fits beside the rest of shared memory, `WG_STAGES` at most (stages 13, 29, 32).
    FillsSharedMemory,
}

/// How a persistent stage's tile order groups its row panels (`WS_GROUP_M`: the walk takes that
/// many rows of tiles at a time, column by column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    /// The `WS_GROUP_M` tunable (8 declared: the sweeps found 4 to 32 within noise where the
    /// operands fit in L2).
    Tunable,
    /// [`group_fit`] per shape, compiled in as the `WS_GROUP_M` define (stage 37); the stage
    /// list's define is what the compile check builds.
    Fitted,
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

/// The switches of a persistent stage's kernel that shape its launch and its limits: the
/// `#define NAME 1` lines of its `.cu` and the stage list's defines (stage 28's switches are the
/// latter, so that its leave-one-out rows can drop each one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Switches {
    /// `WS_PINGPONG`: the consumers take turns, each on a tile of its own (two turn mbarriers).
    ping_pong: bool,
    /// `EPI_BIAS_SMEM`: each consumer copies its tile's bias with 16-byte cp.async.
    copies_bias: bool,
    /// `EPI_STAGED`: each consumer warp stages its interior stores through shared memory.
    stages_store: bool,
    /// `WS_PDL`: the kernel waits for the previous grid and is launched as its programmatic dependent.
    dependent_launch: bool,
    /// `WS_WEIGHTS_EARLY`: the kernel reads `weight` before the kernel before it has finished.
    weights_early: bool,
    /// `WS_MULTICAST`: clusters of 2 blocks along M, the W tile multicast to both.
    multicast: bool,
    /// `EPI_TMA_STORE`: the output stored by the TMA through a tensor map.
    tma_store: bool,
    /// `EPI_TMA_LAST`: the block's last tile stored by the TMA through a tensor map passed after
    /// the pointer arguments, with whether it is valid.
    tma_last: bool,
    /// `WS_STREAM_K`: the last tiles shared out by K steps, through a workspace of partial sums.
    stream_k: bool,
    /// `WS_COLSPLIT`: the consumers split the tile's columns, one `WS_LAG` K steps behind (a lead
    /// mbarrier).
    column_split: bool,
    /// `EPI_LEAN`: the lean store paths, the ones that also store bf16 (`OUT_BF16`).
    lean: bool,
    /// `WS_L2_PREFETCH`: the producer fetches the operands of its walk's K steps up to
    /// `WS_L2_WINDOW` into L2 once its ring's first loads are issued.
    l2_prefetch: bool,
}

impl Switches {
    fn of(v: &Variant) -> Switches {
        let file = match v.source {
            common::Source::Kernel(path) => SOURCES.files.iter().find(|f| f.path == path).map(|f| f.text),
            _ => None,
        };
        let on = |name: &str| {
            v.has(name) || file.is_some_and(|text| text.lines().any(|l| l.trim() == format!("#define {name} 1")))
        };
        Switches {
            ping_pong: on("WS_PINGPONG"),
            copies_bias: on("EPI_BIAS_SMEM"),
            stages_store: on("EPI_STAGED"),
            dependent_launch: on("WS_PDL"),
            weights_early: on("WS_WEIGHTS_EARLY"),
            multicast: on("WS_MULTICAST"),
            tma_store: on("EPI_TMA_STORE"),
            tma_last: on("EPI_TMA_LAST"),
            stream_k: on("WS_STREAM_K"),
            column_split: on("WS_COLSPLIT"),
            lean: on("EPI_LEAN"),
            l2_prefetch: on("WS_L2_PREFETCH"),
        }
    }
    /// Blocks per thread-block cluster (stacked along M, sharing the W tile).
    fn cluster(self) -> u32 {
        if self.multicast {
            2
        } else {
            1
        }
    }
}

/// A persistent stage (its tunables: the ring depth and the tile order's group).
fn persistent(stage: u32, name: &'static str, file: &'static str, plan: Plan, summary: &'static str) -> Variant {
    Variant::kernel(FAMILY, OP, stage, name, file, Precision::Bf16, summary)
        .with_plan(plan)
        .with_tunables(&[("WG_STAGES", 4), ("WS_GROUP_M", DECLARED_GROUP_M)])
        .with_requirements(Requirements::SM90A)
}

/// Stages 9 and 10: the tile width and ring depth a declared sweep space.
fn swept(
    stage: u32,
    name: &'static str,
    file: &'static str,
    entry: (&'static str, TailArgs),
    summary: &'static str,
) -> Variant {
    let plan = Plan::Persistent {
        entry: entry.0,
        tail: entry.1,
        width: Width::Tunable,
        ring: Ring::Tunable,
        group: Group::Tunable,
    };
    persistent(stage, name, file, plan, summary)
        .with_tunables(&[("WG_STAGES", 4), ("WS_GROUP_M", DECLARED_GROUP_M), ("WS_BN", 256)])
        .with_sweep("WS_BN", &[128, 192, 256])
        .with_sweep("WG_STAGES", &[3, 4, 5])
}

/// The wave-fitted stages: the tile width is a define the host sets per shape, not a tunable, so a
/// sweep cannot set it behind the wave model's back (256 is what the compile check builds).
fn wave_fit(
    stage: u32,
    name: &'static str,
    file: &'static str,
    entry: (&'static str, TailArgs),
    ring: Ring,
    summary: &'static str,
) -> Variant {
    let plan = Plan::Persistent { entry: entry.0, tail: entry.1, width: Width::Fitted, ring, group: Group::Tunable };
    persistent(stage, name, file, plan, summary).with_defines(vec![Define::new("WS_BN", "256")])
}

/// A ping-pong stage's plan: an entry per tail, the width and ring depth its tunables.
fn ping_pong_plan(entry: &'static str, group: Group) -> Plan {
    Plan::Persistent { entry, tail: TailArgs::Residual, width: Width::Tunable, ring: Ring::Tunable, group }
}

/// The ping-pong stages: consumers taking turns on 128 x WS_BN tiles, the width and ring depth
/// a declared sweep space (at 192 a stage of the ring is 40 KiB: 5 fit).
fn ping_pong(
    stage: u32,
    name: &'static str,
    file: &'static str,
    entry: &'static str,
    summary: &'static str,
) -> Variant {
    persistent(stage, name, file, ping_pong_plan(entry, Group::Tunable), summary)
        .with_tunables(&[("WG_STAGES", 4), ("WS_GROUP_M", DECLARED_GROUP_M), ("WS_BN", 192)])
        .with_sweep("WS_BN", &[128, 192])
        .with_sweep("WG_STAGES", &[3, 4, 5])
}

/// A ping-pong stage whose tile order's group is [`group_fit`]'s per shape: a define the host sets,
/// not a tunable, so a sweep cannot set it behind the model's back (the compile check builds the
/// declared group, `DECLARED_GROUP_M`).
fn group_fitted(
    stage: u32,
    name: &'static str,
    file: &'static str,
    entry: &'static str,
    summary: &'static str,
) -> Variant {
    ping_pong(stage, name, file, entry, summary)
        .with_plan(ping_pong_plan(entry, Group::Fitted))
        .with_tunables(&[("WG_STAGES", 4), ("WS_BN", 192)])
        .with_defines(vec![Define::new("WS_GROUP_M", "8")])
}

fn stages() -> Vec<Variant> {
    let k = |stage, name, file, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Bf16, summary)
            .with_plan(Plan::Mma)
            .with_tunables(&[("MMA_STAGES", 4)])
            .with_requirements(Requirements::SM80)
    };
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
        Variant::kernel(
            FAMILY,
            OP,
            7,
            "wgmma-tma",
            "linear-bf16/07_wgmma_tma.cu",
            Precision::Bf16,
            "wgmma.m64n128k16 from 128-byte swizzled tiles the TMA loads (mbarrier ring), 2 warpgroups a 128x128 tile",
        )
        .with_plan(Plan::Wgmma)
        .with_tunables(&[("WG_STAGES", 4)])
        .with_requirements(Requirements::SM90A),
        Variant::kernel(
            FAMILY,
            OP,
            8,
            "warp-specialized",
            "linear-bf16/08_warp_specialized.cu",
            Precision::Bf16,
            "a TMA producer warpgroup and two wgmma.m64n256k16 consumers, full/empty mbarriers, setmaxnreg, 128x256 tile",
        )
        .with_plan(Plan::WarpSpecialized)
        .with_tunables(&[("WG_STAGES", 4)])
        .with_requirements(Requirements::SM90A),
        swept(
            9,
            "persistent",
            "linear-bf16/09_persistent.cu",
            ("linear_bf16_persistent", TailArgs::None),
            "stage 8 on one block per SM looping over tiles in groups of 8 row panels (L2 reuse), loads running into the next tile",
        ),
        swept(
            10,
            "epilogue",
            "linear-bf16/10_epilogue.cu",
            ("linear_bf16_epilogue", TailArgs::ResidualAndCode),
            "stage 9 with bias + GELU or bias + residual applied to the accumulators before the store",
        ),
        wave_fit(
            11,
            "wave-fit",
            "linear-bf16/11_wave_fit.cu",
            ("linear_bf16_wave_fit", TailArgs::ResidualAndCode),
            Ring::Tunable,
            "stage 10 with the tile width (128, 192 or 256) picked per shape by a wave-quantization model",
        ),
        wave_fit(
            12,
            "epilogue-prefetch",
            "linear-bf16/12_epilogue_prefetch.cu",
            ("linear_bf16_wave_fit", TailArgs::ResidualAndCode),
            Ring::Tunable,
            "stage 11 with each chunk of 8 column groups' bias and residual pairs loaded before its stores",
        ),
        wave_fit(
            13,
            "tma-store",
            "linear-bf16/13_tma_store.cu",
            ("linear_bf16_tma_store", TailArgs::ResidualAndCode),
            Ring::FillsSharedMemory,
            "stage 12 storing through shared-memory slots with the TMA, the next tile's MMAs overlapping the stores",
        )
        .with_tunables(&[("WG_STAGES", 4), ("WS_GROUP_M", DECLARED_GROUP_M), ("EPI_SLOTS", 2)])
        .with_sweep("EPI_SLOTS", &[1, 2, 3]),
        wave_fit(
            14,
            "multicast",
            "linear-bf16/14_multicast.cu",
            ("linear_bf16_multicast", TailArgs::ResidualAndCode),
            Ring::Tunable,
            "stage 12 in clusters of 2 along M: each block loads half the shared W tile, multicast to both",
        ),
        wave_fit(
            15,
            "lean-epilogue",
            "linear-bf16/15_lean_epilogue.cu",
            ("linear_bf16_lean", TailArgs::Residual),
            Ring::Tunable,
            "stage 12 with one entry per tail, interior tiles stored unchecked, GELU on tanh.approx",
        ),
        persistent(
            16,
            "tall-tile",
            "linear-bf16/16_tall_tile.cu",
            Plan::Persistent {
                entry: "linear_bf16_tall",
                tail: TailArgs::Residual,
                width: Width::Defined,
                ring: Ring::Tunable,
                group: Group::Tunable,
            },
            "stage 15 on 192 x 128 tiles of three consumer warpgroups: exact waves at GPT-2's shapes on 132 SMs",
        )
        .with_defines(vec![Define::new("WS_BM", "192"), Define::new("WS_BN", "128")])
        .with_sweep("WG_STAGES", &[3, 4, 5]),
        ping_pong(
            17,
            "ping-pong",
            "linear-bf16/17_ping_pong.cu",
            "linear_bf16_ping_pong",
            "stage 15 with each consumer on every other 128 x 192 tile whole, one's store under the other's MMAs",
        ),
        wave_fit(
            18,
            "bias-smem",
            "linear-bf16/18_bias_smem.cu",
            ("linear_bf16_bias_smem", TailArgs::Residual),
            Ring::Tunable,
            "stage 15 with each tile's bias copied into shared memory by cp.async while its MMAs run",
        ),
        ping_pong(
            19,
            "ping-pong-bias",
            "linear-bf16/19_ping_pong_bias.cu",
            "linear_bf16_ping_pong_bias",
            "stage 17 (consumers taking turns on 128 x 192 tiles) with stage 18's bias copy",
        ),
        wave_fit(
            20,
            "multicast-bias",
            "linear-bf16/20_multicast_bias.cu",
            ("linear_bf16_multicast_bias", TailArgs::Residual),
            Ring::Tunable,
            "stage 18 in clusters of 2 along M: each block loads half the shared W tile, multicast to both",
        ),
        wave_fit(
            21,
            "staged-store",
            "linear-bf16/21_staged_store.cu",
            ("linear_bf16_staged_store", TailArgs::Residual),
            Ring::Tunable,
            "stage 18 with interior tiles staged per warp in shared memory and stored as whole 128-byte lines",
        ),
        ping_pong(
            22,
            "ping-pong-staged",
            "linear-bf16/22_ping_pong_staged.cu",
            "linear_bf16_ping_pong_staged",
            "stage 19 (consumers taking turns, bias copied) with stage 21's whole-line staged store",
        ),
        ping_pong(
            23,
            "ping-pong-multicast",
            "linear-bf16/23_ping_pong_multicast.cu",
            "linear_bf16_ping_pong_multicast",
            "stage 22 in clusters of 2 along M: each block loads half the shared W tile, multicast to both",
        ),
        wave_fit(
            24,
            "multicast-staged",
            "linear-bf16/24_multicast_staged.cu",
            ("linear_bf16_multicast_staged", TailArgs::Residual),
            Ring::Tunable,
            "stage 21 in clusters of 2 along M: each block loads half the shared W tile, multicast to both",
        ),
        wave_fit(
            25,
            "dependent-launch",
            "linear-bf16/25_dependent_launch.cu",
            ("linear_bf16_dependent_launch", TailArgs::Residual),
            Ring::Tunable,
            "stage 21 as a programmatic dependent launch: its launch and prologue under the previous kernel's tail",
        ),
        ping_pong(
            26,
            "ping-pong-dependent",
            "linear-bf16/26_ping_pong_dependent.cu",
            "linear_bf16_ping_pong_dependent",
            "stage 22 as a programmatic dependent launch: its launch and prologue under the previous kernel's tail",
        ),
        wave_fit(
            27,
            "weights-early",
            "linear-bf16/27_weights_early.cu",
            ("linear_bf16_weights_early", TailArgs::Residual),
            Ring::Tunable,
            "stage 25 loading the first W tiles before it waits for the previous kernel (weights are no kernel's output)",
        ),
        ping_pong(
            28,
            "ping-pong-weights-early",
            "linear-bf16/28_ping_pong_weights_early.cu",
            "linear_bf16_ping_pong_weights_early",
            "stage 26 loading the first W tiles before it waits for the previous kernel (weights are no kernel's output)",
        )
        .with_defines(STAGE_28_SWITCHES.iter().map(|&s| Define::on(s)).collect::<Vec<_>>())
        .with_toggles(&STAGE_28_SWITCHES[..])
        .with_toggle_bases(&STAGE_28_SWITCH_BASES[..]),
        wave_fit(
            29,
            "deep-ring",
            "linear-bf16/29_deep_ring.cu",
            ("linear_bf16_deep_ring", TailArgs::Residual),
            Ring::FillsSharedMemory,
            "stage 27 with the ring as deep as fits at the fitted width: 6 stages at 128 wide, 5 at 192, 4 at 256",
        )
        .with_tunables(&[("WG_STAGES", 6), ("WS_GROUP_M", DECLARED_GROUP_M)]),
        wave_fit(
            30,
            "last-tile-trigger",
            "linear-bf16/30_last_tile_trigger.cu",
            ("linear_bf16_last_tile_trigger", TailArgs::Residual),
            Ring::Tunable,
            "stage 27 letting the next kernel launch only when a block starts its last tile, not as it starts",
        ),
        ping_pong(
            31,
            "ping-pong-last-tile-trigger",
            "linear-bf16/31_ping_pong_last_tile_trigger.cu",
            "linear_bf16_ping_pong_last_tile_trigger",
            "stage 28 letting the next kernel launch only when a block starts its last tile, not as it starts",
        ),
        wave_fit(
            32,
            "cooperative-256",
            "linear-bf16/32_cooperative_256.cu",
            ("linear_bf16_cooperative_256", TailArgs::Residual),
            Ring::FillsSharedMemory,
            "stage 30 on 256-row tiles (cuBLASLt's shape), each consumer 128 rows in two accumulator sets",
        )
        .with_defines(vec![Define::new("WS_BM", "256"), Define::new("WS_BN", "128")]),
        wave_fit(
            33,
            "stream-k",
            "linear-bf16/33_stream_k.cu",
            ("linear_bf16_stream_k", TailArgs::Residual),
            Ring::Tunable,
            "stage 30 with the last partial wave's tiles shared out by K steps over every SM (stream-K, fixed up in block order)",
        )
        .with_tunables(&[("WG_STAGES", 4), ("WS_GROUP_M", DECLARED_GROUP_M), ("SK_FIXUP", 2)])
        .with_sweep("SK_FIXUP", &[1, 2, 4, 8]),
        wave_fit(
            34,
            "ping-pong-64",
            "linear-bf16/34_ping_pong_64.cu",
            ("linear_bf16_ping_pong_64", TailArgs::Residual),
            Ring::Tunable,
            "stage 31 on 64-row tiles, one accumulator set a consumer: at N = 768 two tiles an SM, half the store hidden",
        )
        .with_defines(vec![Define::new("WS_BM", "64"), Define::new("WS_BN", "256")])
        .with_sweep("WG_STAGES", &[3, 4, 5]),
        wave_fit(
            35,
            "column-split",
            "linear-bf16/35_column_split.cu",
            ("linear_bf16_column_split", TailArgs::Residual),
            Ring::FillsSharedMemory,
            "stage 30 with the consumers splitting the tile's columns, one WS_LAG K steps behind: half the store under the other half's MMAs",
        )
        .with_tunables(&[("WG_STAGES", 6), ("WS_GROUP_M", DECLARED_GROUP_M), ("WS_LAG", 2)])
        .with_sweep("WS_LAG", &[0, 1, 2, 3, 4]),
        wave_fit(
            36,
            "l2-prefetch",
            "linear-bf16/36_l2_prefetch.cu",
            ("linear_bf16_l2_prefetch", TailArgs::Residual),
            Ring::Tunable,
            "stage 30 with the operands of the first WS_L2_WINDOW K steps fetched into L2 at the start, each box by one block (TMA prefetches)",
        )
        .with_tunables(&[("WG_STAGES", 4), ("WS_GROUP_M", DECLARED_GROUP_M), ("WS_L2_WINDOW", 12)])
        .with_sweep("WS_L2_WINDOW", &[6, 8, 12, 24, 48]),
        group_fitted(
            37,
            "group-fit",
            "linear-bf16/37_group_fit.cu",
            "linear_bf16_group_fit",
            "stage 31 with the tile order's group of row panels fitted to L2: where W overflows it, each W tile read from DRAM as few times as the L2 allows",
        ),
        wave_fit(
            38,
            "descriptor-prefetch",
            "linear-bf16/38_descriptor_prefetch.cu",
            ("linear_bf16_descriptor_prefetch", TailArgs::Residual),
            Ring::Tunable,
            "stage 30 with both tensor maps prefetched into the TMA unit as each block starts, ahead of the first loads",
        ),
        wave_fit(
            39,
            "tma-last-tile",
            "linear-bf16/39_tma_last_tile.cu",
            ("linear_bf16_tma_last_tile", TailArgs::Residual),
            Ring::Tunable,
            "stage 30 storing each block's last tile with the TMA out of the ring its MMAs no longer need (bias and GELU tails)",
        ),
        wave_fit(
            40,
            "weights-early-one",
            "linear-bf16/40_weights_early_one.cu",
            ("linear_bf16_weights_early_one", TailArgs::Residual),
            Ring::Tunable,
            "stage 30 loading only the first K step's W tile before it waits for the previous kernel, so the first A tile is not queued behind the rest",
        )
        .with_tunables(&[("WG_STAGES", 4), ("WS_GROUP_M", DECLARED_GROUP_M), ("WS_EARLY", 1)])
        .with_sweep("WS_EARLY", &[1, 2, 3, 4]),
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

/// Stage 33's schedule for an M x N x K GEMM of 128-row tiles on `sms` SMs: of `widths` (widest
/// first), the width and the number of tiles at the end of the schedule shared out by K steps, with
/// the fewest K steps x width on the busiest SM. Data-parallel, a block runs `ceil(tiles / sms)`
/// tiles of `K / 64` steps. Stream-K keeps the whole waves data-parallel and spreads the remaining
/// tiles' steps over every SM (`ceil(rest x steps / sms)` more), at a price of `fixup_steps` steps
/// for the partial sums a cut tile writes and reads; it is chosen only where that is cheaper.
pub fn stream_k_fit(m: usize, n: usize, k: usize, sms: u32, widths: &[u32], fixup_steps: u32) -> (u32, u32) {
    let sms = sms.max(1) as usize;
    let steps = k.div_ceil(WG_BK as usize);
    let plan = |w: u32| {
        let tiles = m.div_ceil(TILE_M) * n.div_ceil(w as usize);
        let data_parallel = tiles.div_ceil(sms) * steps;
        let rest = tiles % sms;
        let shared = (tiles / sms) * steps + (rest * steps).div_ceil(sms) + fixup_steps as usize;
        if rest > 0 && shared < data_parallel {
            (shared * w as usize, rest as u32)
        } else {
            (data_parallel * w as usize, 0)
        }
    };
    widths.iter().map(|&w| (w, plan(w))).min_by_key(|&(_, (cost, _))| cost).map_or((128, 0), |(w, (_, sk))| (w, sk))
}

/// The tile width for a tail where a consumer holds two accumulator sets (the ping-pong stages,
/// 256-row tiles): `width`, except that the residual entry runs 128 wide, since beside two
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

/// A numeric define of the stage list (the tile shape of stages 16 and 32).
fn define_u32(v: &Variant, name: &str) -> Result<u32> {
    let value = v.define(name).ok_or_else(|| Error::constraint(format!("a {name} define"), "none"))?;
    value.parse().map_err(|_| Error::constraint(format!("{name} a number"), value.to_string()))
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

/// The element types `out` (and the bias and residual) may have: `f32`, or `u16` holding bf16 bits.
pub trait OutElement: DeviceRepr + ValidAsZeroBits + Copy + Default + Unpin + 'static {
    const OUTPUT: Output;
    /// `x` rounded to this type (nearest even).
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl OutElement for f32 {
    const OUTPUT: Output = Output::F32;
    fn from_f32(x: f32) -> f32 {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl OutElement for u16 {
    const OUTPUT: Output = Output::Bf16;
    fn from_f32(x: f32) -> u16 {
        bf16::from_f32(x).to_bits()
    }
    fn to_f32(self) -> f32 {
        bf16::from_bits(self).to_f32()
    }
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
    fn gemm(self) -> Dims {
        Dims { m: self.m, n: self.n, k: self.k }
    }
}

const TAIL_BIAS: &str = "a bias with a GELU or residual tail (epi > 0 needs bias = 1)";
const TAIL_FUSED: &str = "epi = 0 (this stage fuses no tail; stage 10 and every later one do)";
/// `OUT_BF16` is written for the lean store paths only (the header's `#error`).
const OUT_STORES: &str = "out = 32 (this stage stores fp32; stage 15 on and the library row store bf16 too)";

pub fn check_shape(v: &Variant, d: LinearBf16Dims) -> Result<()> {
    check_dims(d.gemm())?;
    let plan = v.plan::<Plan>()?;
    require(d.tail == Tail::None || d.bias, TAIL_BIAS, || format!("{:?} without a bias", d.tail))?;
    let fuses = plan.fuses_tail();
    require(d.tail == Tail::None || fuses, TAIL_FUSED, || format!("{:?}", d.tail))?;
    let stores_bf16 = plan == Plan::Lt || (matches!(plan, Plan::Persistent { .. }) && Switches::of(v).lean);
    require(d.out == Output::F32 || stores_bf16, OUT_STORES, || "out = 16".to_string())?;
    if matches!(plan, Plan::Mma | Plan::Wgmma | Plan::WarpSpecialized) {
        require(d.m <= 65535 * TILE_M, GRID_M, || format!("M = {}", d.m))?;
    }
    if plan.tma() {
        require(d.k.is_multiple_of(8), TMA_K, || format!("K = {}", d.k))?;
    }
    if Switches::of(v).tma_store {
        require(d.n.is_multiple_of(4), TMA_N, || format!("N = {}", d.n))?;
    }
    Ok(())
}

enum Stage {
    Mma(Launch),
    /// A TMA stage, the rows of its A and B boxes, the tail's arguments its entry takes, and how
    /// it stores.
    Tma {
        launch: Launch,
        a_rows: u32,
        b_rows: usize,
        tail: TailArgs,
        store: Store,
        /// The bias is copied with cp.async (`Switches::copies_bias`): its address must be 16-byte aligned.
        bias_aligned: bool,
        /// Stage 33's partial sums, flags and number of tiles shared out by K steps.
        stream_k: Option<StreamKWorkspace>,
    },
    Lt(Lt),
}

/// Stage 33's workspace, owned by the prepared call (so two calls of it must not run at once).
struct StreamKWorkspace {
    partials: CudaSlice<f32>,
    flags: CudaSlice<u32>,
    tiles: u32,
}

/// The tail's arguments a TMA stage's entry takes after the bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TailArgs {
    /// None (stages 7-9).
    None,
    /// The residual pointer and the tail's code (stages 10-14).
    ResidualAndCode,
    /// The residual pointer; the tail is the entry's (stage 15 on).
    Residual,
}

/// How a TMA stage writes `out`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    /// From registers, through the `out` pointer.
    Direct,
    /// Through the `out` pointer, and the block's last tile with the TMA through a tensor map of
    /// `out` (boxes of 64 rows x 128 bytes) where its rows are a multiple of 16 bytes (stage 39).
    TmaLastTile,
    /// With the TMA, through a tensor map of `out` (boxes of `OUT_BOX`).
    Tma,
}

/// A 2-D tensor map of a row-major `[rows, cols]` matrix at `ptr` of bf16 (`wide` false) or fp32
/// (`wide` true) elements, in boxes of `box_cols` x `box_rows` whose rows are 128 bytes, in the
/// 128-byte swizzle: the layout wgmma reads (operands, 64 bf16 wide) and stage 13's output slots
/// (32 fp32 wide). A load zero-fills the parts of a box past the matrix; a store skips them.
fn tensor_map(
    ptr: u64,
    wide: bool,
    rows: usize,
    cols: usize,
    (box_cols, box_rows): (u32, u32),
) -> Result<sys::CUtensorMap> {
    use sys::{CUtensorMapDataType as T, CUtensorMapFloatOOBfill as F, CUtensorMapInterleave as I};
    use sys::{CUtensorMapL2promotion as L, CUtensorMapSwizzle as S};
    let (dtype, size) =
        if wide { (T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4) } else { (T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2) };
    let dims = [cols as u64, rows as u64];
    let strides = [(size * cols) as u64];
    let boxes = [box_cols, box_rows];
    let elements = [1u32, 1];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: the arrays hold rank (2) entries, rank - 1 for the strides; `map` is written by the
    // call; the address is a device allocation of rows * cols elements (checked by the caller),
    // whose row stride the caller checked is a multiple of 16 bytes.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            dtype,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elements.as_ptr(),
            I::CU_TENSOR_MAP_INTERLEAVE_NONE,
            S::CU_TENSOR_MAP_SWIZZLE_128B,
            L::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            F::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()
        .ctx("encode a TMA tensor map")?;
        Ok(map.assume_init())
    }
}

/// Stage 39's map of `out` for the last tile (boxes of 64 rows x 128 bytes: 32 fp32 or 64 bf16
/// columns) and whether the kernel may use it: the TMA needs `out`'s rows a multiple of 16 bytes.
fn last_tile_map(out: u64, d: LinearBf16Dims) -> Result<(sys::CUtensorMap, bool)> {
    let wide = d.out == Output::F32;
    let size = if wide { 4 } else { 2 };
    if !(d.n * size).is_multiple_of(16) {
        // SAFETY: CUtensorMap is plain bytes; the kernel reads it only when told it is valid.
        return Ok((unsafe { std::mem::zeroed() }, false));
    }
    Ok((tensor_map(out, wide, d.m, d.n, (128 / size as u32, 64))?, true))
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
    let stage = match plan {
        Plan::Mma => {
            // cp.async copies 16-byte pieces: rows of K bf16 are 16-byte aligned only when K % 8 == 0.
            let entry = if d.k.is_multiple_of(8) { "linear_bf16" } else { "linear_bf16_unaligned" };
            let stages = v.tunable("MMA_STAGES")?;
            require(stages >= 2, "MMA_STAGES >= 2", || format!("MMA_STAGES = {stages}"))?;
            let grid = ((d.n as u32).div_ceil(TILE_N), (d.m as u32).div_ceil(TILE_M as u32), 1);
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
            Stage::Lt(Lt::prepare(gpu, LtOperands::Bf16, d.out, epi, d.gemm())?)
        }
        // Every other plan is a TMA stage (`entry_base` names each one's entry).
        _ => {
            // Stages 7 and 8 take no tail and have their tile width in their file.
            let (tail, width, ring, group) = match plan {
                Plan::Persistent { tail, width, ring, group, .. } => (tail, Some(width), ring, Some(group)),
                _ => (TailArgs::None, None, Ring::Tunable, None),
            };
            let stages = v.tunable("WG_STAGES")?;
            require(stages >= 1, "WG_STAGES >= 1", || format!("WG_STAGES = {stages}"))?;
            // Stage 7: 2 warpgroups on a 128 x 128 tile, one mbarrier a stage; stage 8: a producer
            // and 2 consumers on 128 x 256, a full and an empty mbarrier a stage. Stages 9 and 10:
            // 128 x WS_BN (a tunable); the wave-fitted stages: the wave model's width; stage 16: the
            // stage list's WS_BM x WS_BN; the ping-pong stages: 128 x WS_BN (a tunable); stages 32
            // and 34: the stage list's WS_BM, the wave model's width.
            let tile_m = if v.define("WS_BM").is_some() { define_u32(v, "WS_BM")? } else { TILE_M as u32 };
            let rows_ok = [128, 192, 256].contains(&tile_m) || (tile_m == 64 && sw.ping_pong);
            require(rows_ok, "WS_BM in {128, 192, 256}, or 64 with ping-pong consumers", || {
                format!("WS_BM = {tile_m}")
            })?;
            // A consumer warpgroup per 64 rows, or two of 128 rows (two accumulator sets each), or
            // two taking turns on 64-row tiles (stage 34).
            let consumers = if tile_m == 256 || tile_m == 64 { 2 } else { tile_m / 64 };
            let two_sets = (sw.ping_pong && tile_m == 128) || tile_m == 256;
            let widths: &[u32] = if two_sets { &TWO_SETS_WIDTHS } else { &ONE_SET_WIDTHS };
            let fit = || wave_fit_width(d.m, d.n, gpu.info().sm_count, tile_m, widths);
            // Stage 33: the width and the tiles shared out by K steps, from one model.
            let stream_k = if sw.stream_k {
                let fixup = v.tunable("SK_FIXUP")?;
                Some(stream_k_fit(d.m, d.n, d.k, gpu.info().sm_count, &STREAM_K_WIDTHS, fixup))
            } else {
                None
            };
            // Stage 15 on: the entry of the shape's tail.
            let per_tail = |base: &str| match d.tail {
                Tail::None => base.to_string(),
                Tail::Gelu => format!("{base}_gelu"),
                Tail::Residual => format!("{base}_residual"),
            };
            let tile_n = match (plan, width) {
                (Plan::Wgmma, _) => 128,
                (Plan::WarpSpecialized, _) => 256,
                (_, Some(Width::Defined)) => define_u32(v, "WS_BN")?,
                (_, Some(Width::Fitted)) => stream_k.map_or_else(fit, |(width, _)| width),
                _ => v.tunable("WS_BN")?,
            };
            let tile_n = if two_sets { two_sets_width(tile_n, d.tail) } else { tile_n };
            let entry =
                if tail == TailArgs::Residual { per_tail(entry_base(plan)) } else { entry_base(plan).to_string() };
            require([128, 192, 256].contains(&tile_n), "WS_BN in {128, 192, 256}", || format!("WS_BN = {tile_n}"))?;
            require(!two_sets || tile_n <= 192, TWO_SETS_BN, || format!("WS_BN = {tile_n}"))?;
            // Stage 7: one mbarrier a stage and two consumer warpgroups; the others a full and an
            // empty mbarrier a stage, a producer warpgroup and the consumers.
            let (threads, bars) = if plan == Plan::Wgmma { (256, 1) } else { (128 * (1 + consumers), 2) };
            // Per ring stage a tile_m x 64 bf16 tile of inp and a tile_n x 64 one of W, and its
            // mbarriers; stage 13's output slots, two per consumer per EPI_SLOTS; 1 KiB to align
            // the ring for the 128-byte swizzle.
            let stage_bytes = (tile_m + tile_n) * WG_BK * 2 + 8 * bars;
            let slots = if sw.tma_store { v.tunable("EPI_SLOTS")? } else { 0 };
            require(!sw.tma_store || slots >= 1, "EPI_SLOTS >= 1", || format!("EPI_SLOTS = {slots}"))?;
            // The ping-pong stages' two turn mbarriers or stage 35's lead mbarrier; the tile's bias
            // copy per consumer; the staged store's buffer per consumer warp.
            let consumer_barriers = if sw.ping_pong {
                16
            } else if sw.column_split {
                8
            } else {
                0
            };
            let bias_copies = if sw.copies_bias { consumers * tile_n * 4 } else { 0 };
            let staging = if sw.stages_store { consumers * 4 * EPI_STAGING_BYTES } else { 0 };
            let fixed = 1024 + 2 * slots * EPI_SLOT_BYTES + consumer_barriers + bias_copies + staging;
            // Stage 13's ring is as deep as WG_STAGES allows beside its slots, stages 29's and 32's
            // beside the bias copies and the staging buffers.
            let stages = if ring == Ring::FillsSharedMemory {
                stages.min(gpu.info().shared_memory_per_block_optin.saturating_sub(fixed) / stage_bytes).max(1)
            } else {
                stages
            };
            // Stage 40's W tiles before the wait: at least one, at most the ring's depth.
            if let Ok(early) = v.tunable("WS_EARLY") {
                require((1..=stages).contains(&early), EARLY_TILES, || {
                    format!("WS_EARLY = {early}, WG_STAGES = {stages}")
                })?;
            }
            // Stage 39 stores the last tile out of the ring: both consumers' 64 x tile_n results.
            let out_bytes = if d.out == Output::F32 { 4 } else { 2 };
            require(
                !sw.tma_last || stages * (stage_bytes - 8 * bars) >= tile_m * tile_n * out_bytes,
                LAST_TILE_RING,
                || format!("WG_STAGES = {stages} at WS_BN = {tile_n}"),
            )?;
            // The kernel is compiled at the width and ring depth chosen here: the wave-fitted
            // stages' WS_BN define, a two-set stage's narrower residual width in place of its
            // WS_BN tunable, the ring of 13, 29 and 32 as deep as fits.
            let mut compiled = v.clone();
            if width == Some(Width::Fitted) {
                compiled.set_define("WS_BN", tile_n)?;
            } else if v.tunable("WS_BN").is_ok_and(|w| w != tile_n) {
                compiled.set_tunable("WS_BN", tile_n)?;
            }
            if v.tunable("WG_STAGES")? != stages {
                compiled.set_tunable("WG_STAGES", stages)?;
            }
            if d.out == Output::Bf16 {
                compiled.switch_on("OUT_BF16");
            }
            // The persistent stages' tile order walks groups of row panels, pairs of them with
            // clusters of 2: stage 37's group fitted to the shape, the others' the tunable.
            let group_m = match group {
                Some(Group::Fitted) => Some(group_fit(d.m, d.n, d.k, tile_m, gpu.info().l2_bytes)),
                Some(Group::Tunable) => Some(v.tunable("WS_GROUP_M")?),
                None => None,
            };
            if let Some(g) = group_m {
                require(g >= 1 && g % sw.cluster() == 0, GROUP_M, || format!("WS_GROUP_M = {g}"))?;
            }
            if let (Some(Group::Fitted), Some(g)) = (group, group_m) {
                compiled.set_define("WS_GROUP_M", g)?;
            }
            let v = &compiled;
            if sw.column_split {
                // Consumer 0 runs its lead on the stages filled before any is released.
                let lag = v.tunable("WS_LAG")?;
                require(lag <= stages, "WS_LAG <= WG_STAGES (the ring's depth)", || {
                    format!("WS_LAG = {lag}, WG_STAGES = {stages}")
                })?;
            }
            if sw.l2_prefetch {
                // A window no longer than the ring prefetches only what the ring loads at once.
                let window = v.tunable("WS_L2_WINDOW")?;
                require(window > stages, "WS_L2_WINDOW > WG_STAGES (the ring's depth)", || {
                    format!("WS_L2_WINDOW = {window}, WG_STAGES = {stages}")
                })?;
            }
            let (tiles_n, tiles_m) = ((d.n as u32).div_ceil(tile_n), (d.m as u32).div_ceil(tile_m));
            let smem = stages * stage_bytes + fixed;
            let shape = |grid| {
                let shape = LaunchShape::new(grid, (threads, 1, 1)).with_shared(smem);
                if sw.dependent_launch {
                    shape.with_dependent_launch()
                } else {
                    shape
                }
            };
            let entry = entry.as_str();
            let launch = if matches!(plan, Plan::Persistent { .. }) {
                // One block per SM (the ring takes most of an SM's shared memory), at most one per
                // tile (stage 33 sharing tiles out by K steps: every SM); with clusters, one
                // cluster per entry of the schedule (stage 14: pairs of tiles), at most as many as
                // run at once.
                let ctas = sw.cluster();
                let entries = tiles_m.div_ceil(ctas) * tiles_n;
                let shares = stream_k.is_some_and(|(_, tiles)| tiles > 0);
                let blocks = if shares { gpu.info().sm_count } else { ctas * entries.min(gpu.info().sm_count / ctas) };
                if ctas == 1 {
                    gpu.prepare_launch(&SOURCES, v, entry, shape((blocks, 1, 1)))?
                } else {
                    let probe =
                        gpu.prepare_launch(&SOURCES, v, entry, shape((blocks, 1, 1)).with_cluster((ctas, 1, 1)))?;
                    let fit = probe.max_active_clusters().unwrap_or(1);
                    let blocks = ctas * entries.min(fit);
                    gpu.prepare_launch(&SOURCES, v, entry, shape((blocks, 1, 1)).with_cluster((ctas, 1, 1)))?
                }
            } else {
                gpu.prepare_launch(&SOURCES, v, entry, shape((tiles_n, tiles_m, 1)))?
            };
            let store = match (sw.tma_store, sw.tma_last) {
                (true, _) => Store::Tma,
                (false, true) => Store::TmaLastTile,
                (false, false) => Store::Direct,
            };
            // Stage 33's workspace: a slot of 64 x tile_n partial sums and a flag per block and
            // consumer, the flags zero (each launch leaves them so).
            let stream_k = match stream_k {
                Some((_, tiles)) => {
                    let slots = (launch.shape().grid.0 * consumers) as usize;
                    let partials = gpu.zeros::<f32>(slots * 64 * tile_n as usize)?;
                    Some(StreamKWorkspace { partials, flags: gpu.zeros::<u32>(slots)?, tiles })
                }
                None => None,
            };
            // With clusters each block loads its share of the W tile's rows.
            Stage::Tma {
                launch,
                stream_k,
                a_rows: tile_m,
                b_rows: (tile_n / sw.cluster()) as usize,
                tail,
                store,
                bias_aligned: sw.copies_bias,
            }
        }
    };
    Ok(Prepared { stage, d, weight_early: sw.weights_early })
}

/// The buffers of one call (row-major): `out` M·N of the prepared output type `T` (`f32`, or `u16`
/// bf16 bits), `inp` M·K and `weight` N·K bf16 bit patterns, `bias` N of `T` (present exactly when
/// prepared with one), `residual` M·N of `T` (present exactly with the residual tail). Stages 27-37
/// read `weight` while the kernel before them in the stream may still run
/// ([`Prepared::reads_weight_early`]): it must not be that kernel's output (prepared weights never
/// are).
pub struct LinearBf16Args<'a, T: OutElement = f32> {
    pub out: &'a mut CudaSlice<T>,
    pub inp: &'a CudaSlice<u16>,
    pub weight: &'a CudaSlice<u16>,
    pub bias: Option<&'a CudaSlice<T>>,
    pub residual: Option<&'a CudaSlice<T>>,
}

impl Prepared {
    /// Whether the call is launched as a programmatic dependent of the kernel before it in the
    /// stream (stages 25-37): it may start under that kernel's tail.
    pub fn dependent_launch(&self) -> bool {
        matches!(&self.stage, Stage::Tma { launch, .. } if launch.shape().dependent)
    }

    /// Whether the call reads `weight` before the kernel before it in the stream has finished
    /// (stages 27-37): `weight` must not be written by that kernel.
    pub fn reads_weight_early(&self) -> bool {
        self.weight_early
    }

    pub fn enqueue<T: OutElement>(&self, stream: &CudaStream, a: LinearBf16Args<T>) -> Result<()> {
        let d = self.d;
        require(T::OUTPUT == d.out, "out of the type prepared (out = 32: f32, out = 16: u16 bf16 bits)", || {
            format!("{:?} buffers for {:?}", T::OUTPUT, d.out)
        })?;
        require_len("inp", a.inp.len(), d.m * d.k)?;
        require_len("weight", a.weight.len(), d.n * d.k)?;
        require_len("out", a.out.len(), d.m * d.n)?;
        match a.bias {
            Some(b) if d.bias => require_len("bias", b.len(), d.n)?,
            None if !d.bias => {}
            _ => {
                return Err(Error::constraint(format!("a bias exactly when prepared with bias = {}", d.bias), "other"))
            }
        }
        match a.residual {
            Some(r) if d.tail == Tail::Residual => require_len("residual", r.len(), d.m * d.n)?,
            None if d.tail != Tail::Residual => {}
            _ => return Err(Error::constraint("a residual exactly with the residual tail", format!("{:?}", d.tail))),
        }
        let bias = a.bias.map_or(0, common::device_ptr);
        if matches!(self.stage, Stage::Tma { bias_aligned: true, .. }) {
            require(bias.is_multiple_of(16), BIAS_ALIGNED, || format!("bias at {bias:#x}"))?;
        }
        let residual = a.residual.map_or(0, common::device_ptr);
        // SAFETY: every buffer's length was checked against the prepared sizes, which satisfy the
        // stage's limits; the mma entries take (out, inp, w, bias, M, N, K) and read bias only when
        // it is non-null; cuBLASLt reads the bias only with its BIAS epilogue (prepared with one).
        unsafe {
            match &self.stage {
                Stage::Mma(l) => l.enqueue(
                    stream,
                    &[
                        Arg::buf(a.out),
                        Arg::buf(a.inp),
                        Arg::buf(a.weight),
                        Arg::Ptr(bias),
                        Arg::int(d.m),
                        Arg::int(d.n),
                        Arg::int(d.k),
                    ],
                ),
                Stage::Tma { launch, a_rows, b_rows, tail, store, stream_k, .. } => {
                    let map_a = tensor_map(common::device_ptr(a.inp), false, d.m, d.k, (WG_BK, *a_rows))?;
                    let map_b = tensor_map(common::device_ptr(a.weight), false, d.n, d.k, (WG_BK, *b_rows as u32))?;
                    let map_out = match store {
                        Store::Tma => Some(tensor_map(common::device_ptr(a.out), true, d.m, d.n, OUT_BOX)?),
                        Store::TmaLastTile | Store::Direct => None,
                    };
                    // (map_a, map_b, out or map_out, bias[, residual], M, N, K[, tail code][, partials,
                    // flags, shared tiles][, the last tile's map of out, whether it is valid])
                    let mut args = vec![Arg::value(&map_a), Arg::value(&map_b)];
                    args.push(map_out.as_ref().map_or_else(|| Arg::buf(a.out), Arg::value));
                    args.push(Arg::Ptr(bias));
                    if *tail != TailArgs::None {
                        args.push(Arg::Ptr(residual));
                    }
                    args.extend([Arg::int(d.m), Arg::int(d.n), Arg::int(d.k)]);
                    if *tail == TailArgs::ResidualAndCode {
                        args.push(Arg::I32(match d.tail {
                            Tail::None => 0,
                            Tail::Gelu => 1,
                            Tail::Residual => 2,
                        }));
                    }
                    if let Some(sk) = stream_k {
                        args.extend([Arg::buf(&sk.partials), Arg::buf(&sk.flags), Arg::U32(sk.tiles)]);
                    }
                    // Stage 39: `out`'s map for the last tile, valid where its rows are whole 16-byte
                    // pieces; otherwise a zeroed map the kernel does not use (it stores as stage 30).
                    let last_tile_map = match store {
                        Store::TmaLastTile => Some(last_tile_map(common::device_ptr(a.out), d)?),
                        Store::Tma | Store::Direct => None,
                    };
                    if let Some((map, valid)) = &last_tile_map {
                        args.extend([Arg::value(map), Arg::I32(i32::from(*valid))]);
                    }
                    launch.enqueue(stream, &args)
                }
                Stage::Lt(lt) => {
                    let (inp, w, out) =
                        (common::device_ptr(a.inp), common::device_ptr(a.weight), common::device_ptr(a.out));
                    lt.enqueue(stream, inp, w, bias, residual, out)
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

fn dims(s: &Shape) -> Result<LinearBf16Dims> {
    let max = i32::MAX as i64;
    let b = s.get("bias").unwrap_or(1);
    require(b == 0 || b == 1, "bias is 0 or 1", || format!("bias = {b}"))?;
    let tail = match s.get("epi").unwrap_or(0) {
        0 => Tail::None,
        1 => Tail::Gelu,
        2 => Tail::Residual,
        e => return Err(Error::constraint("epi in {0, 1, 2}", format!("epi = {e}"))),
    };
    let out = match s.get("out").unwrap_or(32) {
        32 => Output::F32,
        16 => Output::Bf16,
        o => return Err(Error::constraint("out in {32, 16}", format!("out = {o}"))),
    };
    Ok(LinearBf16Dims { m: s.dim("M", max)?, n: s.dim("N", max)?, k: s.dim("K", max)?, bias: b == 1, tail, out })
}

static INFO: OpInfo = OpInfo {
    family: FAMILY,
    name: OP,
    description:
        "out[M,N] = inp[M,K] . W[N,K]^T + bias[N], bf16 operands (weights prepared once), fp32 accumulate, fp32 or bf16 out",
    sources: &SOURCES,
    shape_keys: &["M", "N", "K", "bias", "epi", "out"],
    stages,
};

pub struct LinearBf16;

impl Op for LinearBf16 {
    fn info(&self) -> &'static OpInfo {
        &INFO
    }
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
        check_shape(v, dims(s)?)
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
        if Switches::of(v).tma_store {
            l.push(Limit { constraint: TMA_N, past: shape(3, 6, 16, 1), inside: Some(shape(3, 8, 16, 1)) });
        }
        l
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let d = dims(s)?;
        check_dims(d.gemm())?;
        match d.out {
            Output::F32 => problem::<f32>(gpu, d, seed),
            Output::Bf16 => problem::<u16>(gpu, d, seed),
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
    let rows = sampled_rows(d.m, d.n, d.k);
    // The bias in the output's type, rounded once; the reference adds exactly those values.
    let b: Vec<T> = b.into_iter().map(T::from_f32).collect();
    let b_wide: Vec<f32> = b.iter().map(|&x| x.to_f32()).collect();
    let mut reference = linear_rows(&x, &w, d.bias.then_some(&b_wide[..]), d.n, d.k, &rows);
    // The residual in the output's type; the reference adds exactly those values.
    let residual: Option<Vec<T>> = (d.tail == Tail::Residual)
        .then(|| uniform(d.m * d.n, -1.0, 1.0, seed ^ 3).into_iter().map(T::from_f32).collect());
    match (d.tail, &residual) {
        (Tail::Gelu, _) => reference.iter_mut().for_each(|x| *x = gelu_tanh(*x)),
        (Tail::Residual, Some(r)) => {
            for (o, &row) in reference.chunks_mut(d.n).zip(&rows) {
                o.iter_mut().zip(&r[row * d.n..(row + 1) * d.n]).for_each(|(x, &y)| *x += y.to_f32() as f64);
            }
        }
        _ => {}
    }
    let out_bytes = d.out.bytes() as usize;
    let copies = rotation_copies(gpu, (2 * (d.m * d.k + d.n * d.k) + out_bytes * d.m * d.n) as u64);
    Ok(Box::new(LinearBf16Problem::<T> {
        d,
        inp: Rotated::upload(gpu, &x16, copies)?,
        w: Rotated::upload(gpu, &w16, copies)?,
        bias: if d.bias { Some(gpu.upload(&b)?) } else { None },
        residual: residual.map(|r| gpu.upload(&r)).transpose()?,
        out: Rotated::outputs(gpu, d.m * d.n, copies)?,
        rows,
        reference,
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
    rows: Vec<usize>,
    reference: Vec<f64>,
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
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        Ok(self.prepared.set(v, prepare(gpu, v, self.d)?))
    }
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
        let out: Vec<f32> = gpu.download(self.out.get(copy))?.into_iter().map(T::to_f32).collect();
        Ok(verify_rows(v, &out, &self.reference, &self.rows, self.d.gemm()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // Stages 7-14 have one entry each, stage 15 and every later one three.
        assert!(checked >= 8 + 15 * 3, "{checked} entries checked");
    }

    /// The host reads a persistent stage's switches from its `.cu` (`Switches::of`): every
    /// `#define` there is a switch in the one form it reads, `#define NAME 1`, and the stages read
    /// as their headers describe them.
    #[test]
    fn switches_are_read_from_the_kernel_files() {
        let mut files = 0;
        for v in LinearBf16.variants() {
            let (Ok(Plan::Persistent { .. }), common::Source::Kernel(path)) = (v.plan::<Plan>(), v.source) else {
                continue;
            };
            let file = SOURCES.files.iter().find(|f| f.path == path).unwrap_or_else(|| panic!("{path}"));
            for line in file.text.lines().filter(|l| l.trim_start().starts_with("#define")) {
                let words: Vec<&str> = line.split_whitespace().collect();
                assert!(words.len() == 3 && words[2] == "1", "{path}: `{line}` is not `#define NAME 1`");
            }
            files += 1;
        }
        assert_eq!(files, 32, "stages 9-40");
        let of = |stage: u32| Switches::of(&LinearBf16.variants().into_iter().find(|v| v.stage == stage).unwrap());
        let none = Switches::default();
        assert_eq!(of(9), none);
        assert_eq!(of(13), Switches { tma_store: true, ..none });
        let staged = Switches { copies_bias: true, stages_store: true, lean: true, ..none };
        assert_eq!(of(23), Switches { ping_pong: true, multicast: true, ..staged });
        let early = Switches { dependent_launch: true, weights_early: true, ..staged };
        assert_eq!(of(28), Switches { ping_pong: true, ..early }, "from the stage list's defines");
        assert_eq!(of(32), early);
        let dependents: Vec<u32> =
            LinearBf16.variants().iter().filter(|v| Switches::of(v).dependent_launch).map(|v| v.stage).collect();
        assert_eq!(dependents, (25..=40).collect::<Vec<_>>());
        assert_eq!(of(34), Switches { ping_pong: true, ..early });
        assert_eq!(of(33), Switches { stream_k: true, ..early });
        assert_eq!(of(35), Switches { column_split: true, ..early });
        assert_eq!(of(36), Switches { l2_prefetch: true, ..early });
        assert_eq!(of(37), of(31), "stage 37 is stage 31's kernel; the host fits its group");
        assert_eq!(of(38), of(30), "stage 38's descriptor prefetch changes nothing in its launch");
        assert_eq!(of(39), Switches { tma_last: true, ..of(30) });
        assert_eq!(of(40), of(30), "stage 40 changes when its W tiles are issued, not its launch");
    }

    /// Stage 28's leave-one-out rows: one per switch, each without the switches that build on it,
    /// and each launched as its switches say (a kernel without `WS_PDL` never waits for the one
    /// before it, so it must not be launched as its dependent).
    #[test]
    fn stage_28_leaves_out_each_switch_and_what_builds_on_it() {
        let all = LinearBf16.variants().into_iter().find(|v| v.stage == 28).unwrap();
        let on = Switches {
            ping_pong: true,
            copies_bias: true,
            stages_store: true,
            dependent_launch: true,
            weights_early: true,
            lean: true,
            ..Switches::default()
        };
        assert_eq!(Switches::of(&all), on);
        let rows = LinearBf16.leave_one_out();
        let names: Vec<&str> = rows.iter().map(|v| v.name.as_ref()).collect();
        let want: Vec<String> = STAGE_28_SWITCHES.iter().map(|s| format!("all-{s}")).collect();
        assert_eq!(names, want, "stage 28 is the one stage with toggles");
        let row = |name: &str| rows.iter().find(|v| v.name == name).unwrap();
        let off = |name: &str| Switches::of(row(name));
        assert_eq!(off("all-WS_PDL"), Switches { dependent_launch: false, weights_early: false, ..on });
        assert_eq!(off("all-WS_WEIGHTS_EARLY"), Switches { weights_early: false, ..on });
        assert_eq!(off("all-WS_PINGPONG"), Switches { ping_pong: false, ..on });
        assert_eq!(off("all-EPI_STAGED"), Switches { stages_store: false, ..on });
        let no_copy = Switches { copies_bias: false, stages_store: false, ..on };
        assert_eq!(off("all-EPI_BIAS_SMEM"), no_copy);
        assert_eq!(off("all-EPI_LEAN"), Switches { lean: false, ..no_copy });
        assert_eq!(off("all-EPI_PREFETCH"), Switches { lean: false, ..no_copy });
        assert!(!row("all-EPI_PREFETCH").has("EPI_LEAN") && !row("all-EPI_LEAN").has("EPI_BIAS_SMEM"));
        assert!(rows.iter().all(|v| v.compared_with.as_deref() == Some("ping-pong-weights-early")));
    }

    /// A bf16 output is stored by the lean stores (`EPI_LEAN`, stage 15 on; the header's `#error`
    /// refuses it elsewhere) and the library row: the others, and stage 28's rows without the lean
    /// store, refuse `out = 16` with the typed error; `out` takes 32 or 16 only.
    #[test]
    fn bf16_output_is_the_lean_stores_and_the_library() {
        let s = bf16_out(shape(129, 132, 136, 1));
        let accepts = |v: &Variant| LinearBf16.validate(v, &s).is_ok();
        let (yes, no): (Vec<Variant>, Vec<Variant>) = LinearBf16.variants().into_iter().partition(accepts);
        let stages = |vs: &[Variant]| vs.iter().map(|v| v.stage).collect::<Vec<_>>();
        assert_eq!(stages(&yes), (15..=40).chain([90]).collect::<Vec<_>>());
        assert_eq!(stages(&no), (5..=14).collect::<Vec<_>>());
        for v in &no {
            let e = LinearBf16.validate(v, &s).unwrap_err();
            assert!(matches!(&e, Error::Constraint { constraint, .. } if constraint == OUT_STORES), "{}: {e}", v.id());
        }
        let lean: Vec<String> =
            LinearBf16.leave_one_out().into_iter().filter(accepts).map(|v| v.name.to_string()).collect();
        let kept: Vec<String> = ["WS_PINGPONG", "EPI_BIAS_SMEM", "EPI_STAGED", "WS_PDL", "WS_WEIGHTS_EARLY"]
            .map(|s| format!("all-{s}"))
            .into();
        assert_eq!(lean, kept, "without EPI_PREFETCH or EPI_LEAN the store is fp32 only");
        let mut odd = shape(129, 132, 136, 1);
        odd.set("out", 8);
        assert!(matches!(dims(&odd), Err(Error::Constraint { .. })));
        assert_eq!(dims(&shape(1, 2, 8, 0)).unwrap().out, Output::F32, "fp32 without the key");
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
    }

    /// Stage 32's widths: 256-row tiles, two accumulator sets a consumer, so at most 192 wide.
    #[test]
    fn wave_fit_of_256_row_tiles() {
        let fit = |m, n| wave_fit_width(m, n, 132, 256, &TWO_SETS_WIDTHS);
        assert_eq!(fit(4096, 4096), 128, "4096^3: 512 tiles in 4 rounds, as 128 x 256 makes");
        assert_eq!(fit(8192, 8192), 128, "8192^3: 16 rounds of 128 against 11 of 192");
        assert_eq!(fit(4096, 2304), 192, "QKV: 3 rounds of 128 or 2 of 192, a tie");
        assert_eq!(fit(4096, 50304), 192, "the padded LM head: a tie");
        assert_eq!(fit(4096, 768), 128, "N = 768: one round either way (96 or 64 tiles)");
        assert_eq!(fit(4100, 2308), 192, "the GPU test's ragged shape for 192: 3 rounds of 128 or 2 of 192");
        assert_eq!(two_sets_width(192, Tail::Residual), 128, "the residual entry spills at 192");
    }

    /// Stage 34's widths: 64-row tiles, one accumulator set a consumer.
    #[test]
    fn wave_fit_of_64_row_tiles() {
        let fit = |m, n| wave_fit_width(m, n, 132, 64, &ONE_SET_WIDTHS);
        assert_eq!(fit(4096, 768), 192, "N = 768: 256 tiles, two an SM on 124 SMs");
        assert_eq!(fit(4096, 2304), 192, "QKV: 6 rounds of 192, 5 of 256");
        assert_eq!(fit(4096, 3072), 256, "MLP up: a three-way tie, the widest");
        assert_eq!(fit(4096, 4096), 256, "4096^3: 8 rounds of 256");
    }

    /// Stage 37's group on the H100's 50 MiB of L2: every row panel at the LM heads, as many 2 MiB
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
        let stage_37 = LinearBf16.variants().into_iter().find(|v| v.stage == 37).unwrap();
        assert_eq!(
            stage_37.define("WS_GROUP_M"),
            Some(DECLARED_GROUP_M.to_string().as_str()),
            "the compile check's group"
        );
    }

    /// Stage 33's model at the default shapes on 132 SMs: stream-K where a partial last wave is
    /// long (4096^3, 8192^3), data-parallel where one fixup costs more than it saves.
    #[test]
    fn stream_k_fit_at_the_default_shapes() {
        let fit = |m, n, k| stream_k_fit(m, n, k, 132, &STREAM_K_WIDTHS, 2);
        assert_eq!(fit(4096, 4096, 4096), (256, 116), "512 tiles: 3 waves whole, 116 tiles shared");
        assert_eq!(fit(8192, 8192, 8192), (256, 68), "2048 tiles: 1986 + 2 steps of 256 beat 21 x 128 of 192");
        assert_eq!(fit(4096, 2304, 768), (192, 0), "QKV: 120 of 132 in the last wave, nothing to gain");
        assert_eq!(fit(4096, 3072, 768), (256, 0), "MLP up");
        assert_eq!(fit(4096, 768, 768), (192, 0), "attn proj: one wave of 128 tiles");
        assert_eq!(fit(4096, 768, 3072), (192, 0), "MLP down: 47 + 2 steps against 48");
        assert_eq!(
            fit(4096, 50304, 768),
            (192, 68),
            "the padded LM head: 765 steps of 192 against 576 of 256, 0.4% less"
        );
        assert_eq!(fit(100, 100, 512), (192, 1), "one tile of 8 steps, one a block, at the narrower width");
        assert_eq!(stream_k_fit(4096, 4096, 4096, 132, &STREAM_K_WIDTHS, 64).1, 0, "a fixup as dear as a tile");
    }

    /// The kernel's `WorkList` (`matmul_wgmma_persistent.cuh`, `WS_STREAM_K`), transcribed: each
    /// block's items (schedule entry, first K step, end K step) in order.
    fn work_items(
        entries: usize,
        sk_tiles: usize,
        ktiles: usize,
        block: usize,
        grid: usize,
    ) -> Vec<(usize, usize, usize)> {
        let dp = entries - sk_tiles;
        let total = sk_tiles * ktiles;
        let begin = |b: usize| b * (total / grid) + b.min(total % grid);
        let mut items: Vec<_> = (block..dp).step_by(grid).map(|e| (e, 0, ktiles)).collect();
        let (mut pos, end) = (begin(block), begin(block + 1));
        while pos < end {
            let t = pos / ktiles;
            let kb = pos - t * ktiles;
            let ke = ktiles.min(kb + end - pos);
            items.push((dp + t, kb, ke));
            pos += ke - kb;
        }
        items
    }

    /// The kernel's `WorkList::owner`: the block whose range holds stream-K step `p`.
    fn owner(p: usize, total: usize, grid: usize) -> usize {
        let (base, longer) = (total / grid, total % grid);
        let split = longer * (base + 1);
        if p < split {
            p / (base + 1)
        } else {
            longer + (p - split) / base
        }
    }

    /// What the kernel's fixup relies on, over schedules of every size: every K step of every tile
    /// is run once; a block writes partial sums at most once, for its first stream-K item; a cut
    /// tile is finished by the lowest block holding a part of it, as that block's last item, and
    /// the blocks it waits for (after it, up to `owner` of the tile's last step) are exactly the
    /// ones that wrote a part of it.
    #[test]
    fn stream_k_work_covers_every_step_once() {
        for (entries, ktiles, grid) in
            [(512, 64, 132), (2048, 128, 132), (1, 8, 132), (7, 3, 5), (33, 12, 16), (5, 1, 8)]
        {
            for sk_tiles in (0..=entries).filter(|s| *s == entries || *s <= 2 * grid) {
                let mut runs = vec![0u32; entries * ktiles];
                let mut holders: Vec<Vec<usize>> = vec![Vec::new(); entries];
                let mut finisher = vec![None; entries];
                for b in 0..grid {
                    let items = work_items(entries, sk_tiles, ktiles, b, grid);
                    for (i, &(e, kb, ke)) in items.iter().enumerate() {
                        (kb..ke).for_each(|k| runs[e * ktiles + k] += 1);
                        if ke - kb < ktiles {
                            holders[e].push(b);
                            if kb == 0 {
                                assert_eq!(i, items.len() - 1, "block {b}: a cut tile it finishes is its last item");
                                finisher[e] = Some(b);
                            } else {
                                let dp_items = items.iter().filter(|it| it.0 < entries - sk_tiles).count();
                                assert_eq!(i, dp_items, "block {b}: only its first stream-K item writes partial sums");
                            }
                        }
                    }
                }
                assert!(runs.iter().all(|&r| r == 1), "{entries} tiles, {sk_tiles} shared: a step run {runs:?} times");
                let dp = entries - sk_tiles;
                for (e, h) in holders.iter().enumerate().filter(|(_, h)| !h.is_empty()) {
                    let f = finisher[e].expect("every cut tile has a block holding its first step");
                    let last = owner((e - dp) * ktiles + ktiles - 1, sk_tiles * ktiles, grid);
                    assert_eq!(
                        *h,
                        (f..=last).collect::<Vec<_>>(),
                        "tile {e}: the finisher waits for exactly its other holders"
                    );
                }
            }
        }
    }
}
