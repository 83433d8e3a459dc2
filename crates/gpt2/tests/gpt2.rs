//! gpt2: the encoder stages against the f64 reference (GPU; SKIP without one), and CPU checks.

use common::testing::{assert_stages_pass, check_stage_files, gpu};
use common::{Op, Shape};
use gpt2::encoder::{self, Encoder};
use proptest::prelude::*;

#[test]
fn stage_list_matches_files() {
    check_stage_files(&gpt2::Gpt2).unwrap();
}

#[test]
fn encoder_reference_hand_case() {
    // B=1, T=2, C=2, vocab 3: tokens [2, 0].
    let wte = [0.0, 1.0, 10.0, 11.0, 20.0, 21.0];
    let wpe = [0.5, 0.25, 0.125, 0.0625];
    assert_eq!(encoder::reference(&[2, 0], &wte, &wpe, 2, 2), vec![20.5, 21.25, 0.125, 1.0625]);
}

#[test]
fn bad_shapes_are_typed_errors() {
    assert!(matches!(encoder::check_shape(0, 4, 4), Err(common::Error::Constraint { .. })));
    assert!(matches!(encoder::check_shape(1 << 12, 1 << 12, 1 << 12), Err(common::Error::Constraint { .. })));
}

#[test]
fn encoder_default_shape() {
    let Some(gpu) = gpu("encoder_default_shape") else { return };
    for s in Encoder.default_shapes() {
        assert_stages_pass(&gpu, &Encoder, &s, &Encoder.variants());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn encoder_ragged(b in 1i64..=4, t in 1i64..=300, c in 1i64..=777, v in 1i64..=1000) {
        let Some(gpu) = gpu("encoder_ragged") else { return Ok(()) };
        let shape = Shape::new(&[("B", b), ("T", t), ("C", c), ("V", v)]);
        assert_stages_pass(&gpu, &Encoder, &shape, &Encoder.variants());
    }
}
