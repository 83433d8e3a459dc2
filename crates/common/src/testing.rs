//! Helpers for tests that need a GPU or NVRTC. Without one they print `SKIP <test>: <reason>` and
//! the test returns; with `LADDER_REQUIRE_GPU=1` (or `LADDER_REQUIRE_NVRTC=1`) they fail instead.

use std::sync::{Arc, OnceLock};

use crate::family::{Family, Op};
use crate::gpu::Gpu;
use crate::nvrtc::Toolchain;
use crate::runner::verify_once;
use crate::shape::Shape;
use crate::variant::{Source, Variant};

fn required(var: &str) -> bool {
    std::env::var(var).map(|v| v == "1").unwrap_or(false)
}

/// The process's GPU, or `None` after printing a SKIP line. Panics (fails the test) when
/// `LADDER_REQUIRE_GPU=1` and there is no usable device.
pub fn gpu(test: &str) -> Option<Arc<Gpu>> {
    static GPU: OnceLock<Result<Arc<Gpu>, String>> = OnceLock::new();
    match GPU.get_or_init(|| Gpu::open().map_err(|e| e.to_string())) {
        Ok(g) => Some(g.clone()),
        Err(reason) if required("LADDER_REQUIRE_GPU") => panic!("{test}: LADDER_REQUIRE_GPU=1 but {reason}"),
        Err(reason) => {
            println!("SKIP {test}: {reason}");
            None
        }
    }
}

/// NVRTC and the CUDA headers, or `None` after a SKIP line (a failure with `LADDER_REQUIRE_NVRTC=1`).
pub fn nvrtc(test: &str) -> Option<Arc<Toolchain>> {
    match crate::nvrtc::toolchain() {
        Ok(t) => Some(t),
        Err(e) if required("LADDER_REQUIRE_NVRTC") => panic!("{test}: LADDER_REQUIRE_NVRTC=1 but {e}"),
        Err(e) => {
            println!("SKIP {test}: {e}");
            None
        }
    }
}

/// Verifies every stage of `op` at `shape` on the same fresh inputs and panics with every failure
/// listed. Stages whose constraints exclude the shape are checked to be refused with a typed error,
/// not run.
pub fn assert_stages_pass(gpu: &Gpu, op: &dyn Op, shape: &Shape, variants: &[Variant]) {
    let seed = crate::data::fresh_seed();
    let mut problem = match op.problem(gpu, shape, seed) {
        Ok(p) => p,
        Err(e) => panic!("{}/{} {shape}: problem setup failed: {e}", op.family(), op.name()),
    };
    let mut failures = Vec::new();
    for v in variants {
        if gpu.supports(v).is_err() || op.validate(v, shape).is_err() {
            continue;
        }
        match verify_once(gpu, problem.as_mut(), v) {
            Ok(ver) if ver.passed() => {}
            Ok(ver) => failures.push(format!("{}: {}", v.id(), ver.summary())),
            Err(e) => failures.push(format!("{}: {e}", v.id())),
        }
    }
    assert!(failures.is_empty(), "{}/{} {shape} (seed {seed}):\n{}", op.family(), op.name(), failures.join("\n"));
}

/// The stage list and the `.cu` files agree: every kernel variant names an embedded file, and every
/// `.cu` file under `kernels/` is named by some variant (headers excepted).
pub fn check_stage_files(family: &dyn Family) -> Result<(), String> {
    let sources = family.sources();
    let mut problems = Vec::new();
    let mut used = std::collections::HashSet::new();
    for op in family.ops() {
        for v in op.variants().into_iter().chain(op.leave_one_out()) {
            if let Source::Kernel(path) = v.source {
                if !sources.iter().any(|s| s.path == path) {
                    problems.push(format!("{} names {path}, which is not under kernels/", v.id()));
                }
                if !path.starts_with(&format!("{}/", op.name())) {
                    problems.push(format!("{} names {path}, outside kernels/{}/", v.id(), op.name()));
                }
                used.insert(path);
            }
        }
    }
    for s in sources.iter().filter(|s| !s.is_header()) {
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
