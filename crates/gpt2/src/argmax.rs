//! Greedy sampling on the device, a small ladder: `ids[b] = argmax(logits[b, ..V])`, the lowest index
//! among equal maxima (the host sampler's rule). A greedy decode step then downloads B ints instead
//! of B·V floats.
//!
//! Shape keys: `B`, `V`.

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, Gpu, Launch, LaunchShape, Limit, Op, OpInfo, Precision, Prepared as Current,
    PreparedStage, Problem, ResourceUse, Result, Shape, Variant, Workload,
};

use crate::{FAMILY, SOURCES};

const OP: &str = "argmax";
const THREADS: u32 = 256;
const ELEMS: &str = "B * V < 2^31";
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

pub fn check_shape(v: &Variant, b: usize, n: usize) -> Result<()> {
    require(b >= 1 && n >= 1, "B, V >= 1", || format!("B = {b}, V = {n}"))?;
    require(b.checked_mul(n).is_some_and(|x| x < 1 << 31), ELEMS, || format!("B = {b}, V = {n}"))?;
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
    b: usize,
    v: usize,
}

pub fn prepare(gpu: &Gpu, variant: &Variant, b: usize, v: usize) -> Result<Prepared> {
    check_shape(variant, b, v)?;
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
    Ok(Prepared { launch: gpu.prepare_launch(&SOURCES, variant, "argmax_rows", shape)?, workspace, b, v })
}

impl Prepared {
    pub fn enqueue(&self, stream: &CudaStream, ids: &mut CudaSlice<i32>, logits: &CudaSlice<f32>) -> Result<()> {
        require_len("ids", ids.len(), self.b)?;
        require_len("logits", logits.len(), self.b * self.v)?;
        let (b, v) = (Arg::int(self.b), Arg::int(self.v));
        // SAFETY: each entry's arguments follow its signature; it reads B·V logits and writes B ids
        // (lengths checked); the workspace was sized for B rows of ARGMAX_SPLITS pieces at prepare.
        unsafe {
            match &self.workspace {
                None => self.launch.enqueue(stream, &[Arg::buf(ids), Arg::buf(logits), b, v]),
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
                    ],
                ),
            }
        }
    }
}

impl PreparedStage for Prepared {
    fn resources(&self) -> Vec<ResourceUse> {
        vec![self.launch.resources().clone()]
    }
}

fn shape(b: i64, v: i64) -> Shape {
    Shape::new(&[("B", b), ("V", v)])
}

fn dims(s: &Shape) -> Result<(usize, usize)> {
    Ok((s.dim("B", i32::MAX as i64)?, s.dim("V", i32::MAX as i64)?))
}

static INFO: OpInfo = OpInfo {
    family: FAMILY,
    name: OP,
    description: "greedy sampling: ids[b] = argmax over V of logits[b, :] (lowest index among equals)",
    sources: &SOURCES,
    shape_keys: &["B", "V"],
    stages,
};

pub struct Argmax;

impl Op for Argmax {
    fn info(&self) -> &'static OpInfo {
        &INFO
    }
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2's vocabulary at the decode batch sizes of the model table.
        vec![shape(1, 50257), shape(8, 50257), shape(32, 50257)]
    }
    fn validate(&self, variant: &Variant, s: &Shape) -> Result<()> {
        let (b, v) = dims(s)?;
        check_shape(variant, b, v)
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        let mut l = vec![Limit { constraint: ELEMS, past: shape(1 << 16, 1 << 15), inside: Some(shape(3, 1001)) }];
        if v.plan::<Plan>().is_ok_and(|p| p == Plan::SplitRow) {
            l.push(Limit { constraint: GRID_Y, past: shape(65536, 2), inside: Some(shape(65535, 2)) });
        }
        l
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let (b, v) = dims(s)?;
        require(b >= 1 && v >= 1, "B, V >= 1", || format!("B = {b}, V = {v}"))?;
        require(b.checked_mul(v).is_some_and(|x| x < 1 << 31), ELEMS, || format!("B = {b}, V = {v}"))?;
        let logits = uniform(b * v, -8.0, 8.0, seed);
        let reference: Vec<f64> = logits.chunks(v).map(|r| crate::generate::argmax(r) as f64).collect();
        let copies = rotation_copies(gpu, (4 * b * v) as u64);
        Ok(Box::new(ArgmaxProblem {
            b,
            v,
            logits: Rotated::upload(gpu, &logits, copies)?,
            ids: Rotated::outputs(gpu, b, copies)?,
            reference,
            copies,
            prepared: Current::default(),
        }))
    }
}

struct ArgmaxProblem {
    b: usize,
    v: usize,
    logits: Rotated<f32>,
    ids: Rotated<i32>,
    reference: Vec<f64>,
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for ArgmaxProblem {
    fn workload(&self) -> Workload {
        let (b, v) = (self.b as u64, self.v as u64);
        Workload { bytes: 4 * b * v + 4 * b, flops: b * v, bound: Bound::Memory }
    }
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.ids.poison(gpu)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        Ok(self.prepared.set(v, prepare(gpu, v, self.b, self.v)?))
    }
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
