//! The `fastest` plan: for each op, the stage that verified and ran fastest at this model's own
//! shapes on this device. The ladders are run once (verify, then a short timing) and the choice is
//! cached per device and model config in the kernel cache directory, with the times that decided it.
//!
//! An op with several shapes (the five linears, three decode batch sizes) is scored by the sum over
//! its shapes of each stage's time over the best time at that shape: the stage that is never far
//! behind wins, and a stage that fails or cannot run at any shape is out. Decode stages that read the
//! paged layout are out too: the plan's decode stage decides the cache's layout, and the `fastest`
//! plans keep it contiguous (a paged cache is asked for by naming a paged stage: `decode=4`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use attention::decode::{Decode, Layout};
use attention::kv_append::KvAppend;
use attention::prefill::Prefill;
use attention::prefill_bf16::PrefillBf16;
use common::ceilings::Ceilings;
use common::runner::{self, RunOptions, Status};
use common::timing::TimingConfig;
use common::{Error, Gpu, Op, Result, Shape};
use matmul::gemv::Gemv;
use matmul::gemv_fp8::GemvFp8;
use matmul::linear::Linear;
use matmul::linear_bf16::LinearBf16;
use matmul::linear_fp8::LinearFp8;
use matmul::quantize_fp8::QuantizeFp8;
use norm::layernorm::LayerNorm;

use crate::argmax::Argmax;
use crate::config::Config;
use crate::decode_step::DecodeStep;
use crate::encoder::Encoder;
use crate::plan::{Plan, Stages, BF16_OPS, FP8_OPS, OFF, PLAN_OPS};
use crate::pointwise::{Gelu, Residual};
use crate::sample::Sample;

/// The prefill shape the choice is made at (and the model table's): B = 4 sequences of the context.
pub const PREFILL_B: usize = 4;
/// The decode batch sizes the choice is made at (and the model table's).
pub const DECODE_BATCHES: [usize; 3] = [1, 8, 32];

/// Bump when the selection changes, so old cache files are not trusted.
const CACHE_VERSION: u32 = 6;

/// One op's evidence: every stage's median at each shape (`None`: failed, or not applicable).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OpChoice {
    pub op: String,
    pub shapes: Vec<String>,
    pub stages: Vec<StageTimes>,
    pub chosen: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StageTimes {
    pub stage: u32,
    pub name: String,
    pub median_ms: Vec<Option<f64>>,
    /// Why the stage is out, if it is.
    pub excluded: Option<String>,
}

/// The choice for every op of [`PLAN_OPS`], in that order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Selection {
    pub device: String,
    pub config: String,
    /// Every op's stage list at the time of the choice: a new or removed stage invalidates the cache.
    pub stage_lists: Vec<Vec<String>>,
    pub ops: Vec<OpChoice>,
}

impl Selection {
    /// The chosen stage of each op of [`PLAN_OPS`].
    pub fn stages(&self) -> Stages {
        std::array::from_fn(|i| self.ops[i].chosen)
    }
}

/// A shape as `(key, value)` pairs, overlaid on the op's first default shape.
type Dims = Vec<(&'static str, i64)>;

/// The ops of the plan, each with the shapes the model runs it at.
fn model_ops(cfg: &Config) -> Vec<(&'static dyn Op, Vec<Shape>)> {
    let (c, t, nh, hs) = (cfg.c as i64, cfg.max_t as i64, cfg.heads as i64, cfg.head_size() as i64);
    let rows = PREFILL_B as i64 * t;
    let (v, vp) = (cfg.vocab as i64, cfg.padded_vocab() as i64);
    // The LM head at the padded vocabulary, as the model runs it.
    let linears = [(3 * c, c), (c, c), (4 * c, c), (c, 4 * c), (cfg.padded_vocab() as i64, c)];
    let decode = |b: usize| vec![("B", b as i64), ("HQ", nh), ("HKV", nh), ("D", hs), ("seq", t), ("ragged", 0)];
    // The bf16 pass's linears as it runs them (N, K, bias, epi, out bits): QKV storing bf16, the MLP
    // up with GELU storing bf16, the LM head (no bias) storing bf16 logits; and apart, the two
    // projections adding into the fp32 residual stream.
    let linears_bf16 = [(3 * c, c, 1, 0, 16), (4 * c, c, 1, 1, 16), (cfg.padded_vocab() as i64, c, 0, 0, 16)];
    let residual_linears_bf16 = [(c, c, 1, 2, 32), (c, 4 * c, 1, 2, 32)];
    let bf16_shapes = |l: &[(i64, i64, i64, i64, i64)]| -> Vec<Dims> {
        l.iter()
            .map(|&(n, k, bias, epi, out)| {
                vec![("M", rows), ("N", n), ("K", k), ("bias", bias), ("epi", epi), ("out", out)]
            })
            .collect()
    };
    let gemv_shapes: Vec<Dims> = DECODE_BATCHES
        .iter()
        .flat_map(|&b| {
            let m = ("M", b as i64);
            [
                vec![m, ("N", 3 * c), ("K", c), ("bias", 1), ("ln", 1)],
                vec![m, ("N", c), ("K", c), ("bias", 1), ("epi", 2), ("in", 16)],
                vec![m, ("N", 4 * c), ("K", c), ("bias", 1), ("epi", 1), ("ln", 1)],
                vec![m, ("N", c), ("K", 4 * c), ("bias", 1), ("epi", 2)],
                vec![m, ("N", vp), ("K", c), ("bias", 1), ("ln", 1)],
            ]
        })
        .collect();
    let ops: Vec<(&'static dyn Op, Vec<Dims>)> = vec![
        (&Encoder, vec![vec![("B", PREFILL_B as i64), ("T", t), ("C", c), ("V", v)]]),
        (&LayerNorm, vec![vec![("rows", rows), ("C", c)]]),
        (&Linear, linears.iter().map(|&(n, k)| vec![("M", rows), ("N", n), ("K", k), ("bias", 1)]).collect()),
        (&Prefill, vec![vec![("B", PREFILL_B as i64), ("T", t), ("NH", nh), ("HS", hs), ("W", t)]]),
        (&Gelu, vec![vec![("N", rows * 4 * c)]]),
        (&Residual, vec![vec![("N", rows * c)]]),
        (&Decode, DECODE_BATCHES.iter().map(|&b| decode(b)).collect()),
        (
            &KvAppend,
            DECODE_BATCHES.iter().map(|&b| vec![("R", b as i64), ("B", b as i64), ("Tmax", t), ("C", c)]).collect(),
        ),
        // The decode step's linears at every decode batch size (a stage that only wins at one
        // sequence, as the FMA stages that re-read W per 8 rows, must not be chosen for all of
        // them), as the step runs them: QKV, the MLP up (with GELU) and the LM head with the
        // LayerNorm before them folded in, the projections adding into the residual stream (the
        // attention's on its bf16 output). Only a stage that folds runs the first three: the one
        // whose step has no LayerNorm kernels.
        (&Gemv, gemv_shapes.clone()),
        (&Argmax, DECODE_BATCHES.iter().map(|&b| vec![("B", b as i64), ("V", v), ("ld", vp)]).collect()),
        (
            &Sample,
            DECODE_BATCHES
                .iter()
                .map(|&b| vec![("B", b as i64), ("V", v), ("ld", vp), ("k", 50), ("p", 900), ("t", 100)])
                .collect(),
        ),
        // The whole step at the model table's decode batches, the cache filled as its decode is timed.
        (
            &DecodeStep,
            DECODE_BATCHES
                .iter()
                .map(|&b| {
                    let len = (t - 24).max(1);
                    vec![("B", b as i64), ("len", len), ("L", cfg.layers as i64), ("C", c), ("H", nh)]
                })
                .collect(),
        ),
        (&LayerNorm, vec![vec![("rows", rows), ("C", c), ("out", 16)]]),
        (&LinearBf16, bf16_shapes(&linears_bf16)),
        (&LinearBf16, bf16_shapes(&residual_linears_bf16)),
        (&PrefillBf16, vec![vec![("B", PREFILL_B as i64), ("T", t), ("NH", nh), ("HS", hs), ("causal", 1)]]),
        // The fp8 linears: their inputs' quantization at both K widths, the linears as the bf16
        // pass's (the projections with the residual tail, the LM head storing bf16), and the GEMVs
        // as the step runs `gemv`'s.
        (
            &QuantizeFp8,
            vec![vec![("M", rows), ("K", c), ("blocks", 0)], vec![("M", rows), ("K", 4 * c), ("blocks", 0)]],
        ),
        (&LinearFp8, bf16_shapes(&[linears_bf16.as_slice(), residual_linears_bf16.as_slice()].concat())),
        (&GemvFp8, gemv_shapes.clone()),
    ];
    ops.into_iter()
        .map(|(op, shapes)| {
            let base = &op.default_shapes()[0];
            let shapes = shapes.iter().map(|kv| base.overlay(&Shape::new(kv), op.shape_keys()).expect("known keys"));
            (op, shapes.collect())
        })
        .collect()
}

fn stage_lists(cfg: &Config) -> Vec<Vec<String>> {
    model_ops(cfg).iter().map(|(op, _)| op.variants().iter().map(|v| v.id()).collect()).collect()
}

fn cache_file(gpu: &Gpu, cfg: &Config) -> Option<PathBuf> {
    let name = format!("fastest-v{CACHE_VERSION}-{}-{}.json", gpu.info().uuid, cfg.key());
    common::nvrtc::cache_dir().map(|d| d.join(name))
}

/// The cached selection for this device and config, or a new one (which runs the ladders, about a
/// minute, and reports each op on `progress`). `fresh` ignores the cache.
pub fn selection(gpu: &Gpu, cfg: &Config, fresh: bool, progress: &mut dyn FnMut(&str)) -> Result<Selection> {
    let file = cache_file(gpu, cfg);
    if !fresh {
        let cached: Option<Selection> =
            file.as_ref().and_then(|f| std::fs::read(f).ok()).and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(s) = cached.filter(|s| s.stage_lists == stage_lists(cfg)) {
            return Ok(s);
        }
    }
    let s = select(gpu, cfg, progress)?;
    if let Some(f) = file {
        // A cache that cannot be written only costs the next run the same minute.
        let _ = std::fs::write(f, serde_json::to_vec_pretty(&s).unwrap_or_default());
    }
    Ok(s)
}

fn select(gpu: &Gpu, cfg: &Config, progress: &mut dyn FnMut(&str)) -> Result<Selection> {
    let ceilings = Ceilings::get(gpu)?;
    // Short timings; a stage that takes over half a second (the report's first attention kernels take
    // seconds at B = 4, T = 1024) is ranked by its one warm-up run.
    let timing = TimingConfig {
        target_ms: 50.0,
        min_reps: 3,
        max_reps: 20,
        warmup_ms: 0.0,
        long_run_above_ms: 500.0,
        long_run_reps: 1,
        ..TimingConfig::default()
    };
    let opts = RunOptions { timing, ..RunOptions::default() };
    let mut ops = Vec::new();
    for ((op, shapes), plan_op) in model_ops(cfg).into_iter().zip(PLAN_OPS) {
        progress(&format!("{}/{}", op.family(), op.name()));
        let variants = op.variants();
        let mut stages: Vec<StageTimes> = variants
            .iter()
            .map(|v| StageTimes {
                stage: v.stage,
                name: v.name.to_string(),
                median_ms: Vec::new(),
                excluded: match op.name() {
                    "decode" => match attention::decode::layout_of(v) {
                        Ok(Layout::Paged) => {
                            Some("reads the paged layout; the fastest plans' cache is contiguous".into())
                        }
                        Ok(Layout::Contiguous) => None,
                        Err(e) => Some(e.to_string()),
                    },
                    _ => None,
                },
            })
            .collect();
        for shape in &shapes {
            let table = runner::run_op(gpu, &ceilings, op, shape, &opts, &mut |_| {})?;
            for (st, row) in stages.iter_mut().zip(&table.rows) {
                let ms = (row.status == Status::Passed).then(|| row.timing.map(|t| t.median_ms)).flatten();
                if ms.is_none() && st.excluded.is_none() {
                    st.excluded = Some(match &row.status {
                        Status::Failed(why) | Status::Skipped(why) => format!("at {shape}: {why}"),
                        Status::Passed => format!("at {shape}: not timed"),
                    });
                }
                st.median_ms.push(ms);
            }
        }
        let chosen = choose(&stages).ok_or_else(|| {
            Error::constraint(format!("a stage of {plan_op} that runs at every model shape"), "none passed")
        })?;
        ops.push(OpChoice {
            op: plan_op.to_string(),
            shapes: shapes.iter().map(|s| s.to_string()).collect(),
            stages,
            chosen,
        });
    }
    Ok(Selection { device: gpu.info().name.clone(), config: cfg.key(), stage_lists: stage_lists(cfg), ops })
}

/// The plan `NAME[:op=stage,...]`: a named plan with overrides. `fastest` is, for each op, the stage that
/// ran fastest at this model's shapes on this device (the ladders run once, then the choice is
/// cached), with fp32 activations and the decode step's linears on the plan's `linear`;
/// `fastest-bf16` runs the whole-sequence pass on the fastest bf16 stages and the decode step's
/// linears on the fastest GEMV.
pub fn resolve(gpu: &Gpu, cfg: &Config, spec: &str, progress: &mut dyn FnMut(&str)) -> Result<Plan> {
    let (name, overrides) = spec.split_once(':').unwrap_or((spec, ""));
    let fastest = name == "fastest" || name == "fastest-bf16";
    let plan = if fastest {
        let mut stages = selection(gpu, cfg, false, progress)?.stages();
        // Both run the bf16 GEMV or none; the fp8 linears are a plan of their own.
        stages[FP8_OPS..].fill(OFF);
        if name == "fastest" {
            stages[8] = OFF;
            stages[BF16_OPS..].fill(OFF);
        }
        Plan::from_stages(name, stages)?
    } else {
        Plan::named(name)?
    };
    // Overrides rebuild the plan from stage numbers, so the saved configurations come after them.
    let mut plan = plan.with_overrides(overrides)?;
    if fastest {
        apply_tuned(&common::tuned::dir()?, &gpu.info().uuid, cfg, &mut plan)?;
    }
    Ok(plan)
}

/// Sets each op of `plan` to the configuration `ladder sweep --save-best` saved for its stage on
/// this device at one of the op's model shapes (the first, in the order the selection times them),
/// and lists what it applied in `plan.tuned`. Nothing saved: the declared configurations.
/// The store is `dir` (`common::tuned::dir()`), the device `uuid`.
pub fn apply_tuned(dir: &Path, uuid: &str, cfg: &Config, plan: &mut Plan) -> Result<()> {
    for (i, (_, shapes)) in model_ops(cfg).iter().enumerate() {
        let Some(v) = plan.variant_mut(i) else { continue };
        let shapes: Vec<String> = shapes.iter().map(|s| s.to_string()).collect();
        if let Some(t) = common::tuned::lookup(dir, uuid, v, &shapes)? {
            *v = t.apply(v)?;
            let config: Vec<String> = t.config.iter().map(|(n, x)| format!("{n}={x}")).collect();
            plan.tuned.push(format!("{}/{:02}-{} {} (best at {})", t.op, t.stage, t.name, config.join(","), t.shape));
        }
    }
    Ok(())
}

/// The first stage of op `i` of [`PLAN_OPS`] (in its ladder's order) that can run at every shape the
/// model runs it at: where the leave-one-op-out rows put an op (stage 0, or for `linear-bf16` the
/// first rung that fuses the tails and stores bf16).
pub fn first_runnable(cfg: &Config, i: usize) -> Result<u32> {
    let (op, shapes) = &model_ops(cfg)[i];
    op.variants()
        .into_iter()
        .find(|v| shapes.iter().all(|s| op.validate(v, s).is_ok()))
        .map(|v| v.stage)
        .ok_or_else(|| Error::constraint(format!("a stage of {} that runs at the model's shapes", PLAN_OPS[i]), "none"))
}

/// The stage with the smallest sum over shapes of its time over the shape's best time.
fn choose(stages: &[StageTimes]) -> Option<u32> {
    let eligible: Vec<(&StageTimes, Vec<f64>)> = stages
        .iter()
        .filter(|s| s.excluded.is_none())
        .filter_map(|s| s.median_ms.iter().copied().collect::<Option<Vec<f64>>>().map(|t| (s, t)))
        .collect();
    let shapes = eligible.first()?.1.len();
    let best: Vec<f64> =
        (0..shapes).map(|i| eligible.iter().map(|(_, t)| t[i]).fold(f64::INFINITY, f64::min)).collect();
    let score = |t: &[f64]| t.iter().zip(&best).map(|(a, b)| a / b).sum::<f64>();
    eligible.iter().min_by(|a, b| score(&a.1).total_cmp(&score(&b.1))).map(|(s, _)| s.stage)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(stage: u32, ms: &[Option<f64>]) -> StageTimes {
        StageTimes { stage, name: format!("s{stage}"), median_ms: ms.to_vec(), excluded: None }
    }

    #[test]
    fn saved_configurations_reach_the_plan_at_the_model_shape() {
        let dir = std::env::temp_dir().join(format!("ladder-apply-tuned-{}", std::process::id()));
        let cfg = Config::GPT2;
        let mut plan = Plan::named("fp32").unwrap().with_overrides("gelu=1").unwrap();
        let gelu_shape = model_ops(&cfg)[4].1[0].to_string();
        let entry = |stage, shape: &str| common::tuned::Tuned {
            family: "gpt2".into(),
            op: "gelu".into(),
            stage,
            name: "vectorized".into(),
            shape: shape.into(),
            config: vec![("PW_THREADS".into(), 64)],
            median_ms: 1.0,
            default_ms: Some(1.1),
        };
        // Saved at another shape, or for another stage: not applied.
        common::tuned::save(&dir, "dev", entry(1, "N=7")).unwrap();
        common::tuned::save(&dir, "dev", entry(0, &gelu_shape)).unwrap();
        apply_tuned(&dir, "dev", &cfg, &mut plan).unwrap();
        assert_eq!(plan.gelu.tunable("PW_THREADS").unwrap(), 256);
        assert!(plan.tuned.is_empty());
        common::tuned::save(&dir, "dev", entry(1, &gelu_shape)).unwrap();
        apply_tuned(&dir, "dev", &cfg, &mut plan).unwrap();
        assert_eq!(plan.gelu.tunable("PW_THREADS").unwrap(), 64);
        assert_eq!(plan.tuned.len(), 1, "{:?}", plan.tuned);
        assert!(plan.tuned[0].contains("PW_THREADS=64"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_stage_never_far_behind_wins_and_failures_are_out() {
        // Stage 1 is best at one shape by far but 3x behind at the other; stage 2 is close at both.
        let stages = [st(0, &[Some(10.0), Some(10.0)]), st(1, &[Some(1.0), Some(6.0)]), st(2, &[Some(1.5), Some(2.0)])];
        assert_eq!(choose(&stages), Some(2));
        let failed = [st(0, &[Some(10.0), Some(10.0)]), st(1, &[Some(1.0), None])];
        assert_eq!(choose(&failed), Some(0));
        let mut paged = st(1, &[Some(1.0), Some(1.0)]);
        paged.excluded = Some("paged".into());
        assert_eq!(choose(&[st(0, &[Some(9.0), Some(9.0)]), paged]), Some(0));
        assert_eq!(choose(&[st(0, &[None])]), None);
    }
}
