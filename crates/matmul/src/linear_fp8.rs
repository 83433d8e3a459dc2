//! `matmul/linear-fp8`: the linear layer on e4m3 tensor cores (issue 48, item 2), `out[M, N] =
//! dequant(A)[M, K] · dequant(W)[N, K]ᵀ (+ bias)` with A and W in [`crate::fp8`]'s format: activations
//! with one fp32 scale per row per 128 channels, weights one per 128 × 128 block (DeepGEMM's scheme).
//! A stage is checked against the f64 product of the dequantized operands, so the kernel's error
//! stands apart from the format's; the format's (the same product on the unquantized operands
//! against the exact layer) is the check's note.
//!
//! Shape keys: `M`, `N`, `K`, `bias` (0/1), `epi` (0: the bias only; 1: then GELU; 2: then plus a
//! residual of out's type; tails need the bias and stage 4), `out` (32: fp32, the default; 16:
//! bf16, which stage 4 and the library row store; 8: e4m3 codes with one scale per row per 128
//! columns, the format the next linear reads, which stage 7 stores).
//!
//! The library row is cuBLASLt's FP8 matmul with the same fine-grained scales (cuBLAS 12.9+ on
//! sm_90: `BLK128x128_32F` for W, `VEC128_32F` for A) on the same codes; it reads the scales in its
//! own layouts and a bf16 bias ([`OperandLayout::CublasLt`]), which the problem prepares once, as a
//! quantizer writing for it would.
//!
//! The stages carry the fp8 precision preset: its tolerance (1e-2, which the exact e4m3 products and
//! fp32 promotion meet by two orders) and its ceiling, cuBLASLt's per-tensor e4m3 GEMM rate
//! ([`common::ceilings::Ceilings::fp8_tflops`]).

use common::check::{compare, compare_scaled, ErrorStats, SampledRows, Verification};
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, Rotated};
use common::{
    require, require_len, Arg, Bound, Define, Gpu, Launch, LaunchShape, Limit, Op, Precision, Prepared as Current,
    PreparedStage, Problem, Requirements, ResourceUse, Result, Shape, Variant, Workload,
};

use crate::linear::inputs;
use crate::linear_bf16::{shape_with_tail, verify_out, LinearBf16Dims, OutElement, Tail};
use crate::reference::{linear_rows, sampled_rows};
use crate::{fp8, FAMILY, SOURCES};
use common::lt::{Lt, LtEpilogue, LtOperands, LtScales, Output};

const OP: &str = "linear-fp8";

common::declare_op! {
    pub struct LinearFp8 {
        name: OP,
        description: "linear layer on e4m3 tensor cores: out = dequant(A) . dequant(W)^T + bias, A with 1 x 128 row scales, W with 128 x 128 block scales",
        shape_keys: ["M", "N", "K", "bias", "epi", "out"],
        stages: stages,
    }
}

const TILE: usize = 128;
const K_ALIGN: &str = "K % 16 == 0";
const ROWS: &str = "M <= 65535 * 128";
/// cuBLASLt's 1 x 128 scales: a K group's M scales start 16-byte aligned, and M % 8 is what
/// TransformerEngine found cuBLASLt to enforce for a 1-D scaled B (its docs say M % 4).
const LT_M: &str = "M % 8 == 0 (cuBLASLt's block-scaled FP8)";
/// cuBLASLt's fp32 D rows 16-byte aligned.
const LT_N: &str = "N % 4 == 0 (cuBLASLt's block-scaled FP8)";
/// The TMA store's 16-byte row stride of the fp32 out.
const TMA_STORE_N: &str = "N % 4 == 0";
const TMA_STORE_N_BF16: &str = "N % 8 == 0 at out = 16";
/// Stages 0-3 store fp32 from registers.
const OUT_F32: &str = "out = 32";
/// Stages 0-3 and the library row add the bias only.
const EPI_NONE: &str = "epi = 0";
const TAIL_BIAS: &str = "a bias with a GELU or residual tail (epi > 0 needs bias = 1)";
/// cuBLASLt's bf16 D rows 16-byte aligned.
const LT_N_BF16: &str = "N % 8 == 0 (cuBLASLt's block-scaled FP8, bf16 out)";
/// Stages 4-6 and the library row store fp32 or bf16; stages 7-8 also e4m3 (stage 8 with stage 7's kernel).
const OUT_WIDE: &str = "out = 32 or 16";
/// The TMA store's 16-byte row stride of the e4m3 codes.
const TMA_STORE_N_E4M3: &str = "N % 16 == 0 at out = 8";
/// A residual sum is the fp32 stream's, never quantized.
const E4M3_TAIL: &str = "epi < 2 at out = 8";

/// How a stage runs; a kernel's entry, block and grid follow from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Two consumer warpgroups, one of whose threads also refills the ring after a block barrier.
    Cooperative,
    /// A producer warpgroup and two consumers on full/empty barriers.
    WarpSpecialized,
    /// Stage 1 with each step's promotion overlapped with the next step's wgmma.
    Overlapped,
    /// Stage 2 with one block an SM walking its tiles.
    Persistent,
    /// Stage 3 storing each tile through shared memory and the TMA under the next tile's first step.
    StagedEpilogue,
    /// Stage 4 with three consumer warpgroups on 192-row tiles, each step waited for.
    ThreeConsumers,
    /// Stage 4's kernel or stage 5's, whichever tile (128 or 192 rows) fits the waves at the shape.
    WaveFit,
    /// Stage 6 walking a group of row panels at a time, the group fitted to the L2 at the shape.
    GroupFit,
    /// Stage 7 with 128 x 256 tiles in two column halves where they read less of the L2 at the shape.
    WideTile,
    /// cuBLASLt's block-scaled FP8 matmul.
    Lt,
}

/// How a kernel stage's grid covers the output's 128 x 128 tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Grid {
    /// One block a tile: (column tiles, row tiles).
    Tiles,
    /// One block an SM (at most one a tile), each walking its tiles.
    Persistent,
}

/// A kernel stage's launch: its entry, threads, mbarriers a ring stage, grid, whether it stores
/// through the TMA (a third tensor map, a consumer's 64 x 128 tile of staging) and whether also as
/// e4m3 (out = 8), its consumer warpgroups, one for each 64 rows of its tile, its tile's columns
/// (W's rows a ring stage), and what the host fits to each shape.
struct KernelPlan {
    entry: &'static str,
    threads: u32,
    barriers: u32,
    grid: Grid,
    tma_store: bool,
    e4m3_out: bool,
    consumers: u32,
    cols: u32,
    per_shape: PerShape,
}

/// What the host chooses per shape for a kernel stage.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PerShape {
    /// Nothing: the stage list's tile and order.
    Nothing,
    /// The tile's rows (stage 6).
    Rows,
    /// The tile's rows and the walk's group of row panels (stage 7).
    RowsAndGroup,
    /// The tile's rows and columns and the walk's group of row panels (stage 8).
    TileAndGroup,
}

/// Stage 6's two tiles, each with its ring depth: stage 5's 192 rows (three stages beside three
/// consumers' fp32 staging) and stage 4's 128 (four), in the order the wave model breaks ties.
const WAVE_FIT_TILES: [(u32, u32); 2] = [(192, 3), (128, 4)];
/// Stage 6's tile rows where no shape is known (the host sets them per shape).
static WAVE_FIT_DEFINES: [Define; 1] = [Define::new("F8_TILE_ROWS", "192")];
/// Stage 7's group where W fits in half the L2: one row panel at a time, stage 6's walk (a group of
/// 8 measured 1-4% slower at GPT-2's block linears and 4096^3, call S9).
const DECLARED_GROUP: u32 = 1;
/// Stage 7's defines where no shape is known.
static GROUP_FIT_DEFINES: [Define; 2] = [Define::new("F8_TILE_ROWS", "192"), Define::new("F8_GROUP_M", "1")];
/// Stage 8's wide tile (rows, columns) and its ring depth: three stages of 48 KiB beside two
/// consumers' fp32 staging (four leave no room for it).
const WIDE_TILE: (u32, u32) = (128, 256);
const WIDE_TILE_STAGES: u32 = 3;
/// Stage 8's threads at the wide tile: a producer warpgroup and two consumers.
const WIDE_TILE_THREADS: u32 = 3 * 128;
/// Stage 8's defines where no shape is known: the wide tile.
static WIDE_TILE_DEFINES: [Define; 3] =
    [Define::new("F8_TILE_ROWS", "128"), Define::new("F8_TILE_COLS", "256"), Define::new("F8_GROUP_M", "1")];

impl KernelPlan {
    /// The rows of the tile (and of A's TMA box).
    fn tile_rows(&self) -> usize {
        64 * self.consumers as usize
    }

    /// The plan and the variant to compile at `d` on `gpu`. Stage 6 on takes the tile whose rounds x
    /// rows is least ([`wave_fit_rows`]), with that tile's consumers, threads and ring depth
    /// (`F8_TILE_ROWS`, `WG_STAGES`); stage 7 the group [`group_fit`] fits to the L2 (`F8_GROUP_M`);
    /// stage 8 also the columns ([`wide_fit`], `F8_TILE_COLS`); every other stage is as declared.
    fn fitted(self, v: &Variant, d: LinearFp8Dims, gpu: &Gpu) -> Result<(KernelPlan, Variant)> {
        if self.per_shape == PerShape::Nothing {
            return Ok((self, v.clone()));
        }
        let sms = gpu.info().sm_count;
        let (rows, cols) = match self.per_shape {
            PerShape::TileAndGroup => wide_fit(d.m, d.n, sms),
            _ => (wave_fit_rows(d.m, d.n, sms), TILE as u32),
        };
        let (stages, threads) = if (rows, cols) == WIDE_TILE {
            (WIDE_TILE_STAGES, WIDE_TILE_THREADS)
        } else {
            (WAVE_FIT_TILES.iter().find(|&&(r, _)| r == rows).map_or(3, |&(_, s)| s), 128 * (1 + rows / 64))
        };
        let mut compiled = v.clone();
        compiled.set_define("F8_TILE_ROWS", rows)?;
        compiled.set_tunable("WG_STAGES", stages)?;
        if self.per_shape != PerShape::Rows {
            compiled.set_define("F8_GROUP_M", group_fit(d.m, d.n, d.k, rows, gpu.info().l2_bytes))?;
        }
        if self.per_shape == PerShape::TileAndGroup {
            compiled.set_define("F8_TILE_COLS", cols)?;
        }
        Ok((KernelPlan { consumers: rows / 64, cols, threads, ..self }, compiled))
    }
}

/// Whether stage `v` stores e4m3 (out = 8): stages 7 and 8's kernels.
pub fn stores_e4m3(v: &Variant) -> bool {
    v.plan::<Plan>().ok().and_then(Plan::kernel).is_some_and(|k| k.e4m3_out)
}

/// Stage 7's group of row panels for an M x N x K product of `rows`-row tiles on a GPU of `l2_bytes`
/// of L2: where W (N x K codes) fits in half the L2, [`DECLARED_GROUP`]; else the most row panels
/// whose A rows (group x rows x K codes, read again for every column) fit in half the L2, every
/// panel where they all fit, so W comes from DRAM once. Half, where `linear-bf16`'s fit lets W have
/// the whole L2: the outputs stream through it too (the LM head's 412 MB of bf16 logits).
pub fn group_fit(m: usize, n: usize, k: usize, rows: u32, l2_bytes: u64) -> u32 {
    let half = l2_bytes as usize / 2;
    if n * k <= half {
        return DECLARED_GROUP;
    }
    let panels = half / (rows as usize * k).max(1);
    panels.clamp(1, m.div_ceil(rows as usize).max(1)) as u32
}

/// Stage 6's tile rows for an M x N output on `sms` SMs: of [`WAVE_FIT_TILES`], the rows with the
/// fewest rounds x rows, where a round is one 128-wide tile on every SM (`linear-bf16` stage 11's
/// model along M; ties go to 192, which reads fewer L2 bytes a flop).
pub fn wave_fit_rows(m: usize, n: usize, sms: u32) -> u32 {
    crate::linear_bf16::wave_fit_width(n, m, sms, TILE as u32, &WAVE_FIT_TILES.map(|(rows, _)| rows))
}

/// Stage 8's tile (rows, columns) for an M x N output on `sms` SMs: [`WIDE_TILE`] where its rounds x
/// (rows + columns), the A and W bytes an SM reads from L2 a K step over all its rounds, is less than
/// that of stage 6's tile ([`wave_fit_rows`], 128 columns); else stage 6's.
pub fn wide_fit(m: usize, n: usize, sms: u32) -> (u32, u32) {
    let l2_reads = |(rows, cols): (u32, u32)| {
        let tiles = m.div_ceil(rows as usize) * n.div_ceil(cols as usize);
        tiles.div_ceil(sms.max(1) as usize) * (rows + cols) as usize
    };
    let fitted = (wave_fit_rows(m, n, sms), TILE as u32);
    if l2_reads(WIDE_TILE) < l2_reads(fitted) {
        WIDE_TILE
    } else {
        fitted
    }
}

impl Plan {
    fn kernel(self) -> Option<KernelPlan> {
        let (entry, threads, barriers, grid, tma_store, consumers) = match self {
            Plan::Cooperative => ("linear_fp8_wgmma", 256, 1, Grid::Tiles, false, 2),
            Plan::WarpSpecialized => ("linear_fp8_ws", 384, 2, Grid::Tiles, false, 2),
            Plan::Overlapped => ("linear_fp8_overlap", 384, 2, Grid::Tiles, false, 2),
            Plan::Persistent => ("linear_fp8_persistent", 384, 2, Grid::Persistent, false, 2),
            Plan::StagedEpilogue => ("linear_fp8_staged_epilogue", 384, 2, Grid::Persistent, true, 2),
            Plan::ThreeConsumers => ("linear_fp8_three_consumers", 512, 2, Grid::Persistent, true, 3),
            Plan::WaveFit => ("linear_fp8_wave_fit", 512, 2, Grid::Persistent, true, 3),
            Plan::GroupFit => ("linear_fp8_group_fit", 512, 2, Grid::Persistent, true, 3),
            Plan::WideTile => ("linear_fp8_wide_tile", 512, 2, Grid::Persistent, true, 3),
            Plan::Lt => return None,
        };
        let per_shape = match self {
            Plan::WaveFit => PerShape::Rows,
            Plan::GroupFit => PerShape::RowsAndGroup,
            Plan::WideTile => PerShape::TileAndGroup,
            _ => PerShape::Nothing,
        };
        let e4m3_out = matches!(self, Plan::GroupFit | Plan::WideTile);
        let cols = TILE as u32;
        Some(KernelPlan { entry, threads, barriers, grid, tma_store, e4m3_out, consumers, cols, per_shape })
    }

    /// The earlier stage whose kernel this one runs unchanged at `d` on `sms` SMs, if any: stage 8
    /// keeps stage 7's where stage 7's tile reads less of the L2 ([`wide_fit`]), and at the e4m3 out,
    /// where the wide tile's quantized store measured 0.89-0.94x stage 7's at the MLP up (calls W3,
    /// Y3).
    fn kept_from(self, d: LinearFp8Dims, sms: u32) -> Option<Plan> {
        let wide = wide_fit(d.m, d.n, sms) == WIDE_TILE && d.out != Output::E4m3;
        (self == Plan::WideTile && !wide).then_some(Plan::GroupFit)
    }

    /// The kernel stage `v` (of this plan) runs at `d` and the variant to compile for it (None for
    /// the library row): where the stage keeps an earlier stage's kernel ([`Plan::kept_from`]), that
    /// stage's, launched from that stage's own module, so both rows share one compile of it.
    fn fitted(self, v: &Variant, d: LinearFp8Dims, gpu: &Gpu) -> Result<Option<(KernelPlan, Variant)>> {
        if let Some(earlier) = self.kept_from(d, gpu.info().sm_count) {
            let stage = stages().into_iter().find(|s| s.plan::<Plan>().ok() == Some(earlier));
            let stage = stage.ok_or_else(|| common::Error::MissingSource(format!("linear-fp8's {earlier:?} stage")))?;
            return earlier.fitted(&stage, d, gpu);
        }
        self.kernel().map(|k| k.fitted(v, d, gpu)).transpose()
    }
}

fn stages() -> Vec<Variant> {
    let k = |stage, name, file, plan: Plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Fp8, summary)
            .with_plan(plan)
            .with_tunables(&[("WG_STAGES", 4)])
            .with_requirements(Requirements::SM90A)
    };
    vec![
        k(
            0,
            "wgmma-scaled",
            "linear-fp8/00_wgmma_scaled.cu",
            Plan::Cooperative,
            "linear-bf16 stage 7's frame on e4m3: TMA tiles of 128 x 128 codes, 4 wgmma.m64n128k32.e4m3 a K step into a fresh tile, promoted into fp32 times the step's row and block scales",
        ),
        k(
            1,
            "warp-specialized",
            "linear-fp8/01_warp_specialized.cu",
            Plan::WarpSpecialized,
            "stage 0 with a producer warpgroup on full/empty barriers: no block barrier in the K loop, a stage refilled as soon as both consumers let it go",
        ),
        k(
            2,
            "overlapped-promotion",
            "linear-fp8/02_overlapped_promotion.cu",
            Plan::Overlapped,
            "stage 1 with step k + 1's wgmma issued before step k's are waited for: the promotion runs beside the tensor cores, two partial tiles alternate",
        ),
        k(
            3,
            "persistent",
            "linear-fp8/03_persistent.cu",
            Plan::Persistent,
            "stage 2 with one block an SM walking its tiles: the ring runs on across tiles, so the next tile's loads land while this one is stored",
        ),
        k(
            4,
            "staged-epilogue",
            "linear-fp8/04_staged_epilogue.cu",
            Plan::StagedEpilogue,
            "stage 3 storing each tile through shared memory and four TMA stores while the next tile's first K step runs",
        ),
        k(
            5,
            "three-consumers",
            "linear-fp8/05_three_consumers.cu",
            Plan::ThreeConsumers,
            "stage 4 with a third consumer warpgroup on 192 x 128 tiles (512 threads; no registers for a second partial tile, so each step waited for): GPT-2's shapes at M = 4096 fit the SMs' waves",
        )
        .with_tunables(&[("WG_STAGES", 3)]),
        k(
            6,
            "wave-fit",
            "linear-fp8/06_wave_fit.cu",
            Plan::WaveFit,
            "stage 4's kernel (128-row tiles) or stage 5's (192) per shape, whichever has the fewer rounds x rows on the SMs (linear-bf16 stage 11's wave model along M)",
        )
        .with_defines(&WAVE_FIT_DEFINES[..])
        .with_tunables(&[("WG_STAGES", 3)]),
        k(
            7,
            "group-fit",
            "linear-fp8/07_group_fit.cu",
            Plan::GroupFit,
            "stage 6 walking F8_GROUP_M row panels at a time, column by column, the group fitted to the L2 per shape: W from DRAM once where it overflows half the L2 (the LM head)",
        )
        .with_defines(&GROUP_FIT_DEFINES[..])
        .with_tunables(&[("WG_STAGES", 3)]),
        k(
            8,
            "wide-tile",
            "linear-fp8/08_wide_tile.cu",
            Plan::WideTile,
            "stage 7 with 128 x 256 tiles where they read less of the L2 at the shape: a K step in two 128-column halves through one partial tile, each waited for and promoted (240 registers a consumer thread)",
        )
        .with_defines(&WIDE_TILE_DEFINES[..])
        .with_tunables(&[("WG_STAGES", WIDE_TILE_STAGES)]),
        Variant::library(
            FAMILY,
            OP,
            90,
            "cublaslt-fp8",
            "cublasLtMatmul e4m3 with BLK128x128_32F W scales and VEC128_32F A scales (BIAS epilogue, bf16 bias)",
            Precision::Fp8,
            "cuBLASLt's block-scaled FP8 matmul on the same codes and scales (in its layouts) and a bf16 copy of the bias",
        )
        .with_plan(Plan::Lt)
        .with_requirements(Requirements::SM90),
    ]
}

/// The sizes of one call, whether it adds a bias, its tail, and its output's type: `linear-bf16`'s.
pub type LinearFp8Dims = LinearBf16Dims;

pub fn check_shape(v: &Variant, d: LinearFp8Dims) -> Result<()> {
    for (key, x) in [("M", d.m), ("N", d.n), ("K", d.k)] {
        require(x >= 1, &format!("{key} >= 1"), || format!("{key} = {x}"))?;
    }
    for (what, a, b) in [("M * K < 2^31", d.m, d.k), ("N * K < 2^31", d.n, d.k), ("M * N < 2^31", d.m, d.n)] {
        require(a.checked_mul(b).is_some_and(|x| x < 1 << 31), what, || format!("{a} x {b}"))?;
    }
    require(d.k.is_multiple_of(16), K_ALIGN, || format!("K = {}", d.k))?;
    require(d.tail == Tail::None || d.bias, TAIL_BIAS, || format!("{:?} without a bias", d.tail))?;
    let kernel = v.plan::<Plan>()?.kernel();
    if !kernel.as_ref().is_some_and(|k| k.tma_store) {
        require(d.tail == Tail::None, EPI_NONE, || format!("{:?}", d.tail))?;
    }
    let bf16 = d.out == Output::Bf16;
    if d.out == Output::E4m3 {
        // Stages 7-8 store it; stages 0-3 refuse it below, as they refuse bf16 (out = 32).
        let stage_7_or_before_4 = kernel.as_ref().is_some_and(|k| k.e4m3_out || !k.tma_store);
        require(stage_7_or_before_4, OUT_WIDE, || "out = 8".to_string())?;
    }
    match &kernel {
        Some(k) if k.e4m3_out && d.out == Output::E4m3 => {
            require(d.tail != Tail::Residual, E4M3_TAIL, || "epi = 2".to_string())?;
            require(d.n.is_multiple_of(16), TMA_STORE_N_E4M3, || format!("N = {}", d.n))?
        }
        Some(k) if k.tma_store && bf16 => require(d.n.is_multiple_of(8), TMA_STORE_N_BF16, || format!("N = {}", d.n))?,
        Some(k) if k.tma_store => require(d.n.is_multiple_of(4), TMA_STORE_N, || format!("N = {}", d.n))?,
        Some(_) => require(d.out == Output::F32, OUT_F32, || format!("out = {}", 8 * d.out.bytes()))?,
        None if bf16 => require(d.n.is_multiple_of(8), LT_N_BF16, || format!("N = {}", d.n))?,
        None => {}
    }
    match kernel.map(|k| k.grid) {
        Some(Grid::Tiles) => require(d.m <= 65535 * TILE, ROWS, || format!("M = {}", d.m)),
        Some(Grid::Persistent) => Ok(()),
        None => {
            require(d.m.is_multiple_of(8), LT_M, || format!("M = {}", d.m))?;
            require(d.n.is_multiple_of(4), LT_N, || format!("N = {}", d.n))
        }
    }
}

/// How a stage reads the scales and the bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandLayout {
    /// [`fp8`]'s: A's scales `[M, ceil(K / 128)]`, W's `[ceil(N / 128), ceil(K / 128)]`, both
    /// row-major; an fp32 bias.
    Fp8,
    /// cuBLASLt's: A's scales K-group-major (`[ceil(K / 128), M]`, M contiguous), W's
    /// `[ceil(N / 128), L4]` with the K groups padded with zeros to L4 = a multiple of 4; a bf16
    /// bias (its FP8 matmul's type beside an fp32 D).
    CublasLt,
}

impl OperandLayout {
    /// W's scale count in this layout.
    fn w_scales(self, d: LinearFp8Dims) -> usize {
        let g = fp8::groups(d.k);
        fp8::groups(d.n) * if self == OperandLayout::CublasLt { g.next_multiple_of(4) } else { g }
    }

    /// `a_scales` and `w_scales`, given in [`OperandLayout::Fp8`], in this layout.
    pub fn arrange(self, a_scales: &[f32], w_scales: &[f32], d: LinearFp8Dims) -> (Vec<f32>, Vec<f32>) {
        let g = fp8::groups(d.k);
        match self {
            OperandLayout::Fp8 => (a_scales.to_vec(), w_scales.to_vec()),
            OperandLayout::CublasLt => {
                let a = (0..g).flat_map(|kb| (0..d.m).map(move |m| a_scales[m * g + kb])).collect();
                let l4 = g.next_multiple_of(4);
                let w = (0..fp8::groups(d.n))
                    .flat_map(|nb| (0..l4).map(move |kb| if kb < g { w_scales[nb * g + kb] } else { 0.0 }))
                    .collect();
                (a, w)
            }
        }
    }
}

enum Runner {
    /// A kernel, whether it takes out's tensor map after the common arguments, and its tile's rows.
    Kernel {
        launch: Launch,
        tma_store: bool,
        tile_rows: usize,
        tile_cols: usize,
    },
    Lt(Lt),
}

/// A stage prepared for one size.
pub struct Prepared {
    runner: Runner,
    d: LinearFp8Dims,
}

pub fn prepare(gpu: &Gpu, v: &Variant, d: LinearFp8Dims) -> Result<Prepared> {
    check_shape(v, d)?;
    let Some((plan, v)) = v.plan::<Plan>()?.fitted(v, d, gpu)? else {
        let epi = if d.bias { LtEpilogue::Bias } else { LtEpilogue::None };
        let dims = common::lt::LtDims { m: d.m, n: d.n, k: d.k };
        return Ok(Prepared { runner: Runner::Lt(Lt::prepare(gpu, LtOperands::E4m3Blocks, d.out, epi, dims)?), d });
    };
    let v = &v;
    let stages = v.tunable("WG_STAGES")?;
    // An A tile of the tile's rows and a W tile of its columns, 128 codes each, a stage, 1 KiB for
    // the swizzle's alignment, the barriers; with TMA stores, rounded up to 1 KiB and each
    // consumer's 64 x 128 staging of out (a wide tile's halves take turns in it).
    let (tile_rows, tile_cols) = (plan.tile_rows(), plan.cols as usize);
    let ring = stages * ((tile_rows + tile_cols) * TILE) as u32 + 8 * plan.barriers * stages;
    let staging = plan.consumers * 64 * TILE as u32 * d.out.bytes() as u32;
    let shared = 1024 + if plan.tma_store { ring.next_multiple_of(1024) + staging } else { ring };
    let (row_tiles, col_tiles) = (d.m.div_ceil(tile_rows) as u32, d.n.div_ceil(tile_cols) as u32);
    let grid = match plan.grid {
        Grid::Tiles => (col_tiles, row_tiles, 1),
        Grid::Persistent => ((row_tiles * col_tiles).min(gpu.info().sm_count), 1, 1),
    };
    let shape = LaunchShape::new(grid, (plan.threads, 1, 1)).with_shared(shared);
    let tail = match d.tail {
        Tail::None => "",
        Tail::Gelu => "_gelu",
        Tail::Residual => "_residual",
    };
    let out = match d.out {
        Output::F32 => "",
        Output::Bf16 => "_bf16",
        Output::E4m3 => "_e4m3",
    };
    let entry = format!("{}{tail}{out}", plan.entry);
    let launch = gpu.prepare_launch(&SOURCES, v, &entry, shape)?;
    Ok(Prepared { runner: Runner::Kernel { launch, tma_store: plan.tma_store, tile_rows, tile_cols }, d })
}

/// The buffers of one call: `out` M·N; A's codes M·K ([`fp8::Fp8Rows`]) and W's N·K
/// ([`fp8::Fp8Blocks`]); their scales and the bias (N) in the stage's [`Prepared::layout`].
pub struct LinearFp8Args<'a> {
    pub out: OutBuf<'a>,
    pub a_codes: &'a CudaSlice<u8>,
    pub a_scales: &'a CudaSlice<f32>,
    pub w_codes: &'a CudaSlice<u8>,
    pub w_scales: &'a CudaSlice<f32>,
    pub bias: Option<Bias<'a>>,
    /// M·N elements of out's type, exactly with the residual tail (it may be `out`'s own buffer).
    pub residual: Option<ResidualBuf<'a>>,
}

/// `out`: M·N elements of the call's output type, borrowed mutably for the call; at out = 8 the
/// codes and their M·ceil(N / 128) scales ([`fp8::Fp8Rows`]' layout).
pub struct OutBuf<'a> {
    ptr: u64,
    len: usize,
    output: Output,
    /// The e4m3 codes' scales: address and length.
    scales: Option<(u64, usize)>,
    _buf: std::marker::PhantomData<&'a mut ()>,
}

impl<'a> OutBuf<'a> {
    pub fn new<T: OutElement>(buf: &'a mut CudaSlice<T>) -> OutBuf<'a> {
        let (ptr, len) = (common::device_ptr(&*buf), buf.len());
        OutBuf { ptr, len, output: T::OUTPUT, scales: None, _buf: std::marker::PhantomData }
    }

    /// An e4m3 out (out = 8): `codes` M·N, `scales` M·ceil(N / 128).
    pub fn e4m3(codes: &'a mut CudaSlice<u8>, scales: &'a mut CudaSlice<f32>) -> OutBuf<'a> {
        let (ptr, len) = (common::device_ptr(&*codes), codes.len());
        let scales = Some((common::device_ptr(&*scales), scales.len()));
        OutBuf { ptr, len, output: Output::E4m3, scales, _buf: std::marker::PhantomData }
    }
}

/// The residual tail's input: M·N elements of the call's output type.
pub struct ResidualBuf<'a> {
    ptr: u64,
    len: usize,
    output: Output,
    _buf: std::marker::PhantomData<&'a ()>,
}

impl<'a> ResidualBuf<'a> {
    pub fn new<T: OutElement>(buf: &'a CudaSlice<T>) -> ResidualBuf<'a> {
        ResidualBuf { ptr: common::device_ptr(buf), len: buf.len(), output: T::OUTPUT, _buf: std::marker::PhantomData }
    }

    /// `out` itself as the residual (`out += ...`): the kernels read each element's residual before
    /// they store it.
    pub fn in_place(out: &OutBuf<'a>) -> ResidualBuf<'a> {
        ResidualBuf { ptr: out.ptr, len: out.len, output: out.output, _buf: std::marker::PhantomData }
    }
}

/// The bias, in the type of the stage's layout.
#[derive(Clone, Copy)]
pub enum Bias<'a> {
    F32(&'a CudaSlice<f32>),
    /// bf16 bit patterns ([`OperandLayout::CublasLt`]).
    Bf16(&'a CudaSlice<u16>),
}

impl Bias<'_> {
    fn check(self, layout: OperandLayout, n: usize) -> Result<u64> {
        let (len, ptr, given) = match self {
            Bias::F32(b) => (b.len(), common::device_ptr(b), OperandLayout::Fp8),
            Bias::Bf16(b) => (b.len(), common::device_ptr(b), OperandLayout::CublasLt),
        };
        require(given == layout, "the bias in the stage's layout (fp32 for the kernels, bf16 for cuBLASLt)", || {
            format!("{given:?}")
        })?;
        require_len("bias", len, n)?;
        Ok(ptr)
    }
}

impl Prepared {
    /// How this stage reads the scales and the bias.
    pub fn layout(&self) -> OperandLayout {
        match self.runner {
            Runner::Kernel { .. } => OperandLayout::Fp8,
            Runner::Lt(_) => OperandLayout::CublasLt,
        }
    }

    pub fn enqueue(&self, stream: &CudaStream, a: LinearFp8Args) -> Result<()> {
        let d = self.d;
        let layout = self.layout();
        require(a.out.output == d.out, "out of the prepared output type", || format!("{:?}", a.out.output))?;
        require_len("out", a.out.len, d.m * d.n)?;
        require_len("a_codes", a.a_codes.len(), d.m * d.k)?;
        require_len("a_scales", a.a_scales.len(), d.m * fp8::groups(d.k))?;
        require_len("w_codes", a.w_codes.len(), d.n * d.k)?;
        require_len("w_scales", a.w_scales.len(), layout.w_scales(d))?;
        require(a.bias.is_some() == d.bias, "bias given exactly when prepared with one", || {
            format!("bias given: {}", a.bias.is_some())
        })?;
        let bias = a.bias.map(|b| b.check(layout, d.n)).transpose()?.unwrap_or(0);
        require(
            a.residual.is_some() == (d.tail == Tail::Residual),
            "a residual exactly with the residual tail",
            || format!("residual given: {}, tail {:?}", a.residual.is_some(), d.tail),
        )?;
        let residual = match &a.residual {
            Some(r) => {
                require(r.output == d.out, "the residual of out's type", || format!("{:?}", r.output))?;
                require_len("residual", r.len, d.m * d.n)?;
                r.ptr
            }
            None => 0,
        };
        // The store's side buffer: the residual, or the e4m3 codes' scales.
        let side = match (d.out, a.out.scales) {
            (Output::E4m3, Some((ptr, len))) => {
                require_len("out scales", len, d.m * fp8::groups(d.n))?;
                ptr
            }
            (Output::E4m3, None) => return Err(common::Error::constraint("scales with an e4m3 out", "none")),
            _ => residual,
        };
        use common::device_ptr as ptr;
        match &self.runner {
            Runner::Kernel { launch, tma_store, tile_rows, tile_cols } => {
                let map_a = common::tma::e4m3_map(ptr(a.a_codes), d.m, d.k, *tile_rows as u32)?;
                let map_b = common::tma::e4m3_map(ptr(a.w_codes), d.n, d.k, *tile_cols as u32)?;
                // Out in boxes of 128 bytes x one warpgroup's 64 rows (16-byte rows checked at prepare).
                let map_out = match (*tma_store, d.out) {
                    (false, _) => None,
                    (true, Output::F32) => Some(common::tma::f32_map(a.out.ptr, d.m, d.n, 64)?),
                    (true, Output::Bf16) => Some(common::tma::bf16_map(a.out.ptr, d.m, d.n, 64)?),
                    (true, Output::E4m3) => Some(common::tma::e4m3_map(a.out.ptr, d.m, d.n, 64)?),
                };
                let mut args = vec![
                    Arg::value(&map_a),
                    Arg::value(&map_b),
                    Arg::Ptr(a.out.ptr),
                    Arg::buf(a.a_scales),
                    Arg::buf(a.w_scales),
                    Arg::Ptr(bias),
                    Arg::int(d.m),
                    Arg::int(d.n),
                    Arg::int(d.k),
                ];
                if let Some(map) = &map_out {
                    args.push(Arg::value(map));
                    args.push(Arg::Ptr(side));
                }
                // SAFETY: the arguments follow every entry's signature; lengths checked above, the
                // maps cover exactly the codes and out (K % 16 == 0 and, with out's map, N % 4 == 0
                // at prepare: 16-byte row strides).
                unsafe { launch.enqueue(stream, &args) }
            }
            Runner::Lt(lt) => {
                let scales = LtScales { inputs: ptr(a.a_scales), weights: ptr(a.w_scales) };
                // SAFETY: lengths and layouts checked above (cudarc's allocations are 256-byte
                // aligned); cuBLAS's A is W, its B the activations.
                unsafe { lt.enqueue(stream, ptr(a.a_codes), ptr(a.w_codes), bias, 0, a.out.ptr, Some(scales)) }
            }
        }
    }
}

impl PreparedStage for Prepared {
    fn resources(&self) -> Vec<ResourceUse> {
        match &self.runner {
            Runner::Kernel { launch, .. } => vec![launch.resources().clone()],
            Runner::Lt(_) => Vec::new(),
        }
    }
}

pub fn shape(m: i64, n: i64, k: i64, bias: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("bias", bias)])
}

/// `s` with an e4m3 output (`out = 8`).
pub fn e4m3_out(mut s: Shape) -> Shape {
    s.set("out", 8);
    s
}

impl Op for LinearFp8 {
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2's four block linears at B = 4, T = 1024, its LM head, and the square 4096^3 and 8192^3;
        // then the block linears and 4096^3 with a bf16 output (what a model feeds the next layer,
        // and what torch's anchors store).
        let fp32 = [
            shape(4096, 2304, 768, 1),
            shape(4096, 768, 768, 1),
            shape(4096, 3072, 768, 1),
            shape(4096, 768, 3072, 1),
            shape(4096, 50257, 768, 0),
            shape(4096, 4096, 4096, 0),
            shape(8192, 8192, 8192, 0),
        ];
        let bf16 = [0, 1, 2, 3, 5].map(|i| crate::linear_bf16::bf16_out(fp32[i].clone()));
        // The tails GPT-2 fuses: the MLP up's GELU into bf16, the projections adding into the fp32
        // residual stream.
        // The LM head as the model runs it: the vocabulary padded to 50304, bf16 logits.
        let head = crate::linear_bf16::bf16_out(shape(4096, 50304, 768, 0));
        // The fp8 plan's MLP up stores its GELU output as e4m3 codes for the MLP down (stage 7).
        let tails = [
            crate::linear_bf16::bf16_out(shape_with_tail(4096, 3072, 768, 1)),
            e4m3_out(shape_with_tail(4096, 3072, 768, 1)),
            shape_with_tail(4096, 768, 768, 2),
            shape_with_tail(4096, 768, 3072, 2),
        ];
        fp32.into_iter().chain(bf16).chain([head]).chain(tails).collect()
    }
    fn validate(&self, v: &Variant, s: &Shape) -> Result<()> {
        check_shape(v, LinearFp8Dims::of(s)?)
    }
    fn compiled_variants(&self, gpu: &Gpu, v: &Variant, s: &Shape) -> Vec<Variant> {
        match LinearFp8Dims::of(s).and_then(|d| v.plan::<Plan>()?.fitted(v, d, gpu)) {
            Ok(Some((_, compiled))) => vec![compiled],
            _ => vec![v.clone()],
        }
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        // A limit with a shape just inside it.
        let limit = |constraint, past, inside| Limit { constraint, past, inside: Some(inside) };
        let mut l = vec![
            limit(K_ALIGN, shape(8, 40, 40, 1), shape(8, 40, 48, 1)),
            Limit { constraint: "M * K < 2^31", past: shape(1 << 16, 8, 1 << 15, 1), inside: None },
            Limit { constraint: "N * K < 2^31", past: shape(8, 1 << 16, 1 << 15, 1), inside: None },
            Limit { constraint: "M * N < 2^31", past: shape(1 << 16, 1 << 15, 16, 1), inside: None },
        ];
        let kernel = v.plan::<Plan>().ok().map(Plan::kernel);
        let bf16 = crate::linear_bf16::bf16_out;
        // Stages 4-6 and the library row: no e4m3 out.
        let out_wide = || limit(OUT_WIDE, e4m3_out(shape(8, 32, 16, 1)), bf16(shape(8, 32, 16, 1)));
        match &kernel {
            Some(Some(k)) if k.tma_store => {
                l.push(limit(TMA_STORE_N, shape(8, 6, 16, 1), shape(8, 12, 16, 1)));
                l.push(limit(TMA_STORE_N_BF16, bf16(shape(8, 12, 16, 1)), bf16(shape(8, 16, 16, 1))));
                if k.e4m3_out {
                    l.push(limit(TMA_STORE_N_E4M3, e4m3_out(shape(8, 24, 16, 1)), e4m3_out(shape(8, 32, 16, 1))));
                    l.push(limit(
                        E4M3_TAIL,
                        e4m3_out(shape_with_tail(8, 32, 16, 2)),
                        e4m3_out(shape_with_tail(8, 32, 16, 1)),
                    ));
                } else {
                    l.push(out_wide());
                }
            }
            Some(Some(_)) => {
                l.push(limit(OUT_F32, bf16(shape(8, 16, 16, 1)), shape(8, 16, 16, 1)));
                l.push(limit(EPI_NONE, shape_with_tail(8, 16, 16, 1), shape(8, 16, 16, 1)));
            }
            Some(None) => {
                l.push(out_wide());
                l.push(limit(LT_N_BF16, bf16(shape(8, 12, 16, 1)), bf16(shape(8, 16, 16, 1))));
                l.push(limit(EPI_NONE, shape_with_tail(8, 16, 16, 2), shape(8, 16, 16, 1)));
            }
            None => {}
        }
        match kernel.map(|p| p.map(|k| k.grid)) {
            Some(Some(Grid::Tiles)) => {
                l.push(Limit { constraint: ROWS, past: shape(65535 * 128 + 1, 1, 16, 1), inside: None })
            }
            Some(Some(Grid::Persistent)) => {}
            Some(None) => {
                l.push(limit(LT_M, shape(12, 8, 16, 1), shape(16, 8, 16, 1)));
                l.push(limit(LT_N, shape(8, 6, 16, 1), shape(8, 12, 16, 1)));
            }
            None => {}
        }
        l
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let d = LinearFp8Dims::of(s)?;
        match d.out {
            Output::F32 => problem::<f32>(gpu, d, seed),
            Output::Bf16 => problem::<u16>(gpu, d, seed),
            Output::E4m3 => problem_e4m3(gpu, d, seed),
        }
    }
}

/// A call's quantized operands, output copies of type `T` and f64 reference.
fn problem<T: OutElement>(gpu: &Gpu, d: LinearFp8Dims, seed: u64) -> Result<Box<dyn Problem>> {
    // The residual tail's input, of out's type, as the kernel reads it.
    let residual: Option<Vec<T>> = d.tail.residual(d.m, d.n, seed);
    let (operands, sample) = Operands::new(gpu, d, seed, residual.as_deref())?;
    let outputs = WideOut {
        residual: residual.map(|r| gpu.upload(&r)).transpose()?,
        out: Rotated::outputs(gpu, d.m * d.n, operands.copies)?,
    };
    Ok(Box::new(LinearFp8Problem { d, operands, outputs, sample, prepared: Current::default() }))
}

/// The quantized operands of a call (rotated copies), their scales and bias as quantized (for the
/// library row's layout), and the note on the format's own error.
struct Operands {
    a_codes: Rotated<u8>,
    a_scales: Rotated<f32>,
    w_codes: Rotated<u8>,
    w_scales: Rotated<f32>,
    bias: Option<CudaSlice<f32>>,
    host_scales: (Vec<f32>, Vec<f32>),
    host_bias: Vec<f32>,
    /// The scales and bias in [`OperandLayout::CublasLt`], made when a library row is prepared.
    lt_operands: Option<LtOperandCopies>,
    /// The f64 product of the dequantized operands against the layer on unquantized operands.
    format_error: f64,
    copies: usize,
}

impl Operands {
    /// Fresh operands at `seed` and the f64 product of the dequantized operands, with the tail
    /// (`residual`: the residual tail's input), on the sampled rows: what the kernel must match;
    /// with a tail, the scale of each element's error ([`Tail::magnitude`]).
    fn new<T: OutElement>(
        gpu: &Gpu,
        d: LinearFp8Dims,
        seed: u64,
        residual: Option<&[T]>,
    ) -> Result<(Operands, SampledRows)> {
        let (x, w, b) = inputs(d.gemm(), seed);
        let (qa, qw) = (fp8::quantize_rows(&x, d.m, d.k), fp8::quantize_blocks(&w, d.n, d.k));
        let rows = sampled_rows(d.m, d.n, d.k, seed ^ 4);
        let bias = d.bias.then_some(&b[..]);
        let (qx, qw_wide) = (qa.dequantize(), qw.dequantize());
        let mut reference = linear_rows(&qx, &qw_wide, bias, d.n, d.k, &rows);
        let mut exact = linear_rows(&x, &w, bias, d.n, d.k, &rows);
        for values in [&mut reference, &mut exact] {
            d.tail.apply(values, residual, &rows, d.n);
        }
        let format_error = compare("format", &reference, &exact).rel_l2;
        let magnitude = d.tail.magnitude(&qx, &qw_wide, bias, residual, d.n, d.k, &rows);
        let out_bytes = d.out.bytes() * (d.m * d.n) as u64 * if residual.is_some() { 2 } else { 1 };
        let copies = rotation_copies(gpu, (d.m * d.k + d.n * d.k) as u64 + out_bytes);
        let operands = Operands {
            a_codes: Rotated::upload(gpu, &qa.codes, copies)?,
            a_scales: Rotated::upload(gpu, &qa.scales, copies)?,
            w_codes: Rotated::upload(gpu, &qw.codes, copies)?,
            w_scales: Rotated::upload(gpu, &qw.scales, copies)?,
            bias: if d.bias { Some(gpu.upload(&b)?) } else { None },
            host_scales: (qa.scales, qw.scales),
            host_bias: b,
            lt_operands: None,
            format_error,
            copies,
        };
        Ok((operands, SampledRows { rows, reference, magnitude }))
    }

    /// Makes the library row's copies of the scales and bias when `p` reads them in its layout.
    fn prepare(&mut self, gpu: &Gpu, p: &Prepared) -> Result<()> {
        if p.layout() == OperandLayout::CublasLt && self.lt_operands.is_none() {
            let (a, w) = OperandLayout::CublasLt.arrange(&self.host_scales.0, &self.host_scales.1, p.d);
            let bias: Vec<u16> = self.host_bias.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
            self.lt_operands = Some(LtOperandCopies {
                a_scales: Rotated::upload(gpu, &a, self.copies)?,
                w_scales: Rotated::upload(gpu, &w, self.copies)?,
                bias: gpu.upload(&bias)?,
            });
        }
        Ok(())
    }

    /// `p`'s arguments from rotation `copy`, into `out` (with `residual`).
    fn enqueue(
        &self,
        stream: &CudaStream,
        p: &Prepared,
        copy: usize,
        out: OutBuf,
        residual: Option<ResidualBuf>,
    ) -> Result<()> {
        let (a_scales, w_scales, bias) = match (p.layout(), &self.lt_operands) {
            (OperandLayout::Fp8, _) => (&self.a_scales, &self.w_scales, self.bias.as_ref().map(Bias::F32)),
            (OperandLayout::CublasLt, Some(lt)) => {
                (&lt.a_scales, &lt.w_scales, self.bias.as_ref().map(|_| Bias::Bf16(&lt.bias)))
            }
            (OperandLayout::CublasLt, None) => {
                return Err(common::Error::constraint("the library row's operands made at prepare", "none"))
            }
        };
        let args = LinearFp8Args {
            out,
            a_codes: self.a_codes.get(copy),
            a_scales: a_scales.get(copy),
            w_codes: self.w_codes.get(copy),
            w_scales: w_scales.get(copy),
            bias,
            residual,
        };
        p.enqueue(stream, args)
    }

    fn note(&self) -> String {
        format!("format: e4m3 A and W against the unquantized layer, rel L2 {:.2e}", self.format_error)
    }
}

/// The bytes a call moves (out written, and read again with the residual tail; an e4m3 out's
/// scales) and its flops.
fn workload(d: LinearFp8Dims) -> Workload {
    let LinearFp8Dims { m, n, k, bias, tail, out } = d;
    let g = fp8::groups(k);
    let scales = 4 * (m * g + fp8::groups(n) * g);
    let out_passes = if tail == Tail::Residual { 2 } else { 1 };
    let out_scales = if out == Output::E4m3 { 4 * m * fp8::groups(n) } else { 0 };
    let bytes =
        m * k + n * k + scales + out_passes * out.bytes() as usize * m * n + out_scales + if bias { 4 * n } else { 0 };
    Workload { bytes: bytes as u64, flops: (2 * m * n * k) as u64, bound: Bound::Compute(Precision::Fp8) }
}

/// A call: its operands, where its out goes (`O`), the f64 reference on the sampled rows.
struct LinearFp8Problem<O: Outputs> {
    d: LinearFp8Dims,
    operands: Operands,
    outputs: O,
    sample: SampledRows,
    prepared: Current<Prepared>,
}

/// The library row's scales (rotated like the kernels') and bias in [`OperandLayout::CublasLt`].
struct LtOperandCopies {
    a_scales: Rotated<f32>,
    w_scales: Rotated<f32>,
    bias: CudaSlice<u16>,
}

/// A call's out as the kernels write it: poisoned, handed to a launch, checked.
trait Outputs {
    fn poison(&mut self, gpu: &Gpu) -> Result<()>;
    /// Rotation `copy`'s out, and the residual the tail reads.
    fn buffers(&mut self, copy: usize) -> (OutBuf<'_>, Option<ResidualBuf<'_>>);
    fn verify(&self, gpu: &Gpu, run: Run) -> Result<Verification>;
}

/// What a check of one run compares against: the stage (its tolerance), the rotation, the sampled
/// reference and the call's sizes.
struct Run<'a> {
    v: &'a Variant,
    copy: usize,
    sample: &'a SampledRows,
    d: LinearFp8Dims,
}

/// fp32 or bf16 out (`T`), and the residual tail's input of the same type.
struct WideOut<T: OutElement> {
    out: Rotated<T>,
    residual: Option<CudaSlice<T>>,
}

impl<T: OutElement> Outputs for WideOut<T> {
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)
    }
    fn buffers(&mut self, copy: usize) -> (OutBuf<'_>, Option<ResidualBuf<'_>>) {
        (OutBuf::new(self.out.get_mut(copy)), self.residual.as_ref().map(ResidualBuf::new))
    }
    fn verify(&self, gpu: &Gpu, run: Run) -> Result<Verification> {
        verify_out(gpu, run.v, self.out.get(run.copy), run.sample, run.d.gemm())
    }
}

/// e4m3 out (out = 8): codes and row scales, checked against e4m3's own rounding.
struct E4m3Out {
    codes: Rotated<u8>,
    scales: Rotated<f32>,
}

impl Outputs for E4m3Out {
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.codes.poison(gpu)?;
        self.scales.poison(gpu)
    }
    fn buffers(&mut self, copy: usize) -> (OutBuf<'_>, Option<ResidualBuf<'_>>) {
        (OutBuf::e4m3(self.codes.get_mut(copy), self.scales.get_mut(copy)), None)
    }
    fn verify(&self, gpu: &Gpu, run: Run) -> Result<Verification> {
        let codes = gpu.download(self.codes.get(run.copy))?;
        let scales = gpu.download(self.scales.get(run.copy))?;
        Ok(verify_e4m3(run.v.tolerance(), &codes, &scales, run.sample, run.d.n))
    }
}

impl<O: Outputs> Problem for LinearFp8Problem<O> {
    fn workload(&self) -> Workload {
        workload(self.d)
    }
    fn copies(&self) -> usize {
        self.operands.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.outputs.poison(gpu)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        let p = prepare(gpu, v, self.d)?;
        self.operands.prepare(gpu, &p)?;
        Ok(self.prepared.set(v, p))
    }
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let (out, residual) = self.outputs.buffers(copy);
        self.operands.enqueue(stream, p, copy, out, residual)
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        let verification = self.outputs.verify(gpu, Run { v, copy, sample: &self.sample, d: self.d })?;
        Ok(verification.with_note(self.operands.note()))
    }
}

/// A call with an e4m3 out (out = 8).
fn problem_e4m3(gpu: &Gpu, d: LinearFp8Dims, seed: u64) -> Result<Box<dyn Problem>> {
    let (operands, sample) = Operands::new::<f32>(gpu, d, seed, None)?;
    let outputs = E4m3Out {
        codes: Rotated::outputs(gpu, d.m * d.n, operands.copies)?,
        scales: Rotated::outputs(gpu, d.m * fp8::groups(d.n), operands.copies)?,
    };
    Ok(Box::new(LinearFp8Problem { d, operands, outputs, sample, prepared: Current::default() }))
}

/// The check of an e4m3 out (`codes` M·N, `scales` M·ceil(N / 128)) against the f64 reference on
/// the sampled rows:
/// - each dequantized element's error in units of e4m3's rounding bound at the kernel's scale
///   ([`fp8::rounding_bound`]), scaled so that `tolerance` is one bound: a kernel that computes the
///   layer and rounds it to e4m3 is within it (its fp32 error is ~1e-4 of a bound), one that stores a
///   wrong code, column or scale is not;
/// - each scale against its reference group's amax / 448;
/// - every code of every row not the NaN code and every scale finite (the poison is NaN).
fn verify_e4m3(tolerance: f64, codes: &[u8], scales: &[f32], sample: &SampledRows, n: usize) -> Verification {
    let g = fp8::groups(n);
    let (mut values, mut bounds, mut got, mut want) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, &row) in sample.rows.iter().enumerate() {
        let reference = &sample.reference[i * n..(i + 1) * n];
        for (group, cols) in reference.chunks(fp8::GROUP).enumerate() {
            let amax = cols.iter().fold(fp8::AMAX_FLOOR as f64, |a, x| a.max(x.abs()));
            want.push(amax / fp8::E4M3_MAX as f64);
            got.push(scales.get(row * g + group).copied().unwrap_or(f32::NAN));
        }
        for (c, &r) in reference.iter().enumerate() {
            let scale = scales.get(row * g + c / fp8::GROUP).copied().unwrap_or(f32::NAN);
            let code = codes.get(row * n + c).map_or(f32::NAN, |&q| fp8::e4m3_value(q));
            values.push(code * scale);
            bounds.push(fp8::rounding_bound(r as f32, scale) as f64 / tolerance);
        }
    }
    let nan_codes = codes.iter().filter(|&&q| q & 0x7F == fp8::NAN_CODE).count();
    let bad_scales = scales.iter().filter(|x| !x.is_finite()).count();
    let every = ErrorStats {
        output: "codes and scales of every row (none NaN)".into(),
        rel_l2: 0.0,
        max_abs: 0.0,
        non_finite: nan_codes + bad_scales,
        first_non_finite: codes.iter().position(|&q| q & 0x7F == fp8::NAN_CODE),
        count: codes.len() + scales.len(),
    };
    Verification::new(tolerance)
        .add_stats(compare_scaled(
            "out (e4m3 dequantized, in units of its rounding bound)",
            &values,
            &sample.reference,
            &bounds,
        ))
        .add("scales (against the reference rows' amax / 448)", &got, &want)
        .add_stats(every)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stage 6's model on an H100's 132 SMs: 192 rows at GPT-2's block linears at M = 4096 (the
    /// MLP up a tie: 4 rounds of 192 against 6 of 128) and at 8192^3; 128 at 4096^3 and the padded
    /// LM head.
    #[test]
    fn wave_fit_rows_fit_the_waves() {
        for n in [2304, 768, 3072] {
            assert_eq!(wave_fit_rows(4096, n, 132), 192, "N = {n}");
        }
        assert_eq!(wave_fit_rows(8192, 8192, 132), 192);
        assert_eq!(wave_fit_rows(4096, 4096, 132), 128);
        assert_eq!(wave_fit_rows(4096, 50304, 132), 128);
    }

    /// Stage 8's tile on an H100's 132 SMs: 128 x 256 at the square shapes, the MLP up (3 rounds of
    /// 384 against 4 of 320) and the padded LM head; stage 6's 192 rows at the N = 768 shapes (one
    /// round of 320 against one of 384) and the QKV (3 rounds of 320 against 3 of 384).
    #[test]
    fn wide_fit_reads_the_least_of_the_l2() {
        for (n, k) in [(4096, 4096), (3072, 768), (50304, 768)] {
            assert_eq!(wide_fit(4096, n, 132), WIDE_TILE, "N = {n}, K = {k}");
        }
        assert_eq!(wide_fit(8192, 8192, 132), WIDE_TILE);
        for n in [768, 2304] {
            assert_eq!(wide_fit(4096, n, 132), (192, 128), "N = {n}");
        }
    }

    /// Stage 8 runs its own kernel only where the wide tile fits and the out is fp32 or bf16; else
    /// stage 7's. No other stage keeps an earlier one's.
    #[test]
    fn wide_tile_keeps_stage_7_at_its_tile_and_the_e4m3_out() {
        let d = |n, out| LinearFp8Dims { m: 4096, n, k: 768, bias: true, tail: Tail::None, out };
        assert_eq!(Plan::WideTile.kept_from(d(3072, Output::F32), 132), None);
        assert_eq!(Plan::WideTile.kept_from(d(3072, Output::Bf16), 132), None);
        assert_eq!(Plan::WideTile.kept_from(d(3072, Output::E4m3), 132), Some(Plan::GroupFit));
        assert_eq!(Plan::WideTile.kept_from(d(768, Output::Bf16), 132), Some(Plan::GroupFit));
        assert_eq!(Plan::GroupFit.kept_from(d(768, Output::E4m3), 132), None);
    }

    /// Stage 7's group on an H100 (50 MB of L2): one row panel (stage 6's walk) where W fits in half
    /// of it (GPT-2's block linears, 4096^3); every row panel for the LM head's 38.6 MB of W; at
    /// 8192^3 the 16 panels of 192 x 8192 codes that fit in 25 MB.
    #[test]
    fn group_fit_reads_w_once_where_it_overflows_half_the_l2() {
        let l2 = 50 << 20;
        assert_eq!(group_fit(4096, 3072, 768, 192, l2), DECLARED_GROUP);
        assert_eq!(group_fit(4096, 4096, 4096, 128, l2), DECLARED_GROUP);
        assert_eq!(group_fit(4096, 50304, 768, 128, l2), 32);
        assert_eq!(group_fit(8192, 8192, 8192, 192, l2), 16);
    }

    /// cuBLASLt's layouts: A's scale (m, kb) at kb·M + m; W's (nb, kb) at nb·L4 + kb, the K groups
    /// past ceil(K / 128) zero.
    #[test]
    fn cublaslt_layout_moves_each_scale_and_pads_k_groups_with_zeros() {
        let d = LinearFp8Dims { m: 3, n: 200, k: 5 * 128 - 16, bias: false, tail: Tail::None, out: Output::F32 };
        let (g, nb) = (fp8::groups(d.k), fp8::groups(d.n));
        assert_eq!((g, nb), (5, 2));
        let a: Vec<f32> = (0..d.m * g).map(|i| i as f32 + 1.0).collect();
        let w: Vec<f32> = (0..nb * g).map(|i| -(i as f32) - 1.0).collect();
        let (la, lw) = OperandLayout::CublasLt.arrange(&a, &w, d);
        assert_eq!((la.len(), lw.len()), (d.m * g, nb * 8));
        assert_eq!(lw.len(), OperandLayout::CublasLt.w_scales(d));
        for m in 0..d.m {
            for kb in 0..g {
                assert_eq!(la[kb * d.m + m], a[m * g + kb]);
            }
        }
        for n in 0..nb {
            for kb in 0..8 {
                assert_eq!(lw[n * 8 + kb], if kb < g { w[n * g + kb] } else { 0.0 });
            }
        }
        assert_eq!(OperandLayout::Fp8.arrange(&a, &w, d), (a.clone(), w.clone()));
    }
}
