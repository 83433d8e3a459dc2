//! Greedy sampling on the device, a small ladder: `ids[b] = argmax(logits[b, ..V])`, the lowest index
//! among equal maxima (the host sampler's rule), rows `ld >= V` apart (the model pads its logits to
//! a multiple of 64 columns). A greedy decode step then downloads B ints instead of B·V floats.
//!
//! Shape keys: `B`, `V`, `ld` (the row stride; 0 or absent: V).

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, Gpu, Launch, LaunchShape, Limit, Op, Precision, Prepared as Current, Problem,
    Result, Shape, Variant, Workload,
};

use crate::{FAMILY, SOURCES};
use matmul::gemv::PICK_WORDS_PER_ROW;

const OP: &str = "argmax";

common::declare_op! {
    pub struct Argmax {
        name: OP,
        description: "greedy sampling: ids[b] = argmax over V of logits[b, :] (lowest index among equals)",
        shape_keys: ["B", "V", "ld"],
        stages: stages,
    }
}

const THREADS: u32 = 256;
pub(crate) const ELEMS: &str = "B * ld < 2^31";
pub(crate) const STRIDE: &str = "ld >= V";
const GRID_Y: &str = "B <= 65535";

/// How a stage covers a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// One block per row.
    BlockRow,
    /// `ARGMAX_SPLITS` blocks per row and a workspace; the row's last block merges.
    SplitRow,
}

fn stages() -> Vec<Variant> {
    let k = |stage, name, file, plan: Plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Fp32, summary)
            .with_plan(plan)
            .with_tolerance(0.0, "token ids are exact")
    };
    vec![
        k(
            0,
            "block-row",
            "argmax/00_block_row.cu",
            Plan::BlockRow,
            "a block of 256 threads per row: strided scan, warp-shuffle and shared-memory merges of (max, index)",
        ),
        k(
            1,
            "split-row",
            "argmax/01_split_row.cu",
            Plan::SplitRow,
            "a row over 32 blocks in one launch: pieces to a workspace, the last block (ticket) merges them",
        )
        .with_tunables(&[("ARGMAX_SPLITS", 32)]),
    ]
}

/// The sizes of one call: B rows of V logits, `ld` apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgmaxDims {
    pub b: usize,
    pub v: usize,
    pub ld: usize,
}

/// The constraints every stage shares (and the problem's buffers need); the sampling op's rows
/// share them too.
pub(crate) fn check_dims(d: ArgmaxDims) -> Result<()> {
    let ArgmaxDims { b, v: n, ld } = d;
    require(b >= 1 && n >= 1, "B, V >= 1", || format!("B = {b}, V = {n}"))?;
    require(ld >= n, STRIDE, || format!("ld = {ld}, V = {n}"))?;
    require(b.checked_mul(ld).is_some_and(|x| x < 1 << 31), ELEMS, || format!("B = {b}, ld = {ld}"))
}

pub fn check_shape(v: &Variant, d: ArgmaxDims) -> Result<()> {
    check_dims(d)?;
    let b = d.b;
    if v.plan::<Plan>()? == Plan::SplitRow {
        require(b <= 65535, GRID_Y, || format!("B = {b}"))?;
    }
    Ok(())
}

/// The split stage's workspace: each (row, piece)'s max and index, and a ticket per row (zero
/// between launches: the last block resets it).
struct Workspace {
    part_v: CudaSlice<f32>,
    part_i: CudaSlice<i32>,
    tickets: CudaSlice<u32>,
}

/// The argmax prepared for B rows of V logits.
pub struct Prepared {
    launch: Launch,
    workspace: Option<Workspace>,
    d: ArgmaxDims,
    /// The `argmax_rows_advance` entry ([`prepare_advance`]).
    advance: bool,
}

/// The host switch that adds `argmax_rows_advance` to the split stage's file.
pub const ADVANCE: &str = "ARGMAX_ADVANCE";

/// Whether stage `v` can advance the decode step's inputs ([`prepare_advance`]).
pub fn advances(v: &Variant) -> bool {
    v.plan::<Plan>().is_ok_and(|p| p == Plan::SplitRow)
}

/// The split stage with the decode step's inputs advanced by the merging lane
/// ([`Prepared::enqueue_advance`]): a greedy loop on the device.
pub fn prepare_advance(gpu: &Gpu, variant: &Variant, d: ArgmaxDims) -> Result<Prepared> {
    require(variant.plan::<Plan>()? == Plan::SplitRow, "a split-row argmax stage (1) to advance the inputs", || {
        format!("stage {}", variant.stage)
    })?;
    let mut v = variant.clone();
    v.switch_on(ADVANCE);
    prepare_entry(gpu, &v, d, ADVANCE_ENTRY)
}

/// The split stage's entry point that also advances the inputs (built with [`ADVANCE`]).
const ADVANCE_ENTRY: &str = "argmax_rows_advance";

/// What [`Prepared::enqueue_advance`] advances: `picks` `[B, tmax]` (row b's pick lands at its
/// position), the next step's tokens, positions, cache cells' positions and attended lengths.
pub struct AdvanceArgs<'a> {
    pub picks: &'a mut CudaSlice<i32>,
    pub tokens: &'a mut CudaSlice<i32>,
    pub pos: &'a mut CudaSlice<i32>,
    pub cell_pos: &'a mut CudaSlice<i32>,
    pub lens: &'a mut CudaSlice<i32>,
    pub tmax: usize,
}

impl AdvanceArgs<'_> {
    /// The advancing entries' last six arguments (picks, tokens, pos, cell_pos, lens, Tmax), their
    /// lengths checked for `b` rows.
    fn args(&self, b: usize) -> Result<[Arg<'static>; 6]> {
        require_len("picks", self.picks.len(), b * self.tmax)?;
        for (name, buf) in
            [("tokens", &*self.tokens), ("pos", &*self.pos), ("cell_pos", &*self.cell_pos), ("lens", &*self.lens)]
        {
            require_len(name, buf.len(), b)?;
        }
        Ok([
            Arg::buf(self.picks),
            Arg::buf(self.tokens),
            Arg::buf(self.pos),
            Arg::buf(self.cell_pos),
            Arg::buf(self.lens),
            Arg::int(self.tmax),
        ])
    }
}

/// The host switch that adds `argmax_picks` (and, with [`ADVANCE`], `argmax_picks_advance`) to the
/// split stage's file: the ids from the pick words a picking LM head merged (`matmul::gemv::PICKS`).
pub const FROM_PICKS: &str = "ARGMAX_FROM_PICKS";

/// The decode step's argmax after a picking LM head: a warp a row reads its pick words
/// ([`PICK_WORDS_PER_ROW`] a row), resets them and writes the id (and, `advance`, moves the step's inputs on as [`Prepared::enqueue_advance`]).
pub struct PickReader {
    launch: Launch,
    b: usize,
    advance: bool,
}

pub fn prepare_pick_reader(gpu: &Gpu, variant: &Variant, b: usize, advance: bool) -> Result<PickReader> {
    require(advances(variant), "a split-row argmax stage (1) to read pick words", || {
        format!("stage {}", variant.stage)
    })?;
    require(b >= 1, "B >= 1", || format!("B = {b}"))?;
    require(b <= 65535, GRID_Y, || format!("B = {b}"))?;
    let mut v = variant.clone();
    v.switch_on(FROM_PICKS);
    if advance {
        v.switch_on(ADVANCE);
    }
    let entry = if advance { "argmax_picks_advance" } else { "argmax_picks" };
    let launch = gpu.prepare_launch(&SOURCES, &v, entry, LaunchShape::linear(b as u32, 32))?;
    Ok(PickReader { launch, b, advance })
}

impl PickReader {
    pub fn enqueue(&self, stream: &CudaStream, ids: &mut CudaSlice<i32>, words: &mut CudaSlice<u64>) -> Result<()> {
        require(!self.advance, "a plain pick reader (enqueue_advance for an advancing one)", || {
            "an advancing one".into()
        })?;
        require_len("ids", ids.len(), self.b)?;
        require_len("pick words", words.len(), self.b * PICK_WORDS_PER_ROW)?;
        // SAFETY: argmax_picks(ids, words): B ids and B rows of pick words (checked above).
        unsafe { self.launch.enqueue(stream, &[Arg::buf(ids), Arg::buf(words)]) }
    }

    /// # Safety
    /// As [`Prepared::enqueue_advance`]: every `pos[b]` in `0..tmax` when the kernel runs.
    pub unsafe fn enqueue_advance(
        &self,
        stream: &CudaStream,
        ids: &mut CudaSlice<i32>,
        words: &mut CudaSlice<u64>,
        a: AdvanceArgs,
    ) -> Result<()> {
        require(self.advance, "a pick reader prepared to advance", || "a plain one".into())?;
        require_len("ids", ids.len(), self.b)?;
        require_len("pick words", words.len(), self.b * PICK_WORDS_PER_ROW)?;
        let mut args = vec![Arg::buf(ids), Arg::buf(words)];
        args.extend(a.args(self.b)?);
        // SAFETY: argmax_picks_advance's signature, lengths checked above; the positions are the
        // caller's promise.
        unsafe { self.launch.enqueue(stream, &args) }
    }
}

common::single_launch_stage!(PickReader);

pub fn prepare(gpu: &Gpu, variant: &Variant, d: ArgmaxDims) -> Result<Prepared> {
    prepare_entry(gpu, variant, d, "argmax_rows")
}

/// Stage `variant` for `d` with entry point `entry` (`argmax_rows`, or the split stage's
/// `argmax_rows_advance`).
fn prepare_entry(gpu: &Gpu, variant: &Variant, d: ArgmaxDims, entry: &str) -> Result<Prepared> {
    check_shape(variant, d)?;
    let b = d.b;
    let (shape, workspace) = match variant.plan::<Plan>()? {
        Plan::BlockRow => (LaunchShape::linear(b as u32, THREADS), None),
        Plan::SplitRow => {
            let splits = variant.tunable("ARGMAX_SPLITS")?;
            let ws = Workspace {
                part_v: gpu.zeros(b * splits as usize)?,
                part_i: gpu.zeros(b * splits as usize)?,
                tickets: gpu.zeros(b)?,
            };
            (LaunchShape::new((splits, b as u32, 1), (THREADS, 1, 1)), Some(ws))
        }
    };
    let launch = gpu.prepare_launch(&SOURCES, variant, entry, shape)?;
    Ok(Prepared { launch, workspace, d, advance: entry == ADVANCE_ENTRY })
}

impl Prepared {
    /// As [`Prepared::enqueue`], and each row's merging lane then advances the step's inputs.
    ///
    /// # Safety
    /// Every `pos[b]` must lie in `0..tmax` when the kernel runs (it writes `picks[b][pos[b]]` and,
    /// while `pos[b] + 1 < tmax`, moves the position on): the decode step's positions are.
    pub unsafe fn enqueue_advance(
        &self,
        stream: &CudaStream,
        ids: &mut CudaSlice<i32>,
        logits: &CudaSlice<f32>,
        a: AdvanceArgs,
    ) -> Result<()> {
        let ArgmaxDims { b, v, ld } = self.d;
        require(self.advance, "an argmax prepared to advance (prepare_advance)", || "a plain one".into())?;
        require_len("ids", ids.len(), b)?;
        require_len("logits", logits.len(), b * ld)?;
        let w = self.workspace.as_ref().expect("a split stage has its workspace");
        let mut args = vec![Arg::buf(ids), Arg::buf(&w.part_v), Arg::buf(&w.part_i), Arg::buf(&w.tickets)];
        args.extend([Arg::buf(logits), Arg::int(b), Arg::int(v), Arg::int(ld)]);
        args.extend(a.args(b)?);
        // SAFETY: the arguments follow argmax_rows_advance's signature, lengths checked above; the
        // positions are the caller's promise.
        unsafe { self.launch.enqueue(stream, &args) }
    }

    pub fn enqueue(&self, stream: &CudaStream, ids: &mut CudaSlice<i32>, logits: &CudaSlice<f32>) -> Result<()> {
        require(!self.advance, "a plain argmax (enqueue_advance for an advancing one)", || "an advancing one".into())?;
        let ArgmaxDims { b, v, ld } = self.d;
        require_len("ids", ids.len(), b)?;
        require_len("logits", logits.len(), b * ld)?;
        let (b, v, ld) = (Arg::int(b), Arg::int(v), Arg::int(ld));
        // SAFETY: each entry's arguments follow its signature; it reads V of each row of ld logits and
        // writes B ids (lengths checked, ld >= V at prepare); the workspace was sized for B rows of ARGMAX_SPLITS pieces at prepare.
        unsafe {
            match &self.workspace {
                None => self.launch.enqueue(stream, &[Arg::buf(ids), Arg::buf(logits), b, v, ld]),
                Some(w) => self.launch.enqueue(
                    stream,
                    &[
                        Arg::buf(ids),
                        Arg::buf(&w.part_v),
                        Arg::buf(&w.part_i),
                        Arg::buf(&w.tickets),
                        Arg::buf(logits),
                        b,
                        v,
                        ld,
                    ],
                ),
            }
        }
    }
}

common::single_launch_stage!(Prepared);

fn shape(b: i64, v: i64, ld: i64) -> Shape {
    Shape::new(&[("B", b), ("V", v), ("ld", ld)])
}

/// `B`, `V` and `ld` (0 or absent: V) of a shape.
pub(crate) fn dims(s: &Shape) -> Result<ArgmaxDims> {
    let (b, v) = (s.dim("B", i32::MAX as i64)?, s.dim("V", i32::MAX as i64)?);
    let ld = match s.get("ld") {
        Some(0) | None => v,
        Some(_) => s.dim("ld", i32::MAX as i64)?,
    };
    Ok(ArgmaxDims { b, v, ld })
}

impl Op for Argmax {
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2's vocabulary, in rows padded to 50304 as the model's logits are, at the decode batch
        // sizes of the model table.
        vec![shape(1, 50257, 50304), shape(8, 50257, 50304), shape(32, 50257, 50304)]
    }
    fn validate(&self, variant: &Variant, s: &Shape) -> Result<()> {
        check_shape(variant, dims(s)?)
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        let mut l = vec![
            Limit { constraint: ELEMS, past: shape(1 << 16, 1 << 15, 0), inside: Some(shape(3, 1001, 1024)) },
            Limit { constraint: STRIDE, past: shape(2, 100, 99), inside: Some(shape(2, 100, 100)) },
        ];
        if v.plan::<Plan>().is_ok_and(|p| p == Plan::SplitRow) {
            l.push(Limit { constraint: GRID_Y, past: shape(65536, 2, 0), inside: Some(shape(65535, 2, 0)) });
        }
        l
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let d = dims(s)?;
        check_dims(d)?;
        let ArgmaxDims { b, v, ld } = d;
        // The padding columns hold larger values than any logit: a stage that reads them fails.
        let mut logits = uniform(b * ld, -8.0, 8.0, seed);
        logits.chunks_mut(ld).for_each(|r| r[v..].fill(100.0));
        let reference: Vec<f64> = logits.chunks(ld).map(|r| crate::sampling::argmax(&r[..v]) as f64).collect();
        let copies = rotation_copies(gpu, (4 * b * ld) as u64);
        Ok(Box::new(ArgmaxProblem {
            d,
            logits: Rotated::upload(gpu, &logits, copies)?,
            ids: Rotated::outputs(gpu, b, copies)?,
            reference,
            copies,
            prepared: Current::default(),
        }))
    }
}

struct ArgmaxProblem {
    d: ArgmaxDims,
    logits: Rotated<f32>,
    ids: Rotated<i32>,
    reference: Vec<f64>,
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for ArgmaxProblem {
    fn workload(&self) -> Workload {
        let (b, v) = (self.d.b as u64, self.d.v as u64);
        Workload { bytes: 4 * b * v + 4 * b, flops: b * v, bound: Bound::Memory }
    }
    common::problem_plumbing!(ids);
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        p.enqueue(stream, self.ids.get_mut(copy), self.logits.get(copy))
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        // Poisoned (unwritten) ids read back as -1: never a match.
        let ids: Vec<f32> = gpu.download(self.ids.get(copy))?.into_iter().map(|i| i as f32).collect();
        Ok(Verification::new(v.tolerance()).add("ids", &ids, &self.reference))
    }
}
