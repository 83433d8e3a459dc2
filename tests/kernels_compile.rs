//! NVRTC-compiles every registered kernel variant of every family for sm_80 and sm_90a (variants
//! that need Hopper-only instructions for sm_90a alone), and checks the stage lists against the
//! files. Compiling needs NVRTC and the CUDA headers, not a GPU: without them those tests are
//! counted as ignored, and fail instead with LADDER_REQUIRE_NVRTC=1.

use common::testing::Suite;
use common::{Arch, Generator, Grid, KernelSource, Source, Variant};

fn compile_everything(tc: &common::Toolchain) {
    let mut jobs: Vec<(&'static common::Sources, Variant, &'static str, Arch)> = Vec::new();
    // The harness's own kernels (empty kernel, gate, non-finite count).
    for v in [common::harness::noop(), common::harness::gate(), common::harness::non_finite()] {
        let Source::Kernel(path) = v.source else { continue };
        jobs.extend([Arch::SM80, Arch::SM90A].map(|arch| (&common::harness::SOURCES, v.clone(), path, arch)));
    }
    for family in kernel_ladder::families() {
        for op in family.ops() {
            // Every declared stage, leave-one-out row and point of a declared sweep space: a
            // configuration `ladder sweep` would try must compile (or be refused by the kernel's
            // own static checks, which none of the declared spaces should hit).
            let points = op.variants().into_iter().flat_map(|v| Grid::declared(&v).derive(&v));
            for v in op.variants().into_iter().chain(op.leave_one_out()).chain(points) {
                let Source::Kernel(path) = v.source else { continue };
                for arch in [Arch::SM80, Arch::SM90A] {
                    // A stage is compiled for the architectures it runs on: sm_90a only for the
                    // arch-specific ones, and none below its minimum compute capability.
                    let below = (arch.major, arch.minor) < v.requires.min_cc;
                    if (v.requires.arch_specific && arch != Arch::SM90A) || below {
                        continue;
                    }
                    jobs.push((family.sources(), v.clone(), path, arch));
                }
            }
        }
    }
    for (sources, v) in decode_step_switched_builds() {
        let Source::Kernel(path) = v.source else { continue };
        jobs.extend([Arch::SM80, Arch::SM90A].map(|arch| (sources, v.clone(), path, arch)));
    }
    let count = jobs.len();
    let failures: Vec<String> = common::nvrtc::compile_on_every_core(
        jobs,
        |(_, v, _, _)| v.stage,
        |(sources, v, path, arch)| {
            let result = sources
                .find(path)
                .and_then(|src| tc.compile(&v.id(), src, &sources.headers()?, &v.compile_defines(), arch));
            match result {
                Ok(c) if !c.image.is_empty() => None,
                Ok(_) => Some(format!("{} {arch}: empty image", v.id())),
                Err(e) => Some(format!("{} {arch}: {e}", v.id())),
            }
        },
    )
    .into_iter()
    .flatten()
    .collect();
    assert!(failures.is_empty(), "{} failed:\n{}", failures.len(), failures.join("\n\n"));
    println!("kernels_compile: {count} variant/arch pairs compiled");
}

/// The composed decode steps' host-switched builds (dependent launch, the QKV append, the advancing
/// argmax), each once.
fn decode_step_switched_builds() -> Vec<(&'static common::Sources, Variant)> {
    let step = gpt2::decode_step::DecodeStep;
    let mut switched: Vec<(&'static common::Sources, Variant)> = Vec::new();
    for v in common::Op::variants(&step) {
        for (sources, b) in common::Op::extra_builds(&step, &v, &common::Op::default_shapes(&step)[0]) {
            if !switched.iter().any(|(s, o)| {
                s.family == sources.family && o.id() == b.id() && o.compile_defines() == b.compile_defines()
            }) {
                switched.push((sources, b));
            }
        }
    }
    switched
}

/// Every build launched as a programmatic dependent (a stage list's, or a composed decode step's
/// switched one) has a stage file that waits for the kernel before it: what `Gpu::prepare_launch`
/// refuses at run time, found without a GPU.
fn dependent_builds_wait_in_their_files() {
    let mut builds: Vec<(&'static common::Sources, Variant)> = Vec::new();
    for family in kernel_ladder::families() {
        for op in family.ops() {
            builds.extend(op.variants().into_iter().chain(op.leave_one_out()).map(|v| (family.sources(), v)));
        }
    }
    builds.extend(decode_step_switched_builds());
    let mut dependent = 0;
    for (sources, v) in builds.into_iter().filter(|(_, v)| v.has(common::DEPENDENT_LAUNCH)) {
        let Source::Kernel(path) = v.source else { panic!("{}: a dependent build without a kernel file", v.id()) };
        let text = sources.find(path).unwrap_or_else(|e| panic!("{e}")).text;
        assert!(text.contains(common::DEPENDENT_WAIT), "{}: {path} never calls {}", v.id(), common::DEPENDENT_WAIT);
        dependent += 1;
    }
    assert!(dependent > 0, "no dependent build found: the check checks nothing");
}

/// Every family has at least one real kernel that compiles for both architectures.
fn every_family_has_a_kernel_stage() {
    for family in kernel_ladder::families() {
        let kernels = family
            .ops()
            .iter()
            .flat_map(|op| op.variants())
            .filter(|v| matches!(v.source, Source::Kernel(_)) && !v.requires.arch_specific)
            .count();
        assert!(kernels > 0, "family {} has no kernel stage", family.name());
    }
}

/// Library rows, and only they, are numbered from `LIBRARY_STAGES` (what readers of saved tables
/// rely on).
fn library_rows_numbered_from_90() {
    for family in kernel_ladder::families() {
        for v in family.ops().iter().flat_map(|op| op.variants()) {
            let library = matches!(v.source, Source::Library(_));
            assert_eq!(library, v.stage >= common::variant::LIBRARY_STAGES, "{}: stage {}", v.id(), v.stage);
        }
    }
}

fn stage_lists_match_kernel_files() {
    for family in kernel_ladder::families() {
        if let Err(problems) = common::testing::check_stage_files(family) {
            panic!("family {}:\n{problems}", family.name());
        }
    }
}

/// Every family's documented limits are checked in Rust (header `Limits:` lines against the ops'
/// declared limits, and each limit's shapes against `validate`).
fn documented_limits_everywhere() {
    for family in kernel_ladder::families() {
        common::testing::check_limits(family).unwrap_or_else(|e| panic!("family {}:\n{e}", family.name()));
    }
}

/// No two families' headers collide, and every family's module cache key names the family.
fn families_have_distinct_headers() {
    for family in kernel_ladder::families() {
        family.sources().headers().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(family.sources().family, family.name());
    }
}

/// A broken kernel source is a typed compile error that names the variant and carries NVRTC's own
/// log (the line and the message), not a panic and not a silent empty image.
fn broken_source_is_a_compile_error_with_the_log(tc: &common::Toolchain) {
    let broken = KernelSource {
        path: "broken/00_broken.cu",
        text: "extern \"C\" __global__ void k(float* x) { x[0] = undeclared_name; }\n",
    };
    let err = tc.compile("test/broken/00-broken", &broken, &[], &[], Arch::SM90A).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, common::Error::Compile { .. }), "{text}");
    assert!(text.lines().next().unwrap().contains("test/broken/00-broken"), "{text}");
    assert!(text.contains("undeclared_name"), "NVRTC's log is missing: {text}");
}

/// The resource report (`ladder resources`) reads ptxas's log of this NVRTC: for the first and the
/// last kernel stage of every op, one row per entry point of the module's PTX, with a register count
/// ptxas could have allocated, read from ptxas's own report (not the driver's fallback reading); and
/// a kernel held to 32 registers that needs more reports its spills, compiled twice without this
/// crate's cache (a repeated compile is what NVRTC's own cache, 12.9 and later with a driver,
/// answers without a ptxas report) and twice through it (which keeps the log with the cubin).
fn resource_report_reads_every_entry(tc: &common::Toolchain) {
    for family in kernel_ladder::families() {
        for op in family.ops() {
            let kernels: Vec<Variant> =
                op.variants().into_iter().filter(|v| matches!(v.source, Source::Kernel(_))).collect();
            let ends: Vec<Variant> = kernels.first().into_iter().chain(kernels.last()).cloned().collect();
            for r in kernel_ladder::resources::measure(tc, op, &ends, Arch::SM90A) {
                let id = format!("{}/{}/{:02}", r.family, r.op, r.stage);
                let v = ends.iter().find(|v| v.stage == r.stage).unwrap();
                let Source::Kernel(path) = v.source else { unreachable!() };
                let src = family.sources().find(path).unwrap();
                let ptx =
                    tc.compile(&v.id(), src, &family.sources().headers().unwrap(), &v.compile_defines(), Arch::SM90A);
                let ptx = ptx.unwrap_or_else(|e| panic!("{e}")).ptx;
                let mut in_ptx = kernel_ladder::resources::entry_names(&ptx);
                let entries = r.entries.as_ref().unwrap_or_else(|e| panic!("{id}: {e}"));
                let mut reported: Vec<&str> = entries.iter().map(|e| e.entry.as_str()).collect();
                in_ptx.sort_unstable();
                reported.sort_unstable();
                assert_eq!(reported, in_ptx, "{id}: entries reported against the PTX's");
                for e in entries {
                    assert!((1..=255).contains(&e.registers), "{id} {}: {} registers", e.entry, e.registers);
                }
            }
        }
    }
    let pressed = KernelSource {
        path: "pressed/00_pressed.cu",
        text: "extern \"C\" __global__ void __launch_bounds__(1024, 2) pressed(float* x, int n) {
    float v[96];
#pragma unroll
    for (int i = 0; i < 96; ++i) v[i] = x[i * n + threadIdx.x];
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int i = 0; i < 96; ++i) s += v[i] * v[(i + r) % 96];
    x[threadIdx.x] = s;
}
",
    };
    let fresh = tc.uncached();
    let e = fresh.resources("test/pressed/00-pressed", &pressed, &[], &[], Arch::SM90A).unwrap();
    // The same program again: NVRTC 12.9 and later (with a driver present) would serve it from their
    // own cache without running ptxas, and so without a report, unless told not to (`--no-cache`).
    let again = fresh.resources("test/pressed/00-pressed", &pressed, &[], &[], Arch::SM90A);
    assert_eq!(again.as_ref().ok(), Some(&e), "compiled twice: {again:?}");
    // Through this crate's cache (CI's fresh LADDER_CACHE_DIR): the second compile is read back
    // from it, with the report.
    assert!(common::nvrtc::cache_dir().is_some(), "a kernel cache directory (LADDER_CACHE_DIR or HOME)");
    let compile = || tc.compile("test/pressed/00-pressed", &pressed, &[], &[], Arch::SM90A).unwrap();
    let (_, second) = (compile(), compile());
    assert!(second.from_cache, "the second compile was not read from the cache");
    assert_eq!(common::EntryResources::parse(&second.log), e, "the cached log's report: {}", second.log);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].registers <= 32, "{e:?}");
    assert!(e[0].spill_store_bytes > 0 && e[0].spill_load_bytes > 0 && e[0].stack_bytes > 0, "{e:?}");
}

/// `ladder sass` reads a stage: the tensor-core GEMV's entry points hold HMMA and no spills, a wgmma
/// stage of `linear-bf16` holds HGMMA, and its main loop is where they are.
fn sass_reads_a_stage(tc: &common::Toolchain) {
    use common::Op;
    use kernel_ladder::sass::{self, Summary};
    let stage = |op: &dyn Op, n: u32| op.variants().into_iter().find(|v| v.stage == n).expect("the stage");
    let gemv = sass::disassemble(tc, &matmul::SOURCES, &stage(&matmul::gemv::Gemv, 4), Arch::SM90A).unwrap().functions;
    let m8 = gemv.iter().find(|f| f.name == "gemv_mma_m8").expect("the M <= 8 entry");
    let s = Summary::of(&m8.instructions);
    assert!(s.get("HMMA") >= 2 && s.get("global ld") > 0, "{s:?}");
    assert_eq!(s.get("spills"), 0, "{s:?}");
    let op = matmul::linear_bf16::LinearBf16;
    let wgmma = op.variants().into_iter().find(|v| v.requires.arch_specific).expect("a wgmma stage");
    let d = sass::disassemble(tc, &matmul::SOURCES, &wgmma, Arch::SM90A).unwrap();
    assert!(d.ptx.contains(".entry") && d.ptx.contains("wgmma.mma_async"), "the PTX ptxas read");
    let functions = d.functions;
    let f = functions.iter().find(|f| Summary::of(&f.instructions).get("HGMMA") > 0).expect("HGMMA somewhere");
    let body = f.main_loop().expect("a main loop");
    assert!(Summary::of(&f.instructions[body]).get("HGMMA") > 0, "{}: the main loop holds the HGMMAs", f.name);
    // prefill-bf16 stage 13 compiles its row max twice, with the mask and without, and branches
    // between them: a turn runs fewer instructions than the loop's static count.
    let s13 = stage(&attention::prefill_bf16::PrefillBf16, 13);
    let functions = sass::disassemble(tc, &attention::SOURCES, &s13, Arch::SM90A).unwrap().functions;
    let f = functions.iter().find(|f| f.name == "attention_bf16_wgmma_hs128").expect("the HS = 128 entry");
    let body = f.main_loop().expect("the key-tile loop");
    let ((fewest, most), total) = (f.turn_lengths(body.clone()), Summary::of(&f.instructions[body]).total);
    assert!(fewest < most && most < total, "a turn runs {fewest}..{most} of {total}");
}

fn main() -> std::process::ExitCode {
    Suite::new()
        .nvrtc("kernels_compile", compile_everything)
        .nvrtc("broken_source_is_a_compile_error_with_the_log", broken_source_is_a_compile_error_with_the_log)
        .nvrtc("resource_report_reads_every_entry", resource_report_reads_every_entry)
        .nvrtc("sass_reads_a_stage", sass_reads_a_stage)
        .cpu("every_family_has_a_kernel_stage", every_family_has_a_kernel_stage)
        .cpu("library_rows_numbered_from_90", library_rows_numbered_from_90)
        .cpu("stage_lists_match_kernel_files", stage_lists_match_kernel_files)
        .cpu("documented_limits_everywhere", documented_limits_everywhere)
        .cpu("families_have_distinct_headers", families_have_distinct_headers)
        .cpu("dependent_builds_wait_in_their_files", dependent_builds_wait_in_their_files)
        .main()
}
