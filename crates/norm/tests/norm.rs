//! norm, CPU side: the references against hand cases, the shape checks, the stage list and the
//! documented limits. The GPU tests are in `gpu.rs`.

use common::testing::check_stage_files;
use common::{ActType, Op};
use norm::layernorm::{self, LayerNorm, LayerNormDims};
use norm::softmax::{self, Softmax, SoftmaxDims};

#[test]
fn stage_list_matches_files() {
    check_stage_files(&norm::Norm).unwrap();
}

#[test]
fn layernorm_reference_hand_case() {
    // Row [1, 2, 3, 4]: mean 2.5, variance 1.25.
    let (out, mean, rstd) = layernorm::reference(&[1.0, 2.0, 3.0, 4.0], &[1.0; 4], &[0.5; 4], 1, 4, 0.0);
    assert_eq!(mean, vec![2.5]);
    let r = 1.0 / 1.25f64.sqrt();
    assert!((rstd[0] - r).abs() < 1e-12);
    assert!((out[0] - (-1.5 * r + 0.5)).abs() < 1e-12);
    assert!((out[3] - (1.5 * r + 0.5)).abs() < 1e-12);
}

#[test]
fn softmax_reference_hand_case() {
    // Two rows of T = 2, causal: row 0 sees one column, row 1 both.
    let out = softmax::reference(&[5.0, 9.0, 0.0, 0.0], 2, 2, 1.0, true);
    assert_eq!(out[..2], [1.0, 0.0]);
    assert!((out[2] - 0.5).abs() < 1e-12 && (out[3] - 0.5).abs() < 1e-12);
    // Large magnitudes stay finite (max subtraction).
    let out = softmax::reference(&[1e4, -1e4, 1e4], 1, 3, 1.0, false);
    assert!((out[0] - 0.5).abs() < 1e-12 && out[1] == 0.0);
}

#[test]
fn softmax_reference_of_sampled_rows_is_those_rows() {
    // Ragged T, causal: a sampled row keeps its own mask length (r % T + 1).
    let (rows, t) = (3 * 37, 37);
    let x = common::data::uniform(rows * t, -8.0, 8.0, 5);
    let full = softmax::reference(&x, rows, t, 0.7, true);
    let picked = [0, 36, 37, 80, 110];
    let sampled = softmax::reference_rows(&x, t, &picked, 0.7, true);
    assert_eq!(sampled, common::check::gather_rows(&full, t, &picked));
}

#[test]
fn bad_shapes_are_typed_errors() {
    for v in LayerNorm.variants() {
        // Each stage at the output type it stores (stage 7: bf16), and at the other.
        let stores = if v.stage == 7 { ActType::Bf16 } else { ActType::F32 };
        for (rows, c) in [(0, 768), (4, 0), (1 << 20, 1 << 12)] {
            let e = layernorm::check_shape(&v, LayerNormDims { rows, c, out: stores }).unwrap_err();
            assert!(matches!(e, common::Error::Constraint { .. }), "{}: {e}", v.id());
        }
        layernorm::check_shape(&v, LayerNormDims { rows: 4, c: 768, out: stores }).unwrap();
        let other = if stores == ActType::F32 { ActType::Bf16 } else { ActType::F32 };
        let e = layernorm::check_shape(&v, LayerNormDims { rows: 4, c: 768, out: other }).unwrap_err();
        assert!(e.to_string().contains("out = 16 for a stage storing bf16"), "{}: {e}", v.id());
    }
    for v in Softmax.variants() {
        let e = softmax::check_shape(&v, SoftmaxDims { rows: 10, t: 4, causal: true }).unwrap_err();
        assert!(e.to_string().contains("rows % T == 0"), "{e}");
        assert!(softmax::check_shape(&v, SoftmaxDims { rows: 0, t: 4, causal: false }).is_err());
    }
}

#[test]
fn softmax_register_stage_refuses_t_past_8192() {
    let v = Softmax.variants().into_iter().find(|v| v.stage == 4).unwrap();
    let shape = common::Shape::parse("rows=17,T=8193,causal=0").unwrap();
    let e = Softmax.validate(&v, &shape).unwrap_err();
    assert!(matches!(e, common::Error::Constraint { .. }) && e.to_string().contains("T <= 32 * SM_THREADS"), "{e}");
    Softmax.validate(&v, &common::Shape::parse("rows=17,T=8192,causal=0").unwrap()).unwrap();
}

#[test]
fn magnitude_zero_is_a_typed_error() {
    let shape = common::Shape::parse("rows=4,T=4,causal=0,magnitude=0").unwrap();
    for v in Softmax.variants() {
        assert!(matches!(Softmax.validate(&v, &shape), Err(common::Error::Constraint { .. })));
    }
}

#[test]
fn documented_limits_are_enforced() {
    let n = common::testing::check_limits(&norm::Norm).unwrap_or_else(|e| panic!("{e}"));
    assert!(n >= 12, "only {n} limits declared");
}
