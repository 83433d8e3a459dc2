//! The decode step's stage list (`gpt2/decode-step`: how each stage runs the step, [`Plan`]) and the
//! megakernel the model launches for a megakernel stage ([`MegaStep`]). The op, its problem and its
//! f64 reference are `decode_step`'s; this module is what the model needs of them, so the model does
//! not import the op that drives it.

use common::cudarc::driver::{CudaSlice, CudaStream};
use common::launch::device_ptr;
use common::{
    require, Arg, Define, DriverContext, Error, Gpu, Launch, LaunchShape, Precision, Requirements, ResourceUse, Result,
    Variant,
};

use crate::config::Config;
use crate::{FAMILY, SOURCES};

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
pub(crate) const B_LIMIT: &str = "B <= 32";
pub(crate) const HEAD_LIMIT: &str = "head size == 64";
pub(crate) const C_MULTIPLE: &str = "C % 256 == 0";
pub(crate) const C_LIMIT: &str = "C <= 1024";
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
    /// [`Plan::AppendInQkv`] on `gemv` 7: the folded LayerNorm's rows read once.
    StagedRows,
    /// [`Plan::StagedRows`] on decode attention 8: the split merge's loads in one round trip.
    BatchedMerge,
    /// [`Plan::BatchedMerge`] on `gemv` 8: the epilogue's operands read right after the wait.
    EarlyOperands,
    /// [`Plan::EarlyOperands`] with the folded GEMVs at 8 warps a block: the next link's blocks fit
    /// beside them.
    CoResident,
    /// [`Plan::CoResident`] on decode attention 9: each split's cached K/V rows requested before
    /// its wait.
    EarlyCache,
    /// [`Plan::EarlyCache`] with the attention's split merge in the projection's prologue: the
    /// attention leaves its partials, no ticket or merging block.
    MergeInProjection,
    /// [`Plan::MergeInProjection`] with the greedy picks in the LM head's epilogue: the argmax
    /// after it reads B words.
    PicksInLmHead,
    /// [`Plan::PicksInLmHead`] with the picking LM head on `gemv` 9's resident blocks, each walking
    /// row tiles and offering its picks once.
    ResidentLmHead,
    /// [`Plan::ResidentLmHead`] on decode attention 11: 8 or 16 warps a block where few blocks run,
    /// 2-4x the cached rows in flight.
    AttentionWarps,

    /// The megakernel launched once per layer (the phases of one block).
    PerLayer,
    /// The megakernel launched once for the whole step.
    WholeStep,
    /// One kernel for the whole step with no grid barrier: a loader warp streams the weights through
    /// a shared-memory ring, consumers wait on counters (`decode-step/08_streamed.cu`).
    Streamed,
}

pub(crate) fn stages() -> Vec<Variant> {
    // A composed step: the model plan's kernels with the host switches its plan turns on.
    let composed = |stage, name, summary, description, plan: Plan| {
        Variant::host(FAMILY, OP, stage, name, summary, Precision::Bf16, description).with_plan(plan)
    };
    let mk = |stage, name, plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, "decode-step/02_megakernel.cu", Precision::Bf16, summary)
            .with_plan(plan)
            .with_tunables(&[("MK_THREADS", THREADS), ("MK_BLOCKS_PER_SM", 1)])
    };
    vec![
        composed(
            0,
            "composed-graph",
            "the bf16 plan's step as a CUDA graph",
            "the model's own step under the bf16 plan (GEMVs with the LayerNorm folded in and the tails fused, kv-append, split-K decode attention, argmax), replayed as one CUDA graph",
            Plan::Composed,
        ),
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
        composed(
            6,
            "dependent-launch",
            "stage 0's graph as a programmatic-dependent chain",
            "stage 0 with every kernel after the encoder launched as a programmatic dependent of the one before it (each starts under its predecessor's tail and waits for it in the kernel), the GEMVs copying their first pass of weights into shared memory before that wait (gemv 6)",
            Plan::ComposedDependent,
        ),
        composed(
            7,
            "append-in-qkv",
            "stage 6 with kv-append in the QKV GEMV's epilogue",
            "stage 6 with kv-append done by the QKV GEMV's epilogue (q to bf16, k and v straight into the cache cells): 5 kernels a layer instead of 6, 63 a step",
            Plan::AppendInQkv,
        ),
        composed(
            9,
            "staged-rows",
            "stage 7 with the folded GEMVs' rows read once (gemv 7)",
            "stage 7 with the folded GEMVs (QKV, MLP up, LM head) on gemv 7: each LayerNorm row read from memory once, its statistics from registers, the row less its mean staged in shared memory for the fragments",
            Plan::StagedRows,
        ),
        composed(
            10,
            "batched-merge",
            "stage 9 with decode attention's split merge in one round trip (decode 8)",
            "stage 9 with decode attention 8: the last split's block requests every split's max, sum and output at once instead of one split after another",
            Plan::BatchedMerge,
        ),
        composed(
            11,
            "early-operands",
            "stage 10 with the GEMVs' bias and residual read right after their wait (gemv 8)",
            "stage 10 with every GEMV on gemv 8: the epilogue's bias and residual read into the storing threads' registers right after the wait, before the products",
            Plan::EarlyOperands,
        ),
        composed(
            12,
            "co-resident",
            "stage 11 with the folded GEMVs at 8 warps a block, so that the next link's blocks fit beside them",
            "stage 11 with QKV, the MLP up and the LM head launched at 8 warps a block instead of 16: a block of the projection or the MLP down (32 warps) then fits on an SM beside one of them, so it copies its weights and waits under the running kernel instead of after it",
            Plan::CoResident,
        ),
        composed(
            13,
            "early-cache",
            "stage 12 with decode attention's cached K/V rows requested before its wait (decode 9)",
            "stage 12 with decode attention 9: each split's first K/V tiles (at B = 1 the whole split) are requested before the block waits for the QKV GEMV, since no kernel of the step writes the cached rows; q and the step's own row are read after the wait",
            Plan::EarlyCache,
        ),
        composed(
            14,
            "merge-in-projection",
            "stage 13 with decode attention's split merge done by the attention projection as it stages its input",
            "stage 13 with decode attention leaving its split partials (no fence, ticket or merging block) and the attention projection's GEMV merging them into its staged bf16 rows (the same merge, by every block): where attention splits (B = 1 at GPT-2), the attention link loses its ticket and merge, the projection gains one L2 round trip of partials in place of its input's",
            Plan::MergeInProjection,
        ),
        composed(
            15,
            "picks-in-lm-head",
            "stage 14 with the greedy picks made in the LM head's epilogue (one atomicMax of a 64-bit word a block and row, into 32 slots a row)",
            "stage 14 with the LM head's GEMV (gemv 8 with GEMV_PICKS) merging each row's argmax over the vocabulary into 64-bit words (value order, then the lower index) with one atomicMax a block and row, into the block's slot of 32 a row, so the argmax kernel after it reads and resets B rows of 32 words: the chain's last link is one L2 round trip instead of a scan of the logits, a fence, a ticket and a merge",
            Plan::PicksInLmHead,
        ),
        composed(
            16,
            "resident-lm-head",
            "stage 15 with the picking LM head on gemv 9: as many blocks as fit at once, each walking row tiles with the next tile's weights in flight, its picks offered once",
            "stage 15 with the LM head's picking GEMV on gemv 9 (GEMV_RESIDENT_TILES on stage 8's recipe): as many blocks as fit on the GPU at once instead of one per 16 rows (524 of six tiles each at B = 1, against 3144 in six waves), the next tile's first pass of weights copied under the current one's products and epilogue, the LayerNorm rows staged once a block and each row's pick merged once a block; the step's other GEMVs stay on gemv 8",
            Plan::ResidentLmHead,
        ),
        composed(
            17,
            "attention-warps",
            "stage 16 with decode attention 11: 16 warps a block where its blocks do not fill the SMs (B = 8), 4x the cached K/V bytes in flight",
            "stage 16 with decode attention 11: a block of the unsplit attention at B = 8 (96 blocks on 132 SMs) runs 16 warps instead of 4, each warp a quarter of the keys with its two tiles in flight, merged in shared memory, so a block keeps 64 KB of the cache in flight instead of 16 KB; at B = 1 (8 splits of 128 keys) and B = 32 (384 blocks) the attention launches stage 9's 4 warps",
            Plan::AttentionWarps,
        ),
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
    /// The model plan whose step a composed stage replays, `NAME[:op=stage,...]` with the ops the
    /// stage pins (`None`: a megakernel stage).
    pub fn model_plan(self) -> Option<&'static str> {
        match self {
            Plan::Composed => Some("bf16"),
            Plan::ComposedDependent | Plan::AppendInQkv => Some("pdl:gemv=6,decode=7"),
            Plan::StagedRows => Some("pdl:gemv=7,decode=7"),
            Plan::BatchedMerge => Some("pdl:gemv=7,decode=8"),
            Plan::EarlyOperands | Plan::CoResident => Some("pdl:gemv=8,decode=8"),
            Plan::EarlyCache | Plan::MergeInProjection | Plan::PicksInLmHead | Plan::ResidentLmHead => {
                Some("pdl:gemv=8,decode=9")
            }
            Plan::AttentionWarps => Some("pdl:gemv=8,decode=11"),
            Plan::PerLayer | Plan::WholeStep | Plan::Streamed => None,
        }
    }

    /// Whether this composed stage has `rung`'s idea: the composed stages are cumulative, each
    /// adding one idea to the one before it ([`COMPOSED_RUNGS`]); a megakernel stage has none.
    fn builds_on(self, rung: Plan) -> bool {
        let at = |p: Plan| COMPOSED_RUNGS.iter().position(|&r| r == p);
        matches!((at(self), at(rung)), (Some(s), Some(r)) if s >= r)
    }

    /// Whether a composed step's kernels after the encoder are launched as programmatic dependents.
    pub fn dependent(self) -> bool {
        self.builds_on(Plan::ComposedDependent)
    }

    /// Whether the QKV GEMV appends to the cache itself (no kv-append kernel).
    pub fn append_in_qkv(self) -> bool {
        self.builds_on(Plan::AppendInQkv)
    }

    /// Whether the folded GEMVs run at 8 warps a block (stages 12-16).
    pub fn narrow_folded_gemvs(self) -> bool {
        self.builds_on(Plan::CoResident)
    }

    /// Whether decode attention leaves its split partials for the attention projection to merge.
    pub fn merges_in_projection(self) -> bool {
        self.builds_on(Plan::MergeInProjection)
    }

    /// Whether a greedy step's LM head makes the picks and the argmax only reads them.
    pub fn picks_in_lm_head(self) -> bool {
        self.builds_on(Plan::PicksInLmHead)
    }

    /// Whether the picking LM head runs on resident blocks that walk row tiles (`gemv` 9's switch).
    pub fn resident_lm_head(self) -> bool {
        self.builds_on(Plan::ResidentLmHead)
    }
}

/// The composed stages in ladder order (0, 6, 7, 9-17): each keeps every idea of those before it.
const COMPOSED_RUNGS: [Plan; 12] = [
    Plan::Composed,
    Plan::ComposedDependent,
    Plan::AppendInQkv,
    Plan::StagedRows,
    Plan::BatchedMerge,
    Plan::EarlyOperands,
    Plan::CoResident,
    Plan::EarlyCache,
    Plan::MergeInProjection,
    Plan::PicksInLmHead,
    Plan::ResidentLmHead,
    Plan::AttentionWarps,
];

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each composed stage has the ideas of the stages before it, by stage number: the chain from 6,
    /// the append from 7, narrow folded GEMVs from 12, the merge in the projection from 14, the picks
    /// in the LM head from 15, the resident LM head from 16; a megakernel stage none of them.
    #[test]
    fn composed_stages_keep_the_ideas_before_them() {
        for v in stages() {
            let p = v.plan::<Plan>().unwrap();
            let composed = p.model_plan().is_some();
            let from = |stage: u32| composed && v.stage >= stage;
            let got = [
                p.dependent(),
                p.append_in_qkv(),
                p.narrow_folded_gemvs(),
                p.merges_in_projection(),
                p.picks_in_lm_head(),
                p.resident_lm_head(),
            ];
            assert_eq!(got, [from(6), from(7), from(12), from(14), from(15), from(16)], "stage {}", v.stage);
        }
    }
}
