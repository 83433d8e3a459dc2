//! gpt2, CPU side: the encoder reference, shape checks, token-id checks, the stage list and the
//! documented limits. The GPU tests are in `gpu.rs`.

use common::testing::check_stage_files;
use gpt2::encoder::{self, EncoderDims};

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
    let d = |b, t, c, max_t| EncoderDims { b, t, c, vocab: 10, max_t };
    for bad in [d(0, 4, 4, 4), d(1 << 12, 1 << 12, 1 << 12, 1 << 12), d(1, 5, 4, 4)] {
        assert!(matches!(encoder::check_shape(bad), Err(common::Error::Constraint { .. })), "{bad:?}");
    }
}

#[test]
fn documented_limits_are_enforced() {
    common::testing::check_limits(&gpt2::Gpt2).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn gelu_reference_matches_known_values() {
    // GELU(0) = 0, GELU(x) -> x for large x, -> 0 for very negative x; GELU(1) = 0.841192 (tanh form).
    use gpt2::pointwise::gelu;
    assert_eq!(gelu(0.0), 0.0);
    assert!((gelu(1.0) - 0.841_191_990_8).abs() < 1e-9, "{}", gelu(1.0));
    assert!((gelu(10.0) - 10.0).abs() < 1e-12);
    assert!(gelu(-10.0).abs() < 1e-12);
}
