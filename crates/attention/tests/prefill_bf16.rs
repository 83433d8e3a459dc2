//! attention/prefill-bf16, CPU side: the masked, row-sampled reference, shape validation and the
//! stage list. The GPU (and NVRTC) tests are in `gpu.rs`.

use attention::prefill_bf16::{self, PrefillBf16};
use attention::reference::{attention_rows, causal_attention, score_magnitude, score_magnitude_rows, Dims, Mask};
use common::testing::assert_constraint;
use common::{Op, Shape};

#[test]
fn sampled_rows_are_the_full_references_rows() {
    // Ragged T, three heads: rows 0, a middle one and the last, across both sequences.
    let d = Dims { b: 2, t: 37, c: 3 * 64, nh: 3 };
    let qkv = common::data::uniform(d.b * d.t * 3 * d.c, -2.0, 2.0, 11);
    let (full, full_lse) = causal_attention(&qkv, d, None);
    let magnitude = score_magnitude(&qkv, d, None);
    let rows = [0, 20, 36, 37, 73];
    let (out, lse) = attention_rows(&qkv, d, Mask::Causal(None), &rows);
    let mag = score_magnitude_rows(&qkv, d, Mask::Causal(None), &rows);
    for (i, &bt) in rows.iter().enumerate() {
        assert_eq!(out[i * d.c..(i + 1) * d.c], full[bt * d.c..(bt + 1) * d.c], "row {bt}");
        for h in 0..d.nh {
            let at = ((bt / d.t) * d.nh + h) * d.t + bt % d.t;
            assert_eq!((lse[i * d.nh + h], mag[i * d.nh + h]), (full_lse[at], magnitude[at]), "row {bt} head {h}");
        }
    }
}

#[test]
fn unmasked_rows_see_every_key() {
    // B=1, T=2, NH=1, HS=1 (scale 1), rows [q, k, v]: without the mask row 0 also sees key 1.
    // Row 0: q0 = ln 3, scores 0 (k0 = 0) and ln 3 (k1 = 1): weights 1/4, 3/4 -> out 4/4 + 3*8/4 = 7.
    let qkv = [3.0f32.ln(), 0.0, 4.0, 0.0, 1.0, 8.0];
    let d = Dims { b: 1, t: 2, c: 1, nh: 1 };
    let (out, lse) = attention_rows(&qkv, d, Mask::Full, &[0, 1]);
    assert!((out[0] - 7.0).abs() < 1e-6 && (lse[0] - 4.0f64.ln()).abs() < 1e-6, "{out:?} {lse:?}");
    // Row 1 (q = 0): both scores 0, the mean of v.
    assert!((out[1] - 6.0).abs() < 1e-6 && (lse[1] - 2.0f64.ln()).abs() < 1e-6, "{out:?} {lse:?}");
    let (causal, _) = attention_rows(&qkv, d, Mask::Causal(None), &[0]);
    assert_eq!(causal, [4.0], "causal: row 0 sees key 0 only");
}

#[test]
fn shape_checks_are_typed_errors() {
    let v = &PrefillBf16.variants()[0];
    let s = |b, t, nh, hs, causal| prefill_bf16::shape(b, t, nh, hs, causal);
    assert_constraint(PrefillBf16.validate(v, &s(1, 8, 2, 32, 1)), "HS in {64, 128}");
    assert_constraint(PrefillBf16.validate(v, &s(1, 8, 2, 64, 2)), "causal is 0 or 1");
    assert_constraint(PrefillBf16.validate(v, &s(65536, 1, 1, 64, 1)), "NH <= 65535 and B <= 65535");
    assert_constraint(PrefillBf16.validate(v, &s(1, 1 << 21, 8, 64, 1)), "B * T * 3C < 2^31");
    assert_constraint(PrefillBf16.validate(v, &s(1, 0, 1, 64, 1)), "1 <= T");
    let no_causal = Shape::parse("B=1,T=8,NH=2,HS=64").unwrap();
    assert!(prefill_bf16::shape_dims(&no_causal).unwrap().causal, "causal by default");
    for shape in PrefillBf16.default_shapes() {
        PrefillBf16.validate(v, &shape).unwrap();
    }
}

#[test]
fn stage_list() {
    let names = [
        "mma-sync",
        "cp-async",
        "wgmma-tma",
        "warp-specialized",
        "ping-pong",
        "intra-warpgroup-overlap",
        "two-blocks",
        "heaviest-first",
        "folded-softmax",
        "l2-fitted-order",
        "mufu-exp2",
        "tma-store-o",
        "packed-pv",
        "two-blocks-hs128",
        "pipelined-consumers",
        "mask-tail",
    ];
    common::testing::assert_stage_names(&PrefillBf16.variants(), &names);
}
