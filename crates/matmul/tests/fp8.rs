//! The FP8 format's CPU reference (`matmul::fp8`): e4m3 rounding and saturation at the edges, and the
//! 1 × 128 and 128 × 128 quantizers over ragged shapes, non-finite rows and all-zero groups.

use matmul::fp8::{
    e4m3, e4m3_value, groups, quantize_blocks, quantize_rows, rounding_bound, E4M3_MAX, GROUP, NAN_CODE,
};
use proptest::prelude::*;

#[test]
fn every_finite_code_is_its_own_value_s_code() {
    let mut finite = 0;
    for code in 0u8..=255 {
        let v = e4m3_value(code);
        if code & 0x7F == 0x7F {
            assert!(v.is_nan(), "code {code:#04x}");
            continue;
        }
        finite += 1;
        // -0 and +0 are two codes of one value; every other finite code round-trips.
        let back = e4m3(v);
        assert!(back == code || (v == 0.0 && back & 0x7F == 0), "code {code:#04x} = {v} -> {back:#04x}");
    }
    assert_eq!(finite, 254);
    assert_eq!(e4m3_value(0x7E), E4M3_MAX);
    assert_eq!(e4m3_value(0x01), 2f32.powi(-9), "the smallest subnormal");
    assert_eq!(e4m3_value(0x08), 2f32.powi(-6), "the smallest normal");
}

#[test]
fn rounding_is_to_nearest_even_and_saturates_to_finite() {
    // 1 + 1/16 is halfway between 1 (mantissa 000) and 1.125 (001): to the even one, 1.
    assert_eq!(e4m3(1.0625), e4m3(1.0));
    // 1.125 + 1/16 is halfway between 1.125 (001) and 1.25 (010): to 1.25.
    assert_eq!(e4m3(1.1875), e4m3(1.25));
    // Just past halfway goes up.
    assert_eq!(e4m3(1.0625f32.next_up()), e4m3(1.125));
    // Past the largest finite value: 448, never NaN (satfinite), whatever the sign.
    for x in [449.0f32, 464.0, 480.0, 1e6, f32::MAX] {
        assert_eq!(e4m3(x), 0x7E, "{x}");
        assert_eq!(e4m3(-x), 0xFE, "{}", -x);
    }
    // Subnormals: 2^-10 is halfway between 0 and 2^-9, to the even 0; 3 * 2^-10 between 2^-9 and
    // 2^-8, to the even 2^-8 (code 2).
    assert_eq!(e4m3(2f32.powi(-10)), 0);
    assert_eq!(e4m3(3.0 * 2f32.powi(-10)), 0x02);
    assert_eq!(e4m3(2f32.powi(-12)), 0, "underflow to zero");
    // Non-finite inputs: the NaN code.
    for x in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        assert_eq!(e4m3(x), NAN_CODE);
    }
}

#[test]
fn a_group_s_largest_element_lands_on_448_and_zeros_stay_zero() {
    let mut x = vec![0.0f32; 3 * 200];
    x[5] = -3.0;
    x[7] = 1.5;
    x[200 + 130] = 7.0; // row 1, second group
    let q = quantize_rows(&x, 3, 200);
    assert_eq!(q.scales.len(), 3 * groups(200));
    assert_eq!(q.scales[0], 3.0 / E4M3_MAX);
    assert_eq!(q.codes[5], 0xFE, "-amax is -448");
    assert_eq!(q.value(0, 5), -3.0);
    assert_eq!(q.value(0, 7), 1.5);
    assert_eq!(q.value(1, 130), 7.0);
    // All-zero groups: codes 0, values 0, a finite scale.
    assert!(q.codes[2 * 200..].iter().all(|&c| c == 0));
    assert!(q.scales.iter().all(|s| s.is_finite() && *s > 0.0));
    assert!(q.dequantize()[2 * 200..].iter().all(|&v| v == 0.0));
}

#[test]
fn non_finite_elements_are_nan_codes_outside_their_group_s_scale() {
    let (m, k) = (2, 130);
    let mut x: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 * 0.25 - 2.0).collect();
    x[3] = f32::NAN;
    x[k + 1] = f32::INFINITY;
    x[k + 129] = f32::NEG_INFINITY; // the second row's narrow last group (2 channels)
    let q = quantize_rows(&x, m, k);
    assert_eq!((q.codes[3], q.codes[k + 1], q.codes[k + 129]), (NAN_CODE, NAN_CODE, NAN_CODE));
    let finite_amax = |r: usize, g: std::ops::Range<usize>| {
        g.map(|c| x[r * k + c]).filter(|v| v.is_finite()).fold(0f32, |a, v| a.max(v.abs()))
    };
    assert_eq!(q.scales[0], finite_amax(0, 0..128) / E4M3_MAX);
    assert_eq!(q.scales[groups(k)], finite_amax(1, 0..128) / E4M3_MAX);
    assert_eq!(q.scales[groups(k) + 1], finite_amax(1, 128..130) / E4M3_MAX);
    assert!(q.value(0, 3).is_nan() && q.value(1, 1).is_nan());
    assert!(q.value(0, 4).is_finite(), "the rest of the group keeps its values");
}

fn check_bound(x: &[f32], deq: &[f32], scale_of: impl Fn(usize) -> f32) -> Result<(), TestCaseError> {
    for (i, (&a, &b)) in x.iter().zip(deq).enumerate() {
        let s = scale_of(i);
        // The bound, and a few fp32 roundings of the scale and its inverse.
        let slack = rounding_bound(a, s) + a.abs() * 1e-6;
        prop_assert!((a - b).abs() <= slack, "element {i}: {a} -> {b} (scale {s}, bound {slack})");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Ragged rows: K a multiple of 128 or not (a narrow last group), M = 1 included; each row's
    /// groups scaled apart (magnitudes from 1e-3 to 1e3 in one row), every element within the bound.
    #[test]
    fn rows_dequantize_within_the_rounding_bound(m in 1usize..6, k in 1usize..400, seed in any::<u64>()) {
        let x: Vec<f32> = (0..m * k)
            .map(|i| {
                let u = ((seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 11) as f64 / (1u64 << 53) as f64;
                let mag = 10f64.powi((i / GROUP % 7) as i32 - 3);
                ((u * 2.0 - 1.0) * mag) as f32
            })
            .collect();
        let q = quantize_rows(&x, m, k);
        prop_assert_eq!(q.scales.len(), m * groups(k));
        let g = groups(k);
        check_bound(&x, &q.dequantize(), |i| q.scales[(i / k) * g + (i % k) / GROUP])?;
        // The codes of a row do not depend on the other rows.
        let first = quantize_rows(&x[..k], 1, k);
        prop_assert_eq!(&first.codes[..], &q.codes[..k]);
    }

    /// Weights in 128 x 128 blocks, N and K ragged: every block's largest magnitude is 448 after
    /// scaling, every element within the bound.
    #[test]
    fn blocks_dequantize_within_the_rounding_bound(n in 1usize..300, k in 1usize..300, seed in any::<u64>()) {
        let w: Vec<f32> = (0..n * k)
            .map(|i| {
                let u = ((seed ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9)) >> 11) as f64 / (1u64 << 53) as f64;
                ((u * 2.0 - 1.0) * 0.05) as f32
            })
            .collect();
        let q = quantize_blocks(&w, n, k);
        let (gn, gk) = (groups(n), groups(k));
        prop_assert_eq!(q.scales.len(), gn * gk);
        check_bound(&w, &q.dequantize(), |i| q.scales[(i / k / GROUP) * gk + (i % k) / GROUP])?;
        for b in 0..gn * gk {
            let (br, bc) = (b / gk, b % gk);
            let codes = (br * GROUP..((br + 1) * GROUP).min(n))
                .flat_map(|r| (bc * GROUP..((bc + 1) * GROUP).min(k)).map(move |c| (r, c)))
                .map(|(r, c)| q.codes[r * k + c] & 0x7F);
            prop_assert_eq!(codes.max(), Some(0x7E), "block {} has its amax at 448", b);
        }
    }
}
