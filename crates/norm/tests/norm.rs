//! norm: every LayerNorm and softmax stage against the f64 reference at the default shapes and at
//! ragged property-test shapes (GPU; SKIP without one), plus CPU tests of the references, the
//! shape checks and the stage list.

use common::testing::{assert_stages_pass, check_stage_files, gpu};
use common::{Op, Shape};
use norm::layernorm::{self, LayerNorm};
use norm::softmax::{self, Softmax};
use proptest::prelude::*;

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
fn bad_shapes_are_typed_errors() {
    for v in LayerNorm.variants() {
        for (rows, c) in [(0, 768), (4, 0), (1 << 20, 1 << 12)] {
            let e = layernorm::check_shape(&v, rows, c).unwrap_err();
            assert!(matches!(e, common::Error::Constraint { .. }), "{}: {e}", v.id());
        }
    }
    for v in Softmax.variants() {
        let e = softmax::check_shape(&v, 10, 4, true).unwrap_err();
        assert!(e.to_string().contains("rows % T == 0"), "{e}");
        assert!(softmax::check_shape(&v, 0, 4, false).is_err());
    }
}

#[test]
fn layernorm_default_shapes() {
    let Some(gpu) = gpu("layernorm_default_shapes") else { return };
    for s in LayerNorm.default_shapes() {
        assert_stages_pass(&gpu, &LayerNorm, &s, &LayerNorm.variants());
    }
}

#[test]
fn softmax_default_shapes() {
    let Some(gpu) = gpu("softmax_default_shapes") else { return };
    for s in Softmax.default_shapes() {
        assert_stages_pass(&gpu, &Softmax, &s, &Softmax.variants());
    }
}

/// Sizes that hit every raggedness: 1, odd, not multiples of 4, 32 or 128, and the boundaries
/// around them, up to 8192.
fn ragged() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        Just(3),
        Just(31),
        Just(33),
        Just(127),
        Just(129),
        Just(770),
        Just(8191),
        Just(8192),
        1usize..=8192,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn layernorm_ragged(rows in 1usize..=4096, c in ragged()) {
        let Some(gpu) = gpu("layernorm_ragged") else { return Ok(()) };
        let rows = rows.min((1 << 22) / c).max(1);
        assert_stages_pass(&gpu, &LayerNorm, &Shape::new(&[("rows", rows as i64), ("C", c as i64)]), &LayerNorm.variants());
    }

    #[test]
    fn softmax_ragged(blocks in 1usize..=8, t in ragged(), causal in any::<bool>(), big in any::<bool>()) {
        let Some(gpu) = gpu("softmax_ragged") else { return Ok(()) };
        // Causal shapes come in whole blocks of T rows; non-causal ones take any row count.
        let rows = if causal { blocks * t } else { blocks * 97 % 4096 + 1 };
        let rows = if rows * t > 1 << 23 { if causal { t } else { 1 } } else { rows };
        let shape = Shape::new(&[
            ("rows", rows as i64),
            ("T", t as i64),
            ("causal", causal as i64),
            ("magnitude", if big { 10_000 } else { 8 }),
        ]);
        assert_stages_pass(&gpu, &Softmax, &shape, &Softmax.variants());
    }
}
