//! The weights on the device in the forms a plan's stages read, made once at load: the fp32
//! parameters, the padded LM head, bf16 copies and the LayerNorm-folded linears.

use common::cudarc::driver::CudaSlice;
use common::{Error, Gpu, Result};

use matmul::gemv;

use super::BlockLinear;
use crate::config::Config;
use crate::weights::{Params, Weights};

/// The token embedding as the LM head: `wte` with zero rows up to [`Config::padded_vocab`].
pub(super) fn padded_head(w: &Weights, cfg: &Config) -> Vec<f32> {
    let mut head = w.wte.clone();
    head.resize(cfg.padded_vocab() * cfg.c, 0.0);
    head
}

/// The weights on the device, in the forms the plan's stages take, made once at load.
pub(super) struct DeviceWeights {
    pub(super) p: Params<CudaSlice<f32>>,
    /// The tied LM head over the padded vocabulary, `[Vp, C]`.
    pub(super) lm_head: CudaSlice<f32>,
    /// bf16 copies of the linear weights, when the plan's decode step runs the GEMV or its
    /// whole-sequence pass runs in bf16.
    pub(super) bf16: Option<Bf16Weights>,
}

impl DeviceWeights {
    /// Linear `which` of layer `layer` with the LayerNorm before it folded in (QKV and the MLP up),
    /// when the decode step's GEMV folds it.
    pub(super) fn folded(&self, which: BlockLinear, layer: usize) -> Option<&Folded> {
        let f = self.bf16.as_ref()?.folded.as_ref()?;
        match which {
            BlockLinear::Qkv => Some(&f.blocks[layer][0]),
            BlockLinear::Fc => Some(&f.blocks[layer][1]),
            BlockLinear::Proj | BlockLinear::FcProj => None,
        }
    }

    pub(super) fn bf16(&self) -> Result<&Bf16Weights> {
        self.bf16.as_ref().ok_or_else(|| Error::constraint("bf16 weights for a bf16 or GEMV plan", "none made"))
    }
}

/// bf16 copies of the linear weights (the padded LM head; per layer QKV, projection, MLP up, MLP
/// down, and the biases of the two linears that store bf16), made once at load; and for a decode
/// step whose GEMV folds the LayerNorm in, the folded linears.
pub(super) struct Bf16Weights {
    pub(super) blocks: Vec<Bf16Block>,
    pub(super) lm_head: CudaSlice<u16>,
    pub(super) folded: Option<FoldedWeights>,
}

/// A linear with the LayerNorm before it folded in ([`gemv::fold_layernorm`]): `W'` (bf16) and
/// `bias'`.
pub(super) struct Folded {
    pub(super) weight: CudaSlice<u16>,
    pub(super) bias: CudaSlice<f32>,
}

/// Per layer QKV with ln_1 and the MLP up with ln_2 folded in, and the LM head with ln_f.
pub(super) struct FoldedWeights {
    pub(super) blocks: Vec<[Folded; 2]>,
    pub(super) lm_head: Folded,
}

pub(super) struct Bf16Block {
    /// In [`BlockLinear`] order.
    pub(super) weights: [CudaSlice<u16>; 4],
    /// A linear storing bf16 takes its bias in bf16 (`linear-bf16` at `out` = 16).
    pub(super) qkv_b: CudaSlice<u16>,
    pub(super) fc_b: CudaSlice<u16>,
}

impl Bf16Weights {
    /// `fold`: also the LayerNorm-folded linears.
    pub(super) fn new(gpu: &Gpu, w: &Weights, lm_head: &Vec<f32>, fold: bool) -> Result<Bf16Weights> {
        let conv =
            |x: &Vec<f32>| gpu.upload(&x.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect::<Vec<u16>>());
        let fold_one = |weight: &[f32], bias: Option<&[f32]>, gamma: &[f32], beta: &[f32]| -> Result<Folded> {
            let (weight, bias) = gemv::fold_layernorm(weight, bias, gamma, beta);
            Ok(Folded { weight: gpu.upload(&weight)?, bias: gpu.upload(&bias)? })
        };
        let folded = fold
            .then(|| -> Result<FoldedWeights> {
                Ok(FoldedWeights {
                    blocks: w
                        .blocks
                        .iter()
                        .map(|b| {
                            Ok([
                                fold_one(&b.qkv_w, Some(&b.qkv_b), &b.ln1_w, &b.ln1_b)?,
                                fold_one(&b.fc_w, Some(&b.fc_b), &b.ln2_w, &b.ln2_b)?,
                            ])
                        })
                        .collect::<Result<_>>()?,
                    lm_head: fold_one(lm_head, None, &w.lnf_w, &w.lnf_b)?,
                })
            })
            .transpose()?;
        Ok(Bf16Weights {
            blocks: w
                .blocks
                .iter()
                .map(|b| {
                    Ok(Bf16Block {
                        weights: [conv(&b.qkv_w)?, conv(&b.proj_w)?, conv(&b.fc_w)?, conv(&b.fcproj_w)?],
                        qkv_b: conv(&b.qkv_b)?,
                        fc_b: conv(&b.fc_b)?,
                    })
                })
                .collect::<Result<_>>()?,
            lm_head: conv(lm_head)?,
            folded,
        })
    }
}
