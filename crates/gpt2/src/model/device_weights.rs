//! The weights on the device in the forms a plan's stages read, made once at load: the fp32
//! parameters, the padded LM head, bf16 copies, e4m3 blocks, and the LayerNorm-folded linears.

use common::cudarc::driver::CudaSlice;
use common::{Error, Gpu, Result};
use rayon::prelude::*;

use matmul::{fp8, gemv};

use super::BlockLinear;
use crate::config::Config;
use crate::weights::{Block, Params, Weights};

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
    /// e4m3 blocks of the linear weights, for an fp8 plan.
    pub(super) fp8: Option<Fp8Weights>,
}

impl DeviceWeights {
    /// Linear `which` of layer `layer` with the LayerNorm before it folded in (QKV and the MLP up),
    /// when the decode step's bf16 GEMV folds it.
    pub(super) fn folded(&self, which: BlockLinear, layer: usize) -> Option<&Folded<CudaSlice<u16>>> {
        self.bf16.as_ref()?.folded.as_ref()?.get(which, layer)
    }

    /// A decode step's linear `which` of layer `layer` (`None`: the LM head; `l`: the layer's
    /// parameters) in every form the plan made, with the bias it adds. With `folded` (a GEMV that
    /// folds the LayerNorm, at QKV, the MLP up and the LM head) the folded forms and their shift.
    pub(super) fn step_linear<'a>(
        &'a self,
        which: Option<(BlockLinear, usize)>,
        l: Option<&'a Block<CudaSlice<f32>>>,
        folded: bool,
    ) -> (LinearWeight<'a>, Option<&'a CudaSlice<f32>>) {
        let (bf16, fp8) = (self.bf16.as_ref(), self.fp8.as_ref());
        let fold16 = bf16.and_then(|w| w.folded.as_ref());
        let fold8 = fp8.and_then(|w| w.folded.as_ref());
        let (f32, param_bias) = match (which, l) {
            (Some((which, _)), Some(l)) => {
                let (w, b) = which.params(l);
                (w, Some(b))
            }
            _ => (&self.lm_head, None),
        };
        match which {
            None if folded => {
                let (h16, h8) = (fold16.map(|f| &f.lm_head), fold8.map(|f| &f.lm_head));
                let bias = h16.map(|f| &f.bias).or(h8.map(|f| &f.bias));
                (LinearWeight { f32, bf16: h16.map(|f| &f.weight), fp8: h8.map(|f| &f.weight) }, bias)
            }
            None => (LinearWeight { f32, bf16: bf16.map(|w| &w.lm_head), fp8: fp8.map(|w| &w.lm_head) }, None),
            Some((which, layer)) => {
                let (f16, f8) = (fold16.and_then(|f| f.get(which, layer)), fold8.and_then(|f| f.get(which, layer)));
                if folded && (f16.is_some() || f8.is_some()) {
                    let bias = f16.map(|f| &f.bias).or(f8.map(|f| &f.bias));
                    (LinearWeight { f32, bf16: f16.map(|f| &f.weight), fp8: f8.map(|f| &f.weight) }, bias)
                } else {
                    let w16 = bf16.map(|w| &w.blocks[layer].weights[which as usize]);
                    let w8 = fp8.map(|w| &w.blocks[layer][which as usize]);
                    (LinearWeight { f32, bf16: w16, fp8: w8 }, param_bias)
                }
            }
        }
    }

    pub(super) fn bf16(&self) -> Result<&Bf16Weights> {
        self.bf16.as_ref().ok_or_else(|| Error::constraint("bf16 weights for a bf16 or GEMV plan", "none made"))
    }

    pub(super) fn fp8(&self) -> Result<&Fp8Weights> {
        self.fp8.as_ref().ok_or_else(|| Error::constraint("e4m3 weights for an fp8 plan", "none made"))
    }
}

/// One linear's weight in the forms the device holds: the fp32 parameter, and where the plan made
/// them its bf16 copy and its e4m3 blocks (the LayerNorm-folded forms, for a folding GEMV).
#[derive(Clone, Copy)]
pub(super) struct LinearWeight<'a> {
    pub(super) f32: &'a CudaSlice<f32>,
    pub(super) bf16: Option<&'a CudaSlice<u16>>,
    pub(super) fp8: Option<&'a Fp8Weight>,
}

/// bf16 copies of the linear weights (the padded LM head; per layer QKV, projection, MLP up, MLP
/// down, and the biases of the two linears that store bf16), made once at load; and for a decode
/// step whose GEMV folds the LayerNorm in, the folded linears.
pub(super) struct Bf16Weights {
    pub(super) blocks: Vec<Bf16Block>,
    pub(super) lm_head: CudaSlice<u16>,
    pub(super) folded: Option<FoldedWeights<CudaSlice<u16>>>,
}

/// A linear with the LayerNorm before it folded in ([`gemv::fold_layernorm_f32`]): `W'` in the
/// form `W` (bf16 bits or e4m3 blocks) and `bias'`.
pub(super) struct Folded<W> {
    pub(super) weight: W,
    pub(super) bias: CudaSlice<f32>,
}

/// Per layer QKV with ln_1 and the MLP up with ln_2 folded in, and the LM head with ln_f.
pub(super) struct FoldedWeights<W> {
    pub(super) blocks: Vec<[Folded<W>; 2]>,
    pub(super) lm_head: Folded<W>,
}

impl<W> FoldedWeights<W> {
    /// Every folded linear of `w` (and the padded `lm_head`), each made by `fold` from `(W ⊙ gamma,
    /// bias')` in fp32 and its `[N, K]`.
    fn new(
        gpu: &Gpu,
        w: &Weights,
        lm_head: &[f32],
        fold: impl Fn(&Gpu, Vec<f32>, (usize, usize)) -> Result<W>,
    ) -> Result<Self> {
        let one = |weight: &[f32], bias: Option<&[f32]>, gamma: &[f32], beta: &[f32]| -> Result<Folded<W>> {
            let (weight, bias) = gemv::fold_layernorm_f32(weight, bias, gamma, beta);
            let nk = (bias.len(), gamma.len());
            Ok(Folded { weight: fold(gpu, weight, nk)?, bias: gpu.upload(&bias)? })
        };
        Ok(FoldedWeights {
            blocks: w
                .blocks
                .iter()
                .map(|b| {
                    Ok([
                        one(&b.qkv_w, Some(&b.qkv_b), &b.ln1_w, &b.ln1_b)?,
                        one(&b.fc_w, Some(&b.fc_b), &b.ln2_w, &b.ln2_b)?,
                    ])
                })
                .collect::<Result<_>>()?,
            lm_head: one(lm_head, None, &w.lnf_w, &w.lnf_b)?,
        })
    }

    /// Linear `which` of layer `layer`, if the LayerNorm before it is folded (QKV and the MLP up).
    pub(super) fn get(&self, which: BlockLinear, layer: usize) -> Option<&Folded<W>> {
        match which {
            BlockLinear::Qkv => Some(&self.blocks[layer][0]),
            BlockLinear::Fc => Some(&self.blocks[layer][1]),
            BlockLinear::Proj | BlockLinear::FcProj => None,
        }
    }
}

pub(super) struct Bf16Block {
    /// In [`BlockLinear`] order.
    pub(super) weights: [CudaSlice<u16>; 4],
    /// A linear storing bf16 takes its bias in bf16 (`linear-bf16` at `out` = 16).
    pub(super) qkv_b: CudaSlice<u16>,
    pub(super) fc_b: CudaSlice<u16>,
}

/// On every core: the linears, the LM head and their folded forms are 210M values at GPT-2 124M.
fn bf16_bits(x: &[f32]) -> Vec<u16> {
    x.par_iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect()
}

impl Bf16Weights {
    /// `fold`: also the LayerNorm-folded linears.
    pub(super) fn new(gpu: &Gpu, w: &Weights, lm_head: &[f32], fold: bool) -> Result<Bf16Weights> {
        let conv = |x: &[f32]| gpu.upload(&bf16_bits(x));
        let folded = fold
            .then(|| FoldedWeights::new(gpu, w, lm_head, |gpu, weight, _| gpu.upload(&bf16_bits(&weight))))
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

/// A weight `[N, K]` in `matmul::fp8`'s 128 x 128 blocks: e4m3 codes `[N, K]` and fp32 scales
/// `[ceil(N / 128), ceil(K / 128)]`.
pub(super) struct Fp8Weight {
    pub(super) codes: CudaSlice<u8>,
    pub(super) scales: CudaSlice<f32>,
}

impl Fp8Weight {
    fn new(gpu: &Gpu, w: &[f32], (n, k): (usize, usize)) -> Result<Fp8Weight> {
        let q = fp8::quantize_blocks(w, n, k);
        Ok(Fp8Weight { codes: gpu.upload(&q.codes)?, scales: gpu.upload(&q.scales)? })
    }
}

/// e4m3 blocks of the linear weights (per layer in [`BlockLinear`] order, and the padded LM head),
/// quantized once at load; and for a decode step whose FP8 GEMV folds the LayerNorm in, the folded
/// linears, quantized after the fold.
pub(super) struct Fp8Weights {
    pub(super) blocks: Vec<[Fp8Weight; 4]>,
    pub(super) lm_head: Fp8Weight,
    pub(super) folded: Option<FoldedWeights<Fp8Weight>>,
}

impl Fp8Weights {
    pub(super) fn new(gpu: &Gpu, cfg: &Config, w: &Weights, lm_head: &[f32], fold: bool) -> Result<Fp8Weights> {
        let c = cfg.c;
        let block = |b: &Block<Vec<f32>>| -> Result<[Fp8Weight; 4]> {
            Ok([
                Fp8Weight::new(gpu, &b.qkv_w, (3 * c, c))?,
                Fp8Weight::new(gpu, &b.proj_w, (c, c))?,
                Fp8Weight::new(gpu, &b.fc_w, (4 * c, c))?,
                Fp8Weight::new(gpu, &b.fcproj_w, (c, 4 * c))?,
            ])
        };
        Ok(Fp8Weights {
            blocks: w.blocks.iter().map(block).collect::<Result<_>>()?,
            lm_head: Fp8Weight::new(gpu, lm_head, (cfg.padded_vocab(), c))?,
            folded: fold
                .then(|| FoldedWeights::new(gpu, w, lm_head, |gpu, weight, nk| Fp8Weight::new(gpu, &weight, nk)))
                .transpose()?,
        })
    }
}
