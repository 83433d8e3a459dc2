//! NVRTC-compiles every registered kernel variant of every family for sm_80 and sm_90a (variants
//! that need Hopper-only instructions for sm_90a alone). Needs NVRTC and the CUDA headers, not a
//! GPU: it prints SKIP without them, and fails instead with LADDER_REQUIRE_NVRTC=1.

use common::module::headers_for;
use common::{Arch, KernelSource, Source};

#[test]
fn kernels_compile() {
    let Some(tc) = common::testing::nvrtc("kernels_compile") else { return };
    let mut jobs = Vec::new();
    for family in kernel_ladder::families() {
        for op in family.ops() {
            for v in op.variants().into_iter().chain(op.leave_one_out()) {
                let Source::Kernel(path) = v.source else { continue };
                for arch in [Arch::SM80, Arch::SM90A] {
                    if v.requires.arch_specific && arch != Arch::SM90A {
                        continue;
                    }
                    jobs.push((family.sources(), v.clone(), path, arch));
                }
            }
        }
    }
    let failures = std::sync::Mutex::new(Vec::new());
    let compiled = std::sync::atomic::AtomicUsize::new(0);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((sources, v, path, arch)) = jobs.get(i) else { break };
                let result = KernelSource::find(sources, path)
                    .and_then(|src| tc.compile(&v.id(), src, &headers_for(sources), &v.defines, *arch));
                match result {
                    Ok(c) if !c.image.is_empty() => {
                        compiled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(_) => failures.lock().unwrap().push(format!("{} {arch}: empty image", v.id())),
                    Err(e) => failures.lock().unwrap().push(format!("{} {arch}: {e}", v.id())),
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{} failed:\n{}", failures.len(), failures.join("\n\n"));
    println!("kernels_compile: {} variant/arch pairs compiled", compiled.into_inner());
}

/// Every family has at least one real kernel that compiles for both architectures (the foundation's
/// end-to-end proof): checked by counting variants with a `.cu` source.
#[test]
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

#[test]
fn stage_lists_match_kernel_files() {
    for family in kernel_ladder::families() {
        if let Err(problems) = common::testing::check_stage_files(family) {
            panic!("family {}:\n{problems}", family.name());
        }
    }
}

/// A broken kernel source is a typed compile error that names the variant and carries NVRTC's own
/// log (the line and the message), not a panic and not a silent empty image.
#[test]
fn broken_source_is_a_compile_error_with_the_log() {
    let Some(tc) = common::testing::nvrtc("broken_source_is_a_compile_error_with_the_log") else { return };
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
