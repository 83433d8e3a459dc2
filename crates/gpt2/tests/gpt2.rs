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
fn composed_steps_preload_their_host_switched_builds() {
    // The dependent composed decode steps name the builds they prepare beyond the stage lists (their
    // model plan's GEMV with the QKV append, kv-append, decode attention and the argmax as links of the
    // chain), so that a run compiles them with the family's modules; the other stages compile only
    // themselves.
    use common::Op;
    let op = gpt2::decode_step::DecodeStep;
    let shape = &op.default_shapes()[0];
    for v in op.variants() {
        let plan = v.plan::<gpt2::megakernel::Plan>().unwrap();
        let extra = op.extra_builds(&v, shape);
        if !plan.dependent() {
            assert!(extra.is_empty(), "stage {}", v.id());
            continue;
        }
        let model = gpt2::plan::Plan::parse(plan.model_plan().unwrap()).unwrap();
        let pinned = [("gemv", model.gemv.as_ref().unwrap().stage), ("decode", model.decode.stage)];
        for (op_name, stage) in pinned {
            assert!(
                extra.iter().any(|(_, b)| b.op == op_name && b.stage == stage && b.has(common::DEPENDENT_LAUNCH)),
                "stage {}: no dependent build of {op_name} {stage}",
                v.id()
            );
        }
        // The folded GEMVs as the engine builds them at the shape's C = 768: a staged-rows stage's
        // rows sized to K (6 pieces of 128), not the stage list's.
        let gemv = model.gemv.as_ref().unwrap();
        if matmul::gemv::folds_layernorm(gemv) && gemv.define("GEMV_STAGED_ROWS").is_some() {
            assert!(
                extra.iter().any(|(_, b)| b.op == "gemv" && b.define("GEMV_STAGED_ROWS") == Some("6")),
                "stage {}: no folded GEMV built for K = 768",
                v.id()
            );
        }
    }
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

mod model {
    use gpt2::config::Config;
    use gpt2::plan::Plan;
    use gpt2::weights::Weights;
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;

    const TINY: Config = Config { layers: 2, heads: 2, c: 8, vocab: 11, max_t: 6 };

    /// `w` written the way Hugging Face stores GPT-2: Conv1D weights [in, out], `transformer.` prefix.
    fn hf_file(w: &Weights, cfg: &Config, skip: Option<&str>, bad_shape: Option<&str>) -> std::path::PathBuf {
        let c = cfg.c;
        let conv = |x: &[f32], out: usize, inp: usize| -> Vec<f32> {
            let mut t = vec![0f32; x.len()];
            for o in 0..out {
                for i in 0..inp {
                    t[i * out + o] = x[o * inp + i];
                }
            }
            t
        };
        let mut tensors: Vec<(String, Vec<f32>, Vec<usize>)> = vec![
            ("wte.weight".into(), w.wte.clone(), vec![cfg.vocab, c]),
            ("wpe.weight".into(), w.wpe.clone(), vec![cfg.max_t, c]),
            ("ln_f.weight".into(), w.lnf_w.clone(), vec![c]),
            ("ln_f.bias".into(), w.lnf_b.clone(), vec![c]),
        ];
        for (l, b) in w.blocks.iter().enumerate() {
            let n = |s: &str| format!("h.{l}.{s}");
            tensors.extend([
                (n("ln_1.weight"), b.ln1_w.clone(), vec![c]),
                (n("ln_1.bias"), b.ln1_b.clone(), vec![c]),
                (n("attn.c_attn.weight"), conv(&b.qkv_w, 3 * c, c), vec![c, 3 * c]),
                (n("attn.c_attn.bias"), b.qkv_b.clone(), vec![3 * c]),
                (n("attn.c_proj.weight"), conv(&b.proj_w, c, c), vec![c, c]),
                (n("attn.c_proj.bias"), b.proj_b.clone(), vec![c]),
                (n("ln_2.weight"), b.ln2_w.clone(), vec![c]),
                (n("ln_2.bias"), b.ln2_b.clone(), vec![c]),
                (n("mlp.c_fc.weight"), conv(&b.fc_w, 4 * c, c), vec![c, 4 * c]),
                (n("mlp.c_fc.bias"), b.fc_b.clone(), vec![4 * c]),
                (n("mlp.c_proj.weight"), conv(&b.fcproj_w, c, 4 * c), vec![4 * c, c]),
                (n("mlp.c_proj.bias"), b.fcproj_b.clone(), vec![c]),
            ]);
        }
        let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
            .into_iter()
            .filter(|(n, _, _)| Some(n.as_str()) != skip)
            .map(|(n, v, mut s)| {
                if Some(n.as_str()) == bad_shape {
                    s.reverse();
                }
                (format!("transformer.{n}"), v.iter().flat_map(|x| x.to_le_bytes()).collect(), s)
            })
            .collect();
        let views: Vec<(String, TensorView)> =
            bytes.iter().map(|(n, b, s)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).unwrap())).collect();
        let path =
            std::env::temp_dir().join(format!("gpt2-test-{}-{skip:?}-{bad_shape:?}.safetensors", std::process::id()));
        safetensors::serialize_to_file(views, None, &path).unwrap();
        path
    }

    #[test]
    fn safetensors_round_trip_transposes_conv1d_once() {
        let w = Weights::random(&TINY, 3);
        let path = hf_file(&w, &TINY, None, None);
        let back = Weights::load(&path, &TINY).unwrap();
        assert_eq!(back.blocks[1].fc_w, w.blocks[1].fc_w);
        assert_eq!(back.blocks[0].qkv_w, w.blocks[0].qkv_w);
        assert_eq!(back.wte, w.wte);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn missing_or_misshaped_tensors_are_named() {
        let w = Weights::random(&TINY, 4);
        let missing = hf_file(&w, &TINY, Some("h.1.mlp.c_fc.bias"), None);
        let e = Weights::load(&missing, &TINY).unwrap_err().to_string();
        assert!(e.contains("transformer.h.1.mlp.c_fc.bias") && e.contains("missing"), "{e}");
        let bad = hf_file(&w, &TINY, None, Some("h.0.attn.c_attn.weight"));
        let e = Weights::load(&bad, &TINY).unwrap_err().to_string();
        assert!(
            e.contains("transformer.h.0.attn.c_attn.weight") && e.contains("[8, 24]") && e.contains("[24, 8]"),
            "{e}"
        );
        let _ = std::fs::remove_file(missing);
        let _ = std::fs::remove_file(bad);
    }

    #[test]
    fn unknown_models_plans_and_overrides_are_refused() {
        assert!(Config::by_name("gpt3").is_err());
        assert_eq!(Config::by_name("gpt2-xl").unwrap().head_size(), 64);
        assert!(Plan::named("fastest-ever").is_err());
        let p = Plan::named("fp32").unwrap();
        assert!(p.clone().with_overrides("attention=9").is_err());
        assert!(p.clone().with_overrides("softmax=1").is_err());
        assert!(p.clone().with_overrides("linear").is_err());
        assert!(p.clone().with_overrides("gemv=maybe").is_err());
        assert!(p.clone().with_overrides("linear=off").is_err());
        assert_eq!(p.clone().with_overrides("gemv=1").unwrap().gemv.map(|v| v.stage), Some(1));
        assert!(Plan::named("cublas-gemv").unwrap().with_overrides("gemv=off").unwrap().gemv.is_none());
        assert_eq!(p.clone().with_overrides("linear=0,gelu=0").unwrap().linear.stage, 0);
        // A paged decode stage (vLLM v1 and v2) gives the model a paged cache.
        assert_eq!(p.clone().with_overrides("decode=3").unwrap().decode.stage, 3);
        assert!(p.clone().with_overrides("decode=12").is_err());
        // The bf16 pass's three ops go on and off together.
        let e = p.clone().with_overrides("linear-bf16=16").unwrap_err().to_string();
        assert!(e.contains("all on (a bf16 pass) or all off"), "{e}");
        let on = "layernorm-bf16=7,linear-bf16=16,linear-bf16-residual=90,attention-bf16=10";
        let bf16 = p.with_overrides(on).unwrap().bf16.unwrap();
        let stages = (bf16.layernorm.stage, bf16.linear.stage, bf16.residual_linear.stage, bf16.attention.stage);
        assert_eq!(stages, (7, 16, 90, 10));
        let off = Plan::named("bf16")
            .unwrap()
            .with_overrides("layernorm-bf16=off,linear-bf16=off,linear-bf16-residual=off,attention-bf16=off");
        assert!(off.unwrap().bf16.is_none());
        assert!(Plan::named("bf16").unwrap().with_overrides("attention-bf16=off").is_err());
        // What a plan runs: a bf16 plan with the GEMV runs none of the fp32 block stages.
        let (fp32, bf16) = (Plan::named("fp32").unwrap(), Plan::named("bf16").unwrap());
        let ran = |p: &Plan| (0..gpt2::plan::PLAN_OPS.len()).filter(|&i| p.runs(i)).collect::<Vec<_>>();
        assert_eq!(ran(&fp32), (0..8).chain([9, 10, 11]).collect::<Vec<_>>());
        assert_eq!(ran(&bf16), [0, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
        assert!(bf16.with_overrides("gemv=off").unwrap().runs(2), "the decode step's linears on the fp32 stage");
    }

    #[test]
    fn every_named_plan_is_known_and_fastest_needs_a_device() {
        for name in gpt2::plan::PLAN_NAMES {
            assert!(Plan::check_spec(name).is_ok(), "{name}");
            let fixed = Plan::named(name);
            assert_eq!(fixed.is_err(), name.starts_with("fastest"), "{name}");
        }
        let report = Plan::named("report").unwrap();
        assert_eq!((report.layernorm.stage, report.linear.stage, report.attention.stage), (4, 90, 5));
        assert!(Plan::check_spec("fastest:linear=0").is_ok());
        assert!(Plan::check_spec("fastest-bf16:linear-bf16=12").is_ok());
        assert!(Plan::check_spec("fastest:linear-bf16=12").is_err(), "fastest has no bf16 pass to change one op of");
        assert!(Plan::check_spec("fastest:softmax=0").is_err());
        assert!(Plan::check_spec("fastest-ever").is_err());
    }

    #[test]
    fn reference_with_no_layers_is_the_tied_head_of_the_embedding() {
        let cfg = Config { layers: 0, ..TINY };
        let mut w = Weights::random(&cfg, 5);
        w.lnf_w = vec![1.0; cfg.c];
        w.lnf_b = vec![0.0; cfg.c];
        let logits = gpt2::reference::forward(&cfg, &w, &[vec![3, 7]]);
        // Position 0: LayerNorm(wte[3] + wpe[0]) . wte[v] for every v.
        let x: Vec<f64> = (0..cfg.c).map(|i| w.wte[3 * cfg.c + i] as f64 + w.wpe[i] as f64).collect();
        let mean = x.iter().sum::<f64>() / cfg.c as f64;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / cfg.c as f64;
        let h: Vec<f64> = x.iter().map(|v| (v - mean) / (var + gpt2::config::LN_EPS as f64).sqrt()).collect();
        for (v, got) in logits.iter().take(cfg.vocab).enumerate() {
            let want: f64 = h.iter().zip(&w.wte[v * cfg.c..(v + 1) * cfg.c]).map(|(a, b)| a * *b as f64).sum();
            assert!((got - want).abs() < 1e-12, "v = {v}: {got} against {want}");
        }
    }

    #[test]
    fn rounded_reference_rounds_only_the_linears_it_is_told_to() {
        use gpt2::reference::{forward, forward_rounded, LinearOperands};
        let cfg = Config { layers: 2, ..TINY };
        let w = Weights::random(&cfg, 11);
        let tokens = [vec![1, 4, 9, 2, 7]];
        let exact = forward(&cfg, &w, &tokens);
        // Operands left as they are: the exact forward but for each linear's input passing through
        // f32, as a plan's operands do.
        let identity =
            LinearOperands { input: |x, _, _| x.to_vec(), weight: |w, _, _| w.to_vec(), blocks: true, head: true };
        let same = forward_rounded(&cfg, &w, &tokens, Some(&identity));
        assert_eq!(same.len(), exact.len());
        assert!(
            same.iter().zip(&exact).all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1e-3)),
            "identity moved the logits"
        );
        // Rounding to zero: the LM head alone gives zero logits; the blocks alone leave the head's
        // product of a LayerNorm'd row, which is not zero.
        let zero = |scope: (bool, bool)| LinearOperands {
            input: |x, _, _| x.to_vec(),
            weight: |w, _, _| vec![0.0; w.len()],
            blocks: scope.0,
            head: scope.1,
        };
        assert!(forward_rounded(&cfg, &w, &tokens, Some(&zero((false, true)))).iter().all(|&v| v == 0.0));
        let blocks_only = forward_rounded(&cfg, &w, &tokens, Some(&zero((true, false))));
        assert!(blocks_only.iter().any(|&v| v != 0.0));
        assert!(blocks_only.iter().zip(&exact).any(|(a, b)| a != b), "zeroed block weights changed nothing");
    }
}

mod generation {
    use gpt2::generate::{Tokenizer, END_OF_TEXT};
    use gpt2::sampling::{Sampler, Sampling};

    #[test]
    fn tokenizer_round_trips_and_knows_end_of_text() {
        let t = Tokenizer::new().unwrap();
        assert_eq!(t.encode("Hello world"), vec![15496, 995]);
        let text = "The quick brown fox, naïve café 1234 <|endoftext|>next";
        let ids = t.encode(text);
        assert!(ids.contains(&END_OF_TEXT));
        assert_eq!(t.decode(&ids).unwrap(), text);
        assert!(t.decode(&[50257]).is_err());
    }

    #[test]
    fn sampling_rules() {
        let logits = [0.0f32, 3.0, 1.0, 2.0];
        let mut greedy = Sampler::new(Sampling::GREEDY).unwrap();
        assert_eq!(greedy.sample(&logits), 1);
        let hot = Sampling { temperature: 5.0, top_k: Some(1), top_p: 1.0, seed: 9 };
        assert!((0..50).all(|_| Sampler::new(hot).unwrap().sample(&logits) == 1), "top-k 1 is argmax");
        let narrow = Sampling { temperature: 1.0, top_k: None, top_p: 1e-6, seed: 9 };
        assert_eq!(Sampler::new(narrow).unwrap().sample(&logits), 1, "a tiny top-p keeps the argmax");
        // Two tokens with probabilities 1/4 and 3/4 at temperature 1.
        let two = [0.0f32, 3f32.ln()];
        let mut s = Sampler::new(Sampling { temperature: 1.0, top_k: None, top_p: 1.0, seed: 1 }).unwrap();
        let ones = (0..20_000).filter(|_| s.sample(&two) == 1).count() as f64 / 20_000.0;
        assert!((ones - 0.75).abs() < 0.02, "{ones}");
        // Seeded: the same draws.
        let draw = |seed| {
            let mut s = Sampler::new(Sampling { temperature: 1.0, top_k: None, top_p: 0.9, seed }).unwrap();
            (0..32).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(5), draw(5));
    }

    #[test]
    fn bad_sampling_parameters_are_refused() {
        for bad in [
            Sampling { top_p: 0.0, ..Sampling::GREEDY },
            Sampling { top_p: 1.5, ..Sampling::GREEDY },
            Sampling { temperature: -1.0, ..Sampling::GREEDY },
            Sampling { top_k: Some(0), ..Sampling::GREEDY },
        ] {
            assert!(Sampler::new(bad).is_err(), "{bad:?}");
        }
    }
}

#[test]
fn decode_step_splits_and_warps_apply_to_composed_stages_only() {
    // `splits` forces a composed step's decode attention splits; a megakernel, whose attention
    // phase splits by its grid, refuses it with a typed error, and so does a count past the limit.
    use common::Op;
    let op = gpt2::decode_step::DecodeStep;
    let at = |splits: i64| {
        common::Shape::new(&[("B", 8), ("len", 1000), ("L", 12), ("C", 768), ("H", 12), ("splits", splits)])
    };
    let max = attention::decode::MAX_SPLITS as i64;
    let mut composed = 0;
    for v in op.variants() {
        let is_composed = v.plan::<gpt2::megakernel::Plan>().unwrap().model_plan().is_some();
        composed += is_composed as usize;
        assert!(op.validate(&v, &at(0)).is_ok(), "stage {} at splits = 0", v.id());
        let forced = op.validate(&v, &at(4));
        assert_eq!(forced.is_ok(), is_composed, "stage {} at splits = 4: {forced:?}", v.id());
        if !is_composed {
            assert!(matches!(forced, Err(common::Error::Constraint { .. })), "stage {}", v.id());
        }
        assert!(matches!(op.validate(&v, &at(max + 1)), Err(common::Error::Constraint { .. })), "stage {}", v.id());
        // `warps` forces decode attention 11's warps a block: only a composed step on that stage.
        let mut forced = at(0);
        forced.set("warps", 8);
        let on_eleven =
            v.plan::<gpt2::megakernel::Plan>().unwrap().model_plan().is_some_and(|spec| {
                gpt2::plan::Plan::parse(spec).unwrap().decode.has(attention::decode::WARPS_BY_SHAPE)
            });
        let checked = op.validate(&v, &forced);
        assert_eq!(checked.is_ok(), on_eleven, "stage {} at warps = 8: {checked:?}", v.id());
    }
    assert!(composed >= 2, "composed stages: {composed}");
}
