//! matmul family tests. CPU: the references against hand-computed values, the row sampling, shape
//! validation, the stage list against the files, and NVRTC compilation of every variant (skipped
//! without NVRTC). GPU (skipped without one, failing with LADDER_REQUIRE_GPU=1): every stage of
//! both ops at the GPT-2 shapes (M = 64 with the real N, K; one full M = 4096 shape), at ragged
//! hand-picked shapes, in property tests over M, N, K in 1..512, and bad buffers -> typed errors.

use common::module::headers_for;
use common::{Arch, Error, Family, Op, Shape, Source, Variant};
use matmul::epilogue::{self, Epilogue, EpilogueArgs, LinearEpilogue};
use matmul::gemm::Workspace;
use matmul::linear::{self, Linear, LinearArgs};
use matmul::reference::{gelu_tanh, linear_rows, sampled_rows, SAMPLE_ROWS};
use proptest::prelude::*;

fn all_variants(op: &dyn Op) -> Vec<Variant> {
    op.variants().into_iter().chain(op.leave_one_out()).collect()
}

fn lin(m: i64, n: i64, k: i64, bias: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("bias", bias)])
}

fn epi(m: i64, n: i64, k: i64, e: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("epi", e)])
}

fn constraint(r: common::Result<()>) -> String {
    match r {
        Err(e @ Error::Constraint { .. }) => e.to_string(),
        other => panic!("expected a constraint error, got {other:?}"),
    }
}

// ---------------------------------------------------------------- CPU

#[test]
fn kernels_compile_here() {
    let Some(tc) = common::testing::nvrtc("kernels_compile_here") else { return };
    let headers = headers_for(matmul::sources());
    let mut n = 0;
    for op in matmul::Matmul.ops() {
        for v in all_variants(op) {
            let Source::Kernel(path) = v.source else { continue };
            let src = common::KernelSource::find(matmul::sources(), path).unwrap();
            for arch in [Arch::SM80, Arch::SM90A] {
                if v.requires.arch_specific && arch != Arch::SM90A {
                    continue;
                }
                let c = tc.compile(&v.id(), src, &headers, &v.defines, arch).unwrap_or_else(|e| panic!("{e}"));
                assert!(!c.image.is_empty(), "{} {arch}: empty image", v.id());
                n += 1;
            }
        }
    }
    assert!(n >= 2 * 8, "compiled only {n} variant/arch pairs");
}

#[test]
fn stage_files_match() {
    common::testing::check_stage_files(&matmul::Matmul).unwrap();
}

#[test]
fn stage_lists_are_ordered_and_named() {
    for op in matmul::Matmul.ops() {
        let v = op.variants();
        assert!(v.windows(2).all(|w| w[0].stage < w[1].stage), "{}: stages out of order", op.name());
        assert_eq!(v[0].stage, 0);
    }
    let names: Vec<String> = Linear.variants().iter().map(|v| v.name.to_string()).collect();
    for want in
        ["naive", "smem-tiled", "register-tiled", "wmma-m2", "wmma-m3", "cublas-fp32", "cublas-tf32", "cublas-fp16"]
    {
        assert!(names.iter().any(|n| n == want), "missing stage {want}");
    }
    let loo = Linear.leave_one_out();
    assert_eq!(loo.len(), 4);
    assert!(loo.iter().all(|v| v.stage == 4 && v.defines.len() == 3));
}

/// The Rust launcher's copy of the block-tiled stage-4 tile sizes matches matmul_wmma.cuh (the
/// kernel would trap on too little shared memory; this catches the mismatch without a GPU).
#[test]
fn block_tile_constants_match_header() {
    let src = common::KernelSource::find(matmul::sources(), "matmul_wmma.cuh").unwrap().text;
    let define = |name: &str| -> usize {
        let line = src
            .lines()
            .find(|l| l.split_whitespace().take(2).eq(["#define", name]))
            .unwrap_or_else(|| panic!("#define {name} missing"));
        line.split_whitespace().nth(2).unwrap().parse().unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    assert_eq!(define("MM_BT_BM"), matmul::gemm::M3_BT_BM);
    assert_eq!(define("MM_BT_BN"), matmul::gemm::M3_BT_BN);
    assert_eq!(define("MM_BT_BK"), matmul::gemm::M3_BT_BK);
    let threads = 32 * define("MM_BT_WARPS_M") * define("MM_BT_WARPS_N");
    assert_eq!(threads, matmul::gemm::M3_BT_THREADS);
    assert!(src.contains("#define MM_BT_LDA (MM_BT_BK + 8)") && src.contains("#define MM_BT_LDB (MM_BT_BN + 8)"));
    assert!(src.contains("#define MM_BT_STAGES 3") && src.contains("#define MM_BT_STAGES 1"));
    // 3 stages of (128 x 40 + 32 x 136) halves.
    assert_eq!(matmul::gemm::m3_block_tile_smem_bytes(3), 3 * 2 * (128 * 40 + 32 * 136));
    assert_eq!(matmul::gemm::m3_block_tile_smem_bytes(1), 18944);
}

#[test]
fn reference_hand_case() {
    // inp 2x3, W 2x3 (N = 2), bias 2.
    let inp = [1.0f32, 2.0, 3.0, -1.0, 0.5, 4.0];
    let w = [0.5f32, -1.0, 2.0, 1.0, 1.0, 1.0];
    let bias = [0.25f32, -3.0];
    let out = linear_rows(&inp, &w, Some(&bias), 2, 3, &[0, 1]);
    // row 0: 0.5 - 2 + 6 + 0.25 = 4.75; 1 + 2 + 3 - 3 = 3
    // row 1: -0.5 - 0.5 + 8 + 0.25 = 7.25; -1 + 0.5 + 4 - 3 = 0.5
    assert_eq!(out, vec![4.75, 3.0, 7.25, 0.5]);
    assert_eq!(linear_rows(&inp, &w, None, 2, 3, &[1]), vec![7.0, 3.5]);
    // K not a multiple of 4 and longer than one chunk: 1·1 + 2·2 + ... + 7·7 = 140.
    let a: Vec<f32> = (1..=7).map(|x| x as f32).collect();
    assert_eq!(linear_rows(&a, &a, None, 1, 7, &[0]), vec![140.0]);
}

#[test]
fn epilogue_reference_hand_case() {
    let inp = [1.0f32, 2.0];
    let w = [1.0f32, 1.0];
    let bias = [0.5f32];
    let g = epilogue::reference_rows(&inp, &w, &bias, None, Epilogue::BiasGelu, 1, 2, &[0]);
    assert!((g[0] - gelu_tanh(3.5)).abs() < 1e-12);
    let r = epilogue::reference_rows(&inp, &w, &bias, Some(&[-1.5]), Epilogue::BiasResidual, 1, 2, &[0]);
    assert_eq!(r, vec![2.0]);
}

#[test]
fn gelu_tanh_values() {
    assert_eq!(gelu_tanh(0.0), 0.0);
    assert!((gelu_tanh(1.0) - 0.8411919906082768).abs() < 1e-12);
    assert!((gelu_tanh(-1.0) + 0.15880800939172324).abs() < 1e-12);
    assert!((gelu_tanh(10.0) - 10.0).abs() < 1e-9);
}

#[test]
fn sampling_covers_first_and_last_rows() {
    assert_eq!(sampled_rows(64, 50257, 768), (0..64).collect::<Vec<_>>());
    assert_eq!(sampled_rows(100, 10, 10).len(), 100);
    let r = sampled_rows(4096, 50257, 768);
    assert_eq!(r.len(), SAMPLE_ROWS);
    assert_eq!((r[0], *r.last().unwrap()), (0, 4095));
    assert!(r.windows(2).all(|w| w[0] < w[1]));
    let r = sampled_rows(4097, 4096, 4096);
    assert_eq!((r[0], *r.last().unwrap()), (0, 4096));
}

#[test]
fn bad_shapes_are_typed_errors() {
    for v in all_variants(&Linear) {
        for (m, n, k, want) in [
            (0, 5, 5, "M >= 1"),
            (5, 0, 5, "N >= 1"),
            (5, 5, 0, "K >= 1"),
            (65536, 5, 65536, "M*K < 2^31"),
            (5, 50257, 50000, "N*K < 2^31"),
            (100_000, 30_000, 8, "M*N < 2^31"),
            (1_048_561, 1, 1, "M <= 1048560"),
            (1, 1, 2_097_121, "K <= 2097120"),
        ] {
            let e = constraint(linear::check_shape(&v, m, n, k));
            assert!(e.contains(want), "{}: {m}x{n}x{k}: {e}", v.id());
        }
        // Ragged sizes are fine for every stage.
        linear::check_shape(&v, 17, 50257, 33).unwrap();
        Linear.validate(&v, &lin(1, 1, 1, 0)).unwrap();
        assert!(constraint(Linear.validate(&v, &lin(4, 4, 4, 2))).contains("bias is 0 or 1"));
        assert!(Linear.validate(&v, &lin(0, 4, 4, 1)).is_err());
    }
    for v in LinearEpilogue.variants() {
        let e = constraint(epilogue::check_shape(&v, 4, 0, 4));
        assert!(e.contains("N >= 1"), "{e}");
        assert!(constraint(LinearEpilogue.validate(&v, &epi(4, 4, 4, 3))).contains("epi is 1"));
        LinearEpilogue.validate(&v, &epi(3, 5, 7, 2)).unwrap();
    }
    assert!(Epilogue::from_key(0).is_err());
}

// ---------------------------------------------------------------- GPU

fn pass(op: &dyn Op, shape: &Shape) {
    let Some(gpu) = common::testing::gpu(&format!("{}/{} {shape}", op.family(), op.name())) else { return };
    common::testing::assert_stages_pass(&gpu, op, shape, &all_variants(op));
}

#[test]
fn linear_gpt2_shapes_m64() {
    for s in Linear.default_shapes() {
        let mut s = s.clone();
        s.set("M", 64);
        pass(&Linear, &s);
    }
}

#[test]
fn linear_full_shape_and_sampled_reference() {
    // Full reference (4096·768·768 < 2^32 MACs) and a sampled one (4096·2304·768).
    pass(&Linear, &lin(4096, 768, 768, 1));
    pass(&Linear, &lin(4096, 2304, 768, 1));
}

#[test]
fn linear_ragged_shapes() {
    for (m, n, k) in [(1, 1, 1), (1, 50257, 3), (17, 33, 15), (129, 127, 130), (31, 2305, 769), (300, 7, 1001)] {
        for b in [0, 1] {
            pass(&Linear, &lin(m, n, k, b));
        }
    }
}

#[test]
fn epilogue_gpt2_shapes_m64() {
    for s in LinearEpilogue.default_shapes() {
        let mut s = s.clone();
        s.set("M", 64);
        pass(&LinearEpilogue, &s);
    }
    pass(&LinearEpilogue, &epi(4096, 768, 768, 2));
}

#[test]
fn epilogue_ragged_shapes() {
    for (m, n, k) in [(1, 1, 1), (17, 33, 15), (130, 515, 47)] {
        for e in [1, 2] {
            pass(&LinearEpilogue, &epi(m, n, k, e));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn linear_any_shape(m in 1i64..512, n in 1i64..512, k in 1i64..512, bias in 0i64..2) {
        pass(&Linear, &lin(m, n, k, bias));
    }

    #[test]
    fn epilogue_any_shape(m in 1i64..512, n in 1i64..512, k in 1i64..512, e in 1i64..3) {
        pass(&LinearEpilogue, &epi(m, n, k, e));
    }
}

#[test]
fn bad_buffers_are_typed_errors_and_launch_nothing() {
    let Some(gpu) = common::testing::gpu("bad_buffers_are_typed_errors_and_launch_nothing") else { return };
    let (m, n, k) = (8usize, 16usize, 24usize);
    let inp = gpu.upload(&vec![1.0f32; m * k]).unwrap();
    let w = gpu.upload(&vec![1.0f32; n * k]).unwrap();
    let bias = gpu.upload(&vec![1.0f32; n]).unwrap();
    let short_bias = gpu.upload(&vec![1.0f32; n - 1]).unwrap();
    let mut ws = Workspace::new();
    for v in Linear.variants() {
        let mut out = gpu.alloc_poisoned::<f32>(m * n).unwrap();
        let mut call = |mm: usize, nn: usize, kk: usize, b: Option<&common::cudarc::driver::CudaSlice<f32>>| {
            let args = LinearArgs { out: &mut out, inp: &inp, weight: &w, bias: b, m: mm, n: nn, k: kk };
            linear::forward(&gpu, &v, args, &mut ws)
        };
        assert!(constraint(call(m, n, k + 1, Some(&bias))).contains("len(inp)"), "{}", v.id());
        assert!(constraint(call(m + 1, n, k, Some(&bias))).contains("len(inp)"), "{}", v.id());
        assert!(constraint(call(m, n, k, Some(&short_bias))).contains("len(bias)"), "{}", v.id());
        assert!(constraint(call(0, n, k, Some(&bias))).contains("M >= 1"), "{}", v.id());
        gpu.synchronize().unwrap();
        // Nothing was launched: out is still all poison.
        assert!(gpu.download(&out).unwrap().iter().all(|x| x.is_nan()), "{} wrote out", v.id());
    }
    let residual = gpu.upload(&vec![1.0f32; m * n]).unwrap();
    for v in LinearEpilogue.variants() {
        let mut out = gpu.alloc_poisoned::<f32>(m * n).unwrap();
        let mut call = |res: Option<&common::cudarc::driver::CudaSlice<f32>>, e: Epilogue| {
            let args =
                EpilogueArgs { out: &mut out, inp: &inp, weight: &w, bias: &bias, residual: res, epilogue: e, m, n, k };
            epilogue::forward(&gpu, &v, args, &mut ws)
        };
        assert!(constraint(call(None, Epilogue::BiasResidual)).contains("residual"), "{}", v.id());
        assert!(constraint(call(Some(&residual), Epilogue::BiasGelu)).contains("no residual"), "{}", v.id());
        assert!(constraint(call(Some(&bias), Epilogue::BiasResidual)).contains("len(residual)"), "{}", v.id());
        gpu.synchronize().unwrap();
        assert!(gpu.download(&out).unwrap().iter().all(|x| x.is_nan()), "{} wrote out", v.id());
    }
}
