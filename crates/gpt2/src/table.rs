//! The model-level ablation (`ladder run gpt2 --op model`): for every named plan, the prefill of
//! B = 4 sequences of the whole context, and decode tokens per second at batch 1, 8 and 32 near the
//! end of a 1024-token context with the KV cache (eager, CUDA graph, and graph with greedy sampling
//! on the device) and without it (the prefix recomputed for every token); "leave one op out" rows (the `fastest` plan with one op back at its
//! stage 0); and where one decode step's time goes, op by op.
//!
//! Decode steps are timed on the host clock around the whole step as generation runs it (inputs
//! written, kernels or graph launched, the logits downloaded), so tok/s is what a caller gets. The
//! prefill is timed with CUDA events. Decode caches are synthetic (lengths set, contents zero: no
//! stage's time depends on the values); correctness is `ladder gpt2 check`'s and the tests' job.

use std::collections::BTreeMap;

use serde::Serialize;

use common::report::fmt_time;
use common::runner::Anchor;
use common::timing::{self, Timing, TimingConfig};
use common::{Gpu, Result};

use crate::config::Config;
use crate::fastest::{Selection, DECODE_BATCHES, PREFILL_B};
use crate::model::{Logits, Model};
use crate::plan::{Plan, PLAN_NAMES, PLAN_OPS};
use crate::weights::Weights;

#[derive(Clone, Debug)]
pub struct TableOptions {
    /// Plan specs (`NAME[:op=stage,...]`), in row order.
    pub plans: Vec<String>,
    /// Add the leave-one-op-out rows of the first `fastest*` plan (or `fastest`).
    pub leave_one_out: bool,
    /// Fewer decode steps and repetitions (a smoke run).
    pub quick: bool,
    /// A no-cache token predicted (from the plan's prefill) to take longer than this is not run.
    pub no_cache_limit_ms: f64,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            plans: PLAN_NAMES.iter().map(|s| s.to_string()).collect(),
            leave_one_out: true,
            quick: false,
            no_cache_limit_ms: 3000.0,
        }
    }
}

/// One measurement, or why there is none.
#[derive(Clone, Debug, Serialize)]
pub enum Cell {
    Timed(Timing),
    Skipped(String),
    Failed(String),
}

impl Cell {
    fn from(r: Result<Timing>) -> Cell {
        r.map_or_else(|e| Cell::Failed(e.to_string().lines().next().unwrap_or_default().to_string()), Cell::Timed)
    }

    pub fn ms(&self) -> Option<f64> {
        match self {
            Cell::Timed(t) => Some(t.median_ms),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct PlanRow {
    pub plan: String,
    /// `op=stage` for every op of the plan.
    pub stages: String,
    /// B = 4 sequences of the context, one forward pass, every position's logits.
    pub prefill: Cell,
    /// The same with only each sequence's last position's logits (what generation computes).
    pub prefill_last: Cell,
    /// Per batch size of [`DECODE_BATCHES`]: one step's time (B tokens).
    pub decode_eager: Vec<Cell>,
    pub decode_graph: Vec<Cell>,
    /// Graph-replayed greedy steps: the plan's argmax on the device, B ids downloaded.
    pub decode_greedy: Vec<Cell>,
    /// The greedy loop on the device ([`Model::decode_greedy_on_device`]): graph-replayed steps back
    /// to back, each advancing its own inputs, the picks downloaded once; time per step.
    pub decode_loop: Vec<Cell>,
    /// Per batch size: one token per sequence with no cache (the forward pass over the prefix).
    pub no_cache: Vec<Cell>,
    /// Kernels in one captured decode step (at the largest batch).
    pub step_kernels: Option<usize>,
}

/// Where one decode step's device time goes (each op's time between events, the launches queued
/// behind a gate so host gaps are not counted).
#[derive(Clone, Debug, Serialize)]
pub struct Breakdown {
    pub plan: String,
    pub batch: usize,
    /// Median over steps of each op's device time summed over the layers, in first-seen order.
    pub ops: Vec<(String, f64)>,
    pub kernels: Option<usize>,
    /// The step on the host clock, replayed from a graph (inputs, replay, logits download).
    pub step_graph_ms: Option<f64>,
    /// The greedy step replayed from a graph with an event node after every op: `(op, start, end)`
    /// in ms from the step's start, in launch order ([`Model::decode_step_timeline`]).
    pub timeline: Vec<(String, f64, f64)>,
    /// That step's device time without the event nodes.
    pub timeline_plain_ms: f64,
}

impl Breakdown {
    /// The timeline's time per op summed over its launches, in `ops`' order (then any op only the
    /// greedy step runs).
    fn replayed_per_op(&self) -> Vec<(String, f64)> {
        let mut names: Vec<&str> = self.ops.iter().map(|(n, _)| n.as_str()).collect();
        for (n, _, _) in &self.timeline {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
        names
            .into_iter()
            .map(|n| (n.to_string(), self.timeline.iter().filter(|(o, _, _)| o == n).map(|(_, a, b)| b - a).sum()))
            .collect()
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelTable {
    pub device: String,
    pub config: String,
    pub context: usize,
    pub prefill_b: usize,
    pub batches: Vec<usize>,
    /// The cache length of the timed decode steps (they end at the context).
    pub decode_from: usize,
    pub copy_gbps: f64,
    /// Bytes of weights one decode step reads: fp32 (GEMM plans), bf16 (GEMV plans) and e4m3 (fp8
    /// plans: a byte a weight and a 4-byte scale per 128 x 128 block), the tied embedding counted once
    /// as the LM head.
    pub weight_bytes_fp32: u64,
    pub weight_bytes_bf16: u64,
    pub weight_bytes_fp8: u64,
    pub rows: Vec<PlanRow>,
    pub leave_one_out_base: Option<String>,
    pub leave_one_out: Vec<PlanRow>,
    pub breakdown: Vec<Breakdown>,
    pub selection: Option<Selection>,
    /// Outside timings from `scripts/anchors.py` (family gpt2, op model): Hugging Face at the same
    /// shapes; the caller fills them in.
    pub anchors: Vec<Anchor>,
}

/// Linear-layer parameters (what a decode step streams), plus the LM head.
fn weight_elements(cfg: &Config) -> u64 {
    let c = cfg.c as u64;
    cfg.layers as u64 * (12 * c * c + 13 * c) + cfg.vocab as u64 * c + 2 * c
}

/// Builds the table, telling `progress` what runs.
pub fn model_table(gpu: &Gpu, cfg: Config, opts: &TableOptions, progress: &mut dyn FnMut(&str)) -> Result<ModelTable> {
    let ceilings = common::ceilings::Ceilings::get(gpu)?;
    let weights = Weights::random(&cfg, 1);
    let steps = if opts.quick { 5 } else { 20 };
    let warm = 3;
    let decode_from = cfg.max_t - 1 - steps - warm;
    let resolve = |spec: &str, progress: &mut dyn FnMut(&str)| {
        crate::fastest::resolve(gpu, &cfg, spec, &mut |op| progress(&format!("choosing fastest: {op}")))
    };
    let mut rows = Vec::new();
    let mut breakdown = Vec::new();
    for spec in &opts.plans {
        let plan = resolve(spec, progress)?;
        progress(&format!("plan {}", plan.name));
        rows.push(plan_row(gpu, cfg, &weights, plan, opts, steps, decode_from, true, progress)?);
    }
    // The leave-one-out base: the last `fastest` plan asked for (`fastest-bf16` after `fastest`).
    let base_spec = opts.plans.iter().rev().find(|p| p.starts_with("fastest")).cloned().unwrap_or("fastest".into());
    let mut loo = Vec::new();
    if opts.leave_one_out {
        let base = resolve(&base_spec, progress)?;
        for (i, (op, stage)) in PLAN_OPS.iter().zip(base.stages()).enumerate() {
            // An op off or not run, or at its first stage already, has nothing to leave out; the GEMV goes off
            // (the step's linears on the plan's `linear`).
            let spec = match *op {
                _ if !base.runs(i) => continue,
                "gemv" => "gemv=off".to_string(),
                _ => match crate::fastest::first_runnable(&cfg, i)? {
                    first if first == stage => continue,
                    first => format!("{op}={first}"),
                },
            };
            let plan = base.clone().with_overrides(&spec)?;
            progress(&format!("leave one out: {}", plan.name));
            loo.push(plan_row(gpu, cfg, &weights, plan, opts, steps, decode_from, false, progress)?);
        }
        for b in DECODE_BATCHES {
            progress(&format!("breakdown of {} at batch {b}", base.name));
            breakdown.push(step_breakdown(gpu, cfg, &weights, base.clone(), b, steps, decode_from)?);
        }
    }
    let selection = if opts.plans.iter().chain([&base_spec]).any(|p| p.starts_with("fastest")) {
        Some(crate::fastest::selection(gpu, &cfg, false, &mut |_| {})?)
    } else {
        None
    };
    let n = weight_elements(&cfg);
    Ok(ModelTable {
        device: gpu.info().name.clone(),
        config: cfg.key(),
        context: cfg.max_t,
        prefill_b: PREFILL_B,
        batches: DECODE_BATCHES.to_vec(),
        decode_from,
        copy_gbps: ceilings.copy_gbps,
        weight_bytes_fp32: 4 * n,
        weight_bytes_bf16: 2 * n,
        weight_bytes_fp8: n + 4 * n.div_ceil(128 * 128),
        rows,
        leave_one_out_base: opts.leave_one_out.then_some(base_spec),
        leave_one_out: loo,
        breakdown,
        selection,
        anchors: Vec::new(),
    })
}

#[allow(clippy::too_many_arguments)]
fn plan_row(
    gpu: &Gpu,
    cfg: Config,
    weights: &Weights,
    plan: Plan,
    opts: &TableOptions,
    steps: usize,
    decode_from: usize,
    no_cache: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<PlanRow> {
    let stages = PLAN_OPS
        .iter()
        .zip(plan.stages())
        .map(|(op, s)| if s == u32::MAX { format!("{op}=off") } else { format!("{op}={s}") })
        .collect::<Vec<_>>()
        .join(",");
    let name = plan.name.clone();
    let mut model = Model::new(gpu, cfg, weights, plan)?;
    let prefill_cfg = TimingConfig {
        target_ms: if opts.quick { 50.0 } else { 500.0 },
        min_reps: 3,
        max_reps: 50,
        warmup_ms: 10.0,
        long_run_above_ms: 1000.0,
        long_run_reps: 1,
        ..TimingConfig::default()
    };
    progress(&format!("plan {name}: prefill"));
    let prefill = Cell::from(model.time_forward(gpu, PREFILL_B, cfg.max_t, Logits::All, &prefill_cfg));
    let prefill_last = Cell::from(model.time_forward(gpu, PREFILL_B, cfg.max_t, Logits::Last, &prefill_cfg));
    progress(&format!("plan {name}: prefill {prefill:?}, last logits only {prefill_last:?}"));
    let mut row = PlanRow {
        plan: name.clone(),
        stages,
        prefill,
        prefill_last,
        decode_eager: Vec::new(),
        decode_graph: Vec::new(),
        decode_greedy: Vec::new(),
        decode_loop: Vec::new(),
        no_cache: Vec::new(),
        step_kernels: None,
    };
    for (graph, greedy) in [(false, false), (true, false), (true, true)] {
        model.set_graph(graph);
        for &b in &DECODE_BATCHES {
            let mode = match (graph, greedy) {
                (false, _) => "eager",
                (true, false) => "graph",
                (true, true) => "graph, argmax on the device",
            };
            let cell = Cell::from(time_steps(gpu, &mut model, b, steps, decode_from, greedy));
            progress(&format!("plan {name}: decode at batch {b} ({mode}): {cell:?}"));
            match (graph, greedy) {
                (false, _) => &mut row.decode_eager,
                (true, false) => &mut row.decode_graph,
                (true, true) => &mut row.decode_greedy,
            }
            .push(cell);
        }
    }
    for &b in &DECODE_BATCHES {
        let cell = match model.has_device_loop()? {
            true => Cell::from(time_device_loop(gpu, &mut model, b, steps, decode_from)),
            false => Cell::Skipped("no greedy loop on the device: a megakernel step or a block-row argmax".into()),
        };
        progress(&format!("plan {name}: decode at batch {b} (graph, greedy loop on the device): {cell:?}"));
        row.decode_loop.push(cell);
    }
    row.step_kernels = model.decode_graph_kernels()?;
    for &b in &DECODE_BATCHES {
        let t = cfg.max_t - 1;
        let predicted = row.prefill.ms().map(|ms| ms * (b * t) as f64 / (PREFILL_B * cfg.max_t) as f64);
        let cell = match predicted {
            _ if !no_cache => Cell::Skipped("not run for leave-one-out rows".into()),
            None => Cell::Skipped("no prefill time to predict from".into()),
            Some(p) if p > opts.no_cache_limit_ms => {
                Cell::Skipped(format!("predicted {:.1} s a token from the prefill", p / 1e3))
            }
            Some(_) => {
                progress(&format!("plan {name}: no cache at batch {b}"));
                Cell::from(time_no_cache(gpu, &mut model, b, t, if opts.quick { 2 } else { 5 }))
            }
        };
        row.no_cache.push(cell);
    }
    Ok(row)
}

/// Host-clock times of `steps` decode steps at batch `b` from cache length `from` (after 3 warm-up
/// steps, which also capture the graph when it is on); `greedy` steps pick the tokens on the
/// device and download ids, the others download the logits.
fn time_steps(gpu: &Gpu, model: &mut Model, b: usize, steps: usize, from: usize, greedy: bool) -> Result<Timing> {
    let mut cache = model.timing_cache(gpu, b, from)?;
    let tokens: Vec<i32> = (0..b as i32).map(|i| (i * 7919) % 50000).collect();
    timing::time_host(3, steps, || {
        if greedy {
            model.decode_step_greedy(gpu, &mut cache, &tokens).map(drop)
        } else {
            model.decode_step(gpu, &mut cache, &tokens).map(drop)
        }
    })
}

/// Host-clock time per step of the greedy loop on the device at batch `b`: `steps` graph-replayed
/// steps from cache length `from` in one call (the first step's inputs written, the picks downloaded
/// at the end), five calls after one warm-up (which captures the graph), each from `from` again.
fn time_device_loop(gpu: &Gpu, model: &mut Model, b: usize, steps: usize, from: usize) -> Result<Timing> {
    let mut cache = model.timing_cache(gpu, b, from)?;
    let tokens: Vec<i32> = (0..b as i32).map(|i| (i * 7919) % 50000).collect();
    let per_call = timing::time_host(1, 5, || {
        cache.lens.iter_mut().for_each(|l| *l = from);
        model.decode_greedy_on_device(gpu, &mut cache, &tokens, steps).map(drop)
    })?;
    let per_step = |ms: f64| ms / steps as f64;
    Ok(Timing {
        median_ms: per_step(per_call.median_ms),
        min_ms: per_step(per_call.min_ms),
        max_ms: per_step(per_call.max_ms),
        ..per_call
    })
}

/// Host-clock times of one token for each of `b` sequences of `t` tokens without a cache: the
/// forward pass over the prefix, the last position's logits downloaded (one warm-up run first).
fn time_no_cache(gpu: &Gpu, model: &mut Model, b: usize, t: usize, reps: usize) -> Result<Timing> {
    let rows: Vec<Vec<i32>> = (0..b).map(|i| (0..t).map(|j| ((i * 31 + j * 7) % 50000) as i32).collect()).collect();
    timing::time_host(1, reps, || model.forward_last(gpu, &rows).map(drop))
}

fn step_breakdown(
    gpu: &Gpu,
    cfg: Config,
    weights: &Weights,
    plan: Plan,
    b: usize,
    steps: usize,
    from: usize,
) -> Result<Breakdown> {
    let name = plan.name.clone();
    let mut model = Model::new(gpu, cfg, weights, plan)?;
    let tokens: Vec<i32> = (0..b as i32).collect();
    let mut cache = model.timing_cache(gpu, b, from)?;
    let mut per_op: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for i in 0..2 + steps {
        let ops = model.decode_step_profiled(gpu, &mut cache, &tokens)?;
        let mut sums: BTreeMap<&str, f64> = BTreeMap::new();
        for (op, ms) in ops {
            if !order.contains(&op) {
                order.push(op);
            }
            *sums.entry(op).or_default() += ms;
        }
        if i >= 2 {
            sums.into_iter().for_each(|(op, ms)| per_op.entry(op).or_default().push(ms));
        }
    }
    let ops =
        order.iter().map(|op| (op.to_string(), Timing::from_samples(&mut per_op[op].clone()).median_ms)).collect();
    let replayed = model.decode_step_timeline(gpu, &mut cache, &tokens, steps.max(20))?;
    model.set_graph(true);
    let step = time_steps(gpu, &mut model, b, steps, from, false)?;
    Ok(Breakdown {
        plan: name,
        batch: b,
        ops,
        kernels: model.decode_graph_kernels()?,
        step_graph_ms: Some(step.median_ms),
        timeline: replayed.ops.into_iter().map(|(n, a, e)| (n.to_string(), a, e)).collect(),
        timeline_plain_ms: replayed.plain_ms,
    })
}

// ---------------------------------------------------------------- rendering

/// One step's per-op breakdown (eager, and replayed from the graph) and its graph timeline, layer by
/// layer: ops launched once a layer are the columns, each cell that launch's time; the ops launched
/// once a step follow with their start and end.
fn render_breakdown(md: &mut String, bd: &Breakdown) {
    let sum: f64 = bd.ops.iter().map(|(_, ms)| ms).sum();
    let replayed = bd.replayed_per_op();
    let marked = bd.timeline.last().map_or(0.0, |(_, _, e)| *e);
    md.push_str(&format!(
        "\nOne decode step of `{}` at batch {}, {} kernels. Eager: device time per op between events, summed over \
         layers (launches queued behind a gate), {} in all. Replayed: the greedy step's graph with an event node \
         after every op, {} (without the event nodes {}, so a node costs about {:.1} µs and each op's replayed \
         time includes one); on the host clock with inputs and logits {}.\n\n\
         | op | eager | share | replayed | share |\n|---|---|---|---|---|\n",
        bd.plan,
        bd.batch,
        bd.kernels.map_or("?".into(), |k| k.to_string()),
        fmt_time(sum),
        fmt_time(marked),
        fmt_time(bd.timeline_plain_ms),
        1e3 * (marked - bd.timeline_plain_ms) / bd.timeline.len().max(1) as f64,
        bd.step_graph_ms.map_or("-".into(), fmt_time)
    ));
    for (op, ms) in &replayed {
        let eager = bd.ops.iter().find(|(n, _)| n == op).map(|(_, e)| *e);
        md.push_str(&format!(
            "| {op} | {} | {} | {} | {:.1}% |\n",
            eager.map_or("-".into(), fmt_time),
            eager.map_or("-".into(), |e| format!("{:.1}%", 100.0 * e / sum)),
            fmt_time(*ms),
            100.0 * ms / marked.max(f64::MIN_POSITIVE)
        ));
    }
    let count = |op: &str| bd.timeline.iter().filter(|(n, _, _)| n == op).count();
    let layers = bd.timeline.iter().map(|(n, _, _)| count(n)).max().unwrap_or(0);
    if layers < 2 {
        return;
    }
    let mut cols: Vec<&str> = Vec::new();
    for (n, _, _) in &bd.timeline {
        if count(n) == layers && !cols.contains(&n.as_str()) {
            cols.push(n);
        }
    }
    md.push_str("\nThe replayed step's timeline (µs: each launch's time; a layer's start from the step's start):\n\n| layer | starts |");
    cols.iter().for_each(|c| md.push_str(&format!(" {c} |")));
    md.push_str(&format!("\n|---|---|{}\n", "---|".repeat(cols.len())));
    for l in 0..layers {
        let nth = |op: &str| bd.timeline.iter().filter(|(n, _, _)| n == op).nth(l);
        let start = cols.iter().filter_map(|c| nth(c)).map(|(_, a, _)| *a).fold(f64::INFINITY, f64::min);
        md.push_str(&format!("| {l} | {:.1} |", 1e3 * start));
        for c in &cols {
            md.push_str(&nth(c).map_or(" - |".into(), |(_, a, e)| format!(" {:.1} |", 1e3 * (e - a))));
        }
        md.push('\n');
    }
    md.push_str("\nOnce a step: ");
    let once: Vec<String> = bd
        .timeline
        .iter()
        .filter(|(n, _, _)| count(n) < layers)
        .map(|(n, a, e)| format!("{n} {:.1}–{:.1} µs", 1e3 * a, 1e3 * e))
        .collect();
    md.push_str(&once.join(", "));
    md.push_str(".\n");
}

/// Tokens per second of a step that makes `b` tokens.
fn tok_s(cell: &Cell, b: usize) -> String {
    match cell {
        Cell::Timed(t) => format!("{:.0}", b as f64 / (t.median_ms * 1e-3)),
        Cell::Skipped(why) => format!("— ({why})"),
        Cell::Failed(why) => format!("FAILED: {why}"),
    }
}

impl ModelTable {
    /// Cells that failed (a plan that did not run, a step that errored).
    pub fn failures(&self) -> usize {
        let failed = |c: &Cell| matches!(c, Cell::Failed(_));
        self.rows
            .iter()
            .chain(&self.leave_one_out)
            .map(|r| {
                [&r.prefill, &r.prefill_last]
                    .into_iter()
                    .chain(&r.decode_eager)
                    .chain(&r.decode_graph)
                    .chain(&r.decode_greedy)
                    .chain(&r.decode_loop)
                    .chain(&r.no_cache)
                    .filter(|c| failed(c))
                    .count()
            })
            .sum()
    }

    /// The table as Markdown.
    pub fn markdown(&self) -> String {
        let mut md = format!(
            "gpt2/model  {} on {}: prefill B={} T={}; decode tok/s at batch {:?}, steps from a {}-token cache to the \
             context; weights per step {:.0} MB fp32 / {:.0} MB bf16 / {:.0} MB e4m3; copy {:.0} GB/s\n\n",
            self.config,
            self.device,
            self.prefill_b,
            self.context,
            self.batches,
            self.decode_from,
            self.weight_bytes_fp32 as f64 / 1e6,
            self.weight_bytes_bf16 as f64 / 1e6,
            self.weight_bytes_fp8 as f64 / 1e6,
            self.copy_gbps
        );
        let b = &self.batches;
        let head = |md: &mut String, first: &str| {
            md.push_str(&format!("| {first} | prefill | prefill (last logits) |"));
            for x in b {
                md.push_str(&format!(" b{x} eager | b{x} graph | b{x} graph+argmax | b{x} device loop |"));
            }
            for x in b {
                md.push_str(&format!(" b{x} no cache |"));
            }
            md.push_str(" kernels/step | stages |\n|");
            md.push_str(&"---|".repeat(4 + 5 * b.len() + 1));
            md.push('\n');
        };
        let row = |md: &mut String, r: &PlanRow| {
            let time = |c: &Cell| match c {
                Cell::Timed(t) => fmt_time(t.median_ms),
                Cell::Skipped(w) => format!("— ({w})"),
                Cell::Failed(w) => format!("FAILED: {w}"),
            };
            md.push_str(&format!("| {} | {} | {} |", r.plan, time(&r.prefill), time(&r.prefill_last)));
            for (i, &x) in b.iter().enumerate() {
                md.push_str(&format!(
                    " {} | {} | {} | {} |",
                    tok_s(&r.decode_eager[i], x),
                    tok_s(&r.decode_graph[i], x),
                    tok_s(&r.decode_greedy[i], x),
                    tok_s(&r.decode_loop[i], x)
                ));
            }
            for (i, &x) in b.iter().enumerate() {
                md.push_str(&format!(" {} |", tok_s(&r.no_cache[i], x)));
            }
            md.push_str(&format!(" {} | {} |\n", r.step_kernels.map_or("-".into(), |k| k.to_string()), r.stages));
        };
        head(&mut md, "plan");
        self.rows.iter().for_each(|r| row(&mut md, r));
        if let Some(base) = &self.leave_one_out_base {
            md.push_str(&format!("\nLeave one op out of `{base}` (that op back at its first stage that runs the model's shapes; gemv: off):\n\n"));
            head(&mut md, "plan");
            self.leave_one_out.iter().for_each(|r| row(&mut md, r));
        }
        md.push_str("\nBest decode step against the weights' bytes (graph, % of copy bandwidth):\n\n");
        for r in &self.rows {
            let bytes = match (r.stages.contains("gemv-fp8=off"), r.stages.contains("gemv=off")) {
                (false, _) => self.weight_bytes_fp8,
                (true, true) => self.weight_bytes_fp32,
                (true, false) => self.weight_bytes_bf16,
            };
            if let Some(ms) = r.decode_graph.first().and_then(Cell::ms) {
                let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
                md.push_str(&format!(
                    "- {}: batch-1 step {} = {:.0} GB/s of weights, {:.1}% of copy\n",
                    r.plan,
                    fmt_time(ms),
                    gbps,
                    100.0 * gbps / self.copy_gbps
                ));
            }
        }
        if !self.anchors.is_empty() {
            md.push_str("\nAnchors (scripts/anchors.py, same device; decode shapes give one step's time):\n\n");
            md.push_str("| anchor | shape | median | tok/s |\n|---|---|---|---|\n");
            for a in &self.anchors {
                // A decode anchor's shape starts with `decode b=N`: N tokens per step.
                let b = a.shape.strip_prefix("decode b=").and_then(|r| r.split(',').next()?.parse::<f64>().ok());
                let rate = b.map_or("-".into(), |b| format!("{:.0}", b / (a.median_ms * 1e-3)));
                md.push_str(&format!("| {} | {} | {} | {rate} |\n", a.name, a.shape, fmt_time(a.median_ms)));
            }
        }
        for bd in &self.breakdown {
            render_breakdown(&mut md, bd);
        }
        if let Some(sel) = &self.selection {
            md.push_str("\nThe `fastest` choice (sum over the model's shapes of time / best time; lower wins):\n\n");
            for op in &sel.ops {
                let cands: Vec<String> = op
                    .stages
                    .iter()
                    .map(|s| match &s.excluded {
                        Some(_) => format!("{:02} out", s.stage),
                        None => format!(
                            "{:02} {}",
                            s.stage,
                            s.median_ms.iter().map(|m| m.map_or("-".into(), fmt_time)).collect::<Vec<_>>().join("/")
                        ),
                    })
                    .collect();
                md.push_str(&format!("- {} → {:02}: {}\n", op.op, op.chosen, cands.join("; ")));
            }
        }
        md
    }
}
