//! GPT-2, composed from the ladders: one prepared stage per op, chosen by a plan.
//!
//! The model is OpenAI's and Hugging Face's: learned token and position embeddings, pre-LayerNorm
//! blocks (ln_1, causal self-attention with a fused QKV projection and an output projection,
//! residual; ln_2, an MLP of 4C with GELU in its tanh form, residual), ln_f, and the LM head tied to
//! the token embedding. [`Model::forward`] reads top to bottom: every call names the op it runs.
//!
//! Two ways through it: the whole-sequence forward pass ([`Model::forward`], every position's
//! logits; generation without a KV cache repeats it over the growing prefix), and the KV cache
//! ([`KvCache`]): [`Model::prefill_into`] runs a prompt and fills its slot's keys and values, then
//! [`Model::decode_step`] runs one token per sequence against the cache (decode attention).

use std::collections::HashMap;
use std::path::Path;

use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::uniform;
use common::timing::{Timing, TimingConfig};
use common::{require, DriverContext, Error, Gpu, Op, Result, Variant};

use attention::decode::{
    self as attn_decode, Decode, DecodeArgs, DecodeDims, Dtype, Heads, KvCache as CacheRef, Layout, PagedCache, SeqLens,
};
use attention::kv_append::{self, Cells, KvAppend, KvAppendArgs, KvAppendDims, KvTarget};
use attention::prefill::{self, Prefill, PrefillArgs, PrefillDims};
use attention::reference::Dims as AttnDims;
use matmul::gemv::{self, Gemv, GemvArgs, GemvDims};
use matmul::linear::{self, Linear, LinearArgs, LinearDims};
use norm::layernorm::{self, LayerNorm, LayerNormArgs, LayerNormDims};

use crate::argmax::{self, Argmax, ArgmaxDims};
use crate::encoder::{self, Encoder, EncoderArgs, EncoderDims, Positions, TokenIds};
use crate::generate::Sampling;
use crate::pointwise::{self, Gelu, Kind, Residual};
use crate::sample::{self, Sample, SampleDims};

/// LayerNorm's epsilon in GPT-2.
pub const LN_EPS: f32 = 1e-5;

/// A GPT-2 configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub layers: usize,
    pub heads: usize,
    pub c: usize,
    pub vocab: usize,
    /// The context length (rows of the position embedding).
    pub max_t: usize,
}

impl Config {
    pub const GPT2: Config = Config { layers: 12, heads: 12, c: 768, vocab: 50257, max_t: 1024 };
    pub const MEDIUM: Config = Config { layers: 24, heads: 16, c: 1024, vocab: 50257, max_t: 1024 };
    pub const LARGE: Config = Config { layers: 36, heads: 20, c: 1280, vocab: 50257, max_t: 1024 };
    pub const XL: Config = Config { layers: 48, heads: 25, c: 1600, vocab: 50257, max_t: 1024 };

    /// `gpt2`, `gpt2-medium`, `gpt2-large` or `gpt2-xl`.
    pub fn by_name(name: &str) -> Result<Config> {
        match name {
            "gpt2" => Ok(Config::GPT2),
            "gpt2-medium" => Ok(Config::MEDIUM),
            "gpt2-large" => Ok(Config::LARGE),
            "gpt2-xl" => Ok(Config::XL),
            _ => Err(Error::constraint("model in {gpt2, gpt2-medium, gpt2-large, gpt2-xl}", format!("'{name}'"))),
        }
    }

    pub fn head_size(&self) -> usize {
        self.c / self.heads
    }

    /// The vocabulary padded to a multiple of 64 (50304 for GPT-2): the LM head's N, so every
    /// leading dimension of its GEMM is aligned (cuBLAS then takes its fast tensor-core path). The
    /// padding rows are zeros and never sampled: logits leave the model with V columns.
    pub fn padded_vocab(&self) -> usize {
        self.vocab.next_multiple_of(64)
    }

    /// Every dimension in one word (`L12-H12-C768-V50257-T1024`), for file names and tables.
    pub fn key(&self) -> String {
        format!("L{}-H{}-C{}-V{}-T{}", self.layers, self.heads, self.c, self.vocab, self.max_t)
    }
}

/// One transformer block's parameters, in the layout the stages take: every linear weight is
/// `[out, in]` (llm.c's `W[N, K]`), i.e. Hugging Face's Conv1D `[in, out]` transposed once at load.
#[derive(Clone, Debug)]
pub struct Block<T> {
    pub ln1_w: T,
    pub ln1_b: T,
    pub qkv_w: T,
    pub qkv_b: T,
    pub proj_w: T,
    pub proj_b: T,
    pub ln2_w: T,
    pub ln2_b: T,
    pub fc_w: T,
    pub fc_b: T,
    pub fcproj_w: T,
    pub fcproj_b: T,
}

/// All parameters: host (`Vec<f32>`) or device (`CudaSlice<f32>`).
#[derive(Clone, Debug)]
pub struct Params<T> {
    pub wte: T,
    pub wpe: T,
    pub blocks: Vec<Block<T>>,
    pub lnf_w: T,
    pub lnf_b: T,
}

impl<T> Block<T> {
    fn map<U>(&self, mut f: impl FnMut(&T) -> Result<U>) -> Result<Block<U>> {
        Ok(Block {
            ln1_w: f(&self.ln1_w)?,
            ln1_b: f(&self.ln1_b)?,
            qkv_w: f(&self.qkv_w)?,
            qkv_b: f(&self.qkv_b)?,
            proj_w: f(&self.proj_w)?,
            proj_b: f(&self.proj_b)?,
            ln2_w: f(&self.ln2_w)?,
            ln2_b: f(&self.ln2_b)?,
            fc_w: f(&self.fc_w)?,
            fc_b: f(&self.fc_b)?,
            fcproj_w: f(&self.fcproj_w)?,
            fcproj_b: f(&self.fcproj_b)?,
        })
    }
}

impl<T> Params<T> {
    fn map<U>(&self, mut f: impl FnMut(&T) -> Result<U>) -> Result<Params<U>> {
        Ok(Params {
            wte: f(&self.wte)?,
            wpe: f(&self.wpe)?,
            blocks: self.blocks.iter().map(|b| b.map(&mut f)).collect::<Result<_>>()?,
            lnf_w: f(&self.lnf_w)?,
            lnf_b: f(&self.lnf_b)?,
        })
    }
}

/// Host parameters.
pub type Weights = Params<Vec<f32>>;

impl Weights {
    /// Seeded random parameters of `cfg`'s shapes: N(0, 0.02)-sized uniform weights like Hugging
    /// Face's initialization, and non-trivial LayerNorm gains and biases so that a test exercises
    /// every parameter (timing does not depend on the values).
    pub fn random(cfg: &Config, seed: u64) -> Weights {
        let c = cfg.c;
        let mut s = seed;
        let mut next = |n: usize, lo: f32, hi: f32| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            uniform(n, lo, hi, s)
        };
        let w = 0.035; // uniform(-w, w) has the standard deviation 0.02
        let blocks = (0..cfg.layers)
            .map(|_| Block {
                ln1_w: next(c, 0.8, 1.2),
                ln1_b: next(c, -0.1, 0.1),
                qkv_w: next(3 * c * c, -w, w),
                qkv_b: next(3 * c, -0.05, 0.05),
                proj_w: next(c * c, -w, w),
                proj_b: next(c, -0.05, 0.05),
                ln2_w: next(c, 0.8, 1.2),
                ln2_b: next(c, -0.1, 0.1),
                fc_w: next(4 * c * c, -w, w),
                fc_b: next(4 * c, -0.05, 0.05),
                fcproj_w: next(4 * c * c, -w, w),
                fcproj_b: next(c, -0.05, 0.05),
            })
            .collect();
        Weights {
            wte: next(cfg.vocab * c, -w, w),
            wpe: next(cfg.max_t * c, -0.01, 0.01),
            blocks,
            lnf_w: next(c, 0.8, 1.2),
            lnf_b: next(c, -0.1, 0.1),
        }
    }

    /// Hugging Face's `model.safetensors` for GPT-2 (tensor names with or without the
    /// `transformer.` prefix of `GPT2LMHeadModel`; `lm_head` is tied to `wte` and not read; f32,
    /// f16 or bf16 stored). Conv1D weights `[in, out]` are transposed to `[out, in]` here, once.
    pub fn load(path: &Path, cfg: &Config) -> Result<Weights> {
        let bytes =
            std::fs::read(path).map_err(|e| Error::Io { context: format!("read {}", path.display()), source: e })?;
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| Error::constraint("a safetensors file", format!("{}: {e}", path.display())))?;
        let prefix = if st.names().iter().any(|n| n.starts_with("transformer.")) { "transformer." } else { "" };
        let get = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let full = format!("{prefix}{name}");
            let t = st.tensor(&full).map_err(|_| {
                Error::constraint(format!("tensor {full} of shape {shape:?} in the weights file"), "missing")
            })?;
            require(t.shape() == shape, &format!("tensor {full} of shape {shape:?}"), || {
                format!("shape {:?}", t.shape())
            })?;
            to_f32(&full, t.dtype(), t.data())
        };
        // A Conv1D weight stored [in, out], returned [out, in].
        let conv = |name: &str, inp: usize, out: usize| -> Result<Vec<f32>> {
            let w = get(name, &[inp, out])?;
            let mut t = vec![0f32; w.len()];
            for i in 0..inp {
                for o in 0..out {
                    t[o * inp + i] = w[i * out + o];
                }
            }
            Ok(t)
        };
        let c = cfg.c;
        let blocks = (0..cfg.layers)
            .map(|l| {
                let n = |s: &str| format!("h.{l}.{s}");
                Ok(Block {
                    ln1_w: get(&n("ln_1.weight"), &[c])?,
                    ln1_b: get(&n("ln_1.bias"), &[c])?,
                    qkv_w: conv(&n("attn.c_attn.weight"), c, 3 * c)?,
                    qkv_b: get(&n("attn.c_attn.bias"), &[3 * c])?,
                    proj_w: conv(&n("attn.c_proj.weight"), c, c)?,
                    proj_b: get(&n("attn.c_proj.bias"), &[c])?,
                    ln2_w: get(&n("ln_2.weight"), &[c])?,
                    ln2_b: get(&n("ln_2.bias"), &[c])?,
                    fc_w: conv(&n("mlp.c_fc.weight"), c, 4 * c)?,
                    fc_b: get(&n("mlp.c_fc.bias"), &[4 * c])?,
                    fcproj_w: conv(&n("mlp.c_proj.weight"), 4 * c, c)?,
                    fcproj_b: get(&n("mlp.c_proj.bias"), &[c])?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Weights {
            wte: get("wte.weight", &[cfg.vocab, c])?,
            wpe: get("wpe.weight", &[cfg.max_t, c])?,
            blocks,
            lnf_w: get("ln_f.weight", &[c])?,
            lnf_b: get("ln_f.bias", &[c])?,
        })
    }
}

fn to_f32(name: &str, dtype: safetensors::Dtype, data: &[u8]) -> Result<Vec<f32>> {
    use safetensors::Dtype;
    let halves = |f: fn(u16) -> f32| data.chunks_exact(2).map(|b| f(u16::from_le_bytes([b[0], b[1]]))).collect();
    match dtype {
        Dtype::F32 => Ok(data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()),
        Dtype::F16 => Ok(halves(|x| half::f16::from_bits(x).to_f32())),
        Dtype::BF16 => Ok(halves(|x| half::bf16::from_bits(x).to_f32())),
        other => Err(Error::constraint(format!("tensor {name} stored as F32, F16 or BF16"), format!("{other:?}"))),
    }
}

// ---------------------------------------------------------------- plans

/// One stage per op: the model-level ablation.
#[derive(Clone, Debug)]
pub struct Plan {
    pub name: String,
    pub encoder: Variant,
    pub layernorm: Variant,
    pub linear: Variant,
    pub attention: Variant,
    pub gelu: Variant,
    pub residual: Variant,
    /// Decode attention over the KV cache (bf16: the decode ladder's cache types). Its layout is the
    /// cache's: a paged stage (3, 4) gives the model a paged cache.
    pub decode: Variant,
    /// Moving q, k and v between the QKV GEMM and the bf16 cache.
    pub kv_append: Variant,
    /// The decode step's linears as `matmul/gemv` on bf16 copies of the weights (made once at load);
    /// `None`: the plan's `linear` on the fp32 weights.
    pub gemv: Option<Variant>,
    /// Greedy sampling on the device (a greedy decode step downloads ids, not logits).
    pub argmax: Variant,
    /// Temperature, top-k and top-p sampling on the device (a sampled step downloads ids too).
    pub sample: Variant,
    /// The saved sweep configurations the `fastest` plans applied (`ladder sweep --save-best`), one
    /// line each: `op/NN-stage NAME=value,... (best at SHAPE)`.
    pub tuned: Vec<String>,
}

/// The op names a plan assigns, in forward order (`decode`, `kv-append` and `gemv` run with the KV
/// cache; `gemv=off` gives the decode step the plan's `linear`; `argmax` ends a greedy decode step,
/// `sample` a sampled one).
pub const PLAN_OPS: [&str; 11] = [
    "encoder",
    "layernorm",
    "linear",
    "attention",
    "gelu",
    "residual",
    "decode",
    "kv-append",
    "gemv",
    "argmax",
    "sample",
];

/// One stage per op of [`PLAN_OPS`].
pub type Stages = [u32; PLAN_OPS.len()];

/// No stage: an optional op (`gemv`) is off.
const OFF: u32 = u32::MAX;

fn stage_of(op: &dyn Op, stage: u32) -> Result<Variant> {
    op.variants().into_iter().find(|v| v.stage == stage).ok_or_else(|| {
        let have: Vec<u32> = op.variants().iter().map(|v| v.stage).collect();
        Error::constraint(format!("{}/{} stage in {have:?}", op.family(), op.name()), format!("stage {stage}"))
    })
}

/// The named plans, in the model table's order. `fastest` and `fastest-bf16` are chosen on the
/// device ([`Plan::resolve`]); the others are fixed.
pub const PLAN_NAMES: [&str; 7] = ["naive", "report", "fp32", "cublas", "cublas-gemv", "fastest", "fastest-bf16"];

impl Plan {
    /// - `naive`: stage 0 of every op;
    /// - `report`: the stages the report's model ended with, where a ladder has them: its
    ///   block-reduction LayerNorm, cuBLAS fp32 GEMMs, its tuned FlashAttention-2, elementwise GELU
    ///   and residual kernels (it fused them into its bias kernel; the model does not fuse yet), and
    ///   its attention kernels run on the one query of a decode step (decode stage 0);
    /// - `fp32`: our fastest fp32 stage of every op, no tensor cores in the prefill (the plan that
    ///   must match Hugging Face to 1e-4);
    /// - `cublas`: `fp32` with cuBLAS fp32 for every linear;
    /// - `cublas-gemv`: cuBLAS TF32 for the prefill's linears, and the decode step's linears as
    ///   our GEMV on bf16 weights.
    ///
    /// `fastest` and `fastest-bf16` need the device: see [`Plan::resolve`].
    pub fn named(name: &str) -> Result<Plan> {
        let stages: Stages = match name {
            "naive" => [0, 0, 0, 0, 0, 0, 0, 0, OFF, 0, 0],
            "report" => [0, 4, 90, 5, 0, 0, 0, 0, OFF, 0, 0],
            "fp32" => [0, 6, 2, 5, 1, 1, 7, 0, OFF, 0, 0],
            "cublas" => [0, 6, 90, 5, 1, 1, 7, 0, OFF, 0, 0],
            "cublas-gemv" => [0, 6, 91, 5, 1, 1, 7, 0, 1, 0, 0],
            "fastest" | "fastest-bf16" => {
                return Err(Error::constraint(
                    "a device to choose the fastest stages on (Plan::resolve)",
                    format!("'{name}' without one"),
                ))
            }
            _ => return Err(Error::constraint(format!("plan in {PLAN_NAMES:?}"), format!("'{name}'"))),
        };
        Plan::from_stages(name, stages)
    }

    /// `NAME[:op=stage,...]`: a named plan with overrides. `fastest` is, for each op, the stage that
    /// ran fastest at this model's shapes on this device (the ladders run once, then the choice is
    /// cached; `crate::fastest`), with the decode step's linears on the plan's `linear`;
    /// `fastest-bf16` adds the fastest GEMV on bf16 weights for them.
    pub fn resolve(gpu: &Gpu, cfg: &Config, spec: &str, progress: &mut dyn FnMut(&str)) -> Result<Plan> {
        let (name, overrides) = spec.split_once(':').unwrap_or((spec, ""));
        let fastest = name == "fastest" || name == "fastest-bf16";
        let plan = if fastest {
            let mut stages = crate::fastest::selection(gpu, cfg, false, progress)?.stages();
            if name == "fastest" {
                stages[8] = OFF;
            }
            Plan::from_stages(name, stages)?
        } else {
            Plan::named(name)?
        };
        // Overrides rebuild the plan from stage numbers, so the saved configurations come after them.
        let mut plan = plan.with_overrides(overrides)?;
        if fastest {
            crate::fastest::apply_tuned(&common::tuned::dir()?, &gpu.info().uuid, cfg, &mut plan)?;
        }
        Ok(plan)
    }

    /// Checks `NAME[:op=stage,...]` without a device: a known name, overrides that name ops and
    /// stages (for `fastest`, checked against stage 0's plan; the chosen stages come later).
    pub fn check_spec(spec: &str) -> Result<()> {
        let (name, overrides) = spec.split_once(':').unwrap_or((spec, ""));
        let base = if name.starts_with("fastest") && PLAN_NAMES.contains(&name) { "naive" } else { name };
        Plan::named(base)?.with_overrides(overrides).map(|_| ())
    }

    /// The stage of each op of [`PLAN_OPS`] (`u32::MAX`: off).
    pub fn stages(&self) -> Stages {
        [
            self.encoder.stage,
            self.layernorm.stage,
            self.linear.stage,
            self.attention.stage,
            self.gelu.stage,
            self.residual.stage,
            self.decode.stage,
            self.kv_append.stage,
            self.gemv.as_ref().map_or(OFF, |v| v.stage),
            self.argmax.stage,
            self.sample.stage,
        ]
    }

    fn from_stages(name: &str, s: Stages) -> Result<Plan> {
        Ok(Plan {
            name: name.to_string(),
            encoder: stage_of(&Encoder, s[0])?,
            layernorm: stage_of(&LayerNorm, s[1])?,
            linear: stage_of(&Linear, s[2])?,
            attention: stage_of(&Prefill, s[3])?,
            gelu: stage_of(&Gelu, s[4])?,
            residual: stage_of(&Residual, s[5])?,
            decode: stage_of(&Decode, s[6])?,
            kv_append: stage_of(&KvAppend, s[7])?,
            gemv: if s[8] == OFF { None } else { Some(stage_of(&Gemv, s[8])?) },
            argmax: stage_of(&Argmax, s[9])?,
            sample: stage_of(&Sample, s[10])?,
            tuned: Vec::new(),
        })
    }

    /// The variant of op `i` of [`PLAN_OPS`] (`None`: an optional op that is off).
    pub fn variant_mut(&mut self, i: usize) -> Option<&mut Variant> {
        match i {
            0 => Some(&mut self.encoder),
            1 => Some(&mut self.layernorm),
            2 => Some(&mut self.linear),
            3 => Some(&mut self.attention),
            4 => Some(&mut self.gelu),
            5 => Some(&mut self.residual),
            6 => Some(&mut self.decode),
            7 => Some(&mut self.kv_append),
            8 => self.gemv.as_mut(),
            9 => Some(&mut self.argmax),
            10 => Some(&mut self.sample),
            _ => None,
        }
    }

    /// This plan with single ops set to other stages: `op=stage,...` (ops as in [`PLAN_OPS`]).
    pub fn with_overrides(self, spec: &str) -> Result<Plan> {
        let mut stages = self.stages();
        for item in spec.split(',').filter(|s| !s.is_empty()) {
            let (op, stage) = item
                .split_once('=')
                .ok_or_else(|| Error::constraint("--plan overrides as op=stage", format!("'{item}'")))?;
            let i = PLAN_OPS
                .iter()
                .position(|&o| o == op)
                .ok_or_else(|| Error::constraint(format!("op in {PLAN_OPS:?}"), format!("'{op}'")))?;
            stages[i] = match stage {
                "off" if op == "gemv" => OFF,
                _ => stage
                    .parse()
                    .map_err(|_| Error::constraint("a stage number (gemv: or off)", format!("'{stage}'")))?,
            };
        }
        let name = if spec.is_empty() { self.name.clone() } else { format!("{}+{spec}", self.name) };
        Plan::from_stages(&name, stages)
    }
}

// ---------------------------------------------------------------- the model

/// Every op of the forward pass prepared for one (B, T).
struct Prepared {
    encoder: encoder::Prepared,
    layernorm: layernorm::Prepared,
    qkv: linear::Prepared,
    proj: linear::Prepared,
    fc: linear::Prepared,
    fcproj: linear::Prepared,
    lm_head: linear::Prepared,
    attention: prefill::Prepared,
    gelu: pointwise::Prepared,
    residual: pointwise::Prepared,
    acts: Activations,
}

/// The activations of one (B, T) forward pass.
struct Activations {
    x: CudaSlice<f32>,
    ln: CudaSlice<f32>,
    mean: CudaSlice<f32>,
    rstd: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    att: CudaSlice<f32>,
    att_lse: CudaSlice<f32>,
    proj: CudaSlice<f32>,
    fc: CudaSlice<f32>,
    gelu: CudaSlice<f32>,
    logits: CudaSlice<f32>,
}

impl Activations {
    /// For `rows` token positions (B·T in the prefill, B in a decode step).
    fn new(gpu: &Gpu, cfg: &Config, rows: usize) -> Result<Activations> {
        let c = cfg.c;
        Ok(Activations {
            x: gpu.zeros(rows * c)?,
            ln: gpu.zeros(rows * c)?,
            mean: gpu.zeros(rows)?,
            rstd: gpu.zeros(rows)?,
            qkv: gpu.zeros(rows * 3 * c)?,
            att: gpu.zeros(rows * c)?,
            att_lse: gpu.zeros(rows * cfg.heads)?,
            proj: gpu.zeros(rows * c)?,
            fc: gpu.zeros(rows * 4 * c)?,
            gelu: gpu.zeros(rows * 4 * c)?,
            logits: gpu.zeros(rows * cfg.padded_vocab())?,
        })
    }
}

/// GPT-2 on the device with a plan.
pub struct Model {
    pub cfg: Config,
    pub plan: Plan,
    weights: DeviceWeights,
    prepared: HashMap<(usize, usize), Prepared>,
    /// The decode step, prepared for one batch size.
    decode: Option<(usize, DecodeStep)>,
    /// Replay the decode step from a CUDA graph captured once per batch size and cache.
    graph: bool,
}

impl Model {
    /// Uploads `weights` (checked against `cfg`'s shapes) for `plan`.
    pub fn new(gpu: &Gpu, cfg: Config, weights: &Weights, plan: Plan) -> Result<Model> {
        require(cfg.heads >= 1 && cfg.c.is_multiple_of(cfg.heads), "C % heads == 0", || {
            format!("C = {}, heads = {}", cfg.c, cfg.heads)
        })?;
        let want = Weights::random(&Config { layers: 0, ..cfg }, 0);
        for (name, got, n) in [
            ("wte", weights.wte.len(), want.wte.len()),
            ("wpe", weights.wpe.len(), want.wpe.len()),
            ("blocks", weights.blocks.len(), cfg.layers),
        ] {
            require(got == n, &format!("{name} of {n} elements for this config"), || format!("{got}"))?;
        }
        let lm_head = padded_head(weights, &cfg);
        let bf16 = if plan.gemv.is_some() { Some(Bf16Weights::new(gpu, weights, &lm_head)?) } else { None };
        let weights = DeviceWeights { p: weights.map(|w| gpu.upload(w))?, lm_head: gpu.upload(&lm_head)?, bf16 };
        Ok(Model { cfg, plan, weights, prepared: HashMap::new(), decode: None, graph: false })
    }

    fn prepare(&mut self, gpu: &Gpu, b: usize, t: usize) -> Result<()> {
        if self.prepared.contains_key(&(b, t)) {
            return Ok(());
        }
        // Each (B, T) holds its activations (the logits alone are B·T·V floats): keep a few, so
        // generation without a cache, one T per step, does not pile them up.
        if self.prepared.len() >= 4 {
            self.prepared.clear();
        }
        let (cfg, p) = (self.cfg, &self.plan);
        let (c, m) = (cfg.c, b * t);
        require(t >= 1 && t <= cfg.max_t, &format!("1 <= T <= context {}", cfg.max_t), || format!("T = {t}"))?;
        let lin = |n: usize, k: usize, bias: bool| linear::prepare(gpu, &p.linear, LinearDims { m, n, k, bias });
        let ed = EncoderDims { b, t, c, vocab: cfg.vocab, max_t: cfg.max_t };
        let ad = AttnDims { b, t, c, nh: cfg.heads };
        let prepared = Prepared {
            encoder: encoder::prepare(gpu, &p.encoder, ed)?,
            layernorm: layernorm::prepare(gpu, &p.layernorm, LayerNormDims { rows: m, c })?,
            qkv: lin(3 * c, c, true)?,
            proj: lin(c, c, true)?,
            fc: lin(4 * c, c, true)?,
            fcproj: lin(c, 4 * c, true)?,
            lm_head: lin(cfg.padded_vocab(), c, false)?,
            attention: prefill::prepare(gpu, &p.attention, PrefillDims { dims: ad, window: t })?,
            gelu: pointwise::prepare(gpu, &p.gelu, Kind::Gelu, m * 4 * c)?,
            residual: pointwise::prepare(gpu, &p.residual, Kind::Residual, m * c)?,
            acts: Activations::new(gpu, &cfg, m)?,
        };
        self.prepared.insert((b, t), prepared);
        Ok(())
    }

    /// The logits `[B, T, V]` of `tokens` (`B` rows of `T` ids each).
    pub fn forward(&mut self, gpu: &Gpu, tokens: &[Vec<i32>]) -> Result<Vec<f32>> {
        let (b, t) = self.run(gpu, tokens)?;
        let (v, vp) = (self.cfg.vocab, self.cfg.padded_vocab());
        gpu.download_rows(&self.prepared[&(b, t)].acts.logits, b * t, v, vp)
    }

    /// The logits of each row's last position only, `[B, V]` (what generation samples from): the
    /// same pass, but only B rows of logits cross to the host.
    pub fn forward_last(&mut self, gpu: &Gpu, tokens: &[Vec<i32>]) -> Result<Vec<f32>> {
        let (b, t) = self.run(gpu, tokens)?;
        let (v, vp) = (self.cfg.vocab, self.cfg.padded_vocab());
        let logits = &self.prepared[&(b, t)].acts.logits;
        let mut out = vec![0f32; b * v];
        for (i, row) in out.chunks_mut(v).enumerate() {
            let off = (i * t + t - 1) * vp;
            gpu.stream().memcpy_dtoh(&logits.slice(off..off + v), row).ctx("copy logits to host")?;
        }
        gpu.synchronize()?;
        Ok(out)
    }

    /// Checks `tokens`, prepares (B, T) and enqueues the forward pass on the harness stream.
    fn run(&mut self, gpu: &Gpu, tokens: &[Vec<i32>]) -> Result<(usize, usize)> {
        let b = tokens.len();
        let t = tokens.first().map_or(0, |r| r.len());
        require(b >= 1 && tokens.iter().all(|r| r.len() == t), "B >= 1 prompts of one length T", || {
            format!("lengths {:?}", tokens.iter().map(|r| r.len()).collect::<Vec<_>>())
        })?;
        self.prepare(gpu, b, t)?;
        let ids = TokenIds::upload(gpu, &tokens.concat(), self.cfg.vocab)?;
        let stream = gpu.stream().clone();
        self.enqueue_forward(&stream, b, t, &ids, None)?;
        Ok((b, t))
    }

    /// The forward pass, op by op, on `stream`.
    /// With `fill`, each layer's k and v also go into the KV cache.
    fn enqueue_forward(
        &mut self,
        s: &CudaStream,
        b: usize,
        t: usize,
        ids: &TokenIds,
        mut fill: Option<Fill>,
    ) -> Result<()> {
        let (w, head) = (&self.weights.p, &self.weights.lm_head);
        let op = self.prepared.get_mut(&(b, t)).expect("prepared above");
        op.encoder.enqueue(s, EncoderArgs { out: &mut op.acts.x, tokens: ids, wte: &w.wte, wpe: &w.wpe })?;
        for (i, l) in w.blocks.iter().enumerate() {
            enqueue_block(s, op, l, fill.as_mut().map(|f| (f, i)))?;
        }
        let a = &mut op.acts;
        layernorm(s, &op.layernorm, a, &w.lnf_w, &w.lnf_b)?;
        op.lm_head.enqueue(s, LinearArgs { out: &mut a.logits, inp: &a.ln, weight: head, bias: None })
    }

    /// Enqueues transformer block `layer` alone, prepared for (B, T), on `s`, over whatever the
    /// activations hold: the unit the cross-family benches time.
    pub fn enqueue_one_block(&mut self, gpu: &Gpu, s: &CudaStream, b: usize, t: usize, layer: usize) -> Result<()> {
        self.prepare(gpu, b, t)?;
        let l =
            self.weights.p.blocks.get(layer).ok_or_else(|| {
                Error::constraint(format!("a layer below {}", self.cfg.layers), format!("layer {layer}"))
            })?;
        enqueue_block(s, self.prepared.get_mut(&(b, t)).expect("prepared above"), l, None)
    }
}

/// One transformer block of the whole-sequence pass; with `fill`, its keys and values also go into
/// layer `i` of the KV cache.
fn enqueue_block(
    s: &CudaStream,
    op: &mut Prepared,
    l: &Block<CudaSlice<f32>>,
    fill: Option<(&mut Fill, usize)>,
) -> Result<()> {
    let a = &mut op.acts;
    layernorm(s, &op.layernorm, a, &l.ln1_w, &l.ln1_b)?;
    op.qkv.enqueue(s, LinearArgs { out: &mut a.qkv, inp: &a.ln, weight: &l.qkv_w, bias: Some(&l.qkv_b) })?;
    if let Some((f, i)) = fill {
        let cache = f.cache.layers[i].target();
        f.kv.enqueue(s, KvAppendArgs { q_out: f.q16, cache, qkv: &a.qkv, cells: f.cells })?;
    }
    op.attention.enqueue(s, PrefillArgs { out: &mut a.att, lse: Some(&mut a.att_lse), qkv: &a.qkv })?;
    op.proj.enqueue(s, LinearArgs { out: &mut a.proj, inp: &a.att, weight: &l.proj_w, bias: Some(&l.proj_b) })?;
    op.residual.enqueue_in_place(s, &mut a.x, &a.proj)?;
    layernorm(s, &op.layernorm, a, &l.ln2_w, &l.ln2_b)?;
    op.fc.enqueue(s, LinearArgs { out: &mut a.fc, inp: &a.ln, weight: &l.fc_w, bias: Some(&l.fc_b) })?;
    op.gelu.enqueue(s, &mut a.gelu, &a.fc, None)?;
    op.fcproj
        .enqueue(s, LinearArgs { out: &mut a.proj, inp: &a.gelu, weight: &l.fcproj_w, bias: Some(&l.fcproj_b) })?;
    op.residual.enqueue_in_place(s, &mut a.x, &a.proj)
}

/// Where a prefill writes its keys and values.
struct Fill<'a> {
    cache: &'a mut KvCache,
    cells: &'a Cells,
    kv: &'a kv_append::Prepared,
    q16: &'a mut CudaSlice<u16>,
}

/// The KV cache of `b` sequences over the model's context (bf16), in the layout the plan's decode
/// stage reads, and each sequence's length.
pub struct KvCache {
    layers: Vec<LayerCache>,
    lens: Vec<usize>,
    /// Distinguishes caches (a captured decode graph has one cache's buffers baked in).
    id: u64,
}

/// One layer's keys and values: contiguous `[b, context, C]` each, or a paged cache of
/// [`PAGED_BLOCK`]-token blocks.
enum LayerCache {
    Contiguous { k: CudaSlice<u16>, v: CudaSlice<u16> },
    Paged(PagedCache),
}

/// Tokens per block of a paged cache.
pub const PAGED_BLOCK: usize = 16;

impl LayerCache {
    /// Where kv-append writes.
    fn target(&mut self) -> KvTarget<'_> {
        match self {
            LayerCache::Contiguous { k, v } => KvTarget::Contiguous { k, v },
            LayerCache::Paged(p) => KvTarget::Paged(p),
        }
    }

    /// What decode attention reads.
    fn read(&self) -> CacheRef<'_> {
        match self {
            LayerCache::Contiguous { k, v } => CacheRef::Contiguous { k, v },
            LayerCache::Paged(p) => CacheRef::Paged(p),
        }
    }
}

impl KvCache {
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// Whether the cache is paged (the plan's decode stage reads the paged layout).
    pub fn is_paged(&self) -> bool {
        matches!(self.layers.first(), Some(LayerCache::Paged(_)))
    }
}

/// A decode step's linear: the plan's GEMM on the fp32 weights, or the GEMV on their bf16 copies.
enum DecodeLinear {
    Gemm(Box<linear::Prepared>),
    Gemv(gemv::Prepared),
}

impl DecodeLinear {
    fn enqueue(
        &self,
        s: &CudaStream,
        out: &mut CudaSlice<f32>,
        inp: &CudaSlice<f32>,
        (w, w16): (&CudaSlice<f32>, Option<&CudaSlice<u16>>),
        bias: Option<&CudaSlice<f32>>,
    ) -> Result<()> {
        match self {
            DecodeLinear::Gemm(p) => p.enqueue(s, LinearArgs { out, inp, weight: w, bias }),
            DecodeLinear::Gemv(p) => {
                let weight = w16.ok_or_else(|| Error::constraint("bf16 weights for a GEMV plan", "none made"))?;
                p.enqueue(s, GemvArgs { out, inp, weight, bias })
            }
        }
    }
}

/// The token embedding as the LM head: `wte` with zero rows up to [`Config::padded_vocab`].
fn padded_head(w: &Weights, cfg: &Config) -> Vec<f32> {
    let mut head = w.wte.clone();
    head.resize(cfg.padded_vocab() * cfg.c, 0.0);
    head
}

/// The weights on the device, in the forms the plan's stages take, made once at load.
struct DeviceWeights {
    p: Params<CudaSlice<f32>>,
    /// The tied LM head over the padded vocabulary, `[Vp, C]`.
    lm_head: CudaSlice<f32>,
    /// bf16 copies of the linear weights, when the plan's decode step runs the GEMV.
    bf16: Option<Bf16Weights>,
}

/// bf16 copies of the linear weights (QKV, projection, MLP up, MLP down per layer; the padded LM
/// head), made once at load for a plan whose decode step runs the GEMV.
struct Bf16Weights {
    blocks: Vec<[CudaSlice<u16>; 4]>,
    lm_head: CudaSlice<u16>,
}

impl Bf16Weights {
    fn new(gpu: &Gpu, w: &Weights, lm_head: &Vec<f32>) -> Result<Bf16Weights> {
        let conv =
            |x: &Vec<f32>| gpu.upload(&x.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect::<Vec<u16>>());
        Ok(Bf16Weights {
            blocks: w
                .blocks
                .iter()
                .map(|b| Ok([conv(&b.qkv_w)?, conv(&b.proj_w)?, conv(&b.fc_w)?, conv(&b.fcproj_w)?]))
                .collect::<Result<_>>()?,
            lm_head: conv(lm_head)?,
        })
    }
}

/// Every op of one decode step prepared for a batch of `b` sequences.
struct DecodeStep {
    encoder: encoder::Prepared,
    layernorm: layernorm::Prepared,
    qkv: DecodeLinear,
    proj: DecodeLinear,
    fc: DecodeLinear,
    fcproj: DecodeLinear,
    lm_head: DecodeLinear,
    kv: kv_append::Prepared,
    attention: attn_decode::Prepared,
    gelu: pointwise::Prepared,
    residual: pointwise::Prepared,
    acts: Activations,
    q16: CudaSlice<u16>,
    att16: CudaSlice<u16>,
    /// The step's inputs, in device memory a captured graph reads: the new tokens, their positions,
    /// their cache cells and the lengths after the append.
    ids: TokenIds,
    pos: Positions,
    cells: Cells,
    lens: SeqLens,
    /// Greedy or sampled picks on the device into `next` (such a step downloads these B ids); a
    /// sampled step draws with `uniforms` (one per sequence, written before each step).
    argmax: argmax::Prepared,
    sample: sample::Prepared,
    uniforms: CudaSlice<f32>,
    next: CudaSlice<i32>,
    /// The captured step, and the cache (its id) and ending it was captured for.
    graph: Option<((u64, StepEnd), common::cudarc::driver::CudaGraph)>,
}

/// How a decode step ends: with the logits on the device, or with each sequence's next token picked
/// there (greedy, or drawn under the sampling settings, which a captured graph bakes in).
#[derive(Clone, Copy, Debug, PartialEq)]
enum StepEnd {
    Logits,
    Greedy,
    Sample(Sampling),
}

impl Model {
    /// Whether the decode step replays a CUDA graph (captured at the first step of a batch size and
    /// cache) instead of launching its kernels one by one.
    pub fn set_graph(&mut self, on: bool) {
        self.graph = on;
    }

    /// An empty KV cache for `b` sequences (bf16, the model's context long), in the layout of the
    /// plan's decode stage. A paged cache's pool holds every sequence's blocks for the whole
    /// context, scattered over the pool by a seeded shuffle of the block table, so decode reads
    /// through the indirection as a serving engine's fragmented pool would (which blocks a server
    /// allocates when is its policy, not the model's).
    pub fn new_cache(&self, gpu: &Gpu, b: usize) -> Result<KvCache> {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let (c, tmax) = (self.cfg.c, self.cfg.max_t);
        let layer = |i: usize| -> Result<LayerCache> {
            Ok(match attn_decode::layout_of(&self.plan.decode)? {
                Layout::Contiguous => {
                    LayerCache::Contiguous { k: gpu.zeros(b * tmax * c)?, v: gpu.zeros(b * tmax * c)? }
                }
                Layout::Paged => {
                    let blocks = b * tmax.div_ceil(PAGED_BLOCK);
                    let mut table: Vec<i32> = (0..blocks as i32).collect();
                    use rand::seq::SliceRandom;
                    table.shuffle(&mut common::data::rng(0x9A6E + i as u64));
                    LayerCache::Paged(PagedCache::zeroed(gpu, blocks, &table, b, PAGED_BLOCK, self.heads())?)
                }
            })
        };
        Ok(KvCache {
            layers: (0..self.cfg.layers).map(layer).collect::<Result<_>>()?,
            lens: vec![0; b],
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    fn heads(&self) -> Heads {
        Heads { hq: self.cfg.heads, hkv: self.cfg.heads, d: self.cfg.head_size() }
    }

    /// The kv-append sizes for `rows` rows into this model's cache of `b` sequences.
    fn kv_dims(&self, rows: usize, b: usize) -> Result<KvAppendDims> {
        let paged = attn_decode::layout_of(&self.plan.decode)? == Layout::Paged;
        let (tmax, c, head) = (self.cfg.max_t, self.cfg.c, self.cfg.head_size());
        Ok(KvAppendDims { rows, b, tmax, c, head, block_size: if paged { PAGED_BLOCK } else { 0 } })
    }

    /// Runs the prompt of sequence `slot` (its cache must be empty) through the whole-sequence pass,
    /// writing every layer's keys and values into the cache; returns the last position's logits.
    pub fn prefill_into(&mut self, gpu: &Gpu, cache: &mut KvCache, slot: usize, prompt: &[i32]) -> Result<Vec<f32>> {
        let (t, c, tmax) = (prompt.len(), self.cfg.c, self.cfg.max_t);
        let b = cache.lens.len();
        require(slot < b && cache.lens[slot] == 0, "an empty cache slot", || format!("slot {slot} of {b}"))?;
        self.prepare(gpu, 1, t)?;
        let ids = TokenIds::upload(gpu, prompt, self.cfg.vocab)?;
        let cells = Cells::upload(gpu, &(0..t).map(|p| (slot, p)).collect::<Vec<_>>(), b, tmax)?;
        let kv = kv_append::prepare(gpu, &self.plan.kv_append, self.kv_dims(t, b)?)?;
        let mut q16 = gpu.zeros::<u16>(t * c)?;
        let stream = gpu.stream().clone();
        let fill = Fill { cache, cells: &cells, kv: &kv, q16: &mut q16 };
        self.enqueue_forward(&stream, 1, t, &ids, Some(fill))?;
        cache.lens[slot] = t;
        let (v, vp) = (self.cfg.vocab, self.cfg.padded_vocab());
        let logits = &self.prepared[&(1, t)].acts.logits;
        let mut out = vec![0f32; v];
        let last = (t - 1) * vp;
        gpu.stream().memcpy_dtoh(&logits.slice(last..last + v), &mut out).ctx("copy logits to host")?;
        gpu.synchronize()?;
        Ok(out)
    }

    fn prepare_decode(&mut self, gpu: &Gpu, b: usize) -> Result<()> {
        if self.decode.as_ref().is_some_and(|(n, _)| *n == b) {
            return Ok(());
        }
        let (cfg, p) = (self.cfg, &self.plan);
        let c = cfg.c;
        let lin = |n: usize, k: usize, bias: bool| -> Result<DecodeLinear> {
            Ok(match &p.gemv {
                Some(v) => DecodeLinear::Gemv(gemv::prepare(gpu, v, GemvDims { m: b, n, k, bias })?),
                None => DecodeLinear::Gemm(Box::new(linear::prepare(gpu, &p.linear, LinearDims { m: b, n, k, bias })?)),
            })
        };
        let dd = DecodeDims {
            b,
            heads: self.heads(),
            tmax: cfg.max_t,
            dtype: Dtype::Bf16,
            block_size: PAGED_BLOCK,
            splits: 0,
        };
        let kv_dims = self.kv_dims(b, b)?;
        let step = DecodeStep {
            encoder: encoder::prepare(gpu, &p.encoder, EncoderDims { b, t: 1, c, vocab: cfg.vocab, max_t: cfg.max_t })?,
            layernorm: layernorm::prepare(gpu, &p.layernorm, LayerNormDims { rows: b, c })?,
            qkv: lin(3 * c, c, true)?,
            proj: lin(c, c, true)?,
            fc: lin(4 * c, c, true)?,
            fcproj: lin(c, 4 * c, true)?,
            lm_head: lin(cfg.padded_vocab(), c, false)?,
            kv: kv_append::prepare(gpu, &p.kv_append, kv_dims)?,
            attention: attn_decode::prepare(gpu, &p.decode, dd)?,
            gelu: pointwise::prepare(gpu, &p.gelu, Kind::Gelu, b * 4 * c)?,
            residual: pointwise::prepare(gpu, &p.residual, Kind::Residual, b * c)?,
            acts: Activations::new(gpu, &cfg, b)?,
            q16: gpu.zeros(b * c)?,
            att16: gpu.zeros(b * c)?,
            ids: TokenIds::upload(gpu, &vec![0; b], cfg.vocab)?,
            pos: Positions::upload(gpu, &vec![0; b], cfg.max_t)?,
            cells: Cells::upload(gpu, &(0..b).map(|i| (i, 0)).collect::<Vec<_>>(), b, cfg.max_t)?,
            lens: SeqLens::new(gpu, &vec![1; b], cfg.max_t)?,
            argmax: argmax::prepare(gpu, &p.argmax, ArgmaxDims { b, v: cfg.vocab, ld: cfg.padded_vocab() })?,
            sample: sample::prepare(gpu, &p.sample, SampleDims { b, v: cfg.vocab, ld: cfg.padded_vocab() })?,
            uniforms: gpu.zeros(b)?,
            next: gpu.zeros(b)?,
            graph: None,
        };
        self.decode = Some((b, step));
        Ok(())
    }

    /// One token for every sequence of `cache`: `tokens[i]` goes in at position `lens[i]`; returns
    /// the logits `[B, V]` and appends to the cache.
    pub fn decode_step(&mut self, gpu: &Gpu, cache: &mut KvCache, tokens: &[i32]) -> Result<Vec<f32>> {
        self.run_step(gpu, cache, tokens, StepEnd::Logits)?;
        let (_, op) = self.decode.as_ref().expect("prepared by run_step");
        gpu.download_rows(&op.acts.logits, cache.lens.len(), self.cfg.vocab, self.cfg.padded_vocab())
    }

    /// A greedy decode step: as [`Model::decode_step`], with the plan's `argmax` picking each
    /// sequence's next token on the device; returns those B ids (the logits stay on the device).
    pub fn decode_step_greedy(&mut self, gpu: &Gpu, cache: &mut KvCache, tokens: &[i32]) -> Result<Vec<i32>> {
        self.run_step(gpu, cache, tokens, StepEnd::Greedy)?;
        let (_, op) = self.decode.as_ref().expect("prepared by run_step");
        gpu.download(&op.next)
    }

    /// A sampled decode step: as [`Model::decode_step`], with the plan's `sample` stage drawing each
    /// sequence's next token on the device under `s` (not greedy) with `uniforms[i]` in [0, 1);
    /// returns those B ids (the logits stay on the device).
    pub fn decode_step_sampled(
        &mut self,
        gpu: &Gpu,
        cache: &mut KvCache,
        tokens: &[i32],
        s: &Sampling,
        uniforms: &[f32],
    ) -> Result<Vec<i32>> {
        s.check()?;
        require(s.temperature > 0.0, "temperature > 0 for a sampled step (0: greedy)", || "0".into())?;
        require(uniforms.len() == cache.lens.len(), "one draw per sequence", || format!("{} draws", uniforms.len()))?;
        require(uniforms.iter().all(|u| (0.0..1.0).contains(u)), "draws in [0, 1)", || format!("{uniforms:?}"))?;
        self.prepare_decode(gpu, cache.lens.len())?;
        let (_, op) = self.decode.as_mut().expect("prepared above");
        gpu.stream().memcpy_htod(uniforms, &mut op.uniforms).ctx("copy the draws")?;
        // The seed does not reach the device: steps differing only in it share a graph.
        self.run_step(gpu, cache, tokens, StepEnd::Sample(Sampling { seed: 0, ..*s }))?;
        let (_, op) = self.decode.as_ref().expect("prepared by run_step");
        gpu.download(&op.next)
    }

    /// Writes the step's inputs, enqueues the step (replaying its graph when graphs are on) and
    /// advances the cache's lengths.
    fn run_step(&mut self, gpu: &Gpu, cache: &mut KvCache, tokens: &[i32], end: StepEnd) -> Result<()> {
        self.begin_step(gpu, cache, tokens)?;
        let (_, op) = self.decode.as_mut().expect("prepared by begin_step");
        let s = gpu.stream().clone();
        let w = &self.weights;
        if self.graph {
            // One graph per cache (its K/V buffers are baked into the kernels' arguments) and ending.
            let key = (cache.id, end);
            if op.graph.as_ref().map(|(k, _)| *k) != Some(key) {
                op.graph = None;
                let g = common::timing::capture(&s, |st| enqueue_decode(st, w, op, cache, end, &mut |_| Ok(())))?;
                op.graph = Some((key, g));
            }
            let (_, g) = op.graph.as_ref().expect("captured above");
            g.launch().ctx("launch the decode graph")?;
        } else {
            enqueue_decode(&s, w, op, cache, end, &mut |_| Ok(()))?;
        }
        cache.lens.iter_mut().for_each(|l| *l += 1);
        Ok(())
    }

    /// One eager decode step with an event after every op, enqueued behind a closed
    /// [`Gate`](common::timing::Gate) so the gaps of the host's launches are not counted: each op's
    /// device time in enqueue order, `(name, ms)` (ops of one name recur once per layer). The
    /// logits stay on the device.
    pub fn decode_step_profiled(
        &mut self,
        gpu: &Gpu,
        cache: &mut KvCache,
        tokens: &[i32],
    ) -> Result<Vec<(&'static str, f64)>> {
        self.begin_step(gpu, cache, tokens)?;
        let (_, op) = self.decode.as_mut().expect("prepared by begin_step");
        let s = gpu.stream().clone();
        let timed = Some(common::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let event = || gpu.context().new_event(timed).ctx("event");
        let gate = common::timing::Gate::close(gpu)?;
        let start = event()?;
        start.record(&s).ctx("record")?;
        let mut marks = Vec::new();
        enqueue_decode(&s, &self.weights, op, cache, StepEnd::Logits, &mut |name| {
            let e = event()?;
            e.record(&s).ctx("record")?;
            marks.push((name, e));
            Ok(())
        })?;
        gate.open()?;
        gpu.synchronize()?;
        let mut out = Vec::with_capacity(marks.len());
        let mut prev = &start;
        for (name, e) in &marks {
            out.push((*name, prev.elapsed_ms(e).ctx("elapsed")? as f64));
            prev = e;
        }
        cache.lens.iter_mut().for_each(|l| *l += 1);
        Ok(out)
    }

    /// Kernels in the captured decode graph (every launch of one step), once a graph step ran.
    pub fn decode_graph_kernels(&self) -> Result<Option<usize>> {
        use common::cudarc::driver::sys;
        let Some((_, step)) = &self.decode else { return Ok(None) };
        let Some((_, g)) = &step.graph else { return Ok(None) };
        let mut n = 0usize;
        // SAFETY: a null node array asks only for the count, which the driver writes into `n`.
        unsafe { sys::cuGraphGetNodes(g.cu_graph(), std::ptr::null_mut(), &mut n) }
            .result()
            .ctx("count graph nodes")?;
        let mut nodes = vec![std::ptr::null_mut(); n];
        // SAFETY: `nodes` holds `n` entries, the count the driver gave for this graph.
        unsafe { sys::cuGraphGetNodes(g.cu_graph(), nodes.as_mut_ptr(), &mut n) }.result().ctx("list graph nodes")?;
        let mut kernels = 0;
        for node in nodes {
            let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: `node` belongs to the live graph listed above.
            unsafe { sys::cuGraphNodeGetType(node, &mut ty) }.result().ctx("graph node type")?;
            kernels += usize::from(ty == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL);
        }
        Ok(Some(kernels))
    }

    /// Checks a step's tokens against `cache`, prepares the step for its batch size and writes the
    /// step's inputs into the step's own device buffers (where a captured graph reads them).
    fn begin_step(&mut self, gpu: &Gpu, cache: &KvCache, tokens: &[i32]) -> Result<()> {
        let (b, tmax) = (cache.lens.len(), self.cfg.max_t);
        require(tokens.len() == b, "one token per cached sequence", || {
            format!("{} tokens, {b} sequences", tokens.len())
        })?;
        if let Some((i, _)) = cache.lens.iter().enumerate().find(|(_, &l)| l == 0 || l >= tmax) {
            return Err(Error::constraint(
                format!("every sequence prefilled and below the context {tmax}"),
                format!("sequence {i} holds {}", cache.lens[i]),
            ));
        }
        self.prepare_decode(gpu, b)?;
        let (_, op) = self.decode.as_mut().expect("prepared above");
        op.ids.set(gpu, tokens)?;
        op.pos.set(gpu, &cache.lens)?;
        op.cells.set(gpu, &cache.lens.iter().enumerate().map(|(i, &l)| (i, l)).collect::<Vec<_>>())?;
        op.lens.set(gpu, &cache.lens.iter().map(|l| l + 1).collect::<Vec<_>>())
    }

    /// A cache of `b` sequences that claim `len` positions each, for timing decode steps at that
    /// length without a prefill. Its keys and values are zeros: no stage's time depends on them.
    pub fn timing_cache(&self, gpu: &Gpu, b: usize, len: usize) -> Result<KvCache> {
        require(len >= 1 && len < self.cfg.max_t, &format!("1 <= len < context {}", self.cfg.max_t), || {
            format!("len = {len}")
        })?;
        let mut cache = self.new_cache(gpu, b)?;
        cache.lens.iter_mut().for_each(|l| *l = len);
        Ok(cache)
    }

    /// Times the whole-sequence forward pass of `b` rows of `t` random tokens (CUDA events).
    pub fn time_forward(&mut self, gpu: &Gpu, b: usize, t: usize, cfg: &TimingConfig) -> Result<Timing> {
        self.prepare(gpu, b, t)?;
        let tokens: Vec<i32> = uniform(b * t, 0.0, (self.cfg.vocab - 1) as f32, 7).iter().map(|&x| x as i32).collect();
        let ids = TokenIds::upload(gpu, &tokens, self.cfg.vocab)?;
        common::timing::time(gpu, 1, cfg, |s, _| self.enqueue_forward(s, b, t, &ids, None))
    }
}

/// One decode step's kernels, op by op, on `s`, reading the step's inputs from `op`'s buffers.
/// Ending `Greedy`, the plan's argmax picks each sequence's next token into `op.next`; ending
/// `Sample`, the plan's sampling stage draws it there. `mark(name)` is called after each op is
/// enqueued (the per-op breakdown records an event there).
fn enqueue_decode(
    s: &CudaStream,
    weights: &DeviceWeights,
    op: &mut DecodeStep,
    cache: &mut KvCache,
    end: StepEnd,
    mark: &mut dyn FnMut(&'static str) -> Result<()>,
) -> Result<()> {
    let (w, w16) = (&weights.p, weights.bf16.as_ref());
    let a = &mut op.acts;
    op.encoder.enqueue_at(s, EncoderArgs { out: &mut a.x, tokens: &op.ids, wte: &w.wte, wpe: &w.wpe }, &op.pos)?;
    mark("encoder")?;
    for (i, l) in w.blocks.iter().enumerate() {
        let b16 = |j: usize| w16.map(|x| &x.blocks[i][j]);
        layernorm(s, &op.layernorm, a, &l.ln1_w, &l.ln1_b)?;
        mark("layernorm")?;
        op.qkv.enqueue(s, &mut a.qkv, &a.ln, (&l.qkv_w, b16(0)), Some(&l.qkv_b))?;
        mark("linear qkv")?;
        let target = cache.layers[i].target();
        op.kv.enqueue(s, KvAppendArgs { q_out: &mut op.q16, cache: target, qkv: &a.qkv, cells: &op.cells })?;
        mark("kv-append")?;
        let args = DecodeArgs {
            out: &mut op.att16,
            lse: &mut a.att_lse,
            q: &op.q16,
            cache: cache.layers[i].read(),
            seq_lens: &op.lens,
            alibi: None,
        };
        op.attention.enqueue(s, args)?;
        mark("decode attention")?;
        op.kv.enqueue_widen(s, &mut a.att, &op.att16)?;
        mark("kv-append")?;
        op.proj.enqueue(s, &mut a.proj, &a.att, (&l.proj_w, b16(1)), Some(&l.proj_b))?;
        mark("linear proj")?;
        op.residual.enqueue_in_place(s, &mut a.x, &a.proj)?;
        mark("residual")?;
        layernorm(s, &op.layernorm, a, &l.ln2_w, &l.ln2_b)?;
        mark("layernorm")?;
        op.fc.enqueue(s, &mut a.fc, &a.ln, (&l.fc_w, b16(2)), Some(&l.fc_b))?;
        mark("linear fc")?;
        op.gelu.enqueue(s, &mut a.gelu, &a.fc, None)?;
        mark("gelu")?;
        op.fcproj.enqueue(s, &mut a.proj, &a.gelu, (&l.fcproj_w, b16(3)), Some(&l.fcproj_b))?;
        mark("linear fcproj")?;
        op.residual.enqueue_in_place(s, &mut a.x, &a.proj)?;
        mark("residual")?;
    }
    layernorm(s, &op.layernorm, a, &w.lnf_w, &w.lnf_b)?;
    mark("layernorm")?;
    op.lm_head.enqueue(s, &mut a.logits, &a.ln, (&weights.lm_head, w16.map(|x| &x.lm_head)), None)?;
    mark("linear lm-head")?;
    match end {
        StepEnd::Logits => {}
        StepEnd::Greedy => {
            op.argmax.enqueue(s, &mut op.next, &a.logits)?;
            mark("argmax")?;
        }
        StepEnd::Sample(sampling) => {
            op.sample.enqueue(s, &mut op.next, &a.logits, &op.uniforms, &sampling)?;
            mark("sample")?;
        }
    }
    Ok(())
}

/// `ln = LayerNorm(x)` with the given gain and bias.
fn layernorm(
    s: &CudaStream,
    p: &layernorm::Prepared,
    a: &mut Activations,
    w: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
) -> Result<()> {
    let args = LayerNormArgs {
        out: &mut a.ln,
        mean: &mut a.mean,
        rstd: &mut a.rstd,
        inp: &a.x,
        weight: w,
        bias: b,
        eps: LN_EPS,
    };
    p.enqueue(s, args)
}

// ---------------------------------------------------------------- the f64 reference

/// The forward pass in f64 on the CPU: logits `[B, T, V]`.
pub fn reference_forward(cfg: &Config, w: &Weights, tokens: &[Vec<i32>]) -> Vec<f64> {
    let (c, nh, hs) = (cfg.c, cfg.heads, cfg.head_size());
    let mut logits = Vec::new();
    for row in tokens {
        let t = row.len();
        let mut x: Vec<f64> = (0..t * c)
            .map(|i| w.wte[row[i / c] as usize * c + i % c] as f64 + w.wpe[(i / c) * c + i % c] as f64)
            .collect();
        let ln = |x: &[f64], g: &[f32], bias: &[f32]| -> Vec<f64> {
            x.chunks(c)
                .flat_map(|r| {
                    let mean = r.iter().sum::<f64>() / c as f64;
                    let var = r.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / c as f64;
                    let rstd = 1.0 / (var + LN_EPS as f64).sqrt();
                    r.iter()
                        .enumerate()
                        .map(move |(i, v)| (v - mean) * rstd * g[i] as f64 + bias[i] as f64)
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        // out[t, n] = inp[t, :] . W[n, :] + bias[n]
        let lin = |inp: &[f64], wt: &[f32], bias: Option<&[f32]>, k: usize, n: usize| -> Vec<f64> {
            inp.chunks(k)
                .flat_map(|r| {
                    (0..n).map(move |o| {
                        r.iter().zip(&wt[o * k..(o + 1) * k]).map(|(a, b)| a * *b as f64).sum::<f64>()
                            + bias.map_or(0.0, |bb| bb[o] as f64)
                    })
                })
                .collect()
        };
        for l in &w.blocks {
            let h = ln(&x, &l.ln1_w, &l.ln1_b);
            let qkv = lin(&h, &l.qkv_w, Some(&l.qkv_b), c, 3 * c);
            let mut att = vec![0f64; t * c];
            for head in 0..nh {
                for i in 0..t {
                    let q = &qkv[i * 3 * c + head * hs..][..hs];
                    let s: Vec<f64> = (0..=i)
                        .map(|j| {
                            let k = &qkv[j * 3 * c + c + head * hs..][..hs];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hs as f64).sqrt()
                        })
                        .collect();
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, p) in e.iter().enumerate() {
                        let v = &qkv[j * 3 * c + 2 * c + head * hs..][..hs];
                        for d in 0..hs {
                            att[i * c + head * hs + d] += p / z * v[d];
                        }
                    }
                }
            }
            let proj = lin(&att, &l.proj_w, Some(&l.proj_b), c, c);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
            let h = ln(&x, &l.ln2_w, &l.ln2_b);
            let fc: Vec<f64> = lin(&h, &l.fc_w, Some(&l.fc_b), c, 4 * c).into_iter().map(pointwise::gelu).collect();
            let proj = lin(&fc, &l.fcproj_w, Some(&l.fcproj_b), 4 * c, c);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
        }
        let h = ln(&x, &w.lnf_w, &w.lnf_b);
        logits.extend(lin(&h, &w.wte, None, c, cfg.vocab));
    }
    logits
}
