//! The lab's instruments behind `ladder sweep`, `ladder run --counters` and `ladder profile`: the
//! CLI glue over `kernel_ladder::sweep`, `common::tuned` and `common::counters`.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use common::ceilings::Ceilings;
use common::counters::{self, Counters};
use common::runner::{first_line, run_variants, Progress, RunOptions, Status, Table};
use common::{Error, Generator, Gpu, Grid, Op, Result, Shape, Sweep, Variant};
use indicatif::{ProgressBar, ProgressStyle};
use kernel_ladder::sweep::SweepSummary;

/// What `ladder sweep` was asked for.
pub struct SweepRequest {
    pub ops: Vec<&'static dyn Op>,
    pub stage: Option<u32>,
    /// `--define` axes; empty: each stage's declared sweep space.
    pub defines: Vec<Sweep>,
    pub shape: Option<Shape>,
    pub all_shapes: bool,
    pub opts: RunOptions,
    pub out: Option<PathBuf>,
    pub save_best: bool,
}

/// One stage's sweep to run: the stage, its grid's points and the shapes.
pub struct Job {
    op: &'static dyn Op,
    base: Variant,
    axes: Vec<String>,
    points: Vec<Variant>,
    shapes: Vec<Shape>,
}

/// The sweeps `req` asks for, checked without a device: unknown tunables, stages without a sweep
/// space and bad shape keys are errors here.
pub fn jobs(req: &SweepRequest) -> Result<Vec<Job>> {
    let mut jobs = Vec::new();
    let mut tunables = Vec::new();
    for &op in &req.ops {
        let shapes = match &req.shape {
            Some(o) => vec![op.default_shapes()[0].overlay(o, op.shape_keys())?],
            None if req.all_shapes => op.default_shapes(),
            None => vec![op.default_shapes()[0].clone()],
        };
        for base in op.variants().into_iter().filter(|v| req.stage.is_none_or(|s| v.stage == s)) {
            tunables.extend(base.tunables.iter().map(|t| format!("{}:{}", base.id(), t.name)));
            let grid = if req.defines.is_empty() { Grid::declared(&base) } else { Grid { axes: req.defines.clone() } };
            let mut points = grid.derive(&base);
            if points.is_empty() {
                continue;
            }
            // The declared configuration is always a point, so the table can mark it.
            if !points.iter().any(|p| p.config() == base.config()) {
                points.insert(0, base.clone());
            }
            let axes = grid.axes.iter().map(|a| a.tunable.clone()).collect();
            jobs.push(Job { op, base, axes, points, shapes: shapes.clone() });
        }
    }
    if jobs.is_empty() {
        let what = if req.defines.is_empty() {
            "a selected stage that declares a sweep space (or --define NAME=v1,v2 on one of its tunables)"
        } else {
            "a selected stage that declares every --define'd tunable"
        };
        let known = if tunables.is_empty() { "no stage has tunables".to_string() } else { tunables.join(", ") };
        return Err(Error::constraint(what, format!("none; tunables: {known}")));
    }
    Ok(jobs)
}

/// Runs every sweep of `req`, prints each sorted table, writes `--out` files and saves the best
/// configurations. Returns the number of failed points (a verification failure is never `n/a`).
pub fn sweep(gpu: &Gpu, req: &SweepRequest, jobs: &[Job]) -> Result<usize> {
    let ceilings = Ceilings::get(gpu)?;
    let total: usize = jobs.iter().map(|j| j.points.len() * j.shapes.len()).sum();
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} points, ETA {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut failed = 0;
    for job in jobs {
        for shape in &job.shapes {
            if let Err(e) = job.op.validate(&job.base, shape).and_then(|_| gpu.supports(&job.base)) {
                bar.inc(job.points.len() as u64);
                bar.suspend(|| println!("sweep {} at {shape}: n/a ({})\n", job.base.id(), first_line(&e)));
                continue;
            }
            let mut progress = |event: Progress| match event {
                Progress::Inputs { shape } => bar.set_message(format!("{} {shape}: inputs", job.base.id())),
                Progress::Stage { variant, .. } => bar.set_message(variant.name.to_string()),
                Progress::StageDone => bar.inc(1),
            };
            let table = run_variants(gpu, &ceilings, job.op, shape, &job.points, &req.opts, &mut progress)?;
            failed += table.rows.iter().filter(|r| matches!(r.status, Status::Failed(_))).count();
            let summary = SweepSummary::new(&table, &job.base, &job.axes);
            bar.suspend(|| {
                let mut out = std::io::stdout();
                let _ = writeln!(out, "{}", summary.text());
            });
            if let Some(dir) = &req.out {
                write_sweep(dir, &summary, &table)?;
            }
            if req.save_best {
                if let Some(best) = summary.tuned() {
                    let path = common::tuned::save(&common::tuned::dir()?, &gpu.info().uuid, best)?;
                    bar.suspend(|| eprintln!("saved the best configuration in {}", path.display()));
                }
            }
        }
    }
    bar.finish_and_clear();
    Ok(failed)
}

fn write_sweep(dir: &Path, summary: &SweepSummary, table: &Table) -> Result<()> {
    let io = |source| Error::Io { context: format!("writing into {}", dir.display()), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    let stem = format!(
        "sweep-{}-{:02}-{}-{}",
        kernel_ladder::baseline::table_stem(table),
        summary.stage,
        summary.name,
        summary.axes.join("-")
    );
    let json = serde_json::json!({ "summary": summary, "table": table });
    std::fs::write(dir.join(format!("{stem}.json")), serde_json::to_vec_pretty(&json).unwrap_or_default())
        .map_err(io)?;
    std::fs::write(dir.join(format!("{stem}.md")), summary.markdown()).map_err(io)?;
    if let Some(svg) = kernel_ladder::chart::sweep_svg(summary)? {
        std::fs::write(dir.join(format!("{stem}.svg")), svg).map_err(io)?;
    }
    Ok(())
}

/// Adds Nsight Compute's counters to every passed row of `table`, each stage run once in a child
/// `ladder verify --profiled` under ncu. A row whose profile fails keeps no counters and the reason
/// is returned beside its name.
pub fn add_counters(table: &mut Table, bar: &ProgressBar) -> Result<Vec<(String, String)>> {
    let exe = ladder_exe()?;
    counters::ncu()?;
    let mut problems = Vec::new();
    for row in table.rows.iter_mut().filter(|r| r.status == Status::Passed) {
        bar.set_message(format!(
            "{}/{} {}: counters of {:02} {}",
            table.family, table.op, table.shape, row.stage, row.name
        ));
        let args = counters::verify_args(&table.family, &table.op, &table.shape, &row.name, &row.config);
        match counters::collect(&exe, &args) {
            Ok(c) => row.counters = Some(c),
            Err(e) => problems.push((row.name.clone(), first_line(&e))),
        }
    }
    Ok(problems)
}

/// The counters block printed under a table: one line per row that has them.
pub fn counters_block(table: &Table) -> String {
    let lines: Vec<String> = table
        .rows
        .iter()
        .filter_map(|r| r.counters.as_ref().map(|c: &Counters| format!("  {:02} {:<24} {}", r.stage, r.name, c.line())))
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    format!(
        "counters (Nsight Compute, one launch per stage; DRAM and SM as % of peak, tensor pipe % of active cycles, \
         achieved occupancy, L2 throughput % of peak (and hit rate), top two stalls in warps per issued instruction):\n{}\n",
        lines.join("\n")
    )
}

/// `ladder profile`: the full Nsight Compute report of one stage at one shape.
pub fn profile(op: &dyn Op, variant: &Variant, shape: &Shape, report: &Path) -> Result<()> {
    let exe = ladder_exe()?;
    let args = counters::verify_args(op.family(), op.name(), &shape.to_string(), &variant.name, &variant.config());
    counters::profile(&exe, &args, report)
}

/// This `ladder` executable, which the profiled children run.
fn ladder_exe() -> Result<PathBuf> {
    std::env::current_exe().map_err(|source| Error::Io { context: "finding ladder's path".into(), source })
}
