//! quant-int4 tests, CPU side: the formats and the quantizer's properties, the reference, the stage
//! table, every shape/buffer constraint and the documented limits. The GPU tests are in `gpu.rs`.

use common::testing::check_stage_files;
use common::{Error, Op, Variant};
use half::{bf16, f16};
use proptest::prelude::*;
use quant_int4::decode::{
    self, check_cache, check_dims, check_seq_lens, checked_seqs, default_splits, Decode, DecodeShape, Dims, StagePlan,
};
use quant_int4::format::{self, check_int4, KvFormat, Layout, Role};
use quant_int4::quantize::{self, Quantize};
use quant_int4::QuantInt4;

fn is_constraint(r: common::Result<()>, needle: &str) {
    match r {
        Err(Error::Constraint { constraint, got }) => {
            assert!(constraint.contains(needle), "constraint '{constraint}' (got {got}) should mention '{needle}'")
        }
        other => panic!("expected a constraint error mentioning '{needle}', got {other:?}"),
    }
}

const ROW: KvFormat = KvFormat::Int4 { groups: 1 };
const GROUP: KvFormat = KvFormat::Int4 { groups: 4 };

// ---------------------------------------------------------------- the stage table

#[test]
fn stage_files_match() {
    check_stage_files(&QuantInt4).unwrap();
}

fn opts_of(v: &Variant) -> Vec<String> {
    v.defines.iter().filter(|d| d.name.starts_with("OPT")).map(|d| d.name.to_string()).collect()
}

#[test]
fn decode_ladder_table() {
    let v = Decode.variants();
    common::testing::assert_stage_names(
        &v,
        &[
            "bf16-splitk",
            "int4-splitk",
            "int4-row+1",
            "int4-row+1..2",
            "int4-row+1..3",
            "int4-row+1..4",
            "int4-row+1..5",
            "int4-row+1..5,7",
            "int4-row+1..5,7..8",
            "int4-row+1..5,7..9",
            "int4-row+1..5,7..10",
            "int4-group+1..6",
            "int4-group+1..7",
            "int4-group+1..8",
            "int4-group+1..9",
            "int4-group+1..10",
            "int4-row+1..5,7..11",
            "int4-row+1..5,7..12",
            "int4-row+1..5,7..13",
            "int4-group+1..11",
            "int4-group+1..12",
            "int4-group+1..13",
            "int4-row-fragments",
            "int4-group-fragments",
            "int4-row-fragments+warp-merge",
            "int4-group-fragments+warp-merge",
        ],
    );
    for s in &v {
        assert_eq!(s.requires, common::Requirements::SM80, "{}", s.name);
    }
    assert_eq!(decode::stage_format(&v[0]).unwrap(), KvFormat::Bf16);
    // Cumulative: each ladder step adds exactly one switch to the previous stage.
    let row: Vec<&Variant> = v[1..=10].iter().chain(&v[16..=18]).collect();
    let group: Vec<&Variant> = v[11..=15].iter().chain(&v[19..=21]).collect();
    for w in row.windows(2).chain(group.windows(2)) {
        let (a, b) = (opts_of(w[0]), opts_of(w[1]));
        assert_eq!(b.len(), a.len() + 1, "{} -> {}", w[0].name, w[1].name);
        assert!(a.iter().all(|o| b.contains(o)), "{} -> {}", w[0].name, w[1].name);
    }
    for s in &row {
        assert_eq!(decode::stage_format(s).unwrap(), ROW, "{}", s.name);
        assert!(!opts_of(s).contains(&"OPT6".to_string()));
    }
    for s in &group {
        assert_eq!(decode::stage_format(s).unwrap(), GROUP, "{}", s.name);
    }
    assert_eq!(opts_of(&v[18]).len(), 12);
    assert_eq!(opts_of(&v[21]).len(), 13);
    // OPT6 is the format and OPT11's pad replaces OPT10's: neither is a leave-one-out toggle.
    assert_eq!(v[18].toggles.len(), 11);
    assert_eq!(v[21].toggles.len(), 11);
    assert!(v.iter().filter(|s| !s.toggles.is_empty()).count() == 2);
    // The fragment-direct stages: one a format, the fragment layout, their own kernel file.
    // Stages 24-25 add the warp-a-row merge to 22-23.
    for (s, want, merge) in [(&v[22], ROW, false), (&v[23], GROUP, false), (&v[24], ROW, true), (&v[25], GROUP, true)] {
        assert_eq!(s.has("QI4F_WARP_MERGE"), merge, "{}", s.name);
        assert_eq!(decode::stage_format(s).unwrap(), want, "{}", s.name);
        assert_eq!(decode::stage_layout(s).unwrap(), Layout::Fragments, "{}", s.name);
        assert!(opts_of(s).is_empty() && s.toggles.is_empty(), "{}", s.name);
    }
    assert!(v[..22].iter().all(|s| decode::stage_layout(s).unwrap() == Layout::Rows));

    let loo = Decode.leave_one_out();
    assert_eq!(loo.len(), 22);
    let mut ids: Vec<String> = v.iter().chain(&loo).map(|s| s.id()).collect();
    let n = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "variant ids are unique");
    for l in &loo {
        assert_eq!(opts_of(l).len() + 1, if l.name.starts_with("group") { 13 } else { 12 }, "{}", l.name);
        let want = if l.name.starts_with("group") { GROUP } else { ROW };
        assert_eq!(decode::stage_format(l).unwrap(), want, "{}", l.name);
    }
}

// ---------------------------------------------------------------- formats and the CPU quantizer

#[test]
fn directed_fp16_rounding_brackets() {
    let xs = uniform_mixed(20_000, 7);
    for x in xs.into_iter().chain([0.0, -0.0, 1e-9, -1e-9, 65504.0, 65510.0, 70000.0, -65510.0, 1.0 / 3.0]) {
        let (lo, hi) = (format::f16_round_down(x), format::f16_round_up(x));
        assert!(lo.to_f32() <= x && hi.to_f32() >= x, "x = {x}: {lo} .. {hi}");
        // adjacent: nothing representable strictly between them
        let rn = f16::from_f32(x);
        assert!(rn == lo || rn == hi, "x = {x}: RN {rn} outside {lo} .. {hi}");
        if lo.to_f32() == x {
            assert_eq!(hi.to_f32(), x);
        } else if lo.is_finite() && hi.is_finite() {
            let (a, b) = (lo.to_f32() as f64, hi.to_f32() as f64);
            let mid = f16::from_f64((a + b) / 2.0).to_f32() as f64;
            assert!(mid == a || mid == b, "x = {x}: {lo} and {hi} not adjacent");
        }
    }
}

fn uniform_mixed(n: usize, seed: u64) -> Vec<f32> {
    let u = common::data::uniform(n, -1.0, 1.0, seed);
    u.iter().enumerate().map(|(i, v)| v * 10f32.powi((i % 9) as i32 - 4)).collect()
}

#[test]
fn nibble_order_hand_case() {
    // D = 64 row-wise, x_i = i % 16: shift 0, scale 1, q_i = i % 16.
    let x: Vec<f32> = (0..64).map(|i| (i % 16) as f32).collect();
    let mut row = vec![0u8; format::int4_row_bytes(64, 1)];
    format::quantize_row(&x, 1, &mut row);
    assert_eq!(row.len(), 36);
    assert_eq!(&row[0..4], &[0x00, 0x3C, 0x00, 0x00], "scale 1.0 (fp16 0x3C00), shift 0");
    let w0 = u32::from_le_bytes(row[4..8].try_into().unwrap());
    assert_eq!(w0, 0x7531_6420, "values 0..7: even ones in the low half-word, odd ones in the high");
    let w1 = u32::from_le_bytes(row[8..12].try_into().unwrap());
    assert_eq!(w1, 0xFDB9_ECA8);
    let mut deq = vec![0f64; 64];
    format::dequantize_row(&row, 64, 1, &mut deq);
    assert!(deq.iter().zip(&x).all(|(a, b)| *a == *b as f64));
    assert_eq!(format::int4_row_bytes(128, 1), 68);
    assert_eq!(format::int4_row_bytes(128, 4), 80);
}

#[test]
fn nan_rows_become_poison() {
    let mut x = vec![bf16::from_f32(0.5); 256];
    x[128] = bf16::NAN;
    let q = format::quantize(&x, 128, 4);
    assert_eq!(q.len(), 160);
    assert!(q[80..].iter().all(|&b| b == 0xFF));
    assert!(q[..80].iter().any(|&b| b != 0xFF));
}

#[test]
fn byte_mismatches_count_every_wrong_or_missing_byte() {
    // Past one stretch of the comparison, so the first mismatch is found in a later one.
    let want: Vec<u8> = (0..200_000).map(|i| (i % 251) as u8).collect();
    let same = quantize::byte_mismatches("bytes", &want, &want);
    assert_eq!((same.non_finite, same.first_non_finite, same.count), (0, None, want.len()));
    assert!(same.passes(0.0));
    let mut got = want.clone();
    got[150_001] ^= 1;
    got[199_999] ^= 0x80;
    let wrong = quantize::byte_mismatches("bytes", &got, &want);
    assert_eq!((wrong.non_finite, wrong.first_non_finite), (2, Some(150_001)));
    assert!(!wrong.passes(f64::INFINITY));
    let short = quantize::byte_mismatches("bytes", &got[..190_000], &want);
    assert_eq!((short.non_finite, short.first_non_finite), (10_001, Some(150_001)));
}

fn max_err_and_sse(x: &[f32], d: usize, groups: usize) -> (Vec<f64>, Vec<(f32, f32)>, f64) {
    let mut row = vec![0u8; format::int4_row_bytes(d, groups)];
    format::quantize_row(x, groups, &mut row);
    let mut deq = vec![0f64; d];
    format::dequantize_row(&row, d, groups, &mut deq);
    let errs: Vec<f64> = deq.iter().zip(x).map(|(a, b)| (a - *b as f64).abs()).collect();
    let sse = errs.iter().map(|e| e * e).sum();
    (errs, format::row_params(&row, groups), sse)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn dequantization_error_within_half_scale(
        d in prop::sample::select(vec![64usize, 128]),
        groups in prop::sample::select(vec![1usize, 4]),
        offset in -300.0f32..300.0,
        spread in 1e-3f32..50.0,
        seed in any::<u64>(),
    ) {
        let x: Vec<f32> = common::data::uniform(d, -1.0, 1.0, seed)
            .into_iter()
            .map(|u| bf16::from_f32(offset + spread * u).to_f32())
            .collect();
        let (errs, params, _) = max_err_and_sse(&x, d, groups);
        for (i, e) in errs.iter().enumerate() {
            let (scale, shift) = params[i / (d / groups)];
            prop_assert!(scale >= 0.0 && shift <= x[i]);
            let bound = scale as f64 / 2.0 * (1.0 + 1e-3) + 1e-6 * (x[i].abs() as f64);
            prop_assert!(*e <= bound, "x[{i}] = {}: err {e} > scale/2 = {}", x[i], scale / 2.0);
        }
    }

    #[test]
    fn group_wise_beats_row_wise_on_outlier_rows(d in prop::sample::select(vec![64usize, 128]), seed in any::<u64>()) {
        let x: Vec<f32> = quantize::cache_values(d, d, seed).iter().map(|v| v.to_f32()).collect();
        prop_assume!(x[3].abs() > 3.0);
        let (_, _, row_sse) = max_err_and_sse(&x, d, 1);
        let (_, _, group_sse) = max_err_and_sse(&x, d, 4);
        prop_assert!(group_sse <= row_sse, "group-wise SSE {group_sse} > row-wise {row_sse}");
    }
}

#[test]
fn cache_quantization_cost_row_vs_group() {
    let d = 128;
    let x = quantize::cache_values(4096 * d, d, 11);
    let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let row = common::check::compare("row", &format::dequantize(&format::quantize(&x, d, 1), d, 1), &xf).rel_l2;
    let grp = common::check::compare("group", &format::dequantize(&format::quantize(&x, d, 4), d, 4), &xf).rel_l2;
    assert!(grp < row, "group-wise {grp} should beat row-wise {row} with an outlier channel");
    assert!(row < 0.2 && grp < 0.1, "row {row}, group {grp}");
}

// ---------------------------------------------------------------- the reference

fn from_rows(rows: Vec<Vec<f64>>) -> impl Fn(usize, usize, usize, &mut [f64]) + Sync {
    move |_b, t, _h, out: &mut [f64]| out.copy_from_slice(&rows[t])
}

#[test]
fn reference_hand_case() {
    // D = 2: s = (0, ln 3) -> p = (1/4, 3/4); O = p0 V0 + p1 V1 = (4, -1).
    let dims = Dims { b: 1, tmax: 2, hq: 1, hkv: 1, d: 2 };
    let q = [1.0f32, 0.0];
    let k = vec![vec![0.0, 0.0], vec![2f64.sqrt() * 3f64.ln(), 7.0]];
    let v = vec![vec![1.0, 2.0], vec![5.0, -2.0]];
    let o = decode::reference(&dims, &q, &[2], &[0], from_rows(k), from_rows(v));
    assert!((o[0] - 4.0).abs() < 1e-12 && (o[1] + 1.0).abs() < 1e-12, "{o:?}");
}

#[test]
fn reference_maps_query_heads_to_kv_heads_and_lengths() {
    // HQ = 4, HKV = 2: heads 0, 1 read KV head 0 (V = 1), heads 2, 3 read KV head 1 (V = 2); the
    // second sequence has length 1, so its output is its first V row (3 or 4).
    let dims = Dims { b: 2, tmax: 3, hq: 4, hkv: 2, d: 2 };
    let q = vec![0.5f32; 2 * 4 * 2];
    let kf = |_b: usize, t: usize, h: usize, out: &mut [f64]| out.fill((t + h) as f64);
    let vf = |b: usize, t: usize, h: usize, out: &mut [f64]| {
        out.fill(if b == 0 {
            1.0 + h as f64
        } else if t == 0 {
            3.0 + h as f64
        } else {
            f64::NAN
        })
    };
    let o = decode::reference(&dims, &q, &[3, 1], &[0, 1], kf, vf);
    let want = [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0, 4.0, 4.0, 4.0, 4.0];
    for (a, b) in o.iter().zip(want) {
        assert!((a - b).abs() < 1e-12, "{o:?}");
    }
}

// ---------------------------------------------------------------- constraints (no GPU needed)

fn dims(b: usize, tmax: usize, hq: usize, hkv: usize, d: usize) -> Dims {
    Dims { b, tmax, hq, hkv, d }
}

#[test]
fn bad_shapes_are_typed_errors() {
    assert!(check_dims(&dims(512, 8192, 8, 1, 128)).is_ok());
    is_constraint(check_dims(&dims(4, 100, 8, 1, 96)), "D in {64, 128}");
    is_constraint(check_dims(&dims(4, 100, 6, 4, 128)), "HQ % HKV == 0");
    is_constraint(check_dims(&dims(4, 100, 16, 1, 128)), "HQ / HKV <= 8");
    is_constraint(check_dims(&dims(70_000, 100, 8, 1, 128)), "B <= 65535");
    is_constraint(check_dims(&dims(4096, 1 << 20, 8, 1, 128)), "B * Tmax * HKV < 2^31");
    is_constraint(check_seq_lens(&[5, 0, 3], 3, 10), "1 <= seq_lens[b] <= Tmax");
    is_constraint(check_seq_lens(&[5, 11, 3], 3, 10), "1 <= seq_lens[b] <= Tmax");
    is_constraint(check_seq_lens(&[5, 3], 3, 10), "len(seq_lens) == B");
    assert!(check_seq_lens(&[1, 10, 3], 3, 10).is_ok());
    is_constraint(check_int4(128, 2), "groups in {1");
    is_constraint(check_int4(128, 0), "groups in {1");
    is_constraint(check_int4(80, 1), "D in {64, 128}");
    assert!(KvFormat::from_key(2).is_err() && KvFormat::from_key(4).unwrap() == GROUP);

    let base = decode::shape(4, 100, 100, true, 8, 1, 128, ROW, 0);
    assert!(DecodeShape::parse(&base).is_ok());
    let with = |k: &str, v: i64| {
        let mut s = base.clone();
        s.set(k, v);
        DecodeShape::parse(&s).map(|_| ())
    };
    is_constraint(with("seq", 101), "1 <= seq <= Tmax");
    is_constraint(with("seq", 0), "1 <= seq <= Tmax");
    is_constraint(with("fmt", 2), "fmt in");
    is_constraint(with("splits", 257), "splits <= 256");
    is_constraint(with("D", 64 + 32), "D in {64, 128}");
    is_constraint(with("HKV", 3), "HQ % HKV == 0");
    is_constraint(with("ragged", 2), "ragged in {0, 1}");
}

#[test]
fn cache_buffers_must_match_the_format() {
    let dm = dims(2, 10, 8, 1, 128);
    let rows = 20;
    let plan = |format| StagePlan { format, layout: Layout::Rows };
    let frag = |format| StagePlan { format, layout: Layout::Fragments };
    let (row, group) = (plan(ROW), plan(GROUP));
    assert!(check_cache("K", "s", row, row, rows * 68, &dm).is_ok());
    assert!(check_cache("K", "s", group, group, rows * 80, &dm).is_ok());
    assert!(check_cache("K", "s", plan(KvFormat::Bf16), plan(KvFormat::Bf16), rows * 256, &dm).is_ok());
    is_constraint(check_cache("K", "s", row, row, rows * 68 - 1, &dm), "K cache bytes == 1360");
    is_constraint(check_cache("V", "s", group, group, rows * 68, &dm), "V cache bytes == 1600");
    is_constraint(check_cache("K", "s", row, group, rows * 80, &dm), "K cache format == int4 row-wise");
    is_constraint(check_cache("K", "s", row, plan(KvFormat::Int4 { groups: 2 }), rows * 72, &dm), "groups in {1");
    // Fragments: Tmax = 10 rounds up to one chunk of 16 tokens a sequence.
    assert!(check_cache("K", "s", frag(ROW), frag(ROW), 2 * 16 * 68, &dm).is_ok());
    assert!(check_cache("V", "s", frag(GROUP), frag(GROUP), 2 * 16 * 80, &dm).is_ok());
    is_constraint(check_cache("K", "s", frag(ROW), frag(ROW), rows * 68, &dm), "K cache bytes == 2176 (Fragments");
    is_constraint(check_cache("K", "s", frag(ROW), row, 2 * 16 * 68, &dm), "K cache layout == Fragments");
}

#[test]
fn fragment_layout_hand_case() {
    // K, token 9, dim 19: k-step 1, lane 4 * 1 + 1 (g = 1, c = 1) holds dims 18, 19 of token g + 8 as
    // a1's pair: the second 512-byte half, lane 5's 16 bytes, word 0, pair 2, element 1.
    assert_eq!(format::fragment_code_position(Role::K, 128, 1, 9, 19), (64 + 512 + 5 * 16, 4 * 2 + 16));
    // V, token 9, dim 19: m-tile 1, lane 4 * 3 + 0 (g = 3, c = 0) holds dims 19, 27 x tokens 0, 1, 8, 9:
    // pair a2 (dim 16 + g, tokens 8, 9), element 1 (token 9).
    assert_eq!(format::fragment_code_position(Role::V, 128, 1, 9, 19), (64 + 12 * 16 + 4, 4 * 2 + 16));
    // m-tile 5 of V is in the second 512-byte half.
    assert_eq!(format::fragment_code_position(Role::V, 128, 4, 0, 80).0, 256 + 512 + 4);
    // Parameters: tokens g and g + 8 side by side.
    assert_eq!(format::fragment_param_offset(3, 1), 24);
    assert_eq!(format::fragment_param_offset(11, 1), 28);
    assert_eq!(format::fragment_param_offset(11, 4), 112);
}

#[test]
fn fragment_code_map_is_a_bijection() {
    // Every nibble of a chunk's codes is the code of exactly one (token, dim).
    for (d, groups, role) in [(64, 1, Role::K), (128, 1, Role::V), (128, 4, Role::K), (64, 4, Role::V)] {
        let codes = format::CHUNK * 4 * groups;
        let mut hits = vec![0u32; 2 * format::chunk_bytes(d, groups)];
        for t in 0..format::CHUNK {
            for dim in 0..d {
                let (w, shift) = format::fragment_code_position(role, d, groups, t, dim);
                hits[2 * w + shift as usize / 4] += 1;
            }
        }
        assert!(hits[..2 * codes].iter().all(|&n| n == 0), "{role:?} D {d} G {groups}");
        assert!(hits[2 * codes..].iter().all(|&n| n == 1), "{role:?} D {d} G {groups}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Every row of a fragment-layout cache reads back byte for byte.
    #[test]
    fn fragment_layout_round_trips(
        b in 1usize..3, tmax in 1usize..40, hkv in 1usize..3,
        d in prop::sample::select(vec![64usize, 128]), groups in prop::sample::select(vec![1usize, 4]),
        seed in any::<u64>(),
    ) {
        let rb = format::int4_row_bytes(d, groups);
        let mut rows = common::data::uniform(b * tmax * hkv * rb, 0.0, 256.0, seed)
            .into_iter().map(|x| x as u8).collect::<Vec<u8>>();
        rows[..rb].fill(0xFF);  // a NaN (padding) row survives too
        for role in [Role::K, Role::V] {
            let frag = format::to_fragments(&rows, b, tmax, hkv, d, groups, role);
            prop_assert_eq!(frag.len(), format::fragment_cache_bytes(b, tmax, hkv, d, groups));
            prop_assert_eq!(&format::from_fragments(&frag, b, tmax, hkv, d, groups, role)[..], &rows[..], "{:?}", role);
        }
    }
}

#[test]
fn validate_matches_stage_and_shape_formats() {
    let v = Decode.variants();
    for (fmt, runs) in [
        (KvFormat::Bf16, vec![0]),
        (ROW, (0..=10).chain(16..=18).chain([22, 24]).collect()),
        (GROUP, [0, 11, 12, 13, 14, 15, 19, 20, 21, 23, 25].to_vec()),
    ] {
        let s = decode::shape(2, 64, 64, false, 8, 1, 128, fmt, 0);
        let ok: Vec<usize> = v.iter().filter(|x| Decode.validate(x, &s).is_ok()).map(|x| x.stage as usize).collect();
        assert_eq!(ok, runs, "fmt {fmt:?}");
    }
    let q = Quantize.variants();
    let qs = quantize::qshape;
    assert!(Quantize.validate(&q[0], &qs(10, 128, 4, 1)).is_ok());
    is_constraint(Quantize.validate(&q[0], &qs(10, 128, 3, 1)), "groups in");
    is_constraint(Quantize.validate(&q[0], &qs(10, 32, 1, 1)), "D in");
    // The fragment layout reads the rows as [Tmax, HKV]; the row layout does not care.
    assert_eq!(q.iter().map(|v| v.name.as_ref()).collect::<Vec<_>>(), ["warp-per-row", "fragments-k", "fragments-v"]);
    assert!(Quantize.validate(&q[0], &qs(10, 128, 1, 3)).is_ok());
    assert!(Quantize.validate(&q[1], &qs(12, 128, 1, 3)).is_ok());
    is_constraint(Quantize.validate(&q[2], &qs(10, 128, 1, 3)), "rows % HKV == 0");
    is_constraint(Quantize.validate(&q[1], &qs(10, 128, 1, 0)), "1 <= HKV");
}

#[test]
fn split_heuristic_and_subsets() {
    for b in [1usize, 32, 64, 128, 256, 512, 4096] {
        for tmax in [1usize, 100, 8192] {
            let s = default_splits(4 * 132, b, 1, tmax);
            assert!((1..=128).contains(&s) && s <= tmax.div_ceil(128).max(1), "B {b} Tmax {tmax}: {s}");
        }
    }
    assert!(default_splits(4 * 132, 32, 1, 8192) > default_splits(4 * 132, 512, 1, 8192));
    // Whole waves of the stage's residency: 16 splits of 32 sequences fill 528 places, 17 would not.
    assert_eq!(default_splits(4 * 132, 32, 1, 8192), 16);
    assert_eq!(default_splits(3 * 132, 32, 1, 8192), 12);
    assert_eq!(default_splits(3 * 132, 512, 1, 8192), 3);
    assert_eq!(default_splits(3 * 132, 32, 1, 1000), 8, "at most one split per 128 tokens");
    assert_eq!(checked_seqs(40, 1), (0..40).collect::<Vec<_>>());
    let c = checked_seqs(512, 1);
    assert_eq!(c.len(), 64);
    assert!(c[0] == 0 && *c.last().unwrap() == 511 && c.windows(2).all(|w| w[0] < w[1]));
    let s = DecodeShape::parse(&decode::shape(64, 2048, 1001, true, 8, 1, 64, ROW, 0)).unwrap();
    let lens = s.lens(5);
    assert!(lens.iter().all(|&l| (501..=1001).contains(&l)), "{lens:?}");
    assert!(lens.windows(2).any(|w| w[0] != w[1]), "ragged lengths differ");
}

#[test]
fn documented_limits_are_enforced() {
    common::testing::check_limits(&QuantInt4).unwrap_or_else(|e| panic!("{e}"));
}
