//! `ladder`: device facts and ceilings, the stage lists, and the ablation tables.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use common::ceilings::Ceilings;
use common::report::{render, Format, RunTimes};
use common::runner::{run_op, Anchor, Progress, RunOptions, Status, Table};
use common::timing::TimingConfig;
use common::{Error, Generator, Gpu, Grid, Op, Shape, Source, Sweep};
use gpt2::table::TableOptions;
use indicatif::{ProgressBar, ProgressStyle};

mod instruments;

/// `--repeat`: a row whose medians differ by more than this (relative) is marked in the spread.
const REPEAT_LIMIT: f64 = 0.03;

/// `--format`: how tables are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    /// Aligned text.
    Table,
    /// Markdown.
    Md,
    /// CSV, one record per row.
    Csv,
    /// JSON, every field.
    Json,
}

impl From<OutputFormat> for Format {
    fn from(f: OutputFormat) -> Format {
        match f {
            OutputFormat::Table => Format::Table,
            OutputFormat::Md => Format::Markdown,
            OutputFormat::Csv => Format::Csv,
            OutputFormat::Json => Format::Json,
        }
    }
}

#[derive(Parser)]
#[command(name = "ladder", version, about = "Verified, timed optimization ladders of GPT-2's GPU kernels")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Device facts and the measured ceilings (copy bandwidth, cuBLAS GEMM rates).
    Device {
        /// Measure the ceilings again instead of reading the cache.
        #[arg(long)]
        remeasure: bool,
        /// How the tables print: aligned text or Markdown.
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// Host cost of one launch: a prepared stage's enqueue against a raw cuLaunchKernel; and the device cost of a kernel boundary in a replayed CUDA graph.
    LaunchOverhead {
        /// Launches per path.
        #[arg(long, default_value_t = 10_000)]
        launches: usize,
        /// Launches between synchronisations (only the enqueue loops are timed).
        #[arg(long, default_value_t = 500)]
        batch: usize,
    },
    /// Families, ops and stages with what each stage changes.
    List { family: Option<String> },
    /// Generate text with GPT-2 (random weights unless --weights is given).
    Generate {
        /// A prompt; repeat for a batch of prompts (of any lengths).
        #[arg(long, required = true)]
        prompt: Vec<String>,
        /// Hugging Face's model.safetensors for the chosen model.
        #[arg(long)]
        weights: Option<PathBuf>,
        /// The model size: gpt2, gpt2-medium, gpt2-large or gpt2-xl.
        #[arg(long, default_value = "gpt2")]
        model: String,
        /// A named plan, optionally with op=stage overrides after a colon (`fp32:linear=90`).
        #[arg(long, default_value = "fp32")]
        plan: String,
        /// Run the prompts this many times over (a larger batch).
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Tokens generated after each prompt.
        #[arg(long, default_value_t = 32)]
        max_new_tokens: usize,
        /// 0 = greedy.
        #[arg(long, default_value_t = 1.0)]
        temperature: f32,
        /// Sample among the k most likely tokens only (default: all).
        #[arg(long)]
        top_k: Option<usize>,
        /// Sample from the smallest set of tokens whose probabilities reach p (1: all).
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        /// The sampler's seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Recompute the whole prefix for every token (the report's ablation).
        #[arg(long)]
        no_kv_cache: bool,
        /// Replay each decode step from a CUDA graph (with the KV cache).
        #[arg(long)]
        graph: bool,
    },
    /// SVG charts of saved tables (the JSON `ladder run --out` writes), each beside its file or in DIR.
    Chart {
        /// Table JSON files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Write the charts into DIR (default: beside each table).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Two saved runs of one table side by side: before, after, the change, and whether it moved
    /// beyond both runs' min-max spread.
    Compare {
        /// The table JSON before the change.
        before: PathBuf,
        /// The same table after it.
        after: PathBuf,
    },
    /// Saved tables (the JSON `ladder run --out` writes) as one stage x shape matrix per op and
    /// timing mode: each stage's TFLOP/s (GB/s at a memory-bound shape), the fastest stage and its
    /// ratio to a library row of the same run.
    Matrix {
        /// Table JSON files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The library row (stage 90 or above) the ratio is taken against; default: each table's
        /// lowest passed library row.
        #[arg(long, value_name = "STAGE")]
        anchor: Option<u32>,
        /// table, md or csv (the saved tables are the JSON form).
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// What ptxas allocates for each stage, without a GPU: every kernel stage of the ops compiled by
    /// NVRTC for one architecture, a row per entry point (registers, spills, stack, static shared
    /// memory, named barriers). Read it before spending device time on a stage.
    Resources {
        /// A family name, or `all`.
        family: String,
        /// Only this op of the family (`ladder list` names them; default: every op).
        #[arg(long)]
        op: Option<String>,
        /// Stage range `a..b` (inclusive) or one stage `a`.
        #[arg(long, value_parser = common::variant::parse_stages)]
        stages: Option<(u32, u32)>,
        #[command(flatten)]
        build: BuildSettings,
        /// Also the leave-one-out rows of toggle ladders.
        #[arg(long)]
        leave_one_out: bool,
        /// Also every point of each stage's declared sweep space.
        #[arg(long)]
        sweep_points: bool,
        /// sm_90a (default), sm_90 or sm_80: stages with Hopper-only instructions are n/a on the last two.
        #[arg(long, default_value = "sm_90a")]
        arch: String,
        /// How the tables print: aligned text or Markdown.
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// A stage's SASS without a GPU: NVRTC compiles it, cuobjdump disassembles the cubin, and each
    /// entry point's instructions are counted by class (HGMMA, HMMA, MUFU, FFMA, global and shared
    /// loads and stores, barriers, spills), for the whole function and its main loop (the backward
    /// branch with the most tensor-core instructions) with the fewest and the most instructions a
    /// turn of the loop runs (the counts are static and hold every copy ptxas made of a path; a
    /// turn runs one); then the listing, or with --diff two stages' counts side by side.
    Sass {
        /// The family of the op.
        family: String,
        /// The op (`ladder list` names them).
        #[arg(long)]
        op: String,
        /// The stage number.
        #[arg(long)]
        stage: u32,
        /// A second stage whose counts are set beside the first's, entry point by entry point.
        #[arg(long)]
        diff: Option<u32>,
        /// Only the entry points whose name contains this.
        #[arg(long)]
        entry: Option<String>,
        /// List the main loop only.
        #[arg(long)]
        main_loop: bool,
        /// The counts only, no listing.
        #[arg(long)]
        summary: bool,
        #[command(flatten)]
        build: BuildSettings,
        /// A leave-one-out row of the stage (`all-SWITCH`, as `ladder list` and the ablation table
        /// name it) instead of the stage itself.
        #[arg(long)]
        row: Option<String>,
        /// sm_90a (default), sm_90 or sm_80.
        #[arg(long, default_value = "sm_90a")]
        arch: String,
        /// Also write the stage's PTX (what NVRTC hands ptxas) to this file.
        #[arg(long)]
        ptx: Option<PathBuf>,
    },
    /// The GPT-2 model.
    Gpt2 {
        #[command(subcommand)]
        command: Gpt2Command,
    },
    /// Verification only (no timing): every stage of the family's ops, each shape's inputs drawn
    /// once, outputs poisoned, one launch, checked; one line per (stage, shape). What
    /// `scripts/sanitize` runs under compute-sanitizer.
    Verify {
        /// A family name, or `all`.
        family: String,
        /// Only this op of the family (`ladder list` names them; default: every op).
        #[arg(long)]
        op: Option<String>,
        /// key=value,... overriding the op's first default shape.
        #[arg(long)]
        shape: Option<String>,
        /// Only the op's smallest default shape (the smallest product of its keys' values).
        #[arg(long, conflicts_with = "shape")]
        smallest: bool,
        /// Leave out the library rows (cuBLAS, cuBLASLt): only this workspace's kernels.
        #[arg(long)]
        no_library: bool,
        /// Only the stage (or derived row: `all-X`, `name[T=v]`) of this name.
        #[arg(long)]
        name: Option<String>,
        /// NAME=value,... tunables set on the selected stage (a sweep point's configuration).
        #[arg(long, requires = "name")]
        config: Option<String>,
        /// Also every point of each stage's declared sweep space (what `ladder sweep` would try).
        #[arg(long, conflicts_with = "name")]
        sweep_points: bool,
        /// Open the profiler around the stage's launch only (what --counters and `ladder profile`
        /// run under ncu --profile-from-start off).
        #[arg(long, hide = true)]
        profiled: bool,
    },
    /// A configuration sweep: every point of a stage's tunable grid compiled, verified and timed;
    /// the table sorted by time with the declared configuration marked and the best one's speedup.
    Sweep {
        /// A family name, or `all`.
        family: String,
        /// Only this op of the family (`ladder list` names them; default: every op).
        #[arg(long)]
        op: Option<String>,
        /// Only this stage number (default: every stage that declares a sweep space, or that has
        /// every --define'd tunable).
        #[arg(long)]
        stage: Option<u32>,
        /// NAME=v1,v2,...: an axis of the grid (repeatable: the grid is every combination). Without
        /// it, each stage's declared sweep space.
        #[arg(long = "define", value_parser = parse_sweep)]
        defines: Vec<Sweep>,
        /// key=value,... overriding the op's first default shape (the shape swept by default).
        #[arg(long)]
        shape: Option<String>,
        /// Sweep at every default shape of the op instead of the first.
        #[arg(long, conflicts_with = "shape")]
        all_shapes: bool,
        /// Write each sweep as JSON, Markdown and an SVG chart (time against the swept define) into DIR.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Save each sweep's best configuration for this device, stage and shape (the GPT-2
        /// `fastest` plans use the one saved at the model's shape).
        #[arg(long)]
        save_best: bool,
        /// Time the points back to back, N per pair of events (as `ladder run --back-to-back`).
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
        back_to_back: u32,
        /// Time the points in N interleaved rounds, samples pooled (as `ladder run --rounds`): a
        /// drift of the clock reaches every point alike.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
        rounds: u32,
        /// Short timings (fewer repetitions): a quick look, not a figure to cite.
        #[arg(long)]
        quick: bool,
        /// Fixed input seed (default: fresh).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// The full Nsight Compute report (`ncu --set full`) of one stage at one shape, into a .ncu-rep.
    Profile {
        /// The family of the op.
        family: String,
        /// The op (`ladder list` names them).
        #[arg(long)]
        op: String,
        /// The stage number.
        #[arg(long)]
        stage: u32,
        /// key=value,... overriding the op's first default shape.
        #[arg(long)]
        shape: Option<String>,
        /// NAME=value,... tunables set on the stage.
        #[arg(long)]
        config: Option<String>,
        /// The report file (default: family-op-NN-name.ncu-rep in the current directory).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Where one launch spends its time, from stamps the kernel writes itself (a stage whose sources
    /// have a `// Timeline:` line): each phase from the first block start, the first block, the mean
    /// and the last block, the median over runs timed one at a time, each behind a gate between its
    /// own events (close to, not the same as, the default table's timing). On a composed stage that
    /// launches a dependent chain: each kernel of the chain, its release after the kernel before it
    /// and its own time from leaving its wait to its last block's return.
    Timeline {
        /// The family of the op.
        family: String,
        /// The op whose stages stamp (`ladder list` names them).
        #[arg(long)]
        op: String,
        /// Stage range `a..b` (inclusive) or one stage `a`: every kernel stage in it that stamps.
        #[arg(long, value_parser = common::variant::parse_stages)]
        stages: (u32, u32),
        /// key=value,... overriding the op's first default shape (repeatable: one timeline each).
        #[arg(long)]
        shape: Vec<String>,
        /// NAME=value,... tunables set on every selected stage that declares all of them.
        #[arg(long)]
        config: Option<String>,
        /// Runs stamped per stage and shape (each stamp's median over them is shown).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10000))]
        runs: u32,
        /// How the tables print: aligned text or Markdown.
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
        /// Fixed input seed (default: fresh).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// The ablation table: verify and time every stage at the default shapes (or --shape).
    Run {
        /// A family name, or `all`.
        family: String,
        /// Only this op of the family (`ladder list` names them; default: every op).
        #[arg(long)]
        op: Option<String>,
        /// key=value,... overriding the op's first default shape (e.g. rows=4096,C=768).
        #[arg(long)]
        shape: Option<String>,
        /// key=value,... applied to every default shape (e.g. `alibi=1`: the whole table with ALiBi).
        #[arg(long, conflicts_with = "shape")]
        each: Option<String>,
        /// Stage range `a..b` (inclusive) or one stage `a`.
        #[arg(long, value_parser = common::variant::parse_stages)]
        stages: Option<(u32, u32)>,
        /// Also run all-on-minus-one variants of toggle ladders.
        #[arg(long)]
        leave_one_out: bool,
        /// NAME=v1,v2,...: extra rows of every selected stage that declares tunable NAME, set to
        /// each value (repeatable; the launch geometry follows the tunable).
        #[arg(long, value_parser = parse_sweep)]
        sweep: Vec<Sweep>,
        /// How the tables print: aligned text or Markdown.
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
        /// Also write every table as JSON and Markdown into DIR.
        #[arg(long)]
        out: Option<PathBuf>,
        /// JSON from scripts/anchors.py: outside timings shown as extra rows.
        #[arg(long)]
        anchors: Option<PathBuf>,
        /// Save each table as baseline NAME (in the cache directory, per device).
        #[arg(long, value_name = "NAME")]
        save_baseline: Option<String>,
        /// Set each table beside the saved baseline NAME of the same op and shape: the change per
        /// stage and whether it moved past both runs' spread.
        #[arg(long, value_name = "NAME")]
        baseline: Option<String>,
        /// Time every stage N times in one process and report each row's spread (the largest
        /// relative difference from the first run; rows past ±3% marked).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10))]
        repeat: u32,
        /// Replay each stage from a captured CUDA graph (for launch-bound ops).
        #[arg(long)]
        graph: bool,
        /// Time runs back to back, N per pair of events (each sample the mean per run), as a
        /// model's consecutive layers run: a stage launched as a programmatic dependent (and
        /// cuBLASLt, whose kernels are) may then start under the tail of the run before. The
        /// default, 1, times each run between its own events.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
        back_to_back: u32,
        /// Time the stages of each table in N interleaved rounds (every stage in turn, each round
        /// with 1/N of its samples; the samples pooled), so that the clock's drift under the
        /// power cap over the table reaches every stage alike. The default, 1, times each stage
        /// once, all its samples together.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
        rounds: u32,
        /// Also run each passed stage once under Nsight Compute (ncu) and add its counters: DRAM and
        /// SM throughput, tensor-pipe activity, achieved occupancy, L2 throughput and hit rate, top two stalls.
        #[arg(long)]
        counters: bool,
        /// Fewer repetitions (a smoke run).
        #[arg(long)]
        quick: bool,
        /// Fixed input seed (default: fresh).
        #[arg(long)]
        seed: Option<u64>,
        /// gpt2's model table (`--op model`, or the family without --op): these plans, each
        /// optionally with op=stage overrides after a colon (default: every named plan).
        #[arg(long, num_args = 1..)]
        plan: Vec<String>,
        /// gpt2's model table at this size, on seeded random weights: gpt2 (default), gpt2-medium,
        /// gpt2-large or gpt2-xl.
        #[arg(long, default_value = "gpt2")]
        model: String,
    },
}

#[derive(Subcommand)]
enum Gpt2Command {
    /// Compare the model's logits and greedy tokens with the directory scripts/gpt2_reference.py
    /// wrote (Hugging Face on the same weights); fails unless every plan is within its tolerance.
    Check {
        /// The directory with model.safetensors, meta.json and the reference logits.
        #[arg(long)]
        reference: PathBuf,
        /// Named plans to check, each optionally with op=stage overrides after a colon
        /// (`fp32:linear=0`).
        #[arg(long, value_delimiter = ' ', num_args = 1.., default_values_t = ["naive".to_string(), "fp32".to_string()])]
        plan: Vec<String>,
        /// Also check each plan's greedy steps through the KV cache.
        #[arg(long)]
        kv_cache: bool,
        /// With --kv-cache, also replay the decode steps from a captured CUDA graph.
        #[arg(long)]
        graph: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match execute(cli.command) {
        Ok(code) => code,
        Err(e) => {
            let text = e.to_string();
            let mut lines = text.lines();
            eprintln!("error: {}", lines.next().unwrap_or_default());
            // Only a compile error carries more (NVRTC's log), which is the point of showing it.
            for l in lines {
                eprintln!("  {l}");
            }
            ExitCode::FAILURE
        }
    }
}

/// `N` or `A..B` (inclusive; `A..=B` also accepted).
/// `NAME=v1,v2,...` (each value a u32).
fn parse_sweep(s: &str) -> Result<Sweep, String> {
    let bad = || format!("'{s}' is not NAME=v1,v2,... with unsigned values");
    let (name, values) = s.split_once('=').ok_or_else(bad)?;
    let values: Vec<u32> = values.split(',').map(|v| v.trim().parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    if name.trim().is_empty() || values.is_empty() {
        return Err(bad());
    }
    Ok(Sweep { tunable: name.trim().to_string(), values })
}

fn execute(command: Command) -> common::Result<ExitCode> {
    match command {
        Command::List { family } => {
            let families = match family {
                Some(f) => vec![kernel_ladder::family(&f)?],
                None => kernel_ladder::families(),
            };
            for f in families {
                println!("{}: {}", f.name(), f.description());
                for op in f.ops() {
                    println!("  {}/{}: {}", f.name(), op.name(), op.description());
                    let shapes: Vec<String> = op.default_shapes().iter().map(|s| s.to_string()).collect();
                    println!("    default shapes: {}", shapes.join("  "));
                    for v in op.variants() {
                        let src = match &v.source {
                            Source::Kernel(p) => format!("kernels/{p}"),
                            Source::Library(l) => l.to_string(),
                            Source::Host(h) => format!("host: {h}"),
                        };
                        let req = if v.requires.arch_specific {
                            format!(" [sm_{}{}a]", v.requires.min_cc.0, v.requires.min_cc.1)
                        } else if v.requires.min_cc > (7, 0) {
                            format!(" [sm_{}{}+]", v.requires.min_cc.0, v.requires.min_cc.1)
                        } else {
                            String::new()
                        };
                        println!(
                            "    {:02} {:<22} {:<10} {}{req}  ({src})",
                            v.stage,
                            v.name,
                            v.precision.label(),
                            v.summary
                        );
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Generate {
            prompt,
            weights,
            model,
            plan,
            batch,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            seed,
            no_kv_cache,
            graph,
        } => {
            use gpt2::config::Config;
            use gpt2::generate::{generate, Tokenizer};
            use gpt2::model::Model;
            use gpt2::plan::Plan;
            use gpt2::sampling::Sampling;
            use gpt2::weights::Weights;
            let sampling = Sampling { temperature, top_k, top_p, seed };
            sampling.check()?;
            let cfg = Config::by_name(&model)?;
            Plan::check_spec(&plan)?;
            let tok = Tokenizer::new()?;
            let one: Vec<Vec<i32>> = prompt.iter().map(|p| tok.encode(p)).collect();
            let prompts: Vec<Vec<i32>> = (0..batch.max(1)).flat_map(|_| one.iter().cloned()).collect();
            let w = match &weights {
                Some(f) => Weights::load(f, &cfg)?,
                None => Weights::random(&cfg, seed),
            };
            let gpu = Gpu::open()?;
            let plan =
                gpt2::fastest::resolve(&gpu, &cfg, &plan, &mut |op| eprintln!("choosing the fastest stages: {op}"))?;
            let mut m = Model::new(&gpu, cfg, &w, plan)?;
            m.set_graph(graph);
            eprintln!("generating {max_new_tokens} tokens after {} prompt(s), plan {}", prompts.len(), m.plan.name);
            if !no_kv_cache {
                eprintln!("compiling the plan's kernels (NVRTC; cached for the next run)");
            }
            for t in &m.plan.tuned {
                eprintln!("  tuned by a saved sweep: {t}");
            }
            // A bar on stderr (drawn only on a terminal): new tokens of the longest sequence.
            let bar = ProgressBar::new(max_new_tokens as u64);
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} tokens {per_sec}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            let g = generate(&gpu, &mut m, &prompts, max_new_tokens, sampling, true, !no_kv_cache, &mut |n| {
                bar.set_position(n as u64)
            })?;
            bar.finish_and_clear();
            for (p, new) in prompts.iter().zip(&g.tokens) {
                println!("{}{}", tok.decode(p)?, tok.decode(new)?);
                println!("---");
            }
            let prompt_tokens: usize = prompts.iter().map(|p| p.len()).sum();
            if !no_kv_cache {
                println!("compile: {:.0} ms (NVRTC and module loads, before anything is timed)", g.compile_ms);
            }
            println!(
                "prefill: {} tokens in {:.2} ms; decode: {} tokens in {:.2} ms ({:.1} tok/s, {}{}{})",
                prompt_tokens,
                g.prefill_ms,
                g.decode_tokens,
                g.decode_ms,
                g.decode_tokens as f64 / (g.decode_ms * 1e-3),
                match (no_kv_cache, graph) {
                    (true, _) => "no KV cache",
                    (false, true) => "KV cache, CUDA graph",
                    (false, false) => "KV cache",
                },
                if g.device_loop { ", greedy loop on the device" } else { "" },
                if weights.is_none() { ", random weights" } else { "" }
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Gpt2 { command: Gpt2Command::Check { reference, plan, kv_cache, graph } } => {
            plan.iter().try_for_each(|p| gpt2::plan::Plan::check_spec(p))?;
            gpt2::check::check_reference_dir(&reference)?;
            let gpu = Gpu::open()?;
            let mut ok = true;
            for spec in plan {
                let modes: &[(bool, bool)] = match (kv_cache, graph) {
                    (true, true) => &[(false, false), (true, false), (true, true)],
                    (true, false) => &[(false, false), (true, false)],
                    _ => &[(false, false)],
                };
                for &(cached, graphed) in modes {
                    let r = gpt2::check::check(&gpu, &reference, &spec, cached, graphed)?;
                    let agree = r.tokens.iter().zip(&r.reference_tokens).all(|(a, b)| a == b);
                    let (prefill_tol, decode_tol) = r.limits();
                    let yardstick = match &r.criterion {
                        gpt2::check::Criterion::HfBf16 { prefill, decode, .. } => format!(
                            " ({}x HF bf16's {prefill:.2e} / {decode:.2e}; tokens where HF bf16's agree)",
                            gpt2::check::HF_BF16_FACTOR
                        ),
                        gpt2::check::Criterion::Fp8 { prefill, decode, decided } => format!(
                            " ({}x HF bf16's {prefill:.2e} / {decode:.2e}; tokens where HF fp32's top-2 gap > 2x the \
                             row's RMS error: {} of {} steps)",
                            gpt2::check::FP8_FACTOR,
                            decided.iter().flatten().filter(|&&d| d).count(),
                            decided.iter().map(Vec::len).sum::<usize>()
                        ),
                        gpt2::check::Criterion::Fixed { .. } => String::new(),
                    };
                    println!(
                        "plan {:<24} prefill logits rel L2 {:.2e}  greedy-step logits rel L2 (worst) {:.2e}  \
                     tol {:.2e} / {:.2e}{}  greedy tokens {}  {}",
                        r.plan,
                        r.prefill_rel_l2,
                        r.decode_rel_l2,
                        prefill_tol,
                        decode_tol,
                        yardstick,
                        if agree {
                            "all equal".to_string()
                        } else {
                            format!("{:?} vs HF {:?}", r.tokens, r.reference_tokens)
                        },
                        if r.passed() { "ok" } else { "FAILED" }
                    );
                    ok &= r.passed();
                }
            }
            Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Verify { family, op, shape, smallest, no_library, name, config, sweep_points, profiled } => {
            let ops = select_ops(&family, op.as_deref())?;
            let overrides = shape.as_deref().map(Shape::parse).transpose()?;
            let config = config.as_deref().map(|c| parse_settings("--config", c)).transpose()?.unwrap_or_default();
            let gpu = Gpu::open()?;
            let (mut passed, mut failed, mut skipped) = (0, 0, 0);
            for op in ops {
                let shapes = match &overrides {
                    Some(o) => vec![op.default_shapes()[0].overlay(o, op.shape_keys())?],
                    None if smallest => {
                        let size = |s: &Shape| s.pairs().iter().map(|(_, v)| (*v).max(1) as f64).product::<f64>();
                        let mut all = op.default_shapes();
                        all.sort_by(|a, b| size(a).total_cmp(&size(b)));
                        all.truncate(1);
                        all
                    }
                    None => op.default_shapes(),
                };
                let variants = verify_variants(op, no_library, sweep_points, name.as_deref(), &config)?;
                for s in shapes {
                    let mut problem = None;
                    for v in &variants {
                        let id = format!("{} {s}", v.id());
                        if let Err(e) = gpu.supports(v).and_then(|_| op.validate(v, &s)) {
                            println!("n/a    {id}: {}", first_line(&e.to_string()));
                            skipped += 1;
                            continue;
                        }
                        if problem.is_none() {
                            problem = Some(op.problem(&gpu, &s, common::data::fresh_seed())?);
                        }
                        let p = problem.as_deref_mut().expect("made above");
                        let outcome = p.prepare(&gpu, v).and_then(|_| {
                            if profiled {
                                common::runner::verify_profiled(&gpu, p)
                            } else {
                                common::runner::verify_once(&gpu, p)
                            }
                        });
                        match outcome {
                            Ok(ver) if ver.passed() => {
                                println!("ok     {id}: {}", ver.summary());
                                passed += 1;
                            }
                            Ok(ver) => {
                                println!("FAILED {id}: {}", ver.summary());
                                failed += 1;
                            }
                            Err(e) if e.is_not_applicable() => {
                                println!("n/a    {id}: {}", first_line(&e.to_string()));
                                skipped += 1;
                            }
                            Err(e) => match common::runner::point_refusal(v, &e) {
                                Some(why) => {
                                    println!("n/a    {id}: {why}");
                                    skipped += 1;
                                }
                                None => {
                                    println!("FAILED {id}: {}", first_line(&e.to_string()));
                                    failed += 1;
                                }
                            },
                        }
                    }
                }
            }
            println!("{passed} verified, {failed} failed, {skipped} n/a");
            Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Sweep {
            family,
            op,
            stage,
            defines,
            shape,
            all_shapes,
            out,
            save_best,
            back_to_back,
            rounds,
            quick,
            seed,
        } => {
            let ops = select_ops(&family, op.as_deref())?;
            let mut timing = if quick { TimingConfig::quick() } else { TimingConfig::default() };
            timing.batch = back_to_back as usize;
            timing.rounds = rounds as usize;
            let req = instruments::SweepRequest {
                ops,
                stage,
                defines,
                shape: shape.as_deref().map(Shape::parse).transpose()?,
                all_shapes,
                opts: RunOptions { timing, seed, ..RunOptions::default() },
                out,
                save_best,
            };
            let jobs = instruments::jobs(&req)?;
            let gpu = Gpu::open()?;
            let failed = instruments::sweep(&gpu, &req, &jobs)?;
            if failed > 0 {
                eprintln!("{failed} point(s) FAILED verification");
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Profile { family, op, stage, shape, config, out } => {
            let op = *select_ops(&family, Some(&op))?.first().expect("select_ops returns one or an error");
            let config = config.as_deref().map(|c| parse_settings("--config", c)).transpose()?.unwrap_or_default();
            let base = op.variants().into_iter().find(|v| v.stage == stage).ok_or_else(|| {
                let known: Vec<String> = op.variants().iter().map(|v| format!("{}:{}", v.stage, v.name)).collect();
                Error::Unknown { what: "stage", name: stage.to_string(), known: known.join(", ") }
            })?;
            let variant = base.with_config(&config)?;
            let shape = match shape.as_deref().map(Shape::parse).transpose()? {
                Some(o) => op.default_shapes()[0].overlay(&o, op.shape_keys())?,
                None => op.default_shapes()[0].clone(),
            };
            op.validate(&variant, &shape)?;
            let report = out.unwrap_or_else(|| {
                PathBuf::from(format!("{}-{}-{:02}-{}.ncu-rep", op.family(), op.name(), variant.stage, variant.name))
            });
            instruments::profile(op, &variant, &shape, &report)?;
            println!("{}", report.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Timeline { family, op, stages, shape, config, runs, format, seed } => {
            let op = *select_ops(&family, Some(&op))?.first().expect("select_ops returns one or an error");
            let config = config.as_deref().map(|c| parse_settings("--config", c)).transpose()?.unwrap_or_default();
            let first = op.default_shapes()[0].clone();
            let shapes = if shape.is_empty() {
                vec![first]
            } else {
                shape.iter().map(|s| first.overlay(&Shape::parse(s)?, op.shape_keys())).collect::<Result<_, _>>()?
            };
            let variants = resource_variants(op, Some(stages), &config, &[], false, false);
            // A kernel stage stamps its phases; a composed stage (host work) may launch a dependent
            // chain, whose kernels stamp their links.
            let composed = |v: &common::Variant| matches!(v.source, Source::Host(_));
            let stamping: Vec<_> =
                variants.iter().filter(|v| composed(v) || common::timeline::slots(op.sources(), v).is_ok()).collect();
            common::require(
                !stamping.is_empty(),
                "at least one selected stage stamps a timeline (a kernel stage's phases or a composed stage's chain)",
                || format!("stages {}..{} of {}/{}", stages.0, stages.1, op.family(), op.name()),
            )?;
            let gpu = Gpu::open()?;
            let seed = seed.unwrap_or_else(common::data::fresh_seed);
            let mut failed = 0;
            for shape in &shapes {
                let mut problem = op.problem(&gpu, shape, seed)?;
                for v in &stamping {
                    let recorded = if composed(v) {
                        common::chain_timeline::record(&gpu, op, problem.as_mut(), v, shape, runs as usize, 5)
                            .map(|t| common::chain_timeline::render(&t, Format::from(format)))
                    } else {
                        common::timeline::record(&gpu, op, problem.as_mut(), v, shape, runs as usize, 5)
                            .map(|t| common::timeline::render(&t, Format::from(format)))
                    };
                    match recorded {
                        Ok(text) => print!("{text}"),
                        // A stage that refuses the shape is n/a; anything else (a failed check) fails.
                        Err(e @ Error::Constraint { .. }) => println!("{}:{} at {shape}: n/a: {e}\n", v.stage, v.name),
                        Err(e) => {
                            failed += 1;
                            println!("{}:{} at {shape}: FAILED: {}\n", v.stage, v.name, first_line(&e.to_string()));
                        }
                    }
                }
            }
            Ok(if failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
        }
        Command::Compare { before, after } => {
            let (b, a) = (kernel_ladder::baseline::read_table(&before)?, kernel_ladder::baseline::read_table(&after)?);
            let changes = kernel_ladder::compare::compare(&b, &a)?;
            print!("{}", kernel_ladder::compare::markdown(&b, &a, &changes));
            Ok(ExitCode::SUCCESS)
        }
        Command::Chart { files, out } => {
            for file in files {
                let table = kernel_ladder::baseline::read_table(&file)?;
                let dir = out.clone().unwrap_or_else(|| file.parent().map(PathBuf::from).unwrap_or_default());
                match write_chart(&dir, &kernel_ladder::baseline::table_stem(&table), &table)? {
                    Some(path) => println!("{}", path.display()),
                    None => eprintln!("{}: no stage passed, no chart", file.display()),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Matrix { files, anchor, format } => {
            common::require(format != OutputFormat::Json, "--format table, md or csv", || "json".into())?;
            let tables =
                files.iter().map(|f| kernel_ladder::baseline::read_table(f)).collect::<common::Result<Vec<_>>>()?;
            print!("{}", kernel_ladder::matrix::render(&tables, Format::from(format), anchor));
            Ok(ExitCode::SUCCESS)
        }
        Command::Resources { family, op, stages, build, leave_one_out, sweep_points, arch, format } => {
            let arch = common::Arch::parse(&arch)?;
            let (config, defines, switches) = build.parse()?;
            let tc = common::nvrtc::toolchain()?;
            let mut any = false;
            for op in select_ops(&family, op.as_deref())? {
                let mut variants = resource_variants(op, stages, &config, &defines, leave_one_out, sweep_points);
                variants.iter_mut().for_each(|v| switches.iter().for_each(|s| v.switch_on(s)));
                let rows = kernel_ladder::resources::measure(&tc, op, &variants, arch);
                any |= !rows.is_empty();
                print!("{}", kernel_ladder::resources::render(&rows, Format::from(format)));
            }
            let configured = || {
                let range = stages.map_or("all".to_string(), |(a, b)| format!("{a}..{b}"));
                let set = |pairs: &[(String, u32)]| pairs.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>();
                let (tunables, defined) = (set(&config), set(&defines));
                format!(
                    "stages {range} of '{family}' with tunables [{}], defines [{}] and switches [{}]",
                    tunables.join(","),
                    defined.join(","),
                    switches.join(",")
                )
            };
            common::require(any, "at least one kernel stage selected", configured)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Sass { family, op, stage, diff, entry, main_loop, summary, build, row, arch, ptx } => {
            use kernel_ladder::sass::{self, Function, Summary};
            let arch = common::Arch::parse(&arch)?;
            let (config, defines, switches) = build.parse()?;
            let tc = common::nvrtc::toolchain()?;
            let op = select_ops(&family, Some(&op))?[0];
            let mut warnings: Vec<String> = Vec::new();
            let mut functions = |n: u32| -> common::Result<Vec<Function>> {
                let known: Vec<String> = op.variants().iter().map(|v| v.stage.to_string()).collect();
                let v = op.variants().into_iter().find(|v| v.stage == n).ok_or_else(|| Error::Unknown {
                    what: "stage",
                    name: n.to_string(),
                    known: known.join(", "),
                })?;
                let v = match row.as_deref() {
                    None => v,
                    Some(name) => {
                        let rows: Vec<common::Variant> =
                            op.leave_one_out().into_iter().filter(|r| r.stage == n).collect();
                        let known: Vec<&str> = rows.iter().map(|r| r.name.as_ref()).collect();
                        let known = known.join(", ");
                        rows.iter().find(|r| r.name == name).cloned().ok_or_else(|| Error::Unknown {
                            what: "leave-one-out row",
                            name: name.to_string(),
                            known,
                        })?
                    }
                };
                let mut v = v.with_config(&config)?;
                defines.iter().try_for_each(|(name, value)| v.set_define(name, *value))?;
                switches.iter().for_each(|s| v.switch_on(s));
                let d = sass::disassemble(&tc, op.sources(), &v, arch)?;
                if let Some(path) = ptx.as_ref().filter(|_| n == stage) {
                    std::fs::write(path, &d.ptx)
                        .map_err(|e| Error::constraint("a writable --ptx file", format!("{}: {e}", path.display())))?;
                }
                warnings.extend(d.ptxas_warnings.iter().map(|w| format!("stage {n}: {w}")));
                let all = d.functions;
                let names: Vec<String> = all.iter().map(|f| f.name.clone()).collect();
                let kept: Vec<Function> =
                    all.into_iter().filter(|f| entry.as_deref().is_none_or(|e| f.name.contains(e))).collect();
                common::require(!kept.is_empty(), "an entry point whose name contains --entry", || {
                    format!("{entry:?} among {names:?}")
                })?;
                Ok(kept)
            };
            // The whole function's counts, then its main loop's (with the loop's addresses).
            let rows = |tag: &str, f: &Function| -> Vec<String> {
                let mut out = vec![sass::summary_row(&format!("{tag}{}", f.name), &Summary::of(&f.instructions))];
                if let Some(r) = f.main_loop() {
                    let body = &f.instructions[r.clone()];
                    let (a, b) = (body[0].address, body[body.len() - 1].address);
                    let (fewest, most) = f.turn_lengths(r.clone());
                    let name = format!("{tag}{}, main loop {a:#06x}..{b:#06x} (a turn runs {fewest}..{most})", f.name);
                    out.push(sass::summary_row(&name, &Summary::of(body)));
                }
                out
            };
            let first = functions(stage)?;
            println!("{}/{} stage {stage}, {}: instructions by class\n", op.family(), op.name(), arch.name());
            println!("{}", sass::summary_head("entry point"));
            match diff {
                Some(m) => {
                    let second = functions(m)?;
                    for f in &first {
                        rows(&format!("{stage:02} "), f).iter().for_each(|r| println!("{r}"));
                        match second.iter().find(|g| g.name == f.name) {
                            Some(g) => rows(&format!("{m:02} "), g).iter().for_each(|r| println!("{r}")),
                            None => println!("| {m:02} {}: no such entry point | |", f.name),
                        }
                    }
                }
                None => {
                    first.iter().flat_map(|f| rows("", f)).for_each(|r| println!("{r}"));
                    if !summary {
                        for f in &first {
                            let range = if main_loop { f.main_loop() } else { Some(0..f.instructions.len()) };
                            let Some(range) = range else { continue };
                            println!("\n{}{}:", f.name, if main_loop { " (main loop)" } else { "" });
                            for i in &f.instructions[range] {
                                println!("  /*{:04x}*/  {}", i.address, i.text);
                            }
                        }
                    }
                }
            }
            if !warnings.is_empty() {
                println!("\nptxas (warnings and wgmma notes):");
                warnings.iter().for_each(|w| println!("  {w}"));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::LaunchOverhead { launches, batch } => {
            let gpu = Gpu::open()?;
            let o = kernel_ladder::overhead::measure(&gpu, launches, batch.max(1))?;
            println!("host cost of one launch, {} launches per path in batches of {}:", o.launches, o.batch);
            for (name, p) in [("prepared (Launch::enqueue)", o.prepared), ("raw cuLaunchKernel (cudarc)", o.raw)] {
                println!("  {name:<28} {:.3} us (min {:.3}, max {:.3})", p.median_us, p.min_us, p.max_us);
            }
            println!("  prepared / raw: {:.2}x", o.ratio());
            // A decode step's 75 kernels, as one block and as a grid of 4 blocks per SM.
            let sms = gpu.info().sm_count;
            println!("device time per kernel node of a replayed graph of 75 empty kernels (a kernel boundary):");
            for blocks in [1, 4 * sms] {
                let g = kernel_ladder::overhead::graph_node(&gpu, 75, blocks, 200)?;
                let p = g.per_node;
                println!(
                    "  {:>4} blocks of 256 threads   {:.3} us (min {:.3}, max {:.3})",
                    g.blocks, p.median_us, p.min_us, p.max_us
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Device { remeasure, format } => {
            let format = Format::from(format);
            // What can be found without a driver is reported first: NVRTC and the CUDA headers.
            let toolchain = match common::nvrtc::toolchain() {
                Ok(tc) => {
                    format!("NVRTC {}.{}, CUDA headers in {}", tc.version.0, tc.version.1, tc.include_dir.display())
                }
                Err(e) => e.to_string(),
            };
            if format != Format::Json {
                println!("{toolchain}");
            }
            // Without a driver or a device, that is the report: NVRTC compiles, nothing runs.
            let gpu = match Gpu::open() {
                Ok(gpu) => gpu,
                Err(e) => {
                    match format {
                        Format::Json => {
                            let v =
                                serde_json::json!({ "device": null, "error": e.to_string(), "toolchain": toolchain });
                            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
                        }
                        _ => println!("no device: {e}"),
                    }
                    return Ok(ExitCode::SUCCESS);
                }
            };
            if remeasure {
                std::env::set_var("LADDER_REMEASURE", "1");
            }
            let measuring = spinner("measuring ceilings (first run on this device)");
            let ceilings = Ceilings::get(&gpu);
            measuring.finish_and_clear();
            let ceilings = ceilings?;
            let info = gpu.info();
            if format == Format::Json {
                let v = serde_json::json!({ "device": info, "toolchain": toolchain, "ceilings": ceilings });
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                println!("device {}: {}", info.index, info.name);
                println!(
                    "  compute capability {}.{} ({}), {} SMs",
                    info.compute_capability.0,
                    info.compute_capability.1,
                    gpu.arch(false),
                    info.sm_count
                );
                println!(
                    "  memory {:.1} GiB, L2 {:.1} MiB",
                    info.total_memory_bytes as f64 / (1u64 << 30) as f64,
                    info.l2_bytes as f64 / (1u64 << 20) as f64
                );
                println!(
                    "  shared memory: {} B/block ({} opt-in), {} B/SM; {} threads/SM, {} registers/SM",
                    info.shared_memory_per_block,
                    info.shared_memory_per_block_optin,
                    info.shared_memory_per_sm,
                    info.max_threads_per_sm,
                    info.registers_per_sm
                );
                println!("  driver CUDA {}.{}", info.driver_version / 1000, (info.driver_version % 1000) / 10);
                println!("ceilings:");
                println!(
                    "  copy bandwidth     {:>8.0} GB/s (device-to-device copy of {} MiB, read + write)",
                    ceilings.copy_gbps,
                    ceilings.copy_bytes >> 20
                );
                println!(
                    "  host-to-device     {:>8.1} GB/s pinned, {:.1} GB/s pageable ({} MiB)",
                    ceilings.h2d_pinned_gbps,
                    ceilings.h2d_pageable_gbps,
                    ceilings.h2d_bytes >> 20
                );
                println!(
                    "  cuBLASLt fp32 GEMM {:>8.1} TFLOP/s ({n}x{n}x{n})",
                    ceilings.fp32_tflops,
                    n = ceilings.gemm_size
                );
                println!("  cuBLASLt tf32 GEMM {:>8.1} TFLOP/s", ceilings.tf32_tflops);
                println!("  cuBLASLt bf16 GEMM {:>8.1} TFLOP/s", ceilings.bf16_tflops);
                println!("  cuBLASLt fp16 GEMM {:>8.1} TFLOP/s (fp32 out)", ceilings.fp16_tflops);
                println!("  cuBLASLt e4m3 GEMM {:>8.1} TFLOP/s (per-tensor scales, bf16 out)", ceilings.fp8_tflops);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            family,
            op,
            shape,
            each,
            stages,
            leave_one_out,
            sweep,
            format,
            out,
            anchors,
            save_baseline,
            baseline,
            repeat,
            graph,
            back_to_back,
            rounds,
            counters,
            quick,
            seed,
            plan: plans,
            model,
        } => {
            let format = Format::from(format);
            let model_cfg = gpt2::config::Config::by_name(&model)?;
            // gpt2's model-level table: `--op model`, or after gpt2's op ladders when no op is named.
            let model_table = family == gpt2::FAMILY && op.as_deref().is_none_or(|o| o == "model");
            let ops = if op.as_deref() == Some("model") && model_table {
                Vec::new()
            } else {
                select_ops(&family, op.as_deref())?
            };
            let overrides = shape.as_deref().map(Shape::parse).transpose()?;
            let each = each.as_deref().map(Shape::parse).transpose()?;
            let anchors: Vec<Anchor> = match anchors {
                Some(path) => read_anchors(&path)?,
                None => Vec::new(),
            };
            let mut timing = if quick { TimingConfig::quick() } else { TimingConfig::default() };
            timing.graph = graph;
            timing.batch = back_to_back as usize;
            timing.rounds = rounds as usize;
            let opts = RunOptions { stages, leave_one_out, sweeps: sweep, timing, seed };

            // Everything that can be checked without a GPU is checked first: unknown shape keys and
            // stage ranges are errors. A stage that cannot take the shape is an `n/a` row, and a shape
            // that no selected stage can take is an error naming each stage's constraint.
            let mut plan = Vec::new();
            for op in &ops {
                let shapes = match (&overrides, &each) {
                    (Some(o), _) => vec![op.default_shapes()[0].overlay(o, op.shape_keys())?],
                    (None, Some(o)) => {
                        op.default_shapes().iter().map(|s| s.overlay(o, op.shape_keys())).collect::<Result<_, _>>()?
                    }
                    (None, None) => op.default_shapes(),
                };
                let variants = common::runner::select_variants(*op, &opts)?;
                for s in &shapes {
                    let refusals: Vec<Error> = variants.iter().filter_map(|v| op.validate(v, s).err()).collect();
                    if refusals.len() == variants.len() {
                        return Err(refusals.into_iter().next().expect("at least one stage is selected"));
                    }
                }
                plan.push((*op, shapes));
            }

            plans.iter().try_for_each(|p| gpt2::plan::Plan::check_spec(p))?;
            if let Some(dir) = &out {
                // A folder that cannot be made is an error before the device is opened, not after the run.
                std::fs::create_dir_all(dir)
                    .map_err(|e| Error::Io { context: format!("create --out {}", dir.display()), source: e })?;
            }
            let started = Instant::now();
            let gpu = Gpu::open()?;
            let measuring = spinner("measuring ceilings (first run on this device)");
            let ceilings = Ceilings::get(&gpu);
            measuring.finish_and_clear();
            let ceilings = ceilings?;
            let uuid = gpu.info().uuid.clone();
            let save_dir = save_baseline.map(|n| kernel_ladder::baseline::dir(&uuid, &n)).transpose()?;
            let baseline_dir = baseline.map(|n| kernel_ladder::baseline::dir(&uuid, &n)).transpose()?;
            let total: usize = plan
                .iter()
                .map(|(op, shapes)| {
                    shapes.len() * (common::runner::select_variants(*op, &opts).map(|v| v.len()).unwrap_or(0))
                })
                .sum::<usize>()
                * repeat as usize;
            let bar = ProgressBar::new(total as u64);
            bar.set_style(
                ProgressStyle::with_template("[{elapsed}] {bar:30} {pos}/{len} stages, eta {average_eta} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .with_key("average_eta", average_eta),
            );
            // Redrawn while nothing else moves it (a family's compile, a long reference).
            bar.enable_steady_tick(std::time::Duration::from_millis(500));
            // Without a terminal the bar is not drawn: each table and family finished is a line
            // instead, so a log cut off still says how far the run got and what took the time.
            let logged = !std::io::stderr().is_terminal();
            let mut times = RunTimes::default();
            let mut failed = 0;
            let mut stdout = std::io::stdout();
            for (i, (op, shapes)) in plan.iter().enumerate() {
                let family = op.family();
                if plan[..i].iter().all(|(o, _)| o.family() != family) {
                    let compile = Instant::now();
                    let loaded = load_family_modules(&gpu, &plan, family, &opts, &bar);
                    let took = compile.elapsed().as_secs_f64();
                    times.family(family).compile_s += took;
                    times.family(family).total_s += took;
                    if logged {
                        eprintln!("{family}: {loaded} modules compiled and loaded in {took:.1} s");
                    }
                }
                for s in shapes {
                    let table_started = Instant::now();
                    // The CPU reference's share: from the inputs drawn to the first stage.
                    let mut reference_started: Option<Instant> = None;
                    let mut reference_s = 0.0;
                    let mut progress = |event: Progress| match event {
                        Progress::Inputs { shape } => {
                            reference_started = Some(Instant::now());
                            bar.set_message(format!("{family}/{} {shape}: inputs and CPU reference", op.name()))
                        }
                        Progress::Stage { shape, variant } => {
                            if let Some(t) = reference_started.take() {
                                reference_s += t.elapsed().as_secs_f64();
                            }
                            bar.set_message(format!(
                                "{family}/{} {shape}: {:02} {}",
                                op.name(),
                                variant.stage,
                                variant.name
                            ))
                        }
                        Progress::StageDone => bar.inc(1),
                    };
                    let runs = (0..repeat)
                        .map(|_| run_op(&gpu, &ceilings, *op, s, &opts, &mut progress))
                        .collect::<common::Result<Vec<Table>>>()?;
                    let mut table = runs[0].clone();
                    table.anchors = anchors
                        .iter()
                        .filter(|a| a.family == table.family && a.op == table.op && a.shape == table.shape)
                        .cloned()
                        .collect();
                    failed += table.rows.iter().filter(|r| matches!(r.status, Status::Failed(_))).count();
                    let mut extra = String::new();
                    if counters {
                        for (name, why) in instruments::add_counters(&mut table, &bar)? {
                            extra.push_str(&format!("counters of {name}: {why}\n"));
                        }
                        extra.push_str(&instruments::counters_block(&table));
                    }
                    if repeat > 1 {
                        let spread = kernel_ladder::baseline::spread(&runs);
                        extra.push_str(&kernel_ladder::baseline::spread_markdown(&table, &spread, REPEAT_LIMIT));
                    }
                    if let Some(dir) = &baseline_dir {
                        match kernel_ladder::baseline::load(dir, &table)? {
                            // A baseline timed in another mode is named, not compared, and the
                            // run's own table still prints.
                            Some(before) => match kernel_ladder::compare::compare(&before, &table) {
                                Ok(changes) => extra.push_str(&format!(
                                    "\nAgainst baseline {}:\n\n{}",
                                    dir.display(),
                                    kernel_ladder::compare::markdown(&before, &table, &changes)
                                )),
                                Err(e) => {
                                    extra.push_str(&format!("\n(baseline in {} not compared: {e})\n", dir.display()))
                                }
                            },
                            None => extra.push_str(&format!("\n(no baseline of this table in {})\n", dir.display())),
                        }
                    }
                    bar.suspend(|| {
                        let _ = writeln!(stdout, "{}{extra}", render(&table, format));
                    });
                    if let Some(dir) = &out {
                        write_table(dir, &table)?;
                    }
                    if let Some(dir) = &save_dir {
                        let path = kernel_ladder::baseline::save(dir, &table)?;
                        bar.suspend(|| eprintln!("saved baseline {}", path.display()));
                    }
                    let took = table_started.elapsed().as_secs_f64();
                    let family_time = times.family(family);
                    family_time.total_s += took;
                    family_time.reference_s += reference_s;
                    family_time.tables += 1;
                    if logged {
                        eprintln!(
                            "[{:.0} s] {family}/{} {}: {} stages in {took:.1} s (reference {reference_s:.1} s)",
                            started.elapsed().as_secs_f64(),
                            op.name(),
                            table.shape,
                            table.rows.len()
                        );
                    }
                }
            }
            bar.finish_and_clear();
            if model_table {
                let opts = TableOptions {
                    plans: if plans.is_empty() { TableOptions::default().plans } else { plans },
                    leave_one_out,
                    quick,
                    ..TableOptions::default()
                };
                let model_started = Instant::now();
                let bar = spinner("gpt2/model");
                let mut table = gpt2::table::model_table(&gpu, model_cfg, &opts, &mut |m| {
                    if logged {
                        eprintln!("gpt2/model: {m}");
                    }
                    bar.set_message(format!("gpt2/model: {m}"))
                })?;
                bar.finish_and_clear();
                // An anchor of another size names its model in its shape (`decode b=1,model=gpt2-xl`).
                let of_model = |shape: &str| {
                    shape.split(',').find_map(|kv| kv.strip_prefix("model=")).unwrap_or("gpt2") == model.as_str()
                };
                table.anchors = anchors
                    .iter()
                    .filter(|a| a.family == gpt2::FAMILY && a.op == "model" && of_model(&a.shape))
                    .cloned()
                    .collect();
                failed += table.failures();
                let md = table.markdown();
                println!(
                    "{}",
                    if format == Format::Json {
                        serde_json::to_string_pretty(&table).unwrap_or_default()
                    } else {
                        md.clone()
                    }
                );
                if let Some(dir) = &out {
                    let io = |source| Error::Io { context: format!("writing into {}", dir.display()), source };
                    std::fs::create_dir_all(dir).map_err(io)?;
                    std::fs::write(dir.join("gpt2-model.md"), &md).map_err(io)?;
                    let json = serde_json::to_vec_pretty(&table).unwrap_or_default();
                    std::fs::write(dir.join("gpt2-model.json"), json).map_err(io)?;
                }
                let family_time = times.family(gpt2::FAMILY);
                family_time.total_s += model_started.elapsed().as_secs_f64();
                family_time.tables += 1;
            }
            times.total_s = started.elapsed().as_secs_f64();
            eprint!("{}", times.render(Format::Table));
            if format == Format::Json {
                println!("{}", times.render(Format::Json));
            }
            if let Some(dir) = &out {
                let io = |source| Error::Io { context: format!("writing into {}", dir.display()), source };
                std::fs::create_dir_all(dir).map_err(io)?;
                std::fs::write(dir.join("run-times.json"), times.render(Format::Json)).map_err(io)?;
                std::fs::write(dir.join("run-times.md"), times.render(Format::Markdown)).map_err(io)?;
            }
            if failed > 0 {
                eprintln!("{failed} stage(s) FAILED verification or launch");
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Compiles and loads, all at once, the modules of every selected stage of `family`'s ops in `plan`
/// at each of the op's shapes it takes, as it is compiled there (per-shape defines and a composed
/// stage's builds of other ladders' stages included: `common::builds_for`); returns how many were
/// loaded.
fn load_family_modules(
    gpu: &Gpu,
    plan: &[(&'static dyn Op, Vec<Shape>)],
    family: &str,
    opts: &RunOptions,
    bar: &ProgressBar,
) -> usize {
    let ops: Vec<&(&'static dyn Op, Vec<Shape>)> = plan.iter().filter(|(op, _)| op.family() == family).collect();
    let mut compiled = Vec::new();
    for (op, shapes) in ops.iter().copied() {
        let selected = common::runner::select_variants(*op, opts).unwrap_or_default();
        compiled.extend(common::builds_for(gpu, *op, shapes, &selected));
    }
    bar.set_message(format!(
        "{family}: compiling the modules of {} stage-shape pairs (NVRTC, every core)",
        compiled.len()
    ));
    gpu.load_builds(&compiled)
}

/// The time left at the run's average pace so far (stages differ too much for a recent rate).
fn average_eta(state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write) {
    let (done, elapsed) = (state.pos(), state.elapsed().as_secs_f64());
    let left = state.len().unwrap_or(done).saturating_sub(done);
    let _ = if done == 0 {
        write!(w, "-")
    } else {
        let secs = (elapsed / done as f64 * left as f64).round() as u64;
        write!(w, "{}m{:02}s", secs / 60, secs % 60)
    };
}

fn spinner(msg: &str) -> ProgressBar {
    let s = ProgressBar::new_spinner();
    s.set_message(msg.to_string());
    s.enable_steady_tick(std::time::Duration::from_millis(120));
    s
}

fn read_anchors(path: &std::path::Path) -> common::Result<Vec<Anchor>> {
    #[derive(serde::Deserialize)]
    struct File {
        anchors: Vec<Anchor>,
    }
    let io = |source| Error::Io { context: format!("reading anchors {}", path.display()), source };
    let bytes = std::fs::read(path).map_err(io)?;
    let file: File = serde_json::from_slice(&bytes).map_err(|e| Error::Io {
        context: format!("parsing anchors {}", path.display()),
        source: std::io::Error::other(e),
    })?;
    Ok(file.anchors)
}

/// A table `ladder run --out` saved as JSON.
/// JSON, Markdown and the SVG chart of `table` in `dir`.
fn write_table(dir: &std::path::Path, table: &Table) -> common::Result<()> {
    let io = |source| Error::Io { context: format!("writing into {}", dir.display()), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    let stem = kernel_ladder::baseline::table_stem(table);
    std::fs::write(dir.join(format!("{stem}.json")), render(table, Format::Json)).map_err(io)?;
    std::fs::write(dir.join(format!("{stem}.md")), render(table, Format::Markdown)).map_err(io)?;
    write_chart(dir, &stem, table)?;
    Ok(())
}

/// `dir/stem.svg`, unless no stage passed.
fn write_chart(dir: &std::path::Path, stem: &str, table: &Table) -> common::Result<Option<PathBuf>> {
    let Some(svg) = kernel_ladder::chart::svg(table)? else { return Ok(None) };
    let path = dir.join(format!("{stem}.svg"));
    let io = |source| Error::Io { context: format!("writing {}", path.display()), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(&path, svg).map_err(io)?;
    Ok(Some(path))
}

/// The ops of `family` (or of every family, for `all`), or only the one named `op`.
fn select_ops(family: &str, op: Option<&str>) -> common::Result<Vec<&'static dyn Op>> {
    let families = if family == "all" { kernel_ladder::families() } else { vec![kernel_ladder::family(family)?] };
    let mut ops: Vec<&'static dyn Op> = families.iter().flat_map(|f| f.ops()).collect();
    if let Some(name) = op {
        let known: Vec<&str> = ops.iter().map(|o| o.name()).collect();
        ops.retain(|o| o.name() == name);
        if ops.is_empty() {
            return Err(Error::Unknown { what: "op", name: name.to_string(), known: known.join(", ") });
        }
    }
    Ok(ops)
}

/// `NAME=value,...` with unsigned values (tunables, or stage-list defines); errors name `flag`.
/// How `resources` and `sass` build a stage beyond its stage list: what the host sets per shape or
/// per call.
#[derive(clap::Args)]
struct BuildSettings {
    /// NAME=value,... tunables set on the stage (`resources`: on every selected stage that declares
    /// all of them, the others left out): a configuration the host picks at some shape, or a sweep
    /// point.
    #[arg(long)]
    config: Option<String>,
    /// NAME=value,... stage-list defines replaced (`resources`: on every selected stage that has all
    /// of them, the others left out): what the host sets per shape where a define, not a tunable,
    /// carries it (a wave-fitted stage's WS_BN).
    #[arg(long = "define")]
    defines: Option<String>,
    /// NAME,... switches (`-DNAME=1`) turned on: what the host sets per call rather than per stage
    /// (linear-bf16's OUT_BF16 for a bf16 output, stages 12 on; LADDER_DEPENDENT for a link of the
    /// decode step's chain).
    #[arg(long = "switch", value_delimiter = ',')]
    switches: Vec<String>,
}

/// Tunables, defines and switches, parsed.
type Settings = (Vec<(String, u32)>, Vec<(String, u32)>, Vec<String>);

impl BuildSettings {
    fn parse(self) -> common::Result<Settings> {
        let config = self.config.as_deref().map(|c| parse_settings("--config", c)).transpose()?.unwrap_or_default();
        let defines = self.defines.as_deref().map(|d| parse_settings("--define", d)).transpose()?.unwrap_or_default();
        Ok((config, defines, self.switches))
    }
}

fn parse_settings(flag: &str, s: &str) -> common::Result<Vec<(String, u32)>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|pair| {
            let bad =
                || Error::constraint(format!("{flag} as NAME=value,... with unsigned values"), format!("'{pair}'"));
            let (n, v) = pair.split_once('=').ok_or_else(bad)?;
            let v = v.trim().parse::<u32>().map_err(|_| bad())?;
            Ok((n.trim().to_string(), v))
        })
        .collect()
}

/// The stages of `op`, then (when asked) its leave-one-out rows, then every point of each stage's
/// declared sweep space: the rows `ladder verify` and `ladder resources` pick from.
fn stage_rows(op: &dyn Op, leave_one_out: bool, sweep_points: bool) -> Vec<common::Variant> {
    let declared = op.variants();
    let points: Vec<common::Variant> =
        declared.iter().filter(|_| sweep_points).flat_map(|v| Grid::declared(v).derive(v)).collect();
    let rows = op.leave_one_out().into_iter().filter(|_| leave_one_out);
    declared.into_iter().chain(rows).chain(points).collect()
}

/// The stages `ladder verify` runs: every stage and leave-one-out row of `op` (and with
/// `sweep_points` every point of each stage's declared sweep space), or the one named `name` (a
/// sweep point `base[T=v]` names its declared stage) with `config` set.
fn verify_variants(
    op: &dyn Op,
    no_library: bool,
    sweep_points: bool,
    name: Option<&str>,
    config: &[(String, u32)],
) -> common::Result<Vec<common::Variant>> {
    let all: Vec<common::Variant> = stage_rows(op, true, sweep_points)
        .into_iter()
        .filter(|v| !(no_library && matches!(v.source, Source::Library(_))))
        .collect();
    let Some(name) = name else { return Ok(all) };
    let base_name = name.split_once('[').map_or(name, |(b, _)| b);
    let base = all.iter().find(|v| v.name == base_name).ok_or_else(|| {
        let known: Vec<&str> = all.iter().map(|v| v.name.as_ref()).collect();
        Error::Unknown { what: "stage name", name: name.to_string(), known: known.join(", ") }
    })?;
    let mut v = base.with_config(config)?;
    v.name = name.to_string().into();
    Ok(vec![v])
}

/// The stages `ladder resources` compiles: those of `op` in `stages` (with the leave-one-out rows
/// and declared sweep points when asked) that declare every tunable of `config` and have every
/// define of `defines`, with them set.
fn resource_variants(
    op: &dyn Op,
    stages: Option<(u32, u32)>,
    config: &[(String, u32)],
    defines: &[(String, u32)],
    leave_one_out: bool,
    sweep_points: bool,
) -> Vec<common::Variant> {
    stage_rows(op, leave_one_out, sweep_points)
        .into_iter()
        .filter(|v| stages.is_none_or(|(a, b)| (a..=b).contains(&v.stage)))
        .filter_map(|v| {
            let mut v = v.with_config(config).ok()?;
            defines.iter().try_for_each(|(name, value)| v.set_define(name, *value)).ok()?;
            Some(v)
        })
        .collect()
}

/// The first line of an error message (NVRTC logs and driver errors run long).
fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}
