//! attention/decode, CPU side: the reference against hand cases (plain, GQA, ALiBi), the ALiBi
//! slopes, the paged layout, shape checks and limits. The GPU tests are in `gpu.rs`.

use attention::decode::{
    self, alibi_slopes, checked_seqs, paged_from_contiguous, reference, Decode, DecodeDims, Dtype, Heads,
};
use common::testing::assert_constraint;
use common::{Op, Shape, Variant};

fn variant(name: &str) -> Variant {
    Decode.variants().into_iter().find(|v| v.name == name).unwrap_or_else(|| panic!("no stage {name}"))
}

fn rows(r: Vec<Vec<f64>>) -> impl Fn(usize, usize, usize, &mut [f64]) + Sync {
    move |_, t, _, out: &mut [f64]| out.copy_from_slice(&r[t])
}

#[test]
fn reference_hand_case() {
    // D = 1 would not be a kernel shape, but the reference is general: scale 1, two keys.
    let heads = Heads { hq: 1, hkv: 1, d: 1 };
    let (o, lse) = reference(
        heads,
        &[1.0],
        &[2],
        &[0],
        None,
        rows(vec![vec![0.0], vec![2f64.ln()]]),
        rows(vec![vec![3.0], vec![6.0]]),
    );
    // scores 0 and ln 2: weights 1/3, 2/3.
    assert!((o[0] - 5.0).abs() < 1e-12, "{o:?}");
    assert!((lse[0] - 3f64.ln()).abs() < 1e-12);
}

#[test]
fn reference_applies_alibi_from_the_last_position() {
    let heads = Heads { hq: 1, hkv: 1, d: 1 };
    // Equal scores; slope ln 2: key 0 gets -ln 2 (one position back), key 1 none -> weights 1/3, 2/3.
    let slopes = [2f64.ln()];
    let (o, _) = reference(
        heads,
        &[0.0],
        &[2],
        &[0],
        Some(&slopes),
        rows(vec![vec![1.0], vec![1.0]]),
        rows(vec![vec![3.0], vec![6.0]]),
    );
    assert!((o[0] - 5.0).abs() < 1e-12, "{o:?}");
}

#[test]
fn alibi_slopes_follow_the_paper() {
    let s8 = alibi_slopes(8);
    assert_eq!(s8.len(), 8);
    assert!((s8[0] - 0.5).abs() < 1e-15 && (s8[7] - 2f64.powi(-8)).abs() < 1e-15);
    // 12 heads: the 8 of n = 8, then every other slope of n = 16 (2^-0.5, 2^-1.5, ...).
    let s12 = alibi_slopes(12);
    assert_eq!(&s12[..8], &s8[..]);
    assert!((s12[8] - 2f64.powf(-0.5)).abs() < 1e-15 && (s12[9] - 2f64.powf(-1.5)).abs() < 1e-15);
}

#[test]
fn paged_layout_holds_the_same_rows() {
    let d = DecodeDims {
        b: 3,
        heads: Heads { hq: 4, hkv: 2, d: 64 },
        tmax: 50,
        dtype: Dtype::Bf16,
        block_size: 16,
        splits: 0,
        warps: 0,
    };
    let lens = [50, 1, 17];
    let k = decode::contiguous_cache(&d, &lens, 1);
    let v = decode::contiguous_cache(&d, &lens, 2);
    let (kp, vp, table) = paged_from_contiguous(&d, &k, &v, &lens, 5, 3);
    let mb = d.max_blocks();
    let used: usize = lens.iter().map(|l| l.div_ceil(16)).sum();
    assert_eq!(kp.len(), (used + 5) * 2 * 64 * 16);
    for (b, &len) in lens.iter().enumerate() {
        for t in 0..len {
            let phys = table[b * mb + t / 16] as usize;
            for h in 0..2 {
                for e in 0..64 {
                    let src = ((b * 50 + t) * 2 + h) * 64 + e;
                    let base = (phys * 2 + h) * 64 * 16;
                    assert_eq!(kp[base + ((e / 8) * 16 + t % 16) * 8 + e % 8], k[src]);
                    assert_eq!(vp[base + e * 16 + t % 16], v[src]);
                }
            }
        }
    }
    // Blocks in use are distinct.
    let mut ids: Vec<i32> =
        lens.iter().enumerate().flat_map(|(b, l)| table[b * mb..b * mb + l.div_ceil(16)].to_vec()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), used);
}

#[test]
fn bad_shapes_are_typed_errors() {
    let s = |b, hq, hkv, d, seq, bs, splits| decode::shape(b, hq, hkv, d, seq, 0, bs, 0, splits);
    for v in Decode.variants() {
        Decode.validate(&v, &s(2, 8, 2, 128, 100, 16, 0)).unwrap_or_else(|e| panic!("{}: {e}", v.id()));
        assert_constraint(Decode.validate(&v, &s(2, 8, 2, 96, 100, 16, 0)), "D in {64, 128}");
        assert_constraint(Decode.validate(&v, &s(2, 6, 4, 64, 100, 16, 0)), "HQ % HKV");
        assert!(Decode.validate(&v, &s(0, 8, 2, 64, 100, 16, 0)).is_err());
    }
    assert_constraint(Decode.validate(&variant("paged-v1"), &s(2, 4, 2, 64, 100, 24, 0)), "block_size");
    assert_constraint(Decode.validate(&variant("decoding-attention"), &s(1, 1, 1, 64, 40000, 16, 0)), "Tmax <= 32768");
    assert_constraint(Decode.validate(&variant("gqa-packed"), &s(2, 6, 2, 64, 100, 16, 0)), "HQ / HKV in");
    assert_constraint(Decode.validate(&variant("flash-decoding"), &s(2, 4, 2, 64, 100, 16, 300)), "splits <= 256");
    let bad_dtype = Shape::parse("B=1,HQ=1,HKV=1,D=64,seq=4,ragged=0,bs=16,dtype=2,alibi=0,splits=0").unwrap();
    assert!(Decode.validate(&variant("naive"), &bad_dtype).is_err());
    assert_eq!(checked_seqs(3, 1), vec![0, 1, 2]);
}

#[test]
fn documented_limits_are_enforced() {
    common::testing::check_limits(&attention::Attention).unwrap_or_else(|e| panic!("{e}"));
}
