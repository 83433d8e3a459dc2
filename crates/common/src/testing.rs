//! Tests that need a GPU or NVRTC, run by a harness that can ignore a test at run time
//! (libtest-mimic): without a device they are counted as *ignored* in the runner's own summary,
//! never as passed; with `LADDER_REQUIRE_GPU=1` (or `LADDER_REQUIRE_NVRTC=1`) they run and fail.
//! Each crate's `tests/gpu.rs` (`harness = false`) builds a [`Suite`] and calls [`Suite::main`].
//! Also here: the shared checks (every stage passes at a shape, stage lists against files, the
//! documented limits, graph capture).

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use libtest_mimic::{Arguments, Failed, Trial};

use crate::error::Error;
use crate::family::{Family, Op};
use crate::gpu::Gpu;
use crate::nvrtc::Toolchain;
use crate::runner::verify_once;
use crate::shape::Shape;
use crate::variant::{Source, Variant};

fn required(var: &str) -> bool {
    std::env::var(var).map(|v| v == "1").unwrap_or(false)
}

/// The process's GPU, opened once.
pub fn open_gpu() -> Result<Arc<Gpu>, String> {
    static GPU: OnceLock<Result<Arc<Gpu>, String>> = OnceLock::new();
    GPU.get_or_init(|| Gpu::open().map_err(|e| e.to_string())).clone()
}

/// NVRTC and the CUDA headers, located once.
pub fn open_nvrtc() -> Result<Arc<Toolchain>, String> {
    crate::nvrtc::toolchain().map_err(|e| e.to_string())
}

/// What a trial needs to run.
enum Needs {
    Gpu,
    Nvrtc,
}

/// A list of trials, each run only when what it needs is present (and ignored otherwise).
#[derive(Default)]
pub struct Suite {
    trials: Vec<Trial>,
    ignored_because: Vec<String>,
}

impl Suite {
    pub fn new() -> Suite {
        Suite::default()
    }

    /// A test that needs nothing but the CPU.
    pub fn cpu(mut self, name: &str, test: impl FnOnce() + Send + 'static) -> Suite {
        self.trials.push(Trial::test(name, move || run_catching(test)));
        self
    }

    /// A test that needs the GPU; it receives the process's device.
    pub fn gpu(mut self, name: &str, test: impl FnOnce(&Gpu) + Send + 'static) -> Suite {
        let trial = self.needing(Needs::Gpu, name, move || test(&open_gpu().expect("checked before the run")));
        self.trials.push(trial);
        self
    }

    /// A test that needs NVRTC and the CUDA headers, not a GPU.
    pub fn nvrtc(mut self, name: &str, test: impl FnOnce(&Toolchain) + Send + 'static) -> Suite {
        let trial = self.needing(Needs::Nvrtc, name, move || test(&open_nvrtc().expect("checked before the run")));
        self.trials.push(trial);
        self
    }

    fn needing(&mut self, needs: Needs, name: &str, test: impl FnOnce() + Send + 'static) -> Trial {
        let (available, var) = match needs {
            Needs::Gpu => (open_gpu().map(|_| ()), "LADDER_REQUIRE_GPU"),
            Needs::Nvrtc => (open_nvrtc().map(|_| ()), "LADDER_REQUIRE_NVRTC"),
        };
        match available {
            Ok(()) => {
                let name = name.to_string();
                Trial::test(name.clone(), move || {
                    // Each trial's wall time on stderr (the runner's log), so a suite that runs
                    // long says which trial to look at.
                    let start = std::time::Instant::now();
                    let outcome = run_catching(test);
                    eprintln!("trial {name}: {:.1} s", start.elapsed().as_secs_f64());
                    outcome
                })
            }
            Err(reason) if required(var) => {
                Trial::test(name, move || Err(Failed::from(format!("{var}=1 but {reason}"))))
            }
            Err(reason) => {
                if !self.ignored_because.contains(&reason) {
                    self.ignored_because.push(reason);
                }
                Trial::test(name, || Ok(())).with_ignored_flag(true)
            }
        }
    }

    /// Runs the trials with the command line's arguments (filters, `--test-threads`, ...).
    pub fn main(self) -> ExitCode {
        for reason in &self.ignored_because {
            println!("ignoring tests that need it: {reason}");
        }
        libtest_mimic::run(&Arguments::from_args(), self.trials).exit_code()
    }
}

fn run_catching(test: impl FnOnce()) -> Result<(), Failed> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(test)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into());
        Failed::from(msg)
    })
}

/// Runs `test` on `cases` values drawn from `strategy` (a property test inside a GPU trial); the
/// failing input is in the panic message.
pub fn proptest<S: proptest::strategy::Strategy>(cases: u32, strategy: S, test: impl Fn(S::Value))
where
    S::Value: std::fmt::Debug,
{
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config::with_cases(cases));
    let result = runner.run(&strategy, |v| {
        run_catching(|| test(v)).map_err(|f| proptest::test_runner::TestCaseError::fail(format!("{f:?}")))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Fails unless `r` is a typed constraint error whose constraint mentions `needle`.
pub fn assert_constraint<T: std::fmt::Debug>(r: crate::Result<T>, needle: &str) {
    match r {
        Err(Error::Constraint { constraint, got }) => {
            assert!(constraint.contains(needle), "constraint '{constraint}' (got {got}) should mention '{needle}'")
        }
        other => panic!("expected a constraint error mentioning '{needle}', got {other:?}"),
    }
}

/// `variants` (an op's stage list) are exactly `names`, in order, numbered 0, 1, 2, ... as listed.
pub fn assert_stage_names(variants: &[Variant], names: &[&str]) {
    let got: Vec<&str> = variants.iter().map(|v| v.name.as_ref()).collect();
    assert_eq!(got, names);
    for (i, v) in variants.iter().enumerate() {
        assert_eq!(v.stage as usize, i, "{}: stage numbers are the ladder order", v.name);
    }
}

/// Prepares and verifies every stage of `op` at `shape` on the same fresh inputs and panics with
/// every failure listed. Stages whose constraints exclude the shape are checked to be refused with a
/// typed error by `prepare` too, not run.
pub fn assert_stages_pass(gpu: &Gpu, op: &dyn Op, shape: &Shape, variants: &[Variant]) {
    assert_stages_pass_at(gpu, op, shape, variants, crate::data::fresh_seed());
}

/// [`assert_stages_pass`] on the inputs of a given seed (a failure's printed seed, kept as a test).
pub fn assert_stages_pass_at(gpu: &Gpu, op: &dyn Op, shape: &Shape, variants: &[Variant], seed: u64) {
    let mut problem = match op.problem(gpu, shape, seed) {
        Ok(p) => p,
        Err(e) => panic!("{}/{} {shape}: problem setup failed: {e}", op.family(), op.name()),
    };
    // Every stage's module for this shape compiled at once, on every core, before the first check.
    crate::family::preload(gpu, op, std::slice::from_ref(shape), variants);
    let mut failures = Vec::new();
    for v in variants {
        if gpu.supports(v).is_err() {
            continue;
        }
        if let Err(refused) = op.validate(v, shape) {
            match problem.prepare(gpu, v) {
                Err(e) if e.is_not_applicable() => {}
                other => failures.push(format!(
                    "{}: validate refused ({refused}) but prepare gave {:?}",
                    v.id(),
                    other.map(|_| ())
                )),
            }
            continue;
        }
        let outcome = problem.prepare(gpu, v).and_then(|_| verify_once(gpu, problem.as_mut()));
        match outcome {
            Ok(ver) if ver.passed() => {}
            Ok(ver) => failures.push(format!("{}: {}", v.id(), ver.summary())),
            Err(e) => failures.push(format!("{}: {e}", v.id())),
        }
    }
    assert!(failures.is_empty(), "{}/{} {shape} (seed {seed}):\n{}", op.family(), op.name(), failures.join("\n"));
}

/// Prepares `variant`, captures its launches on copy 0 as a CUDA graph, replays the graph into
/// poisoned outputs and verifies them: the path a model's graph-captured step takes.
pub fn assert_graph_replay_passes(gpu: &Gpu, op: &dyn Op, shape: &Shape, variant: &Variant) {
    let mut problem = op.problem(gpu, shape, crate::data::fresh_seed()).expect("problem");
    problem.prepare(gpu, variant).unwrap_or_else(|e| panic!("{}: prepare: {e}", variant.id()));
    problem.poison(gpu).expect("poison");
    gpu.synchronize().expect("sync");
    let graph = crate::timing::capture(gpu.stream(), |s| problem.enqueue(s, 0))
        .unwrap_or_else(|e| panic!("{}: {e}", variant.id()));
    for _ in 0..2 {
        graph.launch().expect("graph launch");
    }
    gpu.synchronize().expect("sync after replay");
    let ver = problem.verify(gpu, 0).expect("verify");
    assert!(ver.passed(), "{} replayed from a graph: {}", variant.id(), ver.summary());
}

/// The stage list and the `.cu` files agree: every kernel variant names an embedded file, and every
/// `.cu` file under `kernels/` is named by some variant (headers excepted).
pub fn check_stage_files(family: &dyn Family) -> Result<(), String> {
    let sources = family.sources();
    let mut problems = Vec::new();
    let mut used = HashSet::new();
    for op in family.ops() {
        for v in op.variants().into_iter().chain(op.leave_one_out()) {
            if let Source::Kernel(path) = v.source {
                if sources.find(path).is_err() {
                    problems.push(format!("{} names {path}, which is not under kernels/", v.id()));
                }
                if !path.starts_with(&format!("{}/", op.name())) {
                    problems.push(format!("{} names {path}, outside kernels/{}/", v.id(), op.name()));
                }
                used.insert(path);
            }
        }
    }
    for s in sources.files.iter().filter(|s| !s.is_header()) {
        if !used.contains(s.path) {
            problems.push(format!("kernels/{} is in no stage list", s.path));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// The constraints a stage header lists on its `// Limits: a; b; c` line (none without one).
pub fn header_limits(text: &str) -> Vec<String> {
    text.lines()
        .take_while(|l| l.starts_with("//"))
        .filter_map(|l| l.strip_prefix("// Limits:"))
        .flat_map(|l| l.split(';').map(|c| c.trim().to_string()).filter(|c| !c.is_empty() && c != "none"))
        .collect()
}

/// For every stage of every op of `family`: the limits its header documents are exactly those its op
/// declares, and each declared limit's `past` shape is refused by `validate` with that constraint
/// while its `inside` shape is accepted. Returns every problem found.
pub fn check_limits(family: &dyn Family) -> Result<usize, String> {
    let mut problems = Vec::new();
    let mut checked = 0;
    for op in family.ops() {
        for v in op.variants().into_iter().chain(op.leave_one_out()) {
            let declared = op.limits(&v);
            if let Source::Kernel(path) = v.source {
                match family.sources().find(path) {
                    Ok(src) => {
                        let header: HashSet<String> = header_limits(src.text).into_iter().collect();
                        let ours: HashSet<String> = declared.iter().map(|l| l.constraint.to_string()).collect();
                        for missing in header.difference(&ours) {
                            problems.push(format!("{}: header limit '{missing}' is not checked in Rust", v.id()));
                        }
                        for extra in ours.difference(&header) {
                            problems.push(format!("{}: Rust checks '{extra}', which its header does not list", v.id()));
                        }
                    }
                    Err(e) => problems.push(e.to_string()),
                }
            }
            for limit in declared {
                checked += 1;
                match op.validate(&v, &limit.past) {
                    Err(Error::Constraint { constraint, .. }) if constraint == limit.constraint => {}
                    other => problems.push(format!(
                        "{}: {} past its limit ({}) gave {other:?}, not that constraint",
                        v.id(),
                        limit.constraint,
                        limit.past
                    )),
                }
                if let Some(inside) = &limit.inside {
                    if let Err(e) = op.validate(&v, inside) {
                        problems.push(format!("{}: {} just inside ({inside}) refused: {e}", v.id(), limit.constraint));
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(checked)
    } else {
        Err(problems.join("\n"))
    }
}

/// On the GPU: each stage refuses its limits' `past` shapes in `prepare` too (the public path, not
/// only `validate`) and verifies at their `inside` shapes.
pub fn assert_limits_on_gpu(gpu: &Gpu, family: &dyn Family) {
    let mut failures = Vec::new();
    for op in family.ops() {
        for v in op.variants() {
            if gpu.supports(&v).is_err() {
                continue;
            }
            for limit in op.limits(&v) {
                // Limits with no `inside` shape are the 2^31-element index limits: their `past` shapes
                // are too large for a CPU reference, so `validate` (the CPU test) covers them. The
                // problem itself may refuse a shape no stage can take; then prepare is never reached.
                let problem =
                    limit.inside.as_ref().and_then(|_| op.problem(gpu, &limit.past, crate::data::fresh_seed()).ok());
                if let Some(mut problem) = problem {
                    match problem.prepare(gpu, &v) {
                        Err(Error::Constraint { constraint, .. }) if constraint == limit.constraint => {}
                        other => failures.push(format!(
                            "{}: prepare past '{}' gave {:?}",
                            v.id(),
                            limit.constraint,
                            other.map(|_| ())
                        )),
                    }
                }
                if let Some(inside) = &limit.inside {
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        assert_stages_pass(gpu, op, inside, std::slice::from_ref(&v))
                    }));
                    if outcome.is_err() {
                        failures.push(format!("{}: failed just inside '{}' ({inside})", v.id(), limit.constraint));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_limits_are_read_from_the_header_only() {
        let text = "// Stage 1\n// Limits: T <= 8192; rows * T < 2^31\n// Tolerance\n#include \"x\"\n// Limits: no\n";
        assert_eq!(header_limits(text), ["T <= 8192", "rows * T < 2^31"]);
        assert!(header_limits("// Limits: none\n").is_empty());
    }
}
