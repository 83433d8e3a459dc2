//! matmul family tests, CPU side: the references against hand-computed values, the row sampling,
//! shape validation, the stage list against the files and the documented limits. The GPU tests are
//! in `gpu.rs`.

mod support;

use common::check::SAMPLED_ROWS;
use common::{Family, Op};
use matmul::epilogue::{self, Epilogue, EpilogueDims, LinearEpilogue};
use matmul::linear::{self, Linear, LinearDims};
use matmul::reference::{gelu_tanh, linear_rows, sampled_rows};
use support::{all_variants, constraint, epi, lin};

#[test]
fn stage_files_match() {
    common::testing::check_stage_files(&matmul::Matmul).unwrap();
}

#[test]
fn stage_lists_are_ordered_and_named() {
    // linear-bf16 continues linear's ladder: its first stage follows linear's last kernel stage.
    let linear_last = Linear.variants().iter().filter(|v| v.stage < 90).map(|v| v.stage).max().unwrap();
    for op in matmul::Matmul.ops() {
        let v = op.variants();
        assert!(v.windows(2).all(|w| w[0].stage < w[1].stage), "{}: stages out of order", op.name());
        let first = if op.name() == "linear-bf16" { linear_last + 1 } else { 0 };
        assert_eq!(v[0].stage, first, "{}", op.name());
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

#[test]
fn stage_four_geometry_is_declared_once() {
    // The block tile's shared memory follows the tunables: 3 stages of (128 x 40 + 32 x 136) halves.
    let v = Linear.variants().into_iter().find(|v| v.stage == 4).unwrap();
    assert_eq!(matmul::gemm::m3_block_tile_smem_bytes(&v).unwrap(), 3 * 2 * (128 * 40 + 32 * 136));
    let single = Linear.leave_one_out().into_iter().find(|v| v.name == "all-DOUBLE_BUFFER").unwrap();
    assert_eq!(matmul::gemm::m3_block_tile_smem_bytes(&single).unwrap(), 18944);
    let header = matmul::SOURCES.find("matmul_wmma_m3.cuh").unwrap().text;
    assert!(!header.contains("#define MM_BT_BM 128"), "the tile size must come from the stage list only");
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
    assert_eq!(sampled_rows(64, 50257, 768, 1), (0..64).collect::<Vec<_>>(), "a small problem: every row");
    assert_eq!(sampled_rows(100, 10, 10, 1).len(), 100);
    let r = sampled_rows(4096, 50257, 768, 1);
    assert_eq!(r.len(), SAMPLED_ROWS);
    assert_eq!((r[0], *r.last().unwrap()), (0, 4095));
    assert!(r.windows(2).all(|w| w[0] < w[1]));
    assert_ne!(r, sampled_rows(4096, 50257, 768, 2), "another seed, other rows");
    let r = sampled_rows(4097, 4096, 4096, 1);
    assert_eq!((r[0], *r.last().unwrap()), (0, 4096));
}

#[test]
fn bad_shapes_are_typed_errors() {
    let ld = |m, n, k| LinearDims { m, n, k, bias: true };
    for v in all_variants(&Linear) {
        for (m, n, k, want) in [
            (0, 5, 5, "M >= 1"),
            (5, 0, 5, "N >= 1"),
            (5, 5, 0, "K >= 1"),
            (65536, 5, 65536, "M * K < 2^31"),
            (5, 50257, 50000, "N * K < 2^31"),
            (100_000, 30_000, 8, "M * N < 2^31"),
        ] {
            let e = constraint(linear::check_shape(&v, ld(m, n, k)));
            assert!(e.contains(want), "{}: {m}x{n}x{k}: {e}", v.id());
        }
        // Ragged sizes are fine for every stage.
        linear::check_shape(&v, ld(17, 50257, 33)).unwrap();
        Linear.validate(&v, &lin(1, 1, 1, 0)).unwrap();
        assert!(constraint(Linear.validate(&v, &lin(4, 4, 4, 2))).contains("bias is 0 or 1"));
        assert!(Linear.validate(&v, &lin(0, 4, 4, 1)).is_err());
    }
    let naive = &Linear.variants()[0];
    assert!(constraint(linear::check_shape(naive, ld(1_048_561, 1, 1))).contains("M <= 65535 * 16"));
    for v in LinearEpilogue.variants() {
        let d = EpilogueDims { m: 4, n: 0, k: 4, epilogue: Epilogue::BiasGelu };
        let e = constraint(epilogue::check_shape(&v, d));
        assert!(e.contains("N >= 1"), "{e}");
        assert!(constraint(LinearEpilogue.validate(&v, &epi(4, 4, 4, 3))).contains("epi is 1"));
        LinearEpilogue.validate(&v, &epi(3, 5, 7, 2)).unwrap();
    }
    assert!(Epilogue::from_key(0).is_err());
}

#[test]
fn documented_limits_are_enforced() {
    common::testing::check_limits(&matmul::Matmul).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_folded_layernorm_is_the_layernorm_then_the_linear() {
    use matmul::gemv::{fold_layernorm, folds_layernorm, Gemv};
    // One row through LayerNorm(gamma, beta) then W, bias; and through the fold: rstd · ((x - mean)
    // · W'ᵀ) + bias'. W' is bf16, so the two agree to bf16's rounding of W ⊙ gamma.
    let (k, n) = (16, 3);
    let x: Vec<f32> = (0..k).map(|i| 2.0 + (i as f32 * 0.7).sin() * 3.0).collect();
    let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).cos()).collect();
    let (gamma, beta): (Vec<f32>, Vec<f32>) = (0..k).map(|i| (1.0 + 0.03 * i as f32, 0.1 - 0.02 * i as f32)).unzip();
    let bias = [0.5f32, -0.25, 0.0];
    let mean = x.iter().sum::<f32>() / k as f32;
    let rstd = 1.0 / (x.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / k as f32 + 1e-5).sqrt();
    let (folded, shift) = fold_layernorm(&w, Some(&bias), &gamma, &beta);
    for j in 0..n {
        let row = &w[j * k..(j + 1) * k];
        let plain: f32 = (0..k).map(|i| ((x[i] - mean) * rstd * gamma[i] + beta[i]) * row[i]).sum::<f32>() + bias[j];
        let wf = |i: usize| half::bf16::from_bits(folded[j * k + i]).to_f32();
        let fold: f32 = rstd * (0..k).map(|i| (x[i] - mean) * wf(i)).sum::<f32>() + shift[j];
        assert!((plain - fold).abs() <= 1e-2 * plain.abs().max(1.0), "column {j}: {plain} vs {fold}");
    }
    // Only stages 5 and 6 fold; they need fp32 inp and the folded shift as a bias.
    let shape = |kv: &[(&'static str, i64)]| common::Shape::new(kv);
    for v in Gemv.variants() {
        let ln = shape(&[("M", 1), ("N", 64), ("K", 64), ("bias", 1), ("ln", 1)]);
        assert_eq!(Gemv.validate(&v, &ln).is_ok(), folds_layernorm(&v), "{}", v.id());
        if folds_layernorm(&v) {
            let no_shift = shape(&[("M", 1), ("N", 64), ("K", 64), ("bias", 0), ("ln", 1)]);
            let bf16_in = shape(&[("M", 1), ("N", 64), ("K", 64), ("bias", 1), ("ln", 1), ("in", 16)]);
            for s in [no_shift, bf16_in] {
                let e = Gemv.validate(&v, &s).unwrap_err().to_string();
                assert!(e.contains("ln = 1 with fp32 inp"), "{e}");
            }
        }
    }
}

#[test]
fn gemv_fp8_validation_names_the_constraint() {
    use matmul::gemv::{shape, shape_bf16_in, shape_ln};
    use matmul::gemv_fp8::GemvFp8;
    let stages = GemvFp8.variants();
    let (warp_row, mma) = (&stages[0], &stages[1]);
    for v in &stages {
        GemvFp8.validate(v, &shape(17, 300, 400, 1)).unwrap();
        assert!(constraint(GemvFp8.validate(v, &shape(1, 64, 40, 1))).contains("K % 16 == 0"));
        assert!(constraint(GemvFp8.validate(v, &shape(65, 64, 64, 1))).contains("M <= 64"));
    }
    // Only the tensor-core stage folds the LayerNorm, on fp32 inp with the folded shift as a bias.
    GemvFp8.validate(mma, &shape_ln(1, 64, 64, 0)).unwrap();
    assert!(constraint(GemvFp8.validate(warp_row, &shape_ln(1, 64, 64, 0))).contains("folds the LayerNorm"));
    let mut bf16_ln = shape_bf16_in(1, 64, 64, 1, 0);
    bf16_ln.set("ln", 1);
    assert!(constraint(GemvFp8.validate(mma, &bf16_ln)).contains("ln = 1 with fp32 inp"));
}

/// `gemv::PICK_WORDS_PER_ROW` is `ladder_pick.cuh`'s layout: kPickSlots words a row, kPickStride apart.
#[test]
fn pick_words_per_row_is_the_headers_layout() {
    let header =
        common::common_sources().iter().find(|s| s.path.ends_with("ladder_pick.cuh")).expect("ladder_pick.cuh");
    let value = |name: &str| -> usize {
        let line = header.text.lines().find(|l| l.starts_with(&format!("constexpr int {name} = "))).expect(name);
        line.split('=').nth(1).unwrap().split(';').next().unwrap().trim().parse().unwrap()
    };
    assert_eq!(matmul::gemv::PICK_WORDS_PER_ROW, value("kPickSlots") * value("kPickStride"));
}
