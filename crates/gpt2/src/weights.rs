//! GPT-2's parameters: seeded random ones for tests and tables, or Hugging Face's safetensors
//! (Conv1D weights transposed once at load into the `[out, in]` layout the stages take).

use std::path::Path;

use common::data::uniform;
use common::{require, Error, Result};

use crate::config::Config;

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
    pub(crate) fn map<U>(&self, mut f: impl FnMut(&T) -> Result<U>) -> Result<Params<U>> {
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
