//! The ablation runner: for one op and shape, verify every stage against the CPU reference on the
//! same inputs, time the ones that pass, check the output again after timing, and build the rows of
//! the table.

use serde::{Deserialize, Serialize};

use crate::ceilings::Ceilings;
use crate::check::Verification;
use crate::error::{Error, Result};
use crate::family::{Bound, Op, Problem, Workload};
use crate::gpu::Gpu;
use crate::launch::ResourceUse;
use crate::shape::Shape;
use crate::timing::{self, Samples, Timing, TimingConfig};
use crate::variant::{Precision, Variant};

#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Inclusive stage-number range; all stages when `None`.
    pub stages: Option<(u32, u32)>,
    pub leave_one_out: bool,
    /// Extra rows: each selected stage that declares the sweep's tunable, at each of its values.
    pub sweeps: Vec<crate::variant::Sweep>,
    pub timing: TimingConfig,
    /// Input seed; a fresh one when `None`.
    pub seed: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Status {
    Passed,
    /// Verification failed (before or after timing), or the launch failed: never timed as fine.
    Failed(String),
    /// The stage does not apply here (a shape constraint, a device requirement).
    Skipped(String),
}

/// The resources of a stage's kernels at their launch configurations; with several kernels, the
/// heaviest value of each column.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Resources {
    pub kernels: usize,
    pub registers: u32,
    pub shared_bytes: u32,
    pub local_bytes: u32,
    pub blocks_per_sm: u32,
    pub occupancy: f64,
}

impl Resources {
    pub fn summarize(uses: &[ResourceUse]) -> Option<Resources> {
        if uses.is_empty() {
            return None;
        }
        Some(Resources {
            kernels: uses.len(),
            registers: uses.iter().map(|u| u.registers).max().unwrap_or(0),
            shared_bytes: uses.iter().map(|u| u.static_shared_bytes + u.dynamic_shared_bytes).max().unwrap_or(0),
            local_bytes: uses.iter().map(|u| u.local_bytes).max().unwrap_or(0),
            blocks_per_sm: uses.iter().map(|u| u.blocks_per_sm).min().unwrap_or(0),
            occupancy: uses.iter().map(|u| u.occupancy).fold(f64::INFINITY, f64::min),
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub stage: u32,
    pub name: String,
    pub summary: String,
    pub precision: Precision,
    /// For a derived row: the row its `x prev` is measured against.
    #[serde(default)]
    pub compared_with: Option<String>,
    pub status: Status,
    pub timing: Option<Timing>,
    pub gbps: Option<f64>,
    pub tflops: Option<f64>,
    /// Fraction (0..1) of the ceiling that bounds the op.
    pub of_ceiling: Option<f64>,
    pub vs_stage0: Option<f64>,
    pub vs_previous: Option<f64>,
    pub resources: Option<Resources>,
    pub verification: Option<Verification>,
    /// The stage's tunables as run (a sweep point's configuration).
    #[serde(default)]
    pub config: Vec<(String, u32)>,
    /// Nsight Compute's counters of the stage's kernels (`ladder run --counters`).
    #[serde(default)]
    pub counters: Option<crate::counters::Counters>,
}

impl Row {
    /// A stage's row before anything but its status and timing is known: no summary, nothing
    /// compared, measured or derived; the table fills in the derived columns.
    fn new(stage: u32, name: impl Into<String>, precision: Precision, status: Status, timing: Option<Timing>) -> Row {
        Row {
            stage,
            name: name.into(),
            summary: String::new(),
            precision,
            compared_with: None,
            status,
            timing,
            gbps: None,
            tflops: None,
            of_ceiling: None,
            vs_stage0: None,
            vs_previous: None,
            resources: None,
            verification: None,
            config: Vec::new(),
            counters: None,
        }
    }

    /// A row for the report modules' unit tests (here and in the CLI's instruments): stage, name,
    /// status and timing; fp32.
    #[doc(hidden)]
    pub fn for_tests(stage: u32, name: impl Into<String>, status: Status, timing: Option<Timing>) -> Row {
        Row::new(stage, name, Precision::Fp32, status, timing)
    }
}

/// An outside measurement of the same op and shape (PyTorch, from `scripts/anchors.py`).
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Anchor {
    pub family: String,
    pub op: String,
    pub shape: String,
    pub name: String,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

fn one_run() -> usize {
    1
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Table {
    pub family: String,
    pub op: String,
    pub shape: String,
    pub device: String,
    pub seed: u64,
    /// Timed as CUDA-graph replays (absent in tables saved before graph timing: false).
    #[serde(default)]
    pub graph: bool,
    /// Runs per timed sample (`TimingConfig::batch`; absent in tables saved before: 1).
    #[serde(default = "one_run")]
    pub batch: usize,
    /// Rounds the stages were timed in (`TimingConfig::rounds`; absent in tables saved before: 1).
    #[serde(default = "one_run")]
    pub rounds: usize,
    pub workload: Workload,
    pub ceilings: Ceilings,
    pub rows: Vec<Row>,
    pub anchors: Vec<Anchor>,
}

impl Table {
    /// The fastest passing stage.
    pub fn best(&self) -> Option<&Row> {
        self.rows
            .iter()
            .filter(|r| r.status == Status::Passed)
            .min_by(|a, b| a.timing.unwrap().median_ms.partial_cmp(&b.timing.unwrap().median_ms).unwrap())
    }

    pub fn rates(&self, ms: f64) -> (f64, f64, f64) {
        let s = ms * 1e-3;
        let gbps = self.workload.bytes as f64 / s / 1e9;
        let tflops = self.workload.flops as f64 / s / 1e12;
        (gbps, tflops, self.ceilings.fraction(self.workload.bound, gbps, tflops))
    }
}

/// The op's stages selected by `opts` (and the leave-one-out variants if asked).
pub fn select_variants(op: &dyn Op, opts: &RunOptions) -> Result<Vec<Variant>> {
    // Derived variants keep the stage number of the stage they come from, so a stage range selects
    // them together with it.
    let in_range = |v: &Variant| opts.stages.is_none_or(|(lo, hi)| v.stage >= lo && v.stage <= hi);
    let mut variants: Vec<Variant> = op.variants().into_iter().filter(in_range).collect();
    if variants.is_empty() {
        let known: Vec<String> = op.variants().iter().map(|v| format!("{}:{}", v.stage, v.name)).collect();
        let (lo, hi) = opts.stages.unwrap_or_default();
        return Err(Error::Unknown { what: "stage range", name: format!("{lo}..{hi}"), known: known.join(", ") });
    }
    if opts.leave_one_out {
        variants.extend(op.leave_one_out().into_iter().filter(in_range));
    }
    let mut points = Vec::new();
    for sweep in &opts.sweeps {
        let rows: Vec<Variant> = variants.iter().flat_map(|v| crate::variant::Generator::derive(sweep, v)).collect();
        if rows.is_empty() {
            // Each name once, in the order the stages declare them.
            let mut known: Vec<String> = Vec::new();
            for name in variants.iter().flat_map(|v| v.tunables.iter().map(|t| t.name.to_string())) {
                if !known.contains(&name) {
                    known.push(name);
                }
            }
            return Err(Error::Unknown { what: "tunable", name: sweep.tunable.clone(), known: known.join(", ") });
        }
        points.extend(rows);
    }
    variants.extend(points);
    Ok(variants)
}

/// Poisons every output, enqueues the prepared stage once on copy 0 and checks it.
pub fn verify_once(gpu: &Gpu, problem: &mut dyn Problem) -> Result<Verification> {
    verify_timed(gpu, problem).map(|(verification, _)| verification)
}

/// [`verify_once`] with the run's device time (ms), between a pair of events around its enqueue.
pub fn verify_timed(gpu: &Gpu, problem: &mut dyn Problem) -> Result<(Verification, f64)> {
    problem.poison(gpu)?;
    let ms = timing::time_once(gpu, |stream| problem.enqueue(stream, 0))?;
    gpu.synchronize()?;
    Ok((problem.verify(gpu, 0)?, ms))
}

/// [`verify_once`] with only the stage's launch inside the profiler range (`ladder verify
/// --profiled`, what `--counters` and `ladder profile` run under Nsight Compute).
pub fn verify_profiled(gpu: &Gpu, problem: &mut dyn Problem) -> Result<Verification> {
    problem.poison(gpu)?;
    gpu.profiled(|| problem.enqueue(gpu.stream(), 0))?;
    problem.verify(gpu, 0)
}

/// What the runner is doing, for a progress display.
#[derive(Clone, Copy, Debug)]
pub enum Progress<'a> {
    /// Drawing the inputs and computing the CPU reference of a shape.
    Inputs { shape: &'a Shape },
    /// Verifying and timing one stage.
    Stage { shape: &'a Shape, variant: &'a Variant },
    /// A stage's row is complete.
    StageDone,
}

/// Runs the ablation for `op` at `shape`. `progress` is told what is being worked on.
pub fn run_op(
    gpu: &Gpu,
    ceilings: &Ceilings,
    op: &dyn Op,
    shape: &Shape,
    opts: &RunOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Table> {
    let variants = select_variants(op, opts)?;
    run_variants(gpu, ceilings, op, shape, &variants, opts, progress)
}

/// Verifies and times `variants` of `op` at `shape`, one row each, on one set of inputs.
pub fn run_variants(
    gpu: &Gpu,
    ceilings: &Ceilings,
    op: &dyn Op,
    shape: &Shape,
    variants: &[Variant],
    opts: &RunOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Table> {
    let seed = opts.seed.unwrap_or_else(crate::data::fresh_seed);
    progress(Progress::Inputs { shape });
    let mut problem = op.problem(gpu, shape, seed)?;
    let workload = problem.workload();
    // The modules of every stage that takes this shape compiled at once, not one stage at a time (a
    // no-op for the modules a caller has loaded already, as `ladder run` does per family).
    crate::family::preload(gpu, op, std::slice::from_ref(shape), variants);
    let outcomes = if opts.timing.rounds > 1 {
        run_in_rounds(gpu, op, problem.as_mut(), variants, shape, &opts.timing, progress)
    } else {
        variants
            .iter()
            .map(|v| {
                progress(Progress::Stage { shape, variant: v });
                let outcome = run_variant(gpu, op, problem.as_mut(), v, shape, &opts.timing);
                progress(Progress::StageDone);
                outcome
            })
            .collect()
    };
    let mut rows = Vec::new();
    for (v, (status, timing, resources, verification)) in variants.iter().zip(outcomes) {
        rows.push(Row {
            summary: v.summary.to_string(),
            compared_with: v.compared_with.clone(),
            resources,
            verification,
            config: v.config(),
            ..Row::new(v.stage, v.name.to_string(), v.precision, status, timing)
        });
    }
    let mut table = Table {
        family: op.family().into(),
        op: op.name().into(),
        shape: shape.to_string(),
        device: gpu.info().name.clone(),
        seed,
        graph: opts.timing.graph,
        batch: opts.timing.batch.max(1),
        rounds: opts.timing.rounds.max(1),
        workload,
        ceilings: ceilings.clone(),
        rows,
        anchors: Vec::new(),
    };
    fill_rates(&mut table);
    Ok(table)
}

type VariantOutcome = (Status, Option<Timing>, Option<Resources>, Option<Verification>);

/// A stage prepared and past its first check: what its row keeps while it is timed, and the checked
/// run's device time (a long stage's first sample, [`timing::sample_after_check`]).
struct Checked {
    resources: Option<Resources>,
    verification: Verification,
    checked_ms: f64,
}

impl Checked {
    /// The row of a checked stage whose timing did not complete.
    fn untimed(self, status: Status) -> VariantOutcome {
        (status, None, self.resources, Some(self.verification))
    }
}

/// What the first check of a stage leaves: a stage to time, or its row's outcome already.
enum Check {
    Ready(Checked),
    Finished(VariantOutcome),
}

fn run_variant(
    gpu: &Gpu,
    op: &dyn Op,
    problem: &mut dyn Problem,
    v: &Variant,
    shape: &Shape,
    cfg: &TimingConfig,
) -> VariantOutcome {
    let checked = match check_stage(gpu, op, problem, v, shape) {
        Check::Ready(checked) => checked,
        Check::Finished(outcome) => return outcome,
    };
    match sample_stage(gpu, problem, cfg, Some(checked.checked_ms)) {
        Ok(samples) => recheck(gpu, problem, Timing::of(samples), checked),
        Err(status) => checked.untimed(status),
    }
}

/// `--rounds`: every stage is checked first; then each round times every checked stage in turn
/// (prepared again, the round's share of the budget), so that a drift of the clock over the run
/// reaches all of them alike; each stage's samples are pooled, and the copy its last round wrote
/// is checked again right after that round.
fn run_in_rounds(
    gpu: &Gpu,
    op: &dyn Op,
    problem: &mut dyn Problem,
    variants: &[Variant],
    shape: &Shape,
    cfg: &TimingConfig,
    progress: &mut dyn FnMut(Progress),
) -> Vec<VariantOutcome> {
    let mut done: Vec<Option<VariantOutcome>> = Vec::new();
    let mut pending: Vec<Option<(Checked, Vec<f64>)>> = Vec::new();
    for v in variants {
        progress(Progress::Stage { shape, variant: v });
        match check_stage(gpu, op, problem, v, shape) {
            Check::Ready(checked) => {
                done.push(None);
                pending.push(Some((checked, Vec::new())));
            }
            Check::Finished(outcome) => {
                done.push(Some(outcome));
                pending.push(None);
                progress(Progress::StageDone);
            }
        }
    }
    let (round, rounds) = (cfg.round(), cfg.rounds.max(1));
    for r in 0..rounds {
        for (i, v) in variants.iter().enumerate() {
            let Some((_, pooled)) = pending[i].as_mut() else { continue };
            progress(Progress::Stage { shape, variant: v });
            // Prepared again, and every output poisoned again: what the check after the last round
            // reads is this stage's, never a result the stage before it left.
            let sampled = problem
                .prepare(gpu, v)
                .and_then(|_| problem.poison(gpu))
                .map_err(|e| Status::Failed(format!("round {}: {}", r + 1, first_line(&e))))
                .and_then(|_| sample_stage(gpu, problem, &round, None));
            match sampled {
                Ok(samples) => {
                    pooled.extend(samples.ms);
                    if r + 1 < rounds {
                        continue;
                    }
                    let (checked, ms) = pending[i].take().expect("a pending stage");
                    let timing = Timing::of(Samples { ms, last_copy: samples.last_copy });
                    done[i] = Some(recheck(gpu, problem, timing, checked));
                }
                Err(status) => {
                    let (checked, _) = pending[i].take().expect("a pending stage");
                    done[i] = Some(checked.untimed(status));
                }
            }
            progress(Progress::StageDone);
        }
    }
    done.into_iter().map(|d| d.expect("every stage is done after the last round")).collect()
}

/// Prepares `v` and checks it once on poisoned outputs; a stage that does not apply, cannot be
/// prepared or fails the check is its row's outcome already.
fn check_stage(gpu: &Gpu, op: &dyn Op, problem: &mut dyn Problem, v: &Variant, shape: &Shape) -> Check {
    if let Err(e) = gpu.supports(v).and_then(|_| op.validate(v, shape)) {
        return Check::Finished((Status::Skipped(first_line(&e)), None, None, None));
    }
    let resources = match problem.prepare(gpu, v) {
        Ok(uses) => Resources::summarize(&uses),
        Err(e) if e.is_not_applicable() => return Check::Finished((Status::Skipped(first_line(&e)), None, None, None)),
        Err(e) => {
            let status = match point_refusal(v, &e) {
                Some(why) => Status::Skipped(why),
                None => Status::Failed(format!("prepare: {}", first_line(&e))),
            };
            return Check::Finished((status, None, None, None));
        }
    };
    match verify_timed(gpu, problem) {
        Err(e) => Check::Finished((Status::Failed(first_line(&e)), None, resources, None)),
        Ok((ver, _)) if !ver.passed() => Check::Finished((Status::Failed(ver.summary()), None, resources, Some(ver))),
        Ok((verification, checked_ms)) => Check::Ready(Checked { resources, verification, checked_ms }),
    }
}

/// Times the prepared stage under `cfg`, right after its check's run of `checked_ms` where given; a
/// stage that cannot be captured as a graph is `n/a`.
fn sample_stage(
    gpu: &Gpu,
    problem: &mut dyn Problem,
    cfg: &TimingConfig,
    checked_ms: Option<f64>,
) -> std::result::Result<Samples, Status> {
    let copies = problem.copies();
    timing::sample_after_check(gpu, copies, cfg, checked_ms, |stream, c| problem.enqueue(stream, c)).map_err(
        |e| match e {
            Error::Capture(why) => Status::Skipped(format!("cannot be captured as a graph: {why}")),
            e => Status::Failed(format!("during timing: {}", first_line(&e))),
        },
    )
}

/// Checks again what the timed runs left in the copy written last: a kernel that races, or only
/// works once, fails here.
fn recheck(gpu: &Gpu, problem: &mut dyn Problem, timing: Timing, checked: Checked) -> VariantOutcome {
    let Checked { resources, verification, .. } = checked;
    match problem.verify(gpu, timing.last_copy) {
        Err(e) => {
            (Status::Failed(format!("after timing: {}", first_line(&e))), Some(timing), resources, Some(verification))
        }
        Ok(after) if !after.passed() => {
            (Status::Failed(format!("after timing: {}", after.summary())), Some(timing), resources, Some(after))
        }
        Ok(_) => (Status::Passed, Some(timing), resources, Some(verification)),
    }
}

/// Why a sweep point does not exist, when `e` (from preparing `v`) says so: a configuration the
/// device cannot launch (registers, shared memory, block size) or the kernel refuses at compile time
/// (its static checks) is `n/a` for a sweep point, never a failure of the stage. `None` otherwise.
pub fn point_refusal(v: &Variant, e: &Error) -> Option<String> {
    if !v.sweep_point {
        return None;
    }
    let why = match e {
        Error::Compile { log, .. } => log.lines().find(|l| l.contains("error")).unwrap_or_default().trim().to_string(),
        Error::Launch { .. } => first_line(e),
        _ => return None,
    };
    Some(format!("n/a at this configuration: {why}"))
}

/// The first line of an error's message (NVRTC logs and driver errors run long).
pub fn first_line(e: &Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// GB/s, TFLOP/s, fraction of the ceiling and the two speedup columns. A derived row's `x prev` is
/// measured against the row it names (`compared_with`); a declared stage's against the previous
/// passing declared stage.
pub fn fill_rates(table: &mut Table) {
    let passed = |r: &Row| r.timing.filter(|_| r.status == Status::Passed);
    let stage0 = table.rows.iter().find(|r| r.stage == 0 && r.compared_with.is_none()).and_then(passed);
    let mut previous: Option<Timing> = None;
    for i in 0..table.rows.len() {
        let reference = match &table.rows[i].compared_with {
            Some(name) => table.rows.iter().find(|r| &r.name == name && r.compared_with.is_none()).and_then(passed),
            None => previous,
        };
        let Some(t) = passed(&table.rows[i]) else { continue };
        let (gbps, tflops, _) = table.rates(t.median_ms);
        // A compute-bound row is read against the GEMM rate of its own precision.
        let bound = match table.workload.bound {
            Bound::Compute(_) => Bound::Compute(table.rows[i].precision),
            b => b,
        };
        let frac = table.ceilings.fraction(bound, gbps, tflops);
        let row = &mut table.rows[i];
        row.gbps = Some(gbps);
        row.tflops = Some(tflops);
        row.of_ceiling = Some(frac);
        row.vs_stage0 = stage0.map(|s| s.median_ms / t.median_ms);
        row.vs_previous = reference.map(|p| p.median_ms / t.median_ms);
        if row.compared_with.is_none() {
            previous = Some(t);
        }
    }
}
