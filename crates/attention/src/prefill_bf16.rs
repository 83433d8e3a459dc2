//! Self-attention prefill in bf16 as the bf16 model will run it: `qkv[B, T, 3C]` bf16 (llm.c
//! layout, head h owning columns `h*HS..(h+1)*HS` of q, k and v) to `out[B, T, C]` bf16 and the
//! logsumexp of each row's scaled scores `lse[B, NH, T]` fp32, causal or not, HS = 64 or 128, scale
//! `1/sqrt(HS)`. The ladder starts from the fp32 ladder's tensor-core stage on bf16 I/O and climbs
//! toward the Hopper techniques (cp.async pipelines, then TMA and wgmma).

use common::check::{checked_rows, compare_scaled, ErrorStats, Verification};
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, uniform, Rotated};
use std::borrow::Cow;

use common::{
    require, require_len, Arg, Bound, Define, Error, Gpu, Launch, LaunchShape, Limit, Op, Precision,
    Prepared as Current, Problem, Requirements, Result, Shape, Variant, Workload,
};
use half::bf16;

use crate::reference::{attention_rows, score_magnitude_rows, Dims, Mask, ELEMS};
use crate::{FAMILY, SOURCES};

const OP: &str = "prefill-bf16";

common::declare_op! {
    pub struct PrefillBf16 {
        name: OP,
        description: "self-attention forward in bf16: qkv[B,T,3C] bf16 -> out[B,T,C] bf16 and lse[B,NH,T] fp32, NH heads \
             of HS (64 or 128), scale 1/sqrt(HS), causal=1 (default) or 0",
        shape_keys: ["B", "T", "NH", "HS", "causal"],
        stages: stages,
    }
}

/// The head sizes every stage supports (tiles are sized at compile time).
pub const HEAD_SIZES: [usize; 2] = [64, 128];

const GRID_YZ: usize = 65535;
const HEAD_SIZE: &str = "HS in {64, 128}";
const GRID: &str = "NH <= 65535 and B <= 65535";
const TILE_GRID: &str = "T <= 65535 * 128";

/// A stage's launch geometry: `rows` query rows a block of `threads`, its entry
/// `{entry}_hs{HS}`, and dynamic shared memory of `smem_rows` tile rows of `HS + pad` bf16 plus
/// `extra` bytes; `tma` stages take qkv as a tensor map (64 x 64 boxes) instead of a pointer;
/// `switches` names the kernel file's cumulative switches (stage 2's file: [`SWITCHES`]), whose
/// tile-order switch also bounds T for every stage of that file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Plan {
    entry: &'static str,
    rows: u32,
    threads: u32,
    smem_rows: u32,
    pad: u32,
    extra: u32,
    tma: bool,
    switches: bool,
}

impl Plan {
    fn shared_bytes(self, hs: u32) -> u32 {
        2 * self.smem_rows * (hs + self.pad) + self.extra
    }

    /// A wgmma stage's geometry (`attention_wgmma.cuh`'s `TileRing`): two consumer warpgroups of 64
    /// query rows, and a producer warpgroup when `producer`; Q's 128 rows and `slots` slots of K and
    /// V (128 rows each); 1 KB to align the tiles to the swizzle's 1024-byte atoms, and an 8-byte
    /// mbarrier for Q and each slot's full one, plus each slot's empty one with a producer.
    fn tma_ring(entry: &'static str, producer: bool, slots: u32) -> Plan {
        let barriers = 1 + slots * (1 + producer as u32);
        Plan {
            entry,
            rows: 128,
            threads: 256 + 128 * producer as u32,
            smem_rows: 128 + 2 * slots * 128,
            pad: 0,
            extra: 1024 + 8 * barriers,
            tma: true,
            switches: false,
        }
    }

    /// Stage 14's file: stage 5's geometry (a producer warpgroup, three slots).
    fn pipelined() -> Plan {
        Plan::tma_ring("attention_bf16_pipelined", true, 3)
    }

    /// Stage 2's kernel, the one the switches toggle.
    fn wgmma() -> Plan {
        Plan { switches: true, ..Plan::tma_ring("attention_bf16_wgmma", false, 2) }
    }

    /// The geometry stage `v` launches with at head size `hs`: its plan, except that stage 2's file
    /// at HS = 128 with [`TWO_BLOCKS_HS128`] on has key tiles of 64, so its two slots of K and V
    /// hold half the rows (its define, not its plan, says: `--leave-one-out` rows take switches
    /// away).
    fn at(self, v: &Variant, hs: u32) -> Plan {
        if self.switches && hs == 128 && has_define(v, TWO_BLOCKS_HS128) {
            Plan { smem_rows: 128 + 2 * 2 * 64, ..self }
        } else {
            self
        }
    }
}

/// Stage 2's kernel file, which stages 6-13 compile with its switches on.
const WGMMA_FILE: &str = "prefill-bf16/02_wgmma_tma.cu";
/// Its grid-order switch: the query tiles on the grid's slowest axis.
const TILES_LAST: &str = "PB_TILES_LAST";
/// Stage 2's switches in the order stages 6 to 13 turn them on: the define, the stage's name
/// and what it adds.
const SWITCHES: [(&str, &str, &str); 8] = [
    (
        "PB_TWO_BLOCKS",
        "two-blocks",
        "stage 2 held to 128 registers at HS = 64, so two blocks share an SM (16 warps); stage 2 itself at HS = 128",
    ),
    (
        TILES_LAST,
        "heaviest-first",
        "the grid as (NH, B, query tiles), tiles reversed on the slowest axis: every head's longest causal rows dispatch first",
    ),
    (
        FOLDED_SOFTMAX,
        "folded-softmax",
        "the softmax's scale folded into one FFMA per score: exp2(fma(s, scale log2 e, -max)), the max over raw scores",
    ),
    (
        L2_ORDER,
        "l2-fitted-order",
        "a 1-D grid: (head, sequence) pairs in groups whose K/V fit 16 MB of L2, each group heaviest tile first",
    ),
    (
        MUFU_EXP2,
        "mufu-exp2",
        "each probability's exp2 as one ex2.approx.ftz (MUFU.EX2) instead of exp2f's compare and two predicated multiplies around it",
    ),
    (
        TMA_STORE,
        "tma-store-o",
        "a query tile inside its sequence writes O through Q's shared tile and the TMA (64 x 64 boxes, whole lines) instead of 4-byte stores from registers",
    ),
    (
        "PB_PACKED_PV",
        "packed-pv",
        "all of P packed before P.V's first wgmma (a basic-block boundary between): S dead when P.V issues, no wgmma serialized at HS = 64's 128 registers",
    ),
    (
        TWO_BLOCKS_HS128,
        "two-blocks-hs128",
        "key tiles of 64 at HS = 128: 128 registers a thread and 97 KB a block, so two blocks share an SM",
    ),
];
/// The switch that gives the HS = 128 entry key tiles of 64 ([`Plan::at`]).
const TWO_BLOCKS_HS128: &str = "PB_TWO_BLOCKS_HS128";
/// The switch whose kernel takes out's tensor map as its last parameter.
const TMA_STORE: &str = "PB_TMA_STORE";
/// The 1-D grid-order switch (it takes precedence over [`TILES_LAST`]).
const L2_ORDER: &str = "PB_L2_ORDER";
/// The softmax switches: the scale folded into one FFMA a score, and each exp2 as one MUFU.EX2.
const FOLDED_SOFTMAX: &str = "PB_FOLDED_SOFTMAX";
const MUFU_EXP2: &str = "PB_MUFU_EXP2";

/// Rows of the TMA stages' boxes (their columns are `common::tma::BOX_COLS`).
const TMA_BOX_ROWS: u32 = 64;

/// The stage list: each stage with its launch plan.
fn stages() -> Vec<Variant> {
    let k = |stage, name, file, plan: Plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Bf16, summary)
            .with_plan(plan)
            .with_requirements(Requirements::SM80)
    };
    let mut stages = vec![
        k(
            0,
            "mma-sync",
            "prefill-bf16/00_mma_sync.cu",
            // Q, K and V tiles of 64 rows, each row padded by 8 elements.
            Plan { entry: "attention_bf16_mma", rows: 64, threads: 128, smem_rows: 3 * 64, pad: 8, extra: 0, tma: false, switches: false },
            "prefill stage 6 on bf16 I/O: mma.sync m16n8k16, 4 warps x 16 query rows, key tiles of 64, synchronous loads",
        ),
        k(
            1,
            "cp-async",
            "prefill-bf16/01_cp_async.cu",
            // Q (128 rows) and two stages of K and V (64 rows each), unpadded and swizzled.
            Plan {
                entry: "attention_bf16_cp_async",
                rows: 128,
                threads: 256,
                smem_rows: 128 + 4 * 64,
                pad: 0,
                extra: 0,
                tma: false,
                switches: false,
            },
            "K/V through a two-stage cp.async ring into XOR-swizzled tiles; 8 warps x 16 query rows",
        ),
        k(
            2,
            "wgmma-tma",
            WGMMA_FILE,
            Plan::wgmma(),
            "wgmma (S from shared Q and K, P.V with P in registers and V MN-major) on TMA-loaded 128-byte-swizzled tiles; 2 warpgroups, key tiles of 128",
        )
        .with_requirements(Requirements::SM90A),
        k(
            3,
            "warp-specialized",
            "prefill-bf16/03_warp_specialized.cu",
            Plan::tma_ring("attention_bf16_ws", true, 2),
            "a producer warpgroup issues the TMA loads, two consumer warpgroups compute; slots released on empty mbarriers (no block barrier); setmaxnreg 24/240",
        )
        .with_requirements(Requirements::SM90A),
        k(
            4,
            "ping-pong",
            "prefill-bf16/04_ping_pong.cu",
            Plan::tma_ring("attention_bf16_ping_pong", true, 3),
            "the consumer warpgroups take turns on the tensor cores (named barriers): one's softmax under the other's P.V and next Q.K^T; three slots",
        )
        .with_requirements(Requirements::SM90A),
        k(
            5,
            "intra-warpgroup-overlap",
            "prefill-bf16/05_intra_warpgroup_overlap.cu",
            Plan::tma_ring("attention_bf16_overlap", true, 3),
            "a warpgroup's softmax of tile j under its own P.V of tile j - 1 (S and P.V in separate commit groups; O rescaled after P.V lands)",
        )
        .with_requirements(Requirements::SM90A),
    ];
    // Stages 6-13: stage 2's kernel with its switches turned on one after another.
    for (i, &(_, name, summary)) in SWITCHES.iter().enumerate() {
        let mut v = k(6 + i as u32, name, WGMMA_FILE, Plan::wgmma(), summary).with_requirements(Requirements::SM90A);
        v.defines = Cow::Owned(SWITCHES[..=i].iter().map(|s| Define::on(s.0)).collect());
        stages.push(v);
    }
    let last = stages.last_mut().expect("stages 6-13");
    last.toggles = Cow::Owned(SWITCHES.iter().map(|s| s.0).collect());
    let mut pipelined = k(
        14,
        "pipelined-consumers",
        PIPELINED_FILE,
        Plan::pipelined(),
        "stage 13's order, softmax and store of O on stage 5's mainloop: a producer warpgroup, consumers taking turns, each softmax under its own P.V; key tiles of 128",
    )
    .with_requirements(Requirements::SM90A);
    pipelined.defines = Cow::Owned(PIPELINED_RECIPE.iter().map(|&name| Define::on(name)).collect());
    // Stage 15 on: stage 14's file with its own switches turned on one after another.
    let mut defines = pipelined.defines.to_vec();
    stages.push(pipelined);
    for (i, &(define, name, summary)) in PIPELINED_SWITCHES.iter().enumerate() {
        defines.push(Define::on(define));
        let mut v =
            k(15 + i as u32, name, PIPELINED_FILE, Plan::pipelined(), summary).with_requirements(Requirements::SM90A);
        v.defines = Cow::Owned(defines.clone());
        stages.push(v);
    }
    stages
}

/// Stage 14's file: stage 5's mainloop with the parts of stage 2's file that it shares
/// (`attention_prefill_parts.cuh`), picked by the same switches.
const PIPELINED_FILE: &str = "prefill-bf16/14_pipelined_consumers.cu";
/// The switches of stage 13's recipe that stage 14's parts read: the others pick stage 2's
/// mainloop (P.V's issue, key tiles and blocks an SM), which stage 14 replaces.
const PIPELINED_RECIPE: [&str; 4] = [FOLDED_SOFTMAX, L2_ORDER, MUFU_EXP2, TMA_STORE];
/// Stage 14's own switches in the order stages 15 on turn them on: the define, the stage's name and
/// what it adds.
const PIPELINED_SWITCHES: [(&str, &str, &str); 1] = [
    (
        MASK_TAIL,
        "mask-tail",
        "a mask reaches only a block's last key tiles (the diagonal, T): the turns before them compiled without the compares",
    ),
];
/// The switch that compiles the turns before a block's masked tail without the mask.
const MASK_TAIL: &str = "PB_MASK_TAIL";

/// The sizes of one call: [`Dims`] and whether the mask is causal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillBf16Dims {
    pub dims: Dims,
    pub causal: bool,
}

impl PrefillBf16Dims {
    fn mask(self) -> Mask {
        if self.causal {
            Mask::Causal(None)
        } else {
            Mask::Full
        }
    }
}

/// Shape constraints of every stage at `d`: what the headers' `Limits:` lines document.
pub fn check_shape(d: PrefillBf16Dims) -> Result<()> {
    d.dims.check(&HEAD_SIZES, HEAD_SIZE)?;
    let Dims { b, nh, .. } = d.dims;
    require(nh <= GRID_YZ && b <= GRID_YZ, GRID, || format!("NH = {nh}, B = {b}"))
}

/// Whether stage `v` runs with its query tiles on the grid's slowest axis (its define, not its plan,
/// says: `--leave-one-out` rows take switches away).
fn tiles_last(v: &Variant) -> bool {
    has_define(v, TILES_LAST)
}

fn has_define(v: &Variant, name: &str) -> bool {
    v.defines.iter().any(|d| d.name == name)
}

/// Stage 2's file may put the query tiles on the grid's z axis (65535 at most): T is bounded for
/// every stage compiled from it, switch on or off, as its header says.
fn check_tile_axis(plan: Plan, t: usize) -> Result<()> {
    if plan.switches {
        require(t.div_ceil(plan.rows as usize) <= GRID_YZ, TILE_GRID, || format!("T = {t}"))?;
    }
    Ok(())
}

/// A stage prepared for one size.
pub struct Prepared {
    launch: Launch,
    d: PrefillBf16Dims,
    tma: bool,
    /// The kernel stores O with the TMA: out's tensor map is its last parameter.
    tma_store: bool,
}

/// The buffers of one call; `out` and `qkv` hold bf16 bit patterns (as the bf16 GEMMs' do).
pub struct PrefillBf16Args<'a> {
    pub out: &'a mut CudaSlice<u16>,
    /// `[B, NH, T]`.
    pub lse: &'a mut CudaSlice<f32>,
    pub qkv: &'a CudaSlice<u16>,
}

/// Prepares stage `v` for `d`: checks the shape and configures its kernel.
pub fn prepare(gpu: &Gpu, v: &Variant, d: PrefillBf16Dims) -> Result<Prepared> {
    check_shape(d)?;
    let Dims { b, t, nh, .. } = d.dims;
    let hs = d.dims.hs() as u32;
    let plan = v.plan::<Plan>()?;
    check_tile_axis(plan, t)?;
    let plan = plan.at(v, hs);
    let tiles = (t as u32).div_ceil(plan.rows);
    let grid = if has_define(v, L2_ORDER) {
        (tiles * (nh * b) as u32, 1, 1)
    } else if tiles_last(v) {
        (nh as u32, b as u32, tiles)
    } else {
        (tiles, nh as u32, b as u32)
    };
    let shape = LaunchShape::new(grid, (plan.threads, 1, 1)).with_shared(plan.shared_bytes(hs));
    let launch = gpu.prepare_launch(&SOURCES, v, &format!("{}_hs{hs}", plan.entry), shape)?;
    Ok(Prepared { launch, d, tma: plan.tma, tma_store: has_define(v, TMA_STORE) })
}

impl Prepared {
    /// Enqueues the stage on `stream` after checking the buffers.
    pub fn enqueue(&self, stream: &CudaStream, a: PrefillBf16Args) -> Result<()> {
        let Dims { b, t, c, nh } = self.d.dims;
        require_len("qkv", a.qkv.len(), b * t * 3 * c)?;
        require_len("out", a.out.len(), b * t * c)?;
        require_len("lse", a.lse.len(), b * nh * t)?;
        let scale = Arg::F32(1.0 / (self.d.dims.hs() as f32).sqrt());
        let (out, lse, causal) = (Arg::buf(a.out), Arg::buf(a.lse), Arg::int(self.d.causal as usize));
        // SAFETY (both): the arguments follow the entry's signature; the buffer lengths were checked
        // above and the indices stay below 2^31 (check_shape at prepare). The tensor map covers
        // qkv's B*T rows of 3C (a multiple of 16 bytes a row, as HS is 64 or 128).
        if self.tma || self.tma_store {
            let map = common::tma::bf16_map(common::device_ptr(a.qkv), b * t, 3 * c, TMA_BOX_ROWS)?;
            // The TMA store's stage (11) takes out's map last: its B*T rows of C (a multiple of 16
            // bytes a row).
            let map_o = match self.tma_store {
                true => Some(common::tma::bf16_map(common::device_ptr(a.out), b * t, c, TMA_BOX_ROWS)?),
                false => None,
            };
            let mut args = vec![Arg::value(&map), out, lse, Arg::int(t), Arg::int(nh), scale, causal];
            args.extend(map_o.as_ref().map(Arg::value));
            unsafe { self.launch.enqueue(stream, &args) }
        } else {
            let args = [out, lse, Arg::buf(a.qkv), Arg::int(t), Arg::int(nh), scale, causal];
            unsafe { self.launch.enqueue(stream, &args) }
        }
    }
}

common::single_launch_stage!(Prepared);

/// The op's sizes from shape keys B, T, NH, HS and causal (default 1).
pub fn shape_dims(shape: &Shape) -> Result<PrefillBf16Dims> {
    let causal = shape.get("causal").unwrap_or(1);
    require(causal == 0 || causal == 1, "causal is 0 or 1", || format!("causal = {causal}"))?;
    Ok(PrefillBf16Dims { dims: Dims::from_shape(shape)?, causal: causal == 1 })
}

pub fn shape(b: i64, t: i64, nh: i64, hs: i64, causal: i64) -> Shape {
    Shape::new(&[("B", b), ("T", t), ("NH", nh), ("HS", hs), ("causal", causal)])
}

impl Op for PrefillBf16 {
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2's prefill (and a ragged T); 16 heads of 128 at 16k tokens a batch, causal and not
        // (FlashAttention-3's benchmark sizes); one 16k-token sequence.
        vec![
            shape(4, 1024, 12, 64, 1),
            shape(4, 1000, 12, 64, 1),
            shape(8, 2048, 16, 128, 1),
            shape(8, 2048, 16, 128, 0),
            shape(1, 16384, 16, 128, 1),
        ]
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        let d = shape_dims(shape)?;
        check_shape(d)?;
        check_tile_axis(v.plan::<Plan>()?, d.dims.t)
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        let mut limits = vec![
            Limit { constraint: ELEMS, past: shape(1, 1 << 21, 8, 64, 1), inside: None },
            Limit { constraint: HEAD_SIZE, past: shape(1, 8, 2, 32, 1), inside: Some(shape(1, 8, 2, 64, 1)) },
            Limit { constraint: GRID, past: shape(65536, 1, 1, 64, 1), inside: Some(shape(65535, 1, 1, 64, 1)) },
        ];
        if v.plan::<Plan>().is_ok_and(|p| p.switches) {
            // A sequence of 65535 * 128 + 1 tokens: within B * T * 3C < 2^31 at one head of 64.
            limits.push(Limit { constraint: TILE_GRID, past: shape(1, 65535 * 128 + 1, 1, 64, 1), inside: None });
        }
        limits
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let d = shape_dims(shape)?;
        check_shape(d)?;
        let Dims { b, t, c, nh } = d.dims;
        // Scores with a spread of ~1.3 (as the fp32 op); the reference reads the bf16-rounded values.
        let qkv: Vec<u16> =
            uniform(b * t * 3 * c, -2.0, 2.0, seed).into_iter().map(|x| bf16::from_f32(x).to_bits()).collect();
        let rounded: Vec<f32> = qkv.iter().map(|&x| bf16::from_bits(x).to_f32()).collect();
        let rows = checked_rows(b * t, c, seed ^ 4);
        let (out_ref, lse_ref) = attention_rows(&rounded, d.dims, d.mask(), &rows);
        let magnitude = score_magnitude_rows(&rounded, d.dims, d.mask(), &rows);
        let copies = rotation_copies(gpu, (2 * b * t * 4 * c + 4 * b * nh * t) as u64);
        Ok(Box::new(PrefillBf16Problem {
            d,
            qkv: Rotated::upload(gpu, &qkv, copies)?,
            out: Rotated::outputs(gpu, b * t * c, copies)?,
            lse: Rotated::outputs(gpu, b * nh * t, copies)?,
            rows,
            out_ref,
            lse_ref,
            magnitude,
            copies,
            prepared: Current::default(),
        }))
    }
}

struct PrefillBf16Problem {
    d: PrefillBf16Dims,
    qkv: Rotated<u16>,
    out: Rotated<u16>,
    lse: Rotated<f32>,
    /// The (batch, token) rows compared with the reference ([`checked_rows`]), their `out` and
    /// `lse` (per head) and their rows' score magnitudes per head, the scale lse is checked against.
    rows: Vec<usize>,
    out_ref: Vec<f64>,
    lse_ref: Vec<f64>,
    magnitude: Vec<f64>,
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for PrefillBf16Problem {
    fn workload(&self) -> Workload {
        let Dims { b, t, c, nh } = self.d.dims;
        let (b, t, c, nh, hs) = (b as u64, t as u64, c as u64, nh as u64, self.d.dims.hs() as u64);
        // qkv read once, out written once (bf16), lse (fp32); QK^T and P.V: 2 * 2*HS flops per
        // (query, visible key) pair and head.
        let pairs = if self.d.causal { t * (t + 1) / 2 } else { t * t };
        Workload {
            bytes: 2 * (b * t * 3 * c + b * t * c) + 4 * b * nh * t,
            flops: 4 * hs * pairs * b * nh,
            bound: Bound::Compute(Precision::Bf16),
        }
    }
    common::problem_plumbing!(out, lse);
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let args =
            PrefillBf16Args { out: self.out.get_mut(copy), lse: self.lse.get_mut(copy), qkv: self.qkv.get(copy) };
        p.enqueue(stream, args)
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        let Dims { b, t, c, nh } = self.d.dims;
        let out = self.out.get(copy);
        // SAFETY: u16 and bf16 have one size and alignment; the buffer holds bf16 bit patterns.
        let out =
            unsafe { out.transmute::<bf16>(out.len()) }.ok_or_else(|| Error::constraint("out as bf16", "no view"))?;
        let mut ver = Verification::new(v.tolerance()).add_device_rows(
            gpu,
            "out",
            &out,
            (b * t, c),
            &self.rows,
            &self.out_ref,
        )?;
        // lse is small ([B, NH, T] fp32): all of it comes back, checked finite, and the sampled
        // rows' heads are compared against their score magnitudes (not against themselves: a row's
        // lse may be ~0 while its rounding error is not; see reference::score_magnitude_rows).
        let lse = gpu.download(self.lse.get(copy))?;
        let picked: Vec<f32> = self
            .rows
            .iter()
            .flat_map(|&bt| (0..nh).map(move |h| ((bt / t) * nh + h) * t + bt % t))
            .map(|i| lse[i])
            .collect();
        let name = if self.rows.len() == b * t {
            "lse".to_string()
        } else {
            format!("lse ({} of {} rows)", self.rows.len(), b * t)
        };
        ver.outputs.push(compare_scaled(&name, &picked, &self.lse_ref, &self.magnitude));
        ver.outputs.push(ErrorStats::finite("lse (every row finite)", &lse, b * nh * t));
        Ok(ver)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each stage's dynamic shared memory at HS 64 and 128, as its header states it (the sizes the
    /// H100 runs measured), and within the 227 KB a block may opt into.
    #[test]
    fn shared_memory_matches_the_headers() {
        let bytes: Vec<(u32, u32)> = stages()
            .iter()
            .map(|v| {
                let plan = v.plan::<Plan>().unwrap();
                (plan.at(v, 64).shared_bytes(64), plan.at(v, 128).shared_bytes(128))
            })
            .collect();
        let expected = [
            (27_648, 52_224),
            (49_152, 98_304),
            (82_968, 164_888),
            (82_984, 164_904),
            (115_768, 230_456),
            (115_768, 230_456),
            (82_968, 164_888),
            (82_968, 164_888),
            (82_968, 164_888),
            (82_968, 164_888),
            (82_968, 164_888),
            (82_968, 164_888),
            (82_968, 164_888),
            (82_968, 99_352),
            (115_768, 230_456),
            (115_768, 230_456),
        ];
        assert_eq!(bytes, expected);
        assert!(bytes.iter().all(|&(_, b)| b <= 227 * 1024), "{bytes:?}");
    }
}
