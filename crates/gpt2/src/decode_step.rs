//! `gpt2/decode-step`: one greedy decode step of the whole model (embedding, the blocks, the final
//! LayerNorm, the LM head and the argmax) for B sequences over the bf16 KV cache, as a ladder from
//! the composed step replayed as a CUDA graph (stage 0, the model's own path under the `bf16` plan)
//! to one persistent kernel (the megakernel stages, `decode-step/02_megakernel.cu`).
//!
//! Shape keys: `B` sequences, `len` cached positions before the step (the new token goes to
//! position `len`), `ragged` (1: each sequence's length drawn in [len/2, len]), the model's `L`
//! layers, `C` channels and `H` heads (GPT-2's vocabulary and context), and `grid` (blocks of a
//! megakernel launch; 0: the SMs times its blocks per SM).
//!
//! The check: random weights and a random cache, the step's logits, each layer's appended k and v,
//! and the picked ids against the model in f64 on the CPU ([`reference`]); an id passes when its
//! reference logit is within the logits' measured error of the reference maximum (bf16 weights
//! move near-ties).

use std::sync::Arc;

use common::check::{compare, Verification};
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::launch::device_ptr;
use common::{
    require, Arg, Bound, Define, DriverContext, Error, Gpu, Launch, LaunchShape, Limit, Op, OpInfo, Precision, Problem,
    Requirements, ResourceUse, Result, Shape, Variant, Workload,
};
use rayon::prelude::*;

use crate::config::Config;
use crate::model::Model;
use crate::plan::Plan as ModelPlan;
use crate::weights::Weights;
use crate::{pointwise, FAMILY, SOURCES};

pub const OP: &str = "decode-step";
/// The most sequences a megakernel step takes (its batch tiles: 4 of 8 columns).
pub const MAX_B: usize = 32;
const THREADS: u32 = 384;
/// The streamed stage's consumer threads (8 warps: two k16 steps each of a 256-wide page).
const STREAMED_THREADS: u32 = 256;
/// `SG_PAGE_BYTES` of `08_streamed.cu`: 16 weight rows of 256 bf16, each padded by 8.
const STREAMED_PAGE_BYTES: usize = 16 * (256 + 8) * 2;
/// `SG_FIRST` and `SG_LAYER_WORDS` of `08_streamed.cu`: the counters' words before the layers' and a
/// layer's.
const STREAMED_SYNC_WORDS: (usize, usize) = (4, 32);
/// The most pages a streamed block's ring holds (a layer and a half of GPT-2 124M's weights).
const STREAMED_MAX_PAGES: usize = 32;
const B_LIMIT: &str = "B <= 32";
const HEAD_LIMIT: &str = "head size == 64";
const C_MULTIPLE: &str = "C % 256 == 0";
const C_LIMIT: &str = "C <= 1024";
/// A megakernel wait's bound unless `LADDER_MEGAKERNEL_WAIT_S` sets another (scripts/sanitize does:
/// under racecheck a step runs thousands of times slower).
const WAIT_BOUND_S: f64 = 0.5;
/// The environment variable that overrides [`WAIT_BOUND_S`] (seconds).
pub const WAIT_BOUND_ENV: &str = "LADDER_MEGAKERNEL_WAIT_S";
/// The most ways the megakernel splits one (sequence, head) of attention.
const ATTENTION_MAX_SPLITS: usize = 16;

/// How a stage runs the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The `bf16` model plan's kernels, captured as one CUDA graph and replayed.
    Composed,
    /// The `pdl` model plan's: the same kernels (the GEMV on stage 6), every one after the encoder
    /// launched as a programmatic dependent of the one before it.
    ComposedDependent,
    /// [`Plan::ComposedDependent`] with kv-append in the QKV GEMV's epilogue: one kernel fewer a
    /// layer.
    AppendInQkv,

    /// The megakernel launched once per layer (the phases of one block).
    PerLayer,
    /// The megakernel launched once for the whole step.
    WholeStep,
    /// One kernel for the whole step with no grid barrier: a loader warp streams the weights through
    /// a shared-memory ring, consumers wait on counters (`decode-step/08_streamed.cu`).
    Streamed,
}

fn stages() -> Vec<Variant> {
    let mk = |stage, name, plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, "decode-step/02_megakernel.cu", Precision::Bf16, summary)
            .with_plan(plan)
            .with_tunables(&[("MK_THREADS", THREADS), ("MK_BLOCKS_PER_SM", 1)])
    };
    vec![
        Variant::host(
            FAMILY,
            OP,
            0,
            "composed-graph",
            "the bf16 plan's step as a CUDA graph",
            Precision::Bf16,
            "the model's own step under the bf16 plan (GEMVs with the LayerNorm folded in and the tails fused, kv-append, split-K decode attention, argmax), replayed as one CUDA graph",
        )
        .with_plan(Plan::Composed),
        mk(
            2,
            "layer-launches",
            Plan::PerLayer,
            "one cooperative kernel per layer: its ops as phases over every SM with grid barriers between them; kv-append in the QKV epilogue, the attention merge and the argmax by the last block",
        ),
        mk(
            3,
            "persistent",
            Plan::WholeStep,
            "the same kernel launched once for the whole step: no kernel boundary left, 62 phases and their grid barriers",
        ),
        mk(
            5,
            "early-weights",
            Plan::WholeStep,
            "each block's first unit of a phase has its weights loaded into registers before the barrier that precedes the phase: the loads' latency overlaps the wait and the LayerNorm rows' staging",
        )
        .with_defines(vec![Define::on("MK_EARLY_WEIGHTS")]),
        Variant::host(
            FAMILY,
            OP,
            6,
            "dependent-launch",
            "stage 0's graph as a programmatic-dependent chain",
            Precision::Bf16,
            "stage 0 with every kernel after the encoder launched as a programmatic dependent of the one before it (each starts under its predecessor's tail and waits for it in the kernel), the GEMVs copying their first pass of weights into shared memory before that wait (gemv 6)",
        )
        .with_plan(Plan::ComposedDependent),
        Variant::host(
            FAMILY,
            OP,
            7,
            "append-in-qkv",
            "stage 6 with kv-append in the QKV GEMV's epilogue",
            Precision::Bf16,
            "stage 6 with kv-append done by the QKV GEMV's epilogue (q to bf16, k and v straight into the cache cells): 5 kernels a layer instead of 6, 63 a step",
        )
        .with_plan(Plan::AppendInQkv),
        Variant::kernel(
            FAMILY,
            OP,
            8,
            "streamed",
            "decode-step/08_streamed.cu",
            Precision::Bf16,
            "one kernel with no grid barrier: a loader warp a block streams its GEMV units' weights through a ring of shared-memory pages ahead of the consumers (a layer and a half at B = 1), and the consumer warps wait on counters of exactly the producers they read (a head's QKV rows, four heads' merges, a K range of the MLP)",
        )
        .with_plan(Plan::Streamed)
        // Two blocks an SM (measured 1.30x / 1.19x / 1.18x one at B = 1 / 8 / 32): a block's units
        // are a chain of dependent round trips, and a second block's chain overlaps it.
        .with_tunables(&[("MK_THREADS", STREAMED_THREADS), ("MK_BLOCKS_PER_SM", 2), ("MK_LOADER_WARPS", 1)])
        .with_requirements(Requirements::SM90),
    ]
}

impl Plan {
    /// The model plan whose step a composed stage replays (`None`: a megakernel stage).
    pub fn model_plan(self) -> Option<&'static str> {
        match self {
            Plan::Composed => Some("bf16"),
            Plan::ComposedDependent | Plan::AppendInQkv => Some("pdl"),
            Plan::PerLayer | Plan::WholeStep | Plan::Streamed => None,
        }
    }

    /// Whether a composed step's kernels after the encoder are launched as programmatic dependents.
    pub fn dependent(self) -> bool {
        matches!(self, Plan::ComposedDependent | Plan::AppendInQkv)
    }

    /// Whether the QKV GEMV appends to the cache itself (no kv-append kernel).
    pub fn append_in_qkv(self) -> bool {
        self == Plan::AppendInQkv
    }
}

/// The builds the composed steps make beyond the stage lists' own (the `pdl` plan's stages with the
/// host switches the model turns on: the dependent chain, kv-append in the QKV epilogue, the argmax
/// that advances the inputs), for `kernels_compile` to compile them too.
pub fn host_switched_builds() -> Result<Vec<(&'static common::Sources, Variant)>> {
    let plan = ModelPlan::named("pdl")?;
    let with = |v: &Variant, switches: &[&str]| {
        let mut v = v.clone();
        switches.iter().for_each(|s| v.switch_on(s));
        v
    };
    let dep = common::DEPENDENT_LAUNCH;
    let gemv = plan.gemv.as_ref().ok_or_else(|| Error::constraint("a GEMV in the pdl plan", "none"))?;
    Ok(vec![
        (&matmul::SOURCES, with(gemv, &[dep, matmul::gemv::QKV_APPEND])),
        (&attention::SOURCES, with(&plan.kv_append, &[dep])),
        (&attention::SOURCES, with(&plan.decode, &[dep])),
        (&SOURCES, with(&plan.argmax, &[dep])),
        (&SOURCES, with(&plan.argmax, &[dep, crate::argmax::ADVANCE])),
        (&SOURCES, with(&plan.argmax, &[crate::argmax::ADVANCE])),
    ])
}

/// The megakernel's view of one layer: `MkLayer` of `02_megakernel.cu`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MkLayer {
    pub qkv_w: u64,
    pub qkv_b: u64,
    pub proj_w: u64,
    pub proj_b: u64,
    pub fc_w: u64,
    pub fc_b: u64,
    pub fcproj_w: u64,
    pub fcproj_b: u64,
    pub k: u64,
    pub v: u64,
}

/// `MkArgs` of `02_megakernel.cu`, field for field (passed by value).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MkArgs {
    layers: u64,
    wte: u64,
    wpe: u64,
    head_w: u64,
    head_b: u64,
    ids: u64,
    pos: u64,
    lens: u64,
    x: u64,
    q: u64,
    att: u64,
    h: u64,
    logits: u64,
    next: u64,
    part: u64,
    tickets: u64,
    best_v: u64,
    best_i: u64,
    sync: u64,
    error: u64,
    wait_ns: u64,
    b: i32,
    c: i32,
    heads: i32,
    layers_n: i32,
    vocab: i32,
    vocab_padded: i32,
    tmax: i32,
    splits: i32,
    first: i32,
    last: i32,
    ring_pages: i32,
    sync_words: i32,
}

/// The model-wide pointers a megakernel step reads: the embeddings, the folded LM head.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MkModel {
    pub wte: u64,
    pub wpe: u64,
    pub head_w: u64,
    pub head_b: u64,
}

/// The step's inputs and outputs, owned by the model's decode step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MkIo {
    pub ids: u64,
    pub pos: u64,
    pub lens: u64,
    pub x: u64,
    pub logits: u64,
    pub next: u64,
}

/// A megakernel wait's bound in seconds: [`WAIT_BOUND_S`], or `LADDER_MEGAKERNEL_WAIT_S` when set
/// (a positive number of seconds, at most an hour).
fn wait_bound() -> Result<f64> {
    match std::env::var(WAIT_BOUND_ENV) {
        Err(_) => Ok(WAIT_BOUND_S),
        Ok(v) => v
            .parse::<f64>()
            .ok()
            .filter(|s| *s > 0.0 && *s <= 3600.0)
            .ok_or_else(|| Error::constraint(format!("{WAIT_BOUND_ENV} in (0, 3600] seconds"), format!("'{v}'"))),
    }
}

/// Checks what every megakernel stage needs of the model and the batch.
pub fn check_megakernel(cfg: &Config, b: usize) -> Result<()> {
    require((1..=MAX_B).contains(&b), B_LIMIT, || format!("B = {b}"))?;
    require(cfg.c.is_multiple_of(256), C_MULTIPLE, || format!("C = {}", cfg.c))?;
    require(cfg.c <= 1024, C_LIMIT, || format!("C = {}", cfg.c))?;
    require(cfg.heads * 64 == cfg.c, HEAD_LIMIT, || format!("C = {}, heads = {}", cfg.c, cfg.heads))?;
    require(cfg.padded_vocab().is_multiple_of(16), "padded vocabulary % 16 == 0", || format!("{}", cfg.padded_vocab()))
}

/// The megakernel prepared for a model and a batch: its launch, scratch and the layer table.
pub(crate) struct MegaStep {
    launch: Launch,
    plan: Plan,
    cfg: Config,
    b: usize,
    splits: usize,
    /// The streamed stage's pages of weights a block (0 for the barrier stages).
    ring_pages: usize,
    /// A wait's bound in seconds: past it the step fails with a typed error.
    wait_s: f64,
    q: CudaSlice<f32>,
    att: CudaSlice<u16>,
    h: CudaSlice<u16>,
    part: CudaSlice<f32>,
    tickets: CudaSlice<u32>,
    best_v: CudaSlice<f32>,
    best_i: CudaSlice<i32>,
    sync: CudaSlice<u32>,
    error: CudaSlice<i32>,
    /// The layer table and the cache (its id) it points into.
    table: Option<(u64, CudaSlice<MkLayer>)>,
    model: Option<MkModel>,
}

// SAFETY: plain old data, the layout of the kernel's struct.
unsafe impl common::cudarc::driver::DeviceRepr for MkLayer {}
// SAFETY: all-zero bytes are valid (null pointers the kernel is never launched with).
unsafe impl common::cudarc::driver::ValidAsZeroBits for MkLayer {}

impl MegaStep {
    /// `grid`: blocks of a launch (`None`: the SMs times `MK_BLOCKS_PER_SM`); a cooperative launch,
    /// so at most what fits on the device at once.
    pub(crate) fn prepare(gpu: &Gpu, variant: &Variant, cfg: Config, b: usize, grid: Option<u32>) -> Result<MegaStep> {
        check_megakernel(&cfg, b)?;
        let plan = variant.plan::<Plan>()?;
        require(plan.model_plan().is_none(), "a megakernel stage", || variant.id())?;
        let threads = variant.tunable("MK_THREADS")?;
        let per_sm = variant.tunable("MK_BLOCKS_PER_SM")?;
        let grid = grid.unwrap_or(gpu.info().sm_count * per_sm);
        // Staged rows (the batch padded to 8), partial tiles, attention scores, row statistics and
        // a reduction's scratch.
        let parts = b.div_ceil(8) * 8 * (cfg.c + 8) * 2 + 4 * ((threads as usize / 32) * 16 * MAX_B + cfg.max_t + 64);
        let (block, smem, ring_pages, sync_words) = match plan {
            Plan::Streamed => {
                // The ring fills what a block's share of the SM leaves (the 1 KB the driver keeps a
                // block and a few hundred bytes for the kernel's static shared memory): 128-aligned
                // mbarriers, then 128-aligned pages.
                let align = |x: usize| x.div_ceil(128) * 128;
                let size = |n: usize| align(align(parts) + 16 * n) + n * STREAMED_PAGE_BYTES;
                let info = gpu.info();
                let share = (info.shared_memory_per_sm / per_sm.max(1)) as usize - 1024;
                let limit = share.min(info.shared_memory_per_block_optin as usize) - 256;
                let pages = (2..=STREAMED_MAX_PAGES).take_while(|&n| size(n) <= limit).last().ok_or_else(|| {
                    Error::constraint("two pages of weights in shared memory", format!("{limit} bytes"))
                })?;
                let (head, per_layer) = STREAMED_SYNC_WORDS;
                let loader = 32 * variant.tunable("MK_LOADER_WARPS")?;
                (threads + loader, size(pages), pages, head + per_layer * cfg.layers)
            }
            _ => (threads, parts, 0, 3),
        };
        let shape = LaunchShape::linear(grid, block).with_shared(smem as u32).with_cooperative();
        let launch = gpu.prepare_launch(&SOURCES, variant, "decode_step", shape)?;
        // Attention splits per (sequence, head): whole waves of (sequence, head, split) units.
        let splits = common::launch::wave_splits(b * cfg.heads, grid as usize, ATTENTION_MAX_SPLITS);
        let c = cfg.c;
        Ok(MegaStep {
            launch,
            plan,
            cfg,
            b,
            splits,
            ring_pages,
            wait_s: wait_bound()?,
            q: gpu.zeros(b * c)?,
            att: gpu.zeros(b * c)?,
            h: gpu.zeros(b * 4 * c)?,
            part: gpu.zeros(b * cfg.heads * splits * 66)?,
            tickets: gpu.zeros(b * cfg.heads)?,
            best_v: gpu.zeros(grid as usize * MAX_B)?,
            best_i: gpu.zeros(grid as usize * MAX_B)?,
            sync: gpu.zeros(sync_words)?,
            error: gpu.zeros(1)?,
            table: None,
            model: None,
        })
    }

    /// Points the step at the model's weights and at cache `cache_id`'s layers (uploading the layer
    /// table when the cache changed).
    pub(crate) fn bind(&mut self, gpu: &Gpu, model: MkModel, layers: &[MkLayer], cache_id: u64) -> Result<()> {
        require(layers.len() == self.cfg.layers, "one table entry per layer", || format!("{}", layers.len()))?;
        if self.table.as_ref().map(|(id, _)| *id) != Some(cache_id) {
            self.table = Some((cache_id, gpu.upload(layers)?));
        }
        self.model = Some(model);
        Ok(())
    }

    /// Enqueues the step's launches (one, or one per layer).
    pub(crate) fn enqueue(&self, s: &CudaStream, io: MkIo) -> Result<()> {
        let (Some((_, table)), Some(m)) = (&self.table, self.model) else {
            return Err(Error::constraint("a megakernel step bound to the weights and a cache", "none bound"));
        };
        let (cfg, l) = (self.cfg, self.cfg.layers as i32);
        let args = |first: i32, last: i32| MkArgs {
            layers: device_ptr(table),
            wte: m.wte,
            wpe: m.wpe,
            head_w: m.head_w,
            head_b: m.head_b,
            ids: io.ids,
            pos: io.pos,
            lens: io.lens,
            x: io.x,
            q: device_ptr(&self.q),
            att: device_ptr(&self.att),
            h: device_ptr(&self.h),
            logits: io.logits,
            next: io.next,
            part: device_ptr(&self.part),
            tickets: device_ptr(&self.tickets),
            best_v: device_ptr(&self.best_v),
            best_i: device_ptr(&self.best_i),
            sync: device_ptr(&self.sync),
            error: device_ptr(&self.error),
            wait_ns: (self.wait_s * 1e9) as u64,
            b: self.b as i32,
            c: cfg.c as i32,
            heads: cfg.heads as i32,
            layers_n: l,
            vocab: cfg.vocab as i32,
            vocab_padded: cfg.padded_vocab() as i32,
            tmax: cfg.max_t as i32,
            splits: self.splits as i32,
            first,
            last,
            ring_pages: self.ring_pages as i32,
            sync_words: self.sync.len() as i32,
        };
        // Phases: 0 the embedding, 1 + 5l .. 6 + 5l layer l, 1 + 5L the LM head.
        let ranges: Vec<(i32, i32)> = match self.plan {
            Plan::WholeStep | Plan::Streamed => vec![(0, 2 + 5 * l)],
            _ => (0..l)
                .map(|i| (if i == 0 { 0 } else { 1 + 5 * i }, if i == l - 1 { 2 + 5 * l } else { 6 + 5 * i }))
                .collect(),
        };
        for (first, last) in ranges {
            let a = args(first, last);
            // SAFETY: MkArgs is the kernel's struct field for field; every pointer is a live buffer
            // sized for this batch and model (scratch made at prepare, the table at bind, the io by
            // the model's decode step for the same B), and the shape was checked at prepare.
            unsafe { self.launch.enqueue(s, &[Arg::value(&a)])? };
        }
        Ok(())
    }

    /// Fails with a typed error when a launch reported a wait that timed out (then the counters are
    /// zeroed so the next step can run).
    pub(crate) fn check(&mut self, gpu: &Gpu) -> Result<()> {
        let e = gpu.download(&self.error)?;
        if e[0] != 0 {
            gpu.stream().memset_zeros(&mut self.sync).ctx("reset the barrier and the counters")?;
            gpu.stream().memset_zeros(&mut self.tickets).ctx("reset the tickets")?;
            gpu.stream().memset_zeros(&mut self.error).ctx("reset the error")?;
            return Err(Error::constraint(
                format!("every megakernel wait met within {} s ({WAIT_BOUND_ENV})", self.wait_s),
                format!(
                    "error {} ({})",
                    e[0],
                    match e[0] {
                        1 => "a grid barrier or a counter's wait timed out",
                        2 => "a wait for a page of the weights' ring timed out",
                        3 => "the launch's shared memory or counters do not match the kernel",
                        _ => "unknown",
                    }
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn resources(&self) -> ResourceUse {
        self.launch.resources().clone()
    }
}

/// The sizes of one problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StepDims {
    cfg: Config,
    b: usize,
    len: usize,
    ragged: bool,
    grid: Option<u32>,
}

impl StepDims {
    fn of(s: &Shape) -> Result<StepDims> {
        let get = |k: &str, max: i64, default: i64| -> Result<usize> {
            match s.get(k) {
                None => Ok(default as usize),
                Some(_) => s.dim(k, max),
            }
        };
        let cfg =
            Config { layers: get("L", 96, 12)?, heads: get("H", 64, 12)?, c: get("C", 8192, 768)?, ..Config::GPT2 };
        let (b, len) = (get("B", 4096, 1)?, get("len", 1 << 20, 1000)?);
        require(b >= 1 && cfg.layers >= 1 && cfg.heads >= 1, "B, L, H >= 1", || format!("{s}"))?;
        require(cfg.c.is_multiple_of(cfg.heads), "C % H == 0", || format!("C = {}, H = {}", cfg.c, cfg.heads))?;
        require(len >= 1 && len < cfg.max_t, &format!("1 <= len < context {}", cfg.max_t), || format!("len = {len}"))?;
        let grid = match s.get("grid") {
            None | Some(0) => None,
            Some(_) => Some(s.dim("grid", 1 << 16)? as u32),
        };
        let ragged = s.get("ragged").unwrap_or(0);
        require((0..=1).contains(&ragged), "ragged in {0, 1}", || format!("ragged = {ragged}"))?;
        Ok(StepDims { cfg, b, len, ragged: ragged == 1, grid })
    }

    /// Each sequence's cached length: `len`, or ragged in [len/2, len].
    fn lens(&self) -> Vec<usize> {
        (0..self.b).map(|i| if self.ragged { self.len - (i * 7919) % (self.len / 2 + 1) } else { self.len }).collect()
    }
}

fn check(v: &Variant, d: &StepDims) -> Result<()> {
    if v.plan::<Plan>()?.model_plan().is_none() {
        check_megakernel(&d.cfg, d.b)?;
    }
    Ok(())
}

fn shape(b: i64, len: i64, l: i64, c: i64, h: i64) -> Shape {
    Shape::new(&[("B", b), ("len", len), ("ragged", 0), ("L", l), ("C", c), ("H", h), ("grid", 0)])
}

static INFO: OpInfo = OpInfo {
    family: FAMILY,
    name: OP,
    description: "one greedy decode step of the whole model over the bf16 KV cache (ids in, logits and next ids out)",
    sources: &SOURCES,
    shape_keys: &["B", "len", "ragged", "L", "C", "H", "grid"],
    stages,
};

pub struct DecodeStep;

impl Op for DecodeStep {
    fn info(&self) -> &'static OpInfo {
        &INFO
    }
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2 124M, a 1024-token context filled to 1000, at the model table's decode batches.
        vec![shape(1, 1000, 12, 768, 12), shape(8, 1000, 12, 768, 12), shape(32, 1000, 12, 768, 12)]
    }
    fn validate(&self, v: &Variant, s: &Shape) -> Result<()> {
        check(v, &StepDims::of(s)?)
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        if v.plan::<Plan>().is_ok_and(|p| p.model_plan().is_some()) {
            return Vec::new();
        }
        vec![
            Limit { constraint: B_LIMIT, past: shape(33, 100, 1, 768, 12), inside: Some(shape(32, 100, 1, 768, 12)) },
            Limit { constraint: HEAD_LIMIT, past: shape(1, 100, 1, 768, 6), inside: Some(shape(1, 100, 1, 768, 12)) },
            Limit { constraint: C_MULTIPLE, past: shape(1, 100, 1, 640, 10), inside: Some(shape(1, 100, 1, 512, 8)) },
            Limit { constraint: C_LIMIT, past: shape(1, 100, 1, 1280, 20), inside: Some(shape(1, 100, 1, 1024, 16)) },
        ]
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let d = StepDims::of(s)?;
        Ok(Box::new(StepProblem::new(gpu, d, seed)?))
    }
}

/// A random bf16 cache in [-1, 1): each layer's k and v, `[B, context, C]` bit patterns, rows past a
/// sequence's length zero.
pub(crate) struct HostCache {
    pub k: Vec<Vec<u16>>,
    pub v: Vec<Vec<u16>>,
}

impl HostCache {
    fn random(cfg: &Config, lens: &[usize], seed: u64) -> HostCache {
        let per = cfg.max_t * cfg.c;
        let fill = |salt: u64| -> Vec<u16> {
            let mut out = vec![0u16; lens.len() * per];
            out.par_chunks_mut(cfg.c).enumerate().for_each(|(row, r)| {
                let (b, t) = (row / cfg.max_t, row % cfg.max_t);
                if t < lens[b] {
                    for (i, x) in r.iter_mut().enumerate() {
                        let u = splitmix(seed ^ salt ^ ((row * cfg.c + i) as u64).wrapping_mul(0x9E37_79B9));
                        let f = (u >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                        *x = half::bf16::from_f32(f).to_bits();
                    }
                }
            });
            out
        };
        let layer = |l: usize, kv: u64| fill((l as u64 + 1) * 0x1000_0001 + kv);
        HostCache {
            k: (0..cfg.layers).map(|l| layer(l, 1)).collect(),
            v: (0..cfg.layers).map(|l| layer(l, 2)).collect(),
        }
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One decode step in f64: each sequence's logits `[B, V]` and each layer's new k and v `[L, B, C]`
/// (for one sequence: `[V]`, `[L, C]`).
pub struct StepReference {
    pub logits: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
}

/// The step of `tokens` at positions `lens` over `cache` (rows below each length), in f64 from the
/// fp32 weights.
pub(crate) fn reference(cfg: &Config, w: &Weights, cache: &HostCache, lens: &[usize], tokens: &[i32]) -> StepReference {
    let (c, hs, nh) = (cfg.c, cfg.head_size(), cfg.heads);
    let bf = |x: u16| half::bf16::from_bits(x).to_f64();
    let (ln, lin) = (crate::reference::layernorm_row, crate::reference::linear_row);
    let per_seq: Vec<StepReference> = (0..lens.len())
        .into_par_iter()
        .map(|b| {
            let (pos, tok) = (lens[b], tokens[b] as usize);
            let mut x: Vec<f64> = (0..c).map(|i| w.wte[tok * c + i] as f64 + w.wpe[pos * c + i] as f64).collect();
            let (mut ks, mut vs) = (Vec::new(), Vec::new());
            for (l, blk) in w.blocks.iter().enumerate() {
                let qkv = lin(&ln(&x, &blk.ln1_w, &blk.ln1_b), &blk.qkv_w, Some(&blk.qkv_b), 3 * c);
                let (q, kn, vn) = (&qkv[..c], &qkv[c..2 * c], &qkv[2 * c..]);
                let row = |t: usize| (b * cfg.max_t + t) * c;
                let mut att = vec![0f64; c];
                for h in 0..nh {
                    let d = h * hs..(h + 1) * hs;
                    let key = |t: usize, j: usize| if t == pos { kn[j] } else { bf(cache.k[l][row(t) + j]) };
                    let val = |t: usize, j: usize| if t == pos { vn[j] } else { bf(cache.v[l][row(t) + j]) };
                    let s: Vec<f64> = (0..=pos)
                        .map(|t| d.clone().map(|j| q[j] * key(t, j)).sum::<f64>() / (hs as f64).sqrt())
                        .collect();
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (t, p) in e.iter().enumerate() {
                        for j in d.clone() {
                            att[j] += p / z * val(t, j);
                        }
                    }
                }
                ks.extend_from_slice(kn);
                vs.extend_from_slice(vn);
                let proj = lin(&att, &blk.proj_w, Some(&blk.proj_b), c);
                x.iter_mut().zip(&proj).for_each(|(a, p)| *a += p);
                let fc: Vec<f64> = lin(&ln(&x, &blk.ln2_w, &blk.ln2_b), &blk.fc_w, Some(&blk.fc_b), 4 * c)
                    .into_iter()
                    .map(pointwise::gelu)
                    .collect();
                let proj = lin(&fc, &blk.fcproj_w, Some(&blk.fcproj_b), c);
                x.iter_mut().zip(&proj).for_each(|(a, p)| *a += p);
            }
            StepReference { logits: lin(&ln(&x, &w.lnf_w, &w.lnf_b), &w.wte, None, cfg.vocab), k: ks, v: vs }
        })
        .collect();
    let (b, l) = (lens.len(), cfg.layers);
    // [L, B, C] from each sequence's [L, C].
    let by_layer = |pick: fn(&StepReference) -> &Vec<f64>| -> Vec<f64> {
        let mut out = vec![0f64; l * b * c];
        for (bi, s) in per_seq.iter().enumerate() {
            for li in 0..l {
                out[(li * b + bi) * c..][..c].copy_from_slice(&pick(s)[li * c..][..c]);
            }
        }
        out
    };
    StepReference {
        logits: per_seq.iter().flat_map(|s| s.logits.iter().copied()).collect(),
        k: by_layer(|s| &s.k),
        v: by_layer(|s| &s.v),
    }
}

/// A model with random weights and a random cache, the step's inputs and its f64 reference.
struct StepProblem {
    d: StepDims,
    model: Model,
    cache: crate::cache::KvCache,
    tokens: Vec<i32>,
    lens: Vec<usize>,
    reference: StepReference,
    /// The harness stream, which the step's graph replays on.
    stream: Arc<CudaStream>,
}

impl StepProblem {
    fn new(gpu: &Gpu, d: StepDims, seed: u64) -> Result<StepProblem> {
        let cfg = d.cfg;
        let weights = Weights::random(&cfg, seed);
        let lens = d.lens();
        let host = HostCache::random(&cfg, &lens, seed ^ 0xCAC4E);
        let tokens: Vec<i32> =
            (0..d.b).map(|i| (splitmix(seed.wrapping_add(i as u64)) % cfg.vocab as u64) as i32).collect();
        let reference = reference(&cfg, &weights, &host, &lens, &tokens);
        let mut model = Model::new(gpu, cfg, &weights, ModelPlan::named("bf16")?)?;
        let cache = model.cache_from_host(gpu, &host, &lens)?;
        model.set_graph(true);
        Ok(StepProblem { d, model, cache, tokens, lens, reference, stream: gpu.stream().clone() })
    }
}

impl Problem for StepProblem {
    fn workload(&self) -> Workload {
        let cfg = self.d.cfg;
        let (c, l) = (cfg.c as u64, cfg.layers as u64);
        let weights = l * 12 * c * c + cfg.padded_vocab() as u64 * c;
        let cached: u64 = self.lens.iter().map(|&n| n as u64 + 1).sum::<u64>() * l;
        let b = self.d.b as u64;
        Workload {
            bytes: 2 * weights + 4 * cached * c + 8 * b * c,
            flops: 2 * b * weights + 4 * cached * c,
            bound: Bound::Memory,
        }
    }
    fn copies(&self) -> usize {
        // The weights (247 MB at GPT-2 124M) and the cache pass through L2 once a step.
        1
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.model.poison_step(gpu, &mut self.cache, &self.lens)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        check(v, &self.d)?;
        // A composed stage runs its model plan's ops; a megakernel stage replaces them.
        let plan = v.plan::<Plan>()?.model_plan().unwrap_or("bf16");
        self.model.set_plan(ModelPlan::named(plan)?)?;
        self.model.set_step_stage(v.clone(), self.d.grid);
        self.model.prepare_step(gpu, &self.cache, &self.tokens)
    }
    fn enqueue(&mut self, _: &CudaStream, _: usize) -> Result<()> {
        self.model.replay_step(&self.stream, &mut self.cache)
    }
    fn verify(&mut self, gpu: &Gpu, _: usize) -> Result<Verification> {
        self.model.check_step(gpu)?;
        let crate::model::StepOutputs { logits, ids, k, v } = self.model.step_outputs(gpu, &self.cache, &self.lens)?;
        let r = &self.reference;
        let vocab = self.d.cfg.vocab;
        let err = compare("logits", &logits, &r.logits);
        // Per sequence: the pick's reference logit within the logits' error (its rms) of the maximum.
        let slack = err.rel_l2 * (r.logits.iter().map(|x| x * x).sum::<f64>() / r.logits.len() as f64).sqrt() * 4.0;
        let picks: Vec<f32> = ids
            .iter()
            .enumerate()
            .map(|(b, &id)| {
                let row = &r.logits[b * vocab..(b + 1) * vocab];
                let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let ok = (0..vocab as i32).contains(&id) && row[id as usize] >= max - slack;
                if ok {
                    1.0
                } else {
                    0.0
                }
            })
            .collect();
        Ok(Verification::new(self.model.plan.step.tolerance())
            .add("logits", &logits, &r.logits)
            .add("k appended", &k, &r.k)
            .add("v appended", &v, &r.v)
            .add("ids (reference logit within the error of the max)", &picks, &vec![1.0; ids.len()]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;

    /// The step reference, run token by token from an empty cache (each step's k and v appended in
    /// bf16), ends where the whole-sequence reference does: the two f64 references agree up to the
    /// cache's bf16 rounding.
    #[test]
    fn step_reference_matches_the_sequence_reference() {
        let cfg = Config { layers: 2, heads: 2, c: 128, vocab: 101, max_t: 16 };
        let w = Weights::random(&cfg, 3);
        let tokens = [5, 17, 99, 0, 42, 7];
        let mut cache = HostCache {
            k: vec![vec![0u16; cfg.max_t * cfg.c]; cfg.layers],
            v: vec![vec![0u16; cfg.max_t * cfg.c]; cfg.layers],
        };
        let bits = |x: f64| half::bf16::from_f64(x).to_bits();
        let mut last = Vec::new();
        for (t, &tok) in tokens.iter().enumerate() {
            let r = reference(&cfg, &w, &cache, &[t], &[tok]);
            for l in 0..cfg.layers {
                let row = t * cfg.c..(t + 1) * cfg.c;
                for (dst, &x) in cache.k[l][row.clone()].iter_mut().zip(&r.k[l * cfg.c..(l + 1) * cfg.c]) {
                    *dst = bits(x);
                }
                for (dst, &x) in cache.v[l][row].iter_mut().zip(&r.v[l * cfg.c..(l + 1) * cfg.c]) {
                    *dst = bits(x);
                }
            }
            last = r.logits;
        }
        let whole = reference::forward(&cfg, &w, &[tokens.to_vec()]);
        let want = &whole[(tokens.len() - 1) * cfg.vocab..];
        let err = (last.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum::<f64>()
            / want.iter().map(|b| b * b).sum::<f64>())
        .sqrt();
        assert!(err < 5e-3, "rel L2 {err:e} (measured 7.2e-4)");
        assert!(err > 0.0, "the cache is rounded to bf16: the two cannot agree exactly");
    }
}
