//! gpt2 on the GPU: the encoder, GELU and residual against the f64 reference at the default and ragged shapes, token
//! ids checked on upload, the documented limits, and a graph replay. Ignored (not passed) without a
//! GPU; failing with `LADDER_REQUIRE_GPU=1`.

use common::check::rel_l2;
use common::testing::{assert_graph_replay_passes, assert_limits_on_gpu, assert_stages_pass, proptest, Suite};
use common::{Gpu, Op, Shape};
use gpt2::cache::KvCache;
use gpt2::config::Config;
use gpt2::encoder::{Encoder, TokenIds};
use gpt2::model::{Logits, Model};
use gpt2::plan::Plan;
use gpt2::pointwise::{Gelu, Residual};
use gpt2::reference;
use gpt2::sampling::Sampling;
use gpt2::weights::Weights;
use proptest::prelude::{prop_oneof, Just};

/// The small models' prompts: 3 rows of `t` tokens below 101, varied by `seed`.
fn token_rows(seed: u64, t: usize) -> Vec<Vec<i32>> {
    (0..3).map(|b| (0..t).map(|i| ((b * 31 + i * 7 + seed as usize) % 101) as i32).collect()).collect()
}

/// Each row's last position of `all` (`[B, T, V]`): what `forward_last` computes.
fn last_rows<T: Copy>(all: &[T], t: usize, v: usize) -> Vec<T> {
    all.chunks(t * v).flat_map(|r| r[(t - 1) * v..].to_vec()).collect()
}

/// The rel L2 errors of `plan`'s logits on `tokens` against the reference's, `want` (`[B, T, V]`):
/// of the whole-sequence pass, and of the last-position pass (`forward_last`) against each row's last
/// position.
fn forward_errors(gpu: &Gpu, cfg: Config, w: &Weights, plan: Plan, tokens: &[Vec<i32>], want: &[f64]) -> (f64, f64) {
    let mut m = Model::new(gpu, cfg, w, plan).unwrap();
    let all = rel_l2(&m.forward(gpu, tokens).unwrap(), want);
    let last = rel_l2(&m.forward_last(gpu, tokens).unwrap(), &last_rows(want, tokens[0].len(), cfg.vocab));
    (all, last)
}

/// Each plan of `specs` against the f64 forward on `cfg`'s random weights, at each (seed, T) of
/// `cases`: the logits of the whole-sequence pass and of the last-position pass within `tol`.
fn assert_plans_match_reference(gpu: &Gpu, cfg: Config, cases: &[(u64, usize)], specs: &[&str], tol: f64) {
    for &(seed, t) in cases {
        let w = Weights::random(&cfg, seed);
        let tokens = token_rows(seed, t);
        let want = reference::forward(&cfg, &w, &tokens);
        for spec in specs {
            let (err, err_last) = forward_errors(gpu, cfg, &w, plan_of(spec), &tokens, &want);
            eprintln!("plan {spec}, seed {seed}, T = {t}: logits rel L2 {err:.2e}");
            assert!(err <= tol, "plan {spec}, seed {seed}: logits rel L2 {err:e}");
            assert!(err_last <= tol, "plan {spec}, seed {seed}: last-position logits rel L2 {err_last:e}");
        }
    }
}

/// The decode tests' prompts: ragged sequences of 5, 11 and 17 tokens below 101.
fn decode_prompts() -> Vec<Vec<i32>> {
    [5usize, 11, 17].iter().map(|&n| (0..n).map(|t| ((t * 13 + n) % 101) as i32).collect()).collect()
}

/// Prefills `prompts` into a new cache of `m` (step 0), then feeds every sequence one token a step
/// and decodes (steps 1 to 6); after each step, `check` gets the step, the sequences so far and the
/// step's last-position logits of each. Returns the cache.
fn run_decode(
    gpu: &Gpu,
    m: &mut Model,
    prompts: &[Vec<i32>],
    mut check: impl FnMut(usize, &[Vec<i32>], &[f32]),
) -> KvCache {
    let mut cache = m.new_cache(gpu, prompts.len()).unwrap();
    let mut s = prompts.to_vec();
    for step in 0..7 {
        let last: Vec<f32> = if step == 0 {
            (0..s.len()).flat_map(|i| m.prefill_into(gpu, &mut cache, i, &s[i]).unwrap()).collect()
        } else {
            let fed: Vec<i32> = (0..s.len()).map(|i| ((step * 17 + i * 5) % 101) as i32).collect();
            s.iter_mut().zip(&fed).for_each(|(q, &t)| q.push(t));
            m.decode_step(gpu, &mut cache, &fed).unwrap()
        };
        check(step, &s, &last);
    }
    cache
}

/// Each sequence's last-position logits of the f64 forward `forward`, run on that sequence alone.
fn reference_last(cfg: &Config, seqs: &[Vec<i32>], forward: impl Fn(&[Vec<i32>]) -> Vec<f64>) -> Vec<f64> {
    seqs.iter().flat_map(|q| forward(std::slice::from_ref(q))[(q.len() - 1) * cfg.vocab..].to_vec()).collect()
}

/// The plan `NAME[:op=stage,...]`.
fn plan_of(spec: &str) -> Plan {
    let (name, overrides) = spec.split_once(':').unwrap_or((spec, ""));
    Plan::named(name).unwrap().with_overrides(overrides).unwrap()
}

fn main() -> std::process::ExitCode {
    Suite::new()
        .gpu("encoder_default_shape", |gpu| {
            for s in Encoder.default_shapes() {
                assert_stages_pass(gpu, &Encoder, &s, &Encoder.variants());
            }
        })
        .gpu("encoder_ragged", |gpu| {
            proptest(16, (1i64..=4, 1i64..=300, 1i64..=777, 1i64..=1000), |(b, t, c, v)| {
                let shape = Shape::new(&[("B", b), ("T", t), ("C", c), ("V", v)]);
                assert_stages_pass(gpu, &Encoder, &shape, &Encoder.variants());
            })
        })
        .gpu("token_ids_out_of_range_are_refused_on_upload", |gpu| {
            for ids in [[0, 7, 3], [0, -1, 2], [0, 1, 8]] {
                let r = TokenIds::upload(gpu, &ids, 8);
                assert_eq!(r.is_ok(), ids.iter().all(|&i| (0..8).contains(&i)), "{ids:?}");
            }
        })
        .gpu("pointwise_default_and_ragged", |gpu| {
            let ops: [&dyn Op; 2] = [&Gelu, &Residual];
            for op in ops {
                for s in op.default_shapes() {
                    assert_stages_pass(gpu, op, &s, &op.variants());
                }
            }
            // Sizes that are not multiples of 4 (the vectorized stages' tail) or of the block.
            proptest(16, 1i64..=100_003, |n| {
                let s = Shape::new(&[("N", n)]);
                for op in ops {
                    assert_stages_pass(gpu, op, &s, &op.variants());
                }
            })
        })
        .gpu("argmax_default_and_ragged", |gpu| {
            let op = &gpt2::argmax::Argmax;
            for s in op.default_shapes() {
                assert_stages_pass(gpu, op, &s, &op.variants());
            }
            // Rows shorter than the block, and vocabularies that are not multiples of anything.
            proptest(16, (1i64..=40, 1i64..=70_001), |(b, v)| {
                assert_stages_pass(gpu, op, &Shape::new(&[("B", b), ("V", v)]), &op.variants());
            })
        })
        .gpu("sample_default_and_ragged", |gpu| {
            let op = &gpt2::sample::Sample;
            for s in op.default_shapes() {
                assert_stages_pass(gpu, op, &s, &op.variants());
            }
            // Vocabularies that are not multiples of anything, top-k past V, top-p near 0 and 1,
            // temperatures far from 1.
            proptest(16, (1i64..=9, 1i64..=5000, 0i64..=6000, 1i64..=1000, 5i64..=400), |(b, v, k, p, t)| {
                let shape = Shape::new(&[("B", b), ("V", v), ("k", k), ("p", p), ("t", t)]);
                assert_stages_pass(gpu, op, &shape, &op.variants());
            })
        })
        .gpu("model_matches_the_f64_reference", |gpu| {
            // Two layers, head size 32, a vocabulary and lengths that are not multiples of anything.
            let cfg = Config { layers: 2, heads: 2, c: 64, vocab: 101, max_t: 40 };
            assert_plans_match_reference(gpu, cfg, &[(1, 17), (2, 17)], &["naive", "fp32", "cublas"], 1e-5);
        })
        .gpu("bf16_model_matches_the_f64_reference", |gpu| {
            // The bf16 pass (attention needs heads of 64 or 128): bf16 weights, and LayerNorm's,
            // QKV's, attention's and the MLP up's outputs rounded to bf16 once each (2^-9 relative
            // apiece), the residual stream and logits fp32: bf16's 1e-2. Ragged T, every linear-bf16
            // rung that fuses the tails and stores bf16, and cuBLASLt.
            let cfg = Config { layers: 2, heads: 2, c: 128, vocab: 101, max_t: 40 };
            let specs = [
                "bf16",
                "bf16:linear-bf16=12,linear-bf16-residual=14",
                "bf16:linear-bf16=90,linear-bf16-residual=90,attention-bf16=0",
            ];
            assert_plans_match_reference(gpu, cfg, &[(1, 17), (2, 33)], &specs, 1e-2);
        })
        .gpu("fp8_model_within_the_format_error", |gpu| {
            // The fp8 plan's whole-sequence pass against the exact f64 forward, within 1.5 times the
            // format's own error on this model (the f64 forward on the operands its linears read:
            // inputs in 1 x 128 row groups, weights in 128 x 128 blocks, dequantized) plus bf16's
            // 1e-2. Not against that quantized forward itself: a 2^-9 difference upstream (the bf16
            // pass's roundings) moves a value across an e4m3 rounding midpoint for ~3% of the
            // elements, a whole e4m3 step each, so the two sit ~0.6-0.9 of the format's error apart
            // however exact the kernels (each kernel's own check is against its dequantized inputs).
            // K = 128 and 512 (one and four scale groups), ragged T and M = B·T.
            let cfg = Config { layers: 2, heads: 2, c: 128, vocab: 101, max_t: 40 };
            for (seed, t) in [(1u64, 17usize), (2, 33)] {
                let w = Weights::random(&cfg, seed);
                let tokens = token_rows(seed, t);
                let want = reference::forward(&cfg, &w, &tokens);
                let quantized: Vec<f32> = reference::forward_fp8(&cfg, &w, &tokens).iter().map(|&x| x as f32).collect();
                let format = rel_l2(&quantized, &want);
                let want_last = last_rows(&want, t, cfg.vocab);
                let format_last = rel_l2(&last_rows(&quantized, t, cfg.vocab), &want_last);
                // The LayerNorms taken into the quantizer (quantize-fp8 2), or run apart (1); the MLP
                // up storing e4m3 for the MLP down (linear-fp8 8, stage 7's kernel there), or bf16
                // that the MLP down's own quantizer reads (6).
                for spec in ["fp8", "fp8:quantize-fp8=1", "fp8:linear-fp8=6"] {
                    let (err, err_last) = forward_errors(gpu, cfg, &w, plan_of(spec), &tokens, &want);
                    eprintln!("{spec}, seed {seed}, T = {t}: logits rel L2 {err:.2e} (the format's own {format:.2e})");
                    assert!(
                        err <= 1.5 * format + 1e-2,
                        "{spec}, seed {seed}: logits rel L2 {err:e}, format {format:e}"
                    );
                    assert!(
                        err_last <= 1.5 * format_last + 1e-2,
                        "{spec}, seed {seed}: last-position logits rel L2 {err_last:e}, format {format_last:e}"
                    );
                }
            }
        })
        .gpu("fp8_kv_cache_decode_within_the_format_error", |gpu| {
            // The fp8 plan through the bf16 cache: its prefill fills the cache, its decode step runs the
            // FP8 GEMVs (gemv-fp8 1 folding the LayerNorms, or 4 after the bf16 LayerNorm), eager and
            // replayed. Each step's logits against the exact f64 forward, within 1.5 times the format's
            // own error on this model (the quantized reference against the exact one) plus bf16's 1e-2.
            let cfg = Config { layers: 2, heads: 2, c: 128, vocab: 101, max_t: 40 };
            let w = Weights::random(&cfg, 7);
            for (spec, graph) in [("fp8", false), ("fp8", true), ("fp8:gemv-fp8=4", true), ("fp8:quantize-fp8=1", true)]
            {
                let mut m = Model::new(gpu, cfg, &w, plan_of(spec)).unwrap();
                m.set_graph(graph);
                let cache = run_decode(gpu, &mut m, &decode_prompts(), |step, s, last| {
                    let want = reference_last(&cfg, s, |q| reference::forward(&cfg, &w, q));
                    let quantized: Vec<f32> = reference_last(&cfg, s, |q| reference::forward_fp8(&cfg, &w, q))
                        .iter()
                        .map(|&x| x as f32)
                        .collect();
                    let format = rel_l2(&quantized, &want);
                    let err = rel_l2(last, &want);
                    eprintln!("{spec}, graph {graph}, step {step}: logits rel L2 {err:.2e} (format {format:.2e})");
                    assert!(
                        err <= 1.5 * format + 1e-2,
                        "{spec}, graph {graph}, step {step}: {err:e}, format {format:e}"
                    );
                });
                assert_eq!(cache.lens(), &[11, 17, 23]);
            }
        })
        .gpu("kv_cache_decode_matches_the_f64_reference", |gpu| {
            // Head size 64 (the decode op's), ragged prompts, six steps through the bf16 cache.
            let cfg = Config { layers: 2, heads: 2, c: 128, vocab: 101, max_t: 40 };
            let w = Weights::random(&cfg, 7);
            // cublas-gemv: the decode step's linears on bf16 weights (gemv=4: on the tensor cores).
            // The graph rows replay a captured decode step, with the step's inputs in device memory.
            // decode=3 and decode=4 read a paged cache, which kv-append fills through its table.
            let plans = [
                ("naive", false),
                ("fp32", false),
                ("fp32", true),
                ("cublas-gemv", true),
                ("cublas-gemv:gemv=4", true),
                ("fp32:decode=3", false),
                ("cublas-gemv:decode=4", true),
                // The bf16 pass fills the cache from bf16 QKV rows; its decode step's GEMVs fold the
                // LayerNorms in (gemv=5), or read the bf16 LayerNorm's output (gemv=4).
                ("bf16", false),
                ("bf16", true),
                ("bf16:decode=4", true),
                ("bf16:gemv=4", true),
            ];
            for (spec, graph) in plans {
                let mut m = Model::new(gpu, cfg, &w, plan_of(spec)).unwrap();
                m.set_graph(graph);
                let mut cache = run_decode(gpu, &mut m, &decode_prompts(), |step, s, last| {
                    let err = rel_l2(last, &reference_last(&cfg, s, |q| reference::forward(&cfg, &w, q)));
                    assert!(err <= 2e-2, "plan {spec}, graph {graph}, step {step}: logits rel L2 {err:e}");
                });
                assert_eq!(cache.is_paged(), spec.contains("decode=4") || spec.contains("decode=3"), "{spec}");
                assert_eq!(cache.lens(), &[11, 17, 23]);
                assert!(m.decode_step(gpu, &mut cache, &[1, 2]).is_err(), "one token per sequence");
                let mut empty = m.new_cache(gpu, 2).unwrap();
                assert!(m.decode_step(gpu, &mut empty, &[1, 2]).is_err(), "an unprefilled cache");
            }
        })
        .gpu("decode_step_default_shapes", |gpu| {
            let op = &gpt2::decode_step::DecodeStep;
            for s in op.default_shapes() {
                assert_stages_pass(gpu, op, &s, &op.variants());
            }
        })
        .gpu("decode_step_ragged_and_smaller_grids", |gpu| {
            // Ragged lengths, batches that are not multiples of 8, grids far below the SMs (units
            // strided over fewer blocks; the barriers count the blocks there are), and decode
            // attention's splits forced on the composed stages (the megakernels refuse them).
            let op = &gpt2::decode_step::DecodeStep;
            proptest(
                6,
                (
                    1i64..=32,
                    2i64..=1022,
                    0i64..=1,
                    prop_oneof![Just(0i64), 1i64..=40],
                    prop_oneof![Just(0i64), 1i64..=9],
                ),
                |(b, len, ragged, grid, splits)| {
                    let shape = Shape::new(&[
                        ("B", b),
                        ("len", len),
                        ("ragged", ragged),
                        ("L", 2),
                        ("C", 768),
                        ("H", 12),
                        ("grid", grid),
                        ("splits", splits),
                    ]);
                    assert_stages_pass(gpu, op, &shape, &op.variants());
                },
            )
        })
        .gpu("megakernel_and_dependent_plans_decode_like_the_reference", |gpu| {
            // The megakernel's constraints (C % 256, head size 64) on a small model; ragged prompts,
            // six steps through the bf16 cache, eager and replayed, logits and greedy ids; the same
            // for the streamed megakernel (decode-step 8) and the dependent-launch chain (`pdl`).
            let cfg = Config { layers: 2, heads: 4, c: 256, vocab: 101, max_t: 40 };
            let w = Weights::random(&cfg, 7);
            let seqs: Vec<Vec<i32>> =
                [5usize, 11, 17].iter().map(|&n| (0..n).map(|t| ((t * 13 + n) % 101) as i32).collect()).collect();
            for (plan, graph) in [
                ("megakernel", false),
                ("megakernel", true),
                ("megakernel:decode-step=8", false),
                ("megakernel:decode-step=8", true),
                ("pdl", false),
                ("pdl", true),
                // `pdl` (decode-step 17) has its picking LM head on resident blocks that walk row
                // tiles; stage 15 the one-tile blocks. The greedy steps' picks made by the LM head,
                // the others' logits by its plain form.
                ("pdl:decode-step=15", false),
                ("pdl:decode-step=15", true),
            ] {
                let mut m = Model::new(gpu, cfg, &w, plan_of(plan)).unwrap();
                m.set_graph(graph);
                let mut cache = m.new_cache(gpu, seqs.len()).unwrap();
                let mut s = seqs.clone();
                for (i, q) in s.iter().enumerate() {
                    m.prefill_into(gpu, &mut cache, i, q).unwrap();
                }
                for step in 1..7 {
                    let fed: Vec<i32> = (0..s.len()).map(|i| ((step * 17 + i * 5) % 101) as i32).collect();
                    s.iter_mut().zip(&fed).for_each(|(q, &t)| q.push(t));
                    let want: Vec<f64> = s
                        .iter()
                        .flat_map(|q| {
                            let all = reference::forward(&cfg, &w, std::slice::from_ref(q));
                            all[(q.len() - 1) * cfg.vocab..].to_vec()
                        })
                        .collect();
                    let (got, ids) = if step % 2 == 1 {
                        (m.decode_step(gpu, &mut cache, &fed).unwrap(), None)
                    } else {
                        // The greedy step's ids are the argmax of the logits it leaves on the device.
                        let ids = m.decode_step_greedy(gpu, &mut cache, &fed).unwrap();
                        (m.last_logits(gpu, s.len()).unwrap(), Some(ids))
                    };
                    let err = rel_l2(&got, &want);
                    assert!(err <= 2e-2, "{plan}, graph {graph}, step {step}: logits rel L2 {err:e}");
                    if let Some(ids) = ids {
                        let picks: Vec<i32> = got.chunks(cfg.vocab).map(gpt2::sampling::argmax).collect();
                        assert_eq!(ids, picks, "{plan}, graph {graph}, step {step}");
                    }
                }
                assert_eq!(cache.lens(), &[11, 17, 23]);
            }
        })
        .gpu("greedy_loop_on_the_device_decodes_like_the_host_loop", |gpu| {
            // Ragged prompts; six greedy steps one host round trip at a time, and the same six as the
            // loop on the device (chunks of 4 and 2): the same tokens, the same lengths, and caches
            // that give the same next logits. The composed bf16 step eager and graph-replayed, the
            // dependent chain with the append in the QKV epilogue, and with the picks in the LM head.
            let cfg = Config { layers: 2, heads: 4, c: 256, vocab: 101, max_t: 40 };
            let w = Weights::random(&cfg, 11);
            let seqs: Vec<Vec<i32>> =
                [4usize, 9, 15].iter().map(|&n| (0..n).map(|t| ((t * 17 + n) % 101) as i32).collect()).collect();
            for (plan, graph) in [("bf16", false), ("bf16", true), ("pdl", true), ("pdl:decode-step=15", true)] {
                let mut m = Model::new(gpu, cfg, &w, plan_of(plan)).unwrap();
                assert!(m.has_device_loop().unwrap(), "{plan}");
                m.set_graph(graph);
                let mut caches = [m.new_cache(gpu, seqs.len()).unwrap(), m.new_cache(gpu, seqs.len()).unwrap()];
                for c in caches.iter_mut() {
                    for (i, q) in seqs.iter().enumerate() {
                        m.prefill_into(gpu, c, i, q).unwrap();
                    }
                }
                let first = vec![3, 50, 100];
                let mut host = vec![Vec::new(); seqs.len()];
                let mut last = first.clone();
                for _ in 0..6 {
                    last = m.decode_step_greedy(gpu, &mut caches[0], &last).unwrap();
                    host.iter_mut().zip(&last).for_each(|(h, &t)| h.push(t));
                }
                let mut device = m.decode_greedy_on_device(gpu, &mut caches[1], &first, 4).unwrap();
                let next: Vec<i32> = device.iter().map(|d| *d.last().unwrap()).collect();
                let more = m.decode_greedy_on_device(gpu, &mut caches[1], &next, 2).unwrap();
                device.iter_mut().zip(more).for_each(|(d, m)| d.extend(m));
                assert_eq!(device, host, "{plan}, graph {graph}");
                assert_eq!(caches[0].lens(), caches[1].lens(), "{plan}, graph {graph}");
                let after: Vec<Vec<f32>> = caches.iter_mut().map(|c| m.decode_step(gpu, c, &last).unwrap()).collect();
                assert_eq!(after[0], after[1], "{plan}, graph {graph}: the two caches differ");
                let full = vec![cfg.max_t - 2; seqs.len()];
                let err = m.decode_greedy_on_device(gpu, &mut m.timing_cache(gpu, 3, full[0]).unwrap(), &first, 3);
                assert!(err.is_err(), "past the context: a typed error");
            }
            let mut mk = Model::new(gpu, cfg, &w, Plan::named("megakernel").unwrap()).unwrap();
            assert!(!mk.has_device_loop().unwrap());
            let mut cache = mk.new_cache(gpu, 1).unwrap();
            mk.prefill_into(gpu, &mut cache, 0, &seqs[0]).unwrap();
            assert!(mk.decode_greedy_on_device(gpu, &mut cache, &[1], 2).is_err(), "a megakernel picks its own ids");
        })
        .gpu("profiled_decode_step_appends_like_a_plain_step", |gpu| {
            // The model table's per-op breakdown runs a captured step with an event after every op:
            // it must leave the cache as a plain step does, and name every op of every layer.
            let cfg = Config { layers: 2, heads: 2, c: 128, vocab: 101, max_t: 40 };
            let w = Weights::random(&cfg, 3);
            let prompts: [Vec<i32>; 2] = [(0..9).collect(), (0..14).map(|t| (t * 7) % 101).collect()];
            let mut m = Model::new(gpu, cfg, &w, Plan::named("cublas-gemv").unwrap()).unwrap();
            let mut caches = [m.new_cache(gpu, 2).unwrap(), m.new_cache(gpu, 2).unwrap()];
            for c in caches.iter_mut() {
                for (i, p) in prompts.iter().enumerate() {
                    m.prefill_into(gpu, c, i, p).unwrap();
                }
            }
            let ops = m.decode_step_profiled(gpu, &mut caches[0], &[4, 5]).unwrap();
            m.decode_step(gpu, &mut caches[1], &[4, 5]).unwrap();
            // A GEMV plan's linears carry GELU and the residual adds, and its attention projection
            // reads the bf16 attention output: 8 ops a layer, not 12.
            assert_eq!(ops.len(), 1 + cfg.layers * 8 + 2, "{ops:?}");
            assert!(!ops.iter().any(|(name, _)| *name == "gelu" || *name == "residual"), "{ops:?}");
            assert_eq!(ops.iter().filter(|(name, _)| *name == "kv-append").count(), cfg.layers, "{ops:?}");
            assert!(ops.iter().all(|(_, ms)| ms.is_finite() && *ms >= 0.0), "{ops:?}");
            let after: Vec<Vec<f32>> = caches.iter_mut().map(|c| m.decode_step(gpu, c, &[6, 7]).unwrap()).collect();
            assert_eq!(after[0], after[1], "the profiled step appended different keys or values");
            // Greedy on the device picks what the host's argmax picks from the same step's logits.
            for graph in [false, true] {
                m.set_graph(graph);
                let logits = m.decode_step(gpu, &mut caches[1], &[8, 9]).unwrap();
                let ids = m.decode_step_greedy(gpu, &mut caches[0], &[8, 9]).unwrap();
                let want: Vec<i32> = logits.chunks(cfg.vocab).map(gpt2::sampling::argmax).collect();
                assert_eq!(ids, want, "graph {graph}");
            }
            // A sampled step on the device picks what the host picks from the same step's logits
            // and the same draws (graph and eager; a draw at a token boundary aside).
            let sampling = Sampling { temperature: 0.9, top_k: Some(20), top_p: 0.8, seed: 5 };
            for graph in [false, true] {
                m.set_graph(graph);
                for draws in [[0.1f32, 0.7], [0.45, 0.999]] {
                    let logits = m.decode_step(gpu, &mut caches[1], &[3, 4]).unwrap();
                    let ids = m.decode_step_sampled(gpu, &mut caches[0], &[3, 4], &sampling, &draws).unwrap();
                    let want: Vec<i32> = logits
                        .chunks(cfg.vocab)
                        .zip(draws)
                        .map(|(row, u)| gpt2::sampling::draw(row, &sampling, u as f64))
                        .collect();
                    assert_eq!(ids, want, "graph {graph}, draws {draws:?}");
                }
            }
            assert!(m.decode_step_sampled(gpu, &mut caches[0], &[3, 4], &sampling, &[0.5, 1.0]).is_err(), "u < 1");
            m.set_graph(false);
            let mut m = Model::new(gpu, cfg, &w, Plan::named("cublas-gemv").unwrap()).unwrap();
            let mut caches = [m.new_cache(gpu, 2).unwrap(), m.new_cache(gpu, 2).unwrap()];
            for c in caches.iter_mut() {
                for (i, p) in prompts.iter().enumerate() {
                    m.prefill_into(gpu, c, i, p).unwrap();
                }
            }
            assert_eq!(m.decode_graph_kernels().unwrap(), None, "no graph step ran yet");
            m.set_graph(true);
            m.decode_step(gpu, &mut caches[0], &[1, 2]).unwrap();
            let kernels = m.decode_graph_kernels().unwrap().expect("a graph step ran");
            // The encoder, 8 a layer (the GEMV plan's fused tails and bf16 projection input), ln_f
            // and the LM head.
            assert_eq!(kernels, 1 + cfg.layers * 8 + 2, "kernels in a step of {} layers", cfg.layers);
            // The GEMV that folds the LayerNorms in: 6 a layer, and the LM head without ln_f.
            let mut m = Model::new(gpu, cfg, &w, Plan::named("bf16").unwrap()).unwrap();
            let mut cache = m.new_cache(gpu, 2).unwrap();
            for (i, p) in prompts.iter().enumerate() {
                m.prefill_into(gpu, &mut cache, i, p).unwrap();
            }
            let ops = m.decode_step_profiled(gpu, &mut cache, &[4, 5]).unwrap();
            assert_eq!(ops.len(), 1 + cfg.layers * 6 + 1, "{ops:?}");
            assert!(!ops.iter().any(|(name, _)| *name == "layernorm"), "{ops:?}");
            // The replayed timeline: the greedy step's ops in launch order (the argmax last), each
            // starting where the one before ended, and the cache appended as a plain step appends.
            let mut twin = m.new_cache(gpu, 2).unwrap();
            for (i, p) in prompts.iter().enumerate() {
                m.prefill_into(gpu, &mut twin, i, p).unwrap();
            }
            m.decode_step(gpu, &mut twin, &[4, 5]).unwrap();
            let tl = m.decode_step_timeline(gpu, &mut cache, &[6, 7], 3).unwrap();
            m.decode_step_greedy(gpu, &mut twin, &[6, 7]).unwrap();
            let names: Vec<&str> = tl.ops.iter().map(|(n, _, _)| *n).collect();
            assert_eq!(names.len(), 1 + cfg.layers * 6 + 2, "{names:?}");
            assert_eq!((names[0], names[names.len() - 1]), ("encoder", "argmax"), "{names:?}");
            assert!(tl.ops.windows(2).all(|w| w[0].2 == w[1].1), "{:?}", tl.ops);
            assert!(tl.ops.iter().all(|(_, a, e)| a.is_finite() && *a >= 0.0 && e >= a), "{:?}", tl.ops);
            assert!(tl.plain_ms > 0.0, "{}", tl.plain_ms);
            assert!(m.decode_step_timeline(gpu, &mut cache, &[6, 7], 0).is_err(), "replays >= 1");
            let after: Vec<Vec<f32>> = [&mut cache, &mut twin].map(|c| m.decode_step(gpu, c, &[8, 9]).unwrap()).into();
            assert_eq!(after[0], after[1], "the timeline's step appended different keys or values");
            let t = m.time_forward(gpu, 2, 16, Logits::Last, &common::timing::TimingConfig::quick()).unwrap();
            assert!(t.median_ms > 0.0 && t.min_ms <= t.median_ms && t.median_ms <= t.max_ms, "{t:?}");
        })
        .gpu("model_refuses_bad_input", |gpu| {
            let cfg = Config { layers: 1, heads: 2, c: 64, vocab: 101, max_t: 8 };
            let mut m = Model::new(gpu, cfg, &Weights::random(&cfg, 1), Plan::named("fp32").unwrap()).unwrap();
            let too_long = vec![vec![1; 9]];
            let e = m.forward(gpu, &too_long).unwrap_err().to_string();
            assert!(e.contains("context 8"), "{e}");
            let e = m.forward(gpu, &[vec![1, 2], vec![3]]).unwrap_err().to_string();
            assert!(e.contains("one length"), "{e}");
            let e = m.forward(gpu, &[vec![1, 101]]).unwrap_err().to_string();
            assert!(e.contains("token"), "{e}");
            let wrong = Weights::random(&Config { vocab: 100, ..cfg }, 1);
            assert!(Model::new(gpu, cfg, &wrong, Plan::named("fp32").unwrap()).is_err());
            // The bf16 pass's attention takes heads of 64 or 128 elements (these are 32).
            let mut m = Model::new(gpu, cfg, &Weights::random(&cfg, 1), Plan::named("bf16").unwrap()).unwrap();
            let e = m.forward(gpu, &[vec![1, 2]]).unwrap_err().to_string();
            assert!(e.contains("HS"), "{e}");
        })
        .gpu("limits_past_refused_inside_verified", |gpu| assert_limits_on_gpu(gpu, &gpt2::Gpt2))
        .gpu("graph_replay_every_stage", |gpu| {
            for v in Encoder.variants() {
                assert_graph_replay_passes(gpu, &Encoder, &Encoder.default_shapes()[0], &v);
            }
            let ops: [&dyn Op; 2] = [&Gelu, &Residual];
            for op in ops {
                for v in op.variants() {
                    assert_graph_replay_passes(gpu, op, &Shape::new(&[("N", 1001)]), &v);
                }
            }
            let argmax = &gpt2::argmax::Argmax;
            for v in argmax.variants() {
                assert_graph_replay_passes(gpu, argmax, &Shape::new(&[("B", 3), ("V", 50257)]), &v);
            }
            let sample = &gpt2::sample::Sample;
            for v in sample.variants() {
                assert_graph_replay_passes(gpu, sample, &sample.default_shapes()[3], &v);
            }
        })
        .main()
}
