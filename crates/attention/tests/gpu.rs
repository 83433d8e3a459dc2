//! attention/prefill and prefill-bf16 on the device: every stage compiled without local memory
//! (NVRTC), and (GPU) every stage verified at the default shapes, edge shapes and ragged random
//! shapes, bad buffers as typed errors, the documented limits and graph replays. Ignored (not passed) without NVRTC or a
//! GPU; failing with `LADDER_REQUIRE_NVRTC=1` / `LADDER_REQUIRE_GPU=1`.

use attention::decode::{self, Decode, DecodeArgs, DecodeDims, Dtype, Heads, HostCache, KvCache, PagedCache};
use attention::offload::{self, DecodeOffload, HostKv, OffloadArgs, OffloadDims};
use attention::prefill::{self, Prefill, PrefillArgs, PrefillDims};
use attention::prefill_bf16::{self, PrefillBf16};
use attention::reference::Dims;
use common::testing::{
    assert_constraint, assert_graph_replay_passes, assert_limits_on_gpu, assert_stages_pass, assert_stages_pass_at,
    proptest, Suite,
};
use common::{Arch, Error, Gpu, Op, Shape, Source, Variant};
use proptest::prelude::*;
use rayon::prelude::*;

fn variant(name: &str) -> Variant {
    Prefill.variants().into_iter().find(|v| v.name == name).unwrap_or_else(|| panic!("no stage {name}"))
}

fn shape(b: usize, t: usize, nh: usize, hs: usize, w: usize) -> Shape {
    Shape::new(&[("B", b as i64), ("T", t as i64), ("NH", nh as i64), ("HS", hs as i64), ("W", w as i64)])
}

fn bad_buffers(gpu: &Gpu) {
    let d = Dims { b: 2, t: 33, c: 96, nh: 3 };
    let qkv = gpu.upload(&common::data::uniform(d.b * d.t * 3 * d.c, -1.0, 1.0, 3)).unwrap();
    let short_qkv = gpu.upload(&vec![0.0f32; d.b * d.t * 3 * d.c - 1]).unwrap();
    let mut out = gpu.alloc_poisoned::<f32>(d.b * d.t * d.c).unwrap();
    let mut long_out = gpu.alloc_poisoned::<f32>(d.b * d.t * d.c + 1).unwrap();
    let mut lse = gpu.alloc_poisoned::<f32>(d.b * d.nh * d.t).unwrap();
    let mut short_lse = gpu.alloc_poisoned::<f32>(d.b * d.nh * d.t - 1).unwrap();
    let s = gpu.stream();
    for v in Prefill.variants() {
        let p = prefill::prepare(gpu, &v, PrefillDims { dims: d, window: 16 }).unwrap();
        assert_constraint(
            p.enqueue(s, PrefillArgs { out: &mut out, lse: Some(&mut lse), qkv: &short_qkv }),
            "len(qkv)",
        );
        assert_constraint(p.enqueue(s, PrefillArgs { out: &mut long_out, lse: Some(&mut lse), qkv: &qkv }), "len(out)");
        let bad = PrefillDims { dims: Dims { c: 144, ..d }, window: 16 };
        assert_constraint(prefill::prepare(gpu, &v, bad).map(|_| ()), "HS");
    }
    let tuned = prefill::prepare(gpu, &variant("flash-v2-tuned"), PrefillDims { dims: d, window: 16 }).unwrap();
    assert_constraint(tuned.enqueue(s, PrefillArgs { out: &mut out, lse: None, qkv: &qkv }), "lse");
    assert_constraint(
        tuned.enqueue(s, PrefillArgs { out: &mut out, lse: Some(&mut short_lse), qkv: &qkv }),
        "len(lse)",
    );
    assert_constraint(
        prefill::prepare(gpu, &variant("local-window"), PrefillDims { dims: d, window: 0 }).map(|_| ()),
        "W",
    );
    gpu.synchronize().unwrap();
    // Nothing was launched: out is still all NaN.
    assert!(gpu.download(&out).unwrap().iter().all(|x| x.is_nan()), "a refused call wrote out");
}

#[allow(clippy::too_many_arguments)]
fn decode_shape(b: i64, hq: i64, hkv: i64, d: i64, seq: i64, ragged: i64, bs: i64, dtype: i64, alibi: i64) -> Shape {
    let mut s = decode::shape(b, hq, hkv, d, seq, ragged, bs, alibi, 0);
    s.set("dtype", dtype);
    s
}

/// The ragged decode tests' heads: query heads per KV head (1 to 8), KV heads (1 to 4) and the head size (64
/// or 128).
fn decode_heads() -> impl Strategy<Value = (i64, i64, i64)> {
    (
        prop::sample::select(vec![1i64, 2, 4, 8]),
        prop::sample::select(vec![1i64, 2, 4]),
        prop::sample::select(vec![64i64, 128]),
    )
}

fn decode_bad_input(gpu: &Gpu) {
    let heads = Heads { hq: 4, hkv: 2, d: 64 };
    let dims = DecodeDims { b: 2, heads, tmax: 40, dtype: Dtype::Bf16, block_size: 16, splits: 0, warps: 0 };
    let lens = [40usize, 7];
    let k = decode::contiguous_cache(&dims, &lens, 1);
    let v = decode::contiguous_cache(&dims, &lens, 2);
    let (kp, vp, mut table) = decode::paged_from_contiguous(&dims, &k, &v, &lens, 2, 3);
    let blocks = kp.len() / (2 * 64 * 16);
    // A table entry outside the pool, and a pool whose size is not whole blocks.
    table[1] = blocks as i32;
    assert_constraint(PagedCache::new(gpu, &kp, &vp, &table, 2, 16, heads).map(|_| ()), "block_tables");
    table[1] = -1;
    assert_constraint(PagedCache::new(gpu, &kp, &vp, &table, 2, 16, heads).map(|_| ()), "block_tables");
    assert_constraint(PagedCache::new(gpu, &kp[1..], &vp[1..], &table, 2, 16, heads).map(|_| ()), "len(K pool)");
    // Lengths of 0 or past the capacity.
    assert_constraint(decode::SeqLens::new(gpu, &[0, 3], 40).map(|_| ()), "seq_lens");
    assert_constraint(decode::SeqLens::new(gpu, &[41, 3], 40).map(|_| ()), "seq_lens");
    // Mismatched buffers and the wrong layout: refused before any launch.
    let seq_lens = decode::SeqLens::new(gpu, &lens, 40).unwrap();
    let kd = gpu.upload(&k).unwrap();
    let vd = gpu.upload(&v).unwrap();
    let q = gpu.upload(&vec![Dtype::Bf16.bits(0.5); 2 * 4 * 64]).unwrap();
    let mut out = gpu.alloc_poisoned::<u16>(2 * 4 * 64).unwrap();
    let mut lse = gpu.alloc_poisoned::<f32>(2 * 4).unwrap();
    let stream = gpu.stream();
    for v_ in Decode.variants() {
        let p = decode::prepare(gpu, &v_, dims).unwrap();
        // One call on the contiguous cache of keys `k` (values `vd`) with lengths `seq_lens`.
        let mut enqueue = |k, seq_lens| {
            let cache = KvCache::Contiguous { k, v: &vd };
            p.enqueue(stream, DecodeArgs { out: &mut out, lse: &mut lse, q: &q, cache, seq_lens, alibi: None })
        };
        let short = gpu.upload(&k[1..]).unwrap();
        let r = enqueue(&short, &seq_lens);
        assert!(matches!(r, Err(Error::Constraint { .. })), "{}: {r:?}", v_.id());
        let long_lens = decode::SeqLens::new(gpu, &[41, 3], 41).unwrap();
        assert_constraint(enqueue(&kd, &long_lens), "seq_lens");
    }
    gpu.synchronize().unwrap();
    assert!(gpu.download(&out).unwrap().iter().all(|&x| Dtype::Bf16.value(x).is_nan()), "a refused call wrote out");
}

fn offload_bad_input(gpu: &Gpu) {
    let heads = Heads { hq: 4, hkv: 2, d: 64 };
    let d = OffloadDims { b: 2, heads, seq: 40, chunks: 3 };
    let n = 2 * 40 * 2 * 64;
    let (k, v) = (vec![0u16; n], vec![0u16; n]);
    assert_constraint(HostCache::new(gpu, &k, &v[..n - 1]).map(|_| ()), "len(V cache)");
    let cache = HostKv { pinned: HostCache::new(gpu, &k, &v).unwrap(), k, v };
    let q = gpu.upload(&vec![0u16; 2 * 4 * 64]).unwrap();
    for var in DecodeOffload.variants() {
        let mut p = offload::prepare(gpu, &var, d).unwrap();
        let (mut out, mut lse) = (gpu.alloc_poisoned::<u16>(2 * 4 * 64 - 1).unwrap(), gpu.zeros::<f32>(8).unwrap());
        let args = OffloadArgs { out: &mut out, lse: &mut lse, q: &q, cache: &cache, alibi: None };
        assert_constraint(p.enqueue(gpu.stream(), args), "len(out)");
        let short = HostKv {
            pinned: HostCache::new(gpu, &cache.k[..n - 128], &cache.v[..n - 128]).unwrap(),
            k: cache.k[..n - 128].to_vec(),
            v: cache.v[..n - 128].to_vec(),
        };
        let mut out = gpu.alloc_poisoned::<u16>(2 * 4 * 64).unwrap();
        let args = OffloadArgs { out: &mut out, lse: &mut lse, q: &q, cache: &short, alibi: None };
        assert_constraint(p.enqueue(gpu.stream(), args), "len(K cache)");
        gpu.synchronize().unwrap();
        assert!(gpu.download(&out).unwrap().iter().all(|&x| Dtype::Bf16.value(x).is_nan()), "a refused call wrote out");
    }
    let past = OffloadDims { chunks: 41, ..d };
    let streams = DecodeOffload.variants().into_iter().find(|v| v.name == "streams").unwrap();
    assert_constraint(offload::prepare(gpu, &streams, past).map(|_| ()), "1 <= chunks <= 16");
}

fn main() -> std::process::ExitCode {
    let mut suite = Suite::new().nvrtc("kernels_compile_without_local_memory", |tc| {
        // The cache keeps ptxas's log with the image, so a cached compile carries its warnings too.
        let jobs: Vec<(Variant, Arch)> = Prefill
            .variants()
            .into_iter()
            .chain(PrefillBf16.variants())
            .chain(Decode.variants())
            .chain(DecodeOffload.variants())
            .filter(|v| matches!(v.source, Source::Kernel(_)))
            .flat_map(|v| [Arch::SM80, Arch::SM90A].map(|arch| (v.clone(), arch)))
            .filter(|(v, arch)| !v.requires.arch_specific || *arch == Arch::SM90A)
            .collect();
        jobs.par_iter().for_each(|(v, arch)| {
            let Source::Kernel(path) = v.source else { unreachable!() };
            let src = attention::SOURCES.find(path).unwrap();
            let headers = attention::SOURCES.headers().unwrap();
            let c = tc.compile(&v.id(), src, &headers, &v.compile_defines(), *arch).unwrap_or_else(|e| panic!("{e}"));
            assert!(!c.image.is_empty(), "{} {}: empty image", v.id(), arch.name());
            // No local-memory arrays (a run-time indexed array would show as a .local declaration).
            assert!(!c.ptx.contains(".local"), "{} {}: uses local memory", v.id(), arch.name());
            let warnings = c.ptxas_warnings();
            assert!(warnings.is_empty(), "{} {}: {warnings:?}", v.id(), arch.name());
        });
    });
    for t in [64, 256, 1024] {
        suite = suite.gpu(&format!("stages_pass_default_t{t}"), move |gpu| {
            let s = Prefill.default_shapes().into_iter().find(|s| s.get("T") == Some(t)).expect("a default shape");
            assert_stages_pass(gpu, &Prefill, &s, &Prefill.variants());
        });
    }
    suite
        .gpu("stages_pass_edge_shapes", |gpu| {
            // T = 1 (a single token), T just past a tile, a window of 1, a window past T, W = 1024.
            for s in
                [shape(1, 1, 1, 32, 1), shape(2, 17, 3, 128, 1), shape(1, 33, 2, 64, 1024), shape(3, 100, 4, 32, 99)]
            {
                assert_stages_pass(gpu, &Prefill, &s, &Prefill.variants());
            }
        })
        .gpu("stages_pass_t1_near_zero_lse", |gpu| {
            // The seed whose single score is q.k * scale = 0.143 (score magnitude 5.42): stage 6's
            // bf16 rounding of q and k moves it by 4.9e-3, 3.4e-2 of itself (the lse check once
            // failed here) but 9.1e-4 of the magnitude it is now checked against
            // (`lse_is_checked_against_the_score_magnitude` in tests/prefill.rs).
            assert_stages_pass_at(gpu, &Prefill, &shape(1, 1, 1, 32, 1), &Prefill.variants(), 17551034952955572871);
        })
        .gpu("bf16_stages_pass_edge_shapes", |gpu| {
            // One token, 17 (a ragged T of the list), a tile and one past it (64 and 128
            // query rows a block), both masks and head sizes, several heads and sequences; and 432
            // query tiles of a ragged T, over three times an H100's SMs: several waves, ragged edge
            // tiles among them (and several items a block for a persistent walk).
            let edges =
                [(1, 1, 1, 64), (1, 1, 2, 128), (2, 17, 3, 128), (2, 65, 3, 64), (1, 129, 2, 128), (3, 128, 1, 64)];
            for (b, t, nh, hs) in edges.into_iter().chain([(3, 300, 48, 128)]) {
                for causal in [1, 0] {
                    let s = prefill_bf16::shape(b, t, nh, hs, causal);
                    assert_stages_pass(gpu, &PrefillBf16, &s, &PrefillBf16.variants());
                }
            }
        })
        .gpu("bf16_stages_pass_ragged", |gpu| {
            let strategy = (1i64..=4, 1i64..=300, 1i64..=3, prop::sample::select(vec![64i64, 128]), 0i64..=1);
            proptest(24, strategy, |(b, t, nh, hs, causal)| {
                let s = prefill_bf16::shape(b, t, nh, hs, causal);
                assert_stages_pass(gpu, &PrefillBf16, &s, &PrefillBf16.variants());
            })
        })
        .gpu("bf16_stages_pass_default_gpt2", |gpu| {
            for s in PrefillBf16.default_shapes().into_iter().filter(|s| s.get("HS") == Some(64)) {
                assert_stages_pass(gpu, &PrefillBf16, &s, &PrefillBf16.variants());
            }
        })
        .gpu("bad_buffers_are_typed_errors", bad_buffers)
        .gpu("decode_stages_pass_small_shapes", |gpu| {
            let all = Decode.variants();
            for (dtype, alibi, bs) in [(0, 0, 16), (1, 0, 32), (0, 1, 32), (1, 1, 16)] {
                // GPT-2's heads, a GQA 8:1 layout with ragged lengths, MQA, and a single token.
                for s in [
                    decode_shape(2, 12, 12, 64, 1024, 0, bs, dtype, alibi),
                    decode_shape(3, 32, 4, 128, 700, 1, bs, dtype, alibi),
                    decode_shape(2, 8, 1, 128, 513, 1, bs, dtype, alibi),
                    decode_shape(3, 4, 2, 64, 1, 0, bs, dtype, alibi),
                ] {
                    assert_stages_pass(gpu, &Decode, &s, &all);
                }
                // Two splits of blocks that do not fill the SMs, so that stage 11 launches its
                // merging entries at 16 warps (D = 64) and 8 (D = 128); one split takes its single
                // entries there at the default shapes.
                for mut s in [
                    decode_shape(4, 12, 12, 64, 1024, 1, bs, dtype, alibi),
                    decode_shape(2, 32, 32, 128, 700, 1, bs, dtype, alibi),
                ] {
                    s.set("splits", 2);
                    assert_stages_pass(gpu, &Decode, &s, &all);
                }
            }
        })
        .gpu("decode_stage_11_launches_warps_by_shape", |gpu| {
            // 16 warps where GPT-2's 96 unsplit blocks leave SMs idle, 8 at D = 128 (a 16-warp ring
            // does not fit), stage 9's 4 where the splits are short (B = 1) or the blocks many.
            let v = Decode.variants().into_iter().find(|v| v.stage == 11).unwrap();
            let sms = gpu.info().sm_count as usize;
            let dims = |b, hq, hkv, d, tmax| DecodeDims {
                b,
                heads: Heads { hq, hkv, d },
                tmax,
                dtype: Dtype::Bf16,
                block_size: 16,
                splits: 0,
                warps: 0,
            };
            for (d, warps) in [
                (dims(8, 12, 12, 64, 1024), if sms >= 96 { 16 } else { 4 }),
                (dims(1, 12, 12, 64, 1024), 4),
                (dims(32, 12, 12, 64, 1024), 4),
                (dims(32, 32, 4, 128, 8192), if sms >= 128 { 8 } else { 4 }),
            ] {
                let p = decode::prepare(gpu, &v, d).unwrap();
                let launch = p.split_launch().unwrap();
                assert_eq!(launch.shape().block.0, 32 * warps, "{d:?}: {}", launch.name());
                assert!(launch.name().ends_with(&format!("_w{warps}")), "{d:?}: {}", launch.name());
            }
            // A forced count (the `warps` shape key) is the one launched, and checked where built.
            let forced = DecodeDims { warps: 8, ..dims(8, 12, 12, 64, 1024) };
            let p = decode::prepare(gpu, &v, forced).unwrap();
            assert!(p.split_launch().unwrap().name().ends_with("_w8"));
            let unbuilt = DecodeDims { warps: 16, ..dims(8, 12, 12, 128, 1024) };
            assert_constraint(decode::prepare(gpu, &v, unbuilt).map(|_| ()), "16 only at D = 64");
            let other = Decode.variants().into_iter().find(|v| v.stage == 9).unwrap();
            assert_constraint(decode::prepare(gpu, &other, forced).map(|_| ()), "stage 11");
        })
        .gpu("decode_stages_pass_ragged", |gpu| {
            let strategy = (
                1i64..=8,
                1i64..=4096,
                decode_heads(),
                prop::sample::select(vec![16i64, 32]),
                (0i64..=1, 0i64..=1, 0i64..=40),
            );
            proptest(16, strategy, |(b, seq, (ratio, hkv, d), bs, (dtype, alibi, splits))| {
                let mut s = decode_shape(b, ratio * hkv, hkv, d, seq, 1, bs, dtype, alibi);
                s.set("splits", splits);
                // A stage that takes fewer splits (a cluster's blocks) runs at its most.
                let (over, within): (Vec<_>, Vec<_>) =
                    Decode.variants().into_iter().partition(|v| splits as usize > decode::max_splits(v).unwrap());
                assert_stages_pass(gpu, &Decode, &s, &within);
                if !over.is_empty() {
                    s.set("splits", decode::MAX_CLUSTER_SPLITS as i64);
                    assert_stages_pass(gpu, &Decode, &s, &over);
                }
            })
        })
        .gpu("decode_bad_input_is_refused", decode_bad_input)
        .gpu("offload_stages_pass", |gpu| {
            // GPT-2's heads with chunks that do not divide the sequence, GQA 8:1 with ALiBi, MQA
            // with one token per chunk, a single token.
            let mut alibi = offload::shape(3, 32, 4, 128, 700, 5);
            alibi.set("alibi", 1);
            for s in [
                offload::shape(2, 12, 12, 64, 1000, 3),
                alibi,
                offload::shape(2, 8, 1, 64, 16, 16),
                offload::shape(1, 4, 2, 128, 1, 1),
            ] {
                assert_stages_pass(gpu, &DecodeOffload, &s, &DecodeOffload.variants());
            }
        })
        .gpu("offload_stages_pass_ragged", |gpu| {
            let strategy = (1i64..=4, 1i64..=2048, decode_heads(), 1i64..=16);
            proptest(8, strategy, |(b, seq, (ratio, hkv, d), chunks)| {
                let s = offload::shape(b, ratio * hkv, hkv, d, seq, chunks.min(seq));
                assert_stages_pass(gpu, &DecodeOffload, &s, &DecodeOffload.variants());
            })
        })
        .gpu("offload_bad_input_is_refused", offload_bad_input)
        .gpu("kv_append_default_and_ragged", |gpu| {
            use attention::kv_append::KvAppend;
            for s in KvAppend.default_shapes() {
                assert_stages_pass(gpu, &KvAppend, &s, &KvAppend.variants());
            }
            proptest(12, (1i64..=6, 1i64..=70, 1i64..=300), |(b, tmax, c)| {
                let s = Shape::new(&[("R", (b * tmax + 1) / 2), ("B", b), ("Tmax", tmax), ("C", c)]);
                assert_stages_pass(gpu, &KvAppend, &s, &KvAppend.variants());
            })
        })
        .gpu("stages_pass_ragged", |gpu| {
            // Ragged shapes: T not a multiple of 16 or 32, every head size, B and NH up to GPT-2's, any window.
            let hs = prop::sample::select(prefill::HEAD_SIZES.to_vec());
            proptest(16, (1usize..=4, 1usize..=12, 1usize..=512, hs, 1usize..=1024), |(b, nh, t, hs, w)| {
                assert_stages_pass(gpu, &Prefill, &shape(b, t, nh, hs, w), &Prefill.variants())
            })
        })
        .gpu("limits_past_refused_inside_verified", |gpu| assert_limits_on_gpu(gpu, &attention::Attention))
        .gpu("graph_replay_every_stage", |gpu| {
            for v in Prefill.variants() {
                assert_graph_replay_passes(gpu, &Prefill, &shape(2, 100, 3, 64, 33), &v);
            }
            for v in PrefillBf16.variants() {
                assert_graph_replay_passes(gpu, &PrefillBf16, &prefill_bf16::shape(2, 100, 3, 128, 0), &v);
            }
            for v in Decode.variants() {
                assert_graph_replay_passes(gpu, &Decode, &decode_shape(3, 8, 2, 128, 700, 1, 16, 0, 1), &v);
            }
        })
        .main()
}
