//! The whole-sequence pass: every op prepared for one (B, T) in fp32, bf16 or bf16 with FP8 linears,
//! its activations, and the [`Pass`] that runs them (with, for a prefill into the KV cache, each layer's keys and values
//! appended).

use std::sync::Arc;

use common::cudarc::driver::{CudaSlice, CudaStream};
use common::{require, Act, ActMut, ActType, DriverContext, Error, Gpu, Result};

use attention::kv_append::{self, Cells, KvAppendArgs};
use attention::prefill::{self, PrefillArgs, PrefillDims};
use attention::prefill_bf16::{self, PrefillBf16Args, PrefillBf16Dims};
use attention::reference::Dims as AttnDims;
use matmul::linear::{self, LinearArgs, LinearDims};
use matmul::linear_bf16::{self, LinearBf16Args, LinearBf16Dims, OutElement, Output, Tail};
use matmul::linear_fp8::{self, Bias, LinearFp8Args, LinearFp8Dims, OperandLayout, OutBuf, ResidualBuf};
use matmul::quantize_fp8::{self, QuantizeDims};
use norm::layernorm::{self, LayerNormDims};

use super::device_weights::{DeviceWeights, Fp8Weight};
use super::{block, enqueue_layernorm, forward, BlockLinear, Layer, Model, Pass};
use crate::cache::KvCache;
use crate::config::{Config, LN_EPS};
use crate::encoder::{self, EncoderArgs, TokenIds};
use crate::plan::{Bf16Stages, Fp8Stages};
use crate::pointwise::{self, Kind};
use crate::weights::Block;

/// Every op of the whole-sequence pass prepared for one (B, T), in the plan's precision.
pub(super) enum Prepared {
    F32(Box<Stages32>),
    Bf16(Box<Stages16<linear_bf16::Prepared>>),
    Fp8(Box<Stages16<Fp8Linear>>),
}

impl Prepared {
    /// The logits a pass ending in `which` wrote, as fp32: `[B·T, V]` or `[B, V]` (from the padded
    /// `[rows, Vp]` on the device).
    pub(super) fn download_logits(
        &self,
        gpu: &Gpu,
        which: Logits,
        rows: usize,
        (v, vp): (usize, usize),
    ) -> Result<Vec<f32>> {
        match (self, which) {
            (Prepared::F32(p), Logits::All) => gpu.download_rows(&p.acts.logits, rows, v, vp),
            (Prepared::F32(p), Logits::Last) => gpu.download_rows(&p.last.logits, rows, v, vp),
            (Prepared::Bf16(p), _) => p.download_logits(gpu, which, rows, (v, vp)),
            (Prepared::Fp8(p), _) => p.download_logits(gpu, which, rows, (v, vp)),
        }
    }
}

/// The fp32 pass's stages for one (B, T).
pub(super) struct Stages32 {
    encoder: encoder::Prepared,
    layernorm: layernorm::Prepared,
    /// A block's linears, in [`BlockLinear`] order.
    linears: [linear::Prepared; 4],
    lm_head: linear::Prepared,
    attention: prefill::Prepared,
    gelu: pointwise::Prepared,
    residual: pointwise::Prepared,
    acts: Activations,
    last: LastLogits<linear::Prepared, f32>,
}

/// The bf16 pass's stages for one (B, T) ([`crate::plan::Bf16Stages`]), its linears of kind `L`
/// (`linear-bf16`, or an fp8 plan's [`Fp8Linear`]): the block's GELU and residual adds run in its
/// linears' tails.
pub(super) struct Stages16<L> {
    encoder: encoder::Prepared,
    layernorm: layernorm::Prepared,
    /// A block's linears, in [`BlockLinear`] order (the projections on the plan's residual stage).
    linears: [L; 4],
    lm_head: L,
    attention: prefill_bf16::Prepared,
    acts: Activations16,
    last: LastLogits<L, u16>,
}

impl<L> Stages16<L> {
    /// [`Prepared::download_logits`]: every position's bf16 logits widened, or the last ones' fp32.
    fn download_logits(&self, gpu: &Gpu, which: Logits, rows: usize, (v, vp): (usize, usize)) -> Result<Vec<f32>> {
        match which {
            Logits::All => {
                let bits = gpu.download_rows(&self.acts.logits, rows, v, vp)?;
                Ok(bits.into_iter().map(|b| half::bf16::from_bits(b).to_f32()).collect())
            }
            Logits::Last => gpu.download_rows(&self.last.logits, rows, v, vp),
        }
    }
}

/// A linear of the bf16 pass as its stage runs it: `linear-bf16` on bf16 copies of the weights, or
/// [`Fp8Linear`] on e4m3 blocks.
pub(super) trait PassLinear {
    /// Block linear `which` of layer `l` on the pass's activations: QKV and the
    /// MLP up store bf16 (the MLP up with GELU applied); the projections add into the fp32 residual
    /// stream in place.
    fn block(
        &mut self,
        s: &Arc<CudaStream>,
        which: BlockLinear,
        a: &mut Activations16,
        w: &DeviceWeights,
        l: Layer,
    ) -> Result<()>;

    /// The LM head (no bias) into `out`: bf16 logits at every position, fp32 at the last.
    fn head<T: OutElement>(
        &mut self,
        s: &Arc<CudaStream>,
        out: &mut CudaSlice<T>,
        inp: HeadInput,
        w: &DeviceWeights,
    ) -> Result<()>;

    /// Whether the linears after a LayerNorm (QKV, the MLP up, the LM head) take it in themselves
    /// and read the residual stream: then the pass launches no LayerNorm.
    fn takes_layernorm(&self) -> bool;
}

/// What the LM head reads: ln_f's bf16 output, or the fp32 residual stream (a head that takes ln_f
/// in).
pub(super) enum HeadInput<'a> {
    LayerNorm(&'a CudaSlice<u16>),
    Stream(&'a CudaSlice<f32>),
}

impl PassLinear for linear_bf16::Prepared {
    fn block(
        &mut self,
        s: &Arc<CudaStream>,
        which: BlockLinear,
        a: &mut Activations16,
        w: &DeviceWeights,
        Layer { w: l, index: layer }: Layer,
    ) -> Result<()> {
        let w16 = &w.bf16()?.blocks[layer];
        let weight = &w16.weights[which as usize];
        match which {
            BlockLinear::Qkv => {
                let bias = Some(&w16.qkv_b);
                self.enqueue(s, LinearBf16Args { out: &mut a.qkv, inp: &a.ln, weight, bias, residual: None })
            }
            BlockLinear::Fc => {
                let bias = Some(&w16.fc_b);
                self.enqueue(s, LinearBf16Args { out: &mut a.gelu, inp: &a.ln, weight, bias, residual: None })
            }
            BlockLinear::Proj => self.enqueue_residual_in_place(s, &mut a.x, &a.att, weight, Some(&l.proj_b)),
            BlockLinear::FcProj => self.enqueue_residual_in_place(s, &mut a.x, &a.gelu, weight, Some(&l.fcproj_b)),
        }
    }

    fn head<T: OutElement>(
        &mut self,
        s: &Arc<CudaStream>,
        out: &mut CudaSlice<T>,
        inp: HeadInput,
        w: &DeviceWeights,
    ) -> Result<()> {
        let HeadInput::LayerNorm(ln) = inp else {
            return Err(Error::constraint("ln_f's bf16 output for a linear-bf16 LM head", "the residual stream"));
        };
        let weight = &w.bf16()?.lm_head;
        self.enqueue(s, LinearBf16Args { out, inp: ln, weight, bias: None, residual: None })
    }

    fn takes_layernorm(&self) -> bool {
        false
    }
}

/// A linear of an fp8 plan's pass: `linear-fp8` on the weight's 128 x 128 blocks with the fp32 bias,
/// its input e4m3 with one scale per row per 128 channels: quantized from a bf16 activation by its
/// own [`Quantizer`] (after a LayerNorm, with a stage that takes it in, from the fp32 residual stream
/// through the LayerNorm), or, for the MLP down after an MLP up that stores e4m3, as the MLP up
/// wrote it.
pub(super) struct Fp8Linear {
    quantizer: Option<Quantizer>,
    linear: linear_fp8::Prepared,
}

/// `quantize-fp8` on a linear's input, and the e4m3 activation it writes.
struct Quantizer {
    prepared: quantize_fp8::Prepared,
    out: E4m3Act,
}

/// What an [`Fp8Linear`] reads: a bf16 activation or the residual stream through the LayerNorm with
/// this gain and shift, which its quantizer quantizes; or codes and scales already quantized.
enum Fp8Input<'a> {
    Bf16(&'a CudaSlice<u16>),
    LayerNorm(&'a CudaSlice<f32>, (&'a CudaSlice<f32>, &'a CudaSlice<f32>)),
    E4m3(&'a E4m3Act),
}

/// An activation in e4m3 with one scale per row per 128 channels (`matmul::fp8::Fp8Rows`' layout).
pub(super) struct E4m3Act {
    codes: CudaSlice<u8>,
    scales: CudaSlice<f32>,
}

impl E4m3Act {
    fn new(gpu: &Gpu, rows: usize, k: usize) -> Result<E4m3Act> {
        Ok(E4m3Act { codes: gpu.zeros(rows * k)?, scales: gpu.zeros(rows * matmul::fp8::groups(k))? })
    }
}

impl Fp8Linear {
    /// `after_ln`: the linear reads a LayerNorm's output, which a stage that can takes in; `input`:
    /// whether it quantizes its input (no: it reads an [`E4m3Act`]).
    fn prepare(gpu: &Gpu, f: &Fp8Stages, d: LinearFp8Dims, after_ln: bool, input: Output) -> Result<Fp8Linear> {
        let linear = linear_fp8::prepare(gpu, &f.linear, d)?;
        require(
            linear.layout() == OperandLayout::Fp8,
            "a linear-fp8 kernel stage (the quantizer's scale layout)",
            || format!("stage {} reads {:?}", f.linear.stage, linear.layout()),
        )?;
        let quantizer = (input != Output::E4m3)
            .then(|| -> Result<Quantizer> {
                let ln = after_ln && quantize_fp8::takes_layernorm(&f.quantize);
                let q = QuantizeDims { m: d.m, k: d.k, blocks: false, ln };
                Ok(Quantizer {
                    prepared: quantize_fp8::prepare(gpu, &f.quantize, q)?,
                    out: E4m3Act::new(gpu, d.m, d.k)?,
                })
            })
            .transpose()?;
        Ok(Fp8Linear { quantizer, linear })
    }

    /// `inp` quantized (unless it is e4m3 already), then `out = dequant(inp) · dequant(weight)ᵀ
    /// (+ bias)` and the prepared tail.
    fn enqueue(
        &mut self,
        s: &Arc<CudaStream>,
        (out, residual): (OutBuf, Option<ResidualBuf>),
        inp: Fp8Input,
        weight: &Fp8Weight,
        bias: Option<&CudaSlice<f32>>,
    ) -> Result<()> {
        let a = match (inp, &mut self.quantizer) {
            (Fp8Input::E4m3(act), _) => act,
            (Fp8Input::Bf16(x), Some(q)) => {
                q.prepared.enqueue(s, &mut q.out.codes, &mut q.out.scales, x)?;
                &q.out
            }
            (Fp8Input::LayerNorm(x, ln), Some(q)) => {
                q.prepared.enqueue_layernorm(s, &mut q.out.codes, &mut q.out.scales, x, ln, LN_EPS)?;
                &q.out
            }
            (_, None) => return Err(Error::constraint("an e4m3 input for a linear without a quantizer", "bf16")),
        };
        let args = LinearFp8Args {
            out,
            a_codes: &a.codes,
            a_scales: &a.scales,
            w_codes: &weight.codes,
            w_scales: &weight.scales,
            bias: bias.map(Bias::F32),
            residual,
        };
        self.linear.enqueue(s, args)
    }
}

/// `x` as a linear's output and its residual (`x += ...`).
fn in_place(x: &mut CudaSlice<f32>) -> (OutBuf<'_>, Option<ResidualBuf<'_>>) {
    let out = OutBuf::new(x);
    let residual = ResidualBuf::in_place(&out);
    (out, Some(residual))
}

impl PassLinear for Fp8Linear {
    fn block(
        &mut self,
        s: &Arc<CudaStream>,
        which: BlockLinear,
        a: &mut Activations16,
        w: &DeviceWeights,
        Layer { w: l, index: layer }: Layer,
    ) -> Result<()> {
        let weight = &w.fp8()?.blocks[layer][which as usize];
        let bias = Some(which.params(l).1);
        // QKV and the MLP up read their LayerNorm: its output, or the stream through it.
        let after_ln = |gain_shift| match self.takes_layernorm() {
            true => Fp8Input::LayerNorm(&a.x, gain_shift),
            false => Fp8Input::Bf16(&a.ln),
        };
        match which {
            BlockLinear::Qkv => {
                let inp = after_ln((&l.ln1_w, &l.ln1_b));
                self.enqueue(s, (OutBuf::new(&mut a.qkv), None), inp, weight, bias)
            }
            BlockLinear::Fc => {
                let inp = after_ln((&l.ln2_w, &l.ln2_b));
                let out = match &mut a.gelu_e4m3 {
                    Some(q) => OutBuf::e4m3(&mut q.codes, &mut q.scales),
                    None => OutBuf::new(&mut a.gelu),
                };
                self.enqueue(s, (out, None), inp, weight, bias)
            }
            BlockLinear::Proj => self.enqueue(s, in_place(&mut a.x), Fp8Input::Bf16(&a.att), weight, bias),
            BlockLinear::FcProj => {
                let inp = a.gelu_e4m3.as_ref().map_or(Fp8Input::Bf16(&a.gelu), Fp8Input::E4m3);
                self.enqueue(s, in_place(&mut a.x), inp, weight, bias)
            }
        }
    }

    fn head<T: OutElement>(
        &mut self,
        s: &Arc<CudaStream>,
        out: &mut CudaSlice<T>,
        inp: HeadInput,
        w: &DeviceWeights,
    ) -> Result<()> {
        let inp = match inp {
            HeadInput::LayerNorm(ln) => Fp8Input::Bf16(ln),
            HeadInput::Stream(x) => Fp8Input::LayerNorm(x, (&w.p.lnf_w, &w.p.lnf_b)),
        };
        self.enqueue(s, (OutBuf::new(out), None), inp, &w.fp8()?.lm_head, None)
    }

    fn takes_layernorm(&self) -> bool {
        self.quantizer.as_ref().is_some_and(|q| q.prepared.takes_layernorm())
    }
}

/// Which positions' logits a whole-sequence pass computes: every one (what the model table's
/// prefill and Hugging Face's forward compute), or each sequence's last (what generation samples
/// from: the LM head over B rows instead of B·T).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    All,
    Last,
}

/// The LM head over each sequence's last position: those rows of the final LayerNorm's output (of
/// element type `E`), or of the residual stream for an LM head that takes the LayerNorm in,
/// gathered, and their logits.
struct LastLogits<L, E> {
    lm_head: L,
    ln: CudaSlice<E>,
    stream: CudaSlice<f32>,
    logits: CudaSlice<f32>,
}

impl<L, E: common::cudarc::driver::DeviceRepr + common::cudarc::driver::ValidAsZeroBits> LastLogits<L, E> {
    fn new(gpu: &Gpu, cfg: &Config, b: usize, lm_head: L) -> Result<Self> {
        let (ln, stream) = (gpu.zeros(b * cfg.c)?, gpu.zeros(b * cfg.c)?);
        Ok(LastLogits { lm_head, ln, stream, logits: gpu.zeros(b * cfg.padded_vocab())? })
    }
}

/// Copies row `t - 1` of each of the B sequences of `from` (`[B·T, C]`) into `into` (`[B, C]`).
fn gather_last<T: common::cudarc::driver::DeviceRepr>(
    s: &Arc<CudaStream>,
    from: &CudaSlice<T>,
    into: &mut CudaSlice<T>,
    (b, t, c): (usize, usize, usize),
) -> Result<()> {
    for i in 0..b {
        let row = (i * t + t - 1) * c;
        s.memcpy_dtod(&from.slice(row..row + c), &mut into.slice_mut(i * c..(i + 1) * c))
            .ctx("gather the last positions")?;
    }
    Ok(())
}

/// The activations of one fp32 pass over `rows` token positions (B·T in the prefill, B in a decode
/// step).
pub(super) struct Activations {
    pub(super) x: CudaSlice<f32>,
    pub(super) ln: CudaSlice<f32>,
    pub(super) mean: CudaSlice<f32>,
    pub(super) rstd: CudaSlice<f32>,
    pub(super) qkv: CudaSlice<f32>,
    pub(super) att: CudaSlice<f32>,
    pub(super) att_lse: CudaSlice<f32>,
    pub(super) proj: CudaSlice<f32>,
    pub(super) fc: CudaSlice<f32>,
    pub(super) gelu: CudaSlice<f32>,
    pub(super) logits: CudaSlice<f32>,
}

impl Activations {
    /// The output and input of a block's linear `which`; `fused`: a linear that applies the block's
    /// tail itself writes where the tail would (the MLP up into `gelu`, the projections into `x`).
    pub(super) fn linear_io(&mut self, which: BlockLinear, fused: bool) -> (&mut CudaSlice<f32>, &CudaSlice<f32>) {
        match (which, fused) {
            (BlockLinear::Qkv, _) => (&mut self.qkv, &self.ln),
            (BlockLinear::Proj, false) => (&mut self.proj, &self.att),
            (BlockLinear::Proj, true) => (&mut self.x, &self.att),
            (BlockLinear::Fc, false) => (&mut self.fc, &self.ln),
            (BlockLinear::Fc, true) => (&mut self.gelu, &self.ln),
            (BlockLinear::FcProj, false) => (&mut self.proj, &self.gelu),
            (BlockLinear::FcProj, true) => (&mut self.x, &self.gelu),
        }
    }

    pub(super) fn new(gpu: &Gpu, cfg: &Config, rows: usize) -> Result<Activations> {
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

/// The activations of one bf16 pass over `rows` positions: the residual stream `x` fp32, the rest
/// bf16 bit patterns (`gelu`: the MLP up's output, GELU applied in its tail; `logits`: every
/// position's, bf16 as Hugging Face's bf16 model returns them; the last positions' are fp32,
/// [`LastLogits`], for sampling).
pub(super) struct Activations16 {
    x: CudaSlice<f32>,
    ln: CudaSlice<u16>,
    mean: CudaSlice<f32>,
    rstd: CudaSlice<f32>,
    qkv: CudaSlice<u16>,
    att: CudaSlice<u16>,
    att_lse: CudaSlice<f32>,
    gelu: CudaSlice<u16>,
    /// The MLP up's output in e4m3 instead of `gelu`, where an fp8 plan's MLP up stores it so.
    gelu_e4m3: Option<E4m3Act>,
    logits: CudaSlice<u16>,
}

impl Activations16 {
    /// `gelu_out`: the MLP up's output type (bf16, or e4m3).
    fn new(gpu: &Gpu, cfg: &Config, rows: usize, gelu_out: Output) -> Result<Activations16> {
        let c = cfg.c;
        Ok(Activations16 {
            x: gpu.zeros(rows * c)?,
            ln: gpu.zeros(rows * c)?,
            mean: gpu.zeros(rows)?,
            rstd: gpu.zeros(rows)?,
            qkv: gpu.zeros(rows * 3 * c)?,
            att: gpu.zeros(rows * c)?,
            att_lse: gpu.zeros(rows * cfg.heads)?,
            gelu: gpu.zeros(if gelu_out == Output::E4m3 { 0 } else { rows * 4 * c })?,
            gelu_e4m3: (gelu_out == Output::E4m3).then(|| E4m3Act::new(gpu, rows, 4 * c)).transpose()?,
            logits: gpu.zeros(rows * cfg.padded_vocab())?,
        })
    }
}

impl Model {
    pub(super) fn prepare_f32(&self, gpu: &Gpu, b: usize, t: usize, encoder: encoder::Prepared) -> Result<Stages32> {
        let (cfg, p) = (self.cfg, &self.plan);
        let (c, m) = (cfg.c, b * t);
        let lin =
            |m: usize, n: usize, k: usize, bias: bool| linear::prepare(gpu, &p.linear, LinearDims { m, n, k, bias });
        let ad = AttnDims { b, t, c, nh: cfg.heads };
        Ok(Stages32 {
            encoder,
            layernorm: layernorm::prepare(gpu, &p.layernorm, LayerNormDims { rows: m, c, out: ActType::F32 })?,
            linears: [lin(m, 3 * c, c, true)?, lin(m, c, c, true)?, lin(m, 4 * c, c, true)?, lin(m, c, 4 * c, true)?],
            lm_head: lin(m, cfg.padded_vocab(), c, false)?,
            attention: prefill::prepare(gpu, &p.attention, PrefillDims { dims: ad, window: t })?,
            gelu: pointwise::prepare(gpu, &p.gelu, Kind::Gelu, m * 4 * c)?,
            residual: pointwise::prepare(gpu, &p.residual, Kind::Residual, m * c)?,
            acts: Activations::new(gpu, &cfg, m)?,
            last: LastLogits::new(gpu, &cfg, b, lin(b, cfg.padded_vocab(), c, false)?)?,
        })
    }

    pub(super) fn prepare_bf16(
        &self,
        gpu: &Gpu,
        bf: &Bf16Stages,
        b: usize,
        t: usize,
        encoder: encoder::Prepared,
    ) -> Result<Stages16<linear_bf16::Prepared>> {
        let lin = |m: usize, n: usize, k: usize, bias: bool, tail: Tail, out: Output, _after_ln: bool| {
            let stage = if tail == Tail::Residual { &bf.residual_linear } else { &bf.linear };
            linear_bf16::prepare(gpu, stage, LinearBf16Dims { m, n, k, bias, tail, out })
        };
        self.prepare_16(gpu, bf, (b, t), encoder, Output::Bf16, lin)
    }

    pub(super) fn prepare_fp8(
        &self,
        gpu: &Gpu,
        (bf, f8): (&Bf16Stages, &Fp8Stages),
        b: usize,
        t: usize,
        encoder: encoder::Prepared,
    ) -> Result<Stages16<Fp8Linear>> {
        // The MLP up stores e4m3 where its stage can, and the MLP down (the one linear with K = 4C)
        // reads it with no quantizer of its own.
        let gelu_out = if linear_fp8::stores_e4m3(&f8.linear) { Output::E4m3 } else { Output::Bf16 };
        let lin = |m: usize, n: usize, k: usize, bias: bool, tail: Tail, out: Output, after_ln: bool| {
            let input = if k == 4 * self.cfg.c { gelu_out } else { Output::Bf16 };
            Fp8Linear::prepare(gpu, f8, LinearFp8Dims { m, n, k, bias, tail, out }, after_ln, input)
        };
        self.prepare_16(gpu, bf, (b, t), encoder, gelu_out, lin)
    }

    /// The bf16 pass's stages with its linears made by `lin(M, N, K, bias, tail, out, after_ln)`
    /// (`after_ln`: the linear reads a LayerNorm's output), the MLP up's output of type `gelu_out`.
    fn prepare_16<L>(
        &self,
        gpu: &Gpu,
        bf: &Bf16Stages,
        (b, t): (usize, usize),
        encoder: encoder::Prepared,
        gelu_out: Output,
        lin: impl Fn(usize, usize, usize, bool, Tail, Output, bool) -> Result<L>,
    ) -> Result<Stages16<L>> {
        let cfg = self.cfg;
        let (c, m) = (cfg.c, b * t);
        let dims = PrefillBf16Dims { dims: AttnDims { b, t, c, nh: cfg.heads }, causal: true };
        Ok(Stages16 {
            encoder,
            layernorm: layernorm::prepare(gpu, &bf.layernorm, LayerNormDims { rows: m, c, out: ActType::Bf16 })?,
            linears: [
                lin(m, 3 * c, c, true, Tail::None, Output::Bf16, true)?,
                lin(m, c, c, true, Tail::Residual, Output::F32, false)?,
                lin(m, 4 * c, c, true, Tail::Gelu, gelu_out, true)?,
                lin(m, c, 4 * c, true, Tail::Residual, Output::F32, false)?,
            ],
            lm_head: lin(m, cfg.padded_vocab(), c, false, Tail::None, Output::Bf16, true)?,
            attention: prefill_bf16::prepare(gpu, &bf.attention, dims)?,
            acts: Activations16::new(gpu, &cfg, m, gelu_out)?,
            last: LastLogits::new(gpu, &cfg, b, lin(b, cfg.padded_vocab(), c, false, Tail::None, Output::F32, true)?)?,
        })
    }

    /// The logits `[B, T, V]` of `tokens` (`B` rows of `T` ids each).
    pub fn forward(&mut self, gpu: &Gpu, tokens: &[Vec<i32>]) -> Result<Vec<f32>> {
        let (b, t) = self.run(gpu, tokens, Logits::All)?;
        self.prepared[&(b, t)].download_logits(gpu, Logits::All, b * t, (self.cfg.vocab, self.cfg.padded_vocab()))
    }

    /// The logits of each row's last position only, `[B, V]` (what generation samples from): the
    /// same pass with the LM head over those B rows alone.
    pub fn forward_last(&mut self, gpu: &Gpu, tokens: &[Vec<i32>]) -> Result<Vec<f32>> {
        let (b, t) = self.run(gpu, tokens, Logits::Last)?;
        self.prepared[&(b, t)].download_logits(gpu, Logits::Last, b, (self.cfg.vocab, self.cfg.padded_vocab()))
    }

    /// Checks `tokens`, prepares (B, T) and enqueues the forward pass on the harness stream.
    fn run(&mut self, gpu: &Gpu, tokens: &[Vec<i32>], logits: Logits) -> Result<(usize, usize)> {
        let b = tokens.len();
        let t = tokens.first().map_or(0, |r| r.len());
        require(b >= 1 && tokens.iter().all(|r| r.len() == t), "B >= 1 prompts of one length T", || {
            format!("lengths {:?}", tokens.iter().map(|r| r.len()).collect::<Vec<_>>())
        })?;
        self.prepare(gpu, b, t)?;
        let ids = TokenIds::upload(gpu, &tokens.concat(), self.cfg.vocab)?;
        let stream = gpu.stream().clone();
        self.enqueue_forward(&stream, b, t, &ids, None, logits)?;
        Ok((b, t))
    }

    /// The forward pass of (B, T) on `s`, ending in `logits`. With `fill`, each layer's k and v
    /// also go into the KV cache.
    pub(super) fn enqueue_forward(
        &mut self,
        s: &Arc<CudaStream>,
        b: usize,
        t: usize,
        ids: &TokenIds,
        fill: Option<Fill>,
        logits: Logits,
    ) -> Result<()> {
        let ctx = Whole { w: &self.weights, ids: Some(ids), fill, logits, b, t, c: self.cfg.c };
        match self.prepared.get_mut(&(b, t)).expect("prepared before") {
            Prepared::F32(op) => forward(s, &mut Sequence { op: op.as_mut(), ctx }, &self.weights.p),
            Prepared::Bf16(op) => forward(s, &mut Sequence { op: op.as_mut(), ctx }, &self.weights.p),
            Prepared::Fp8(op) => forward(s, &mut Sequence { op: op.as_mut(), ctx }, &self.weights.p),
        }
    }

    /// Enqueues transformer block `layer` alone, prepared for (B, T), on `s`, over whatever the
    /// activations hold: the unit the cross-family benches time.
    pub fn enqueue_one_block(
        &mut self,
        gpu: &Gpu,
        s: &Arc<CudaStream>,
        b: usize,
        t: usize,
        layer: usize,
    ) -> Result<()> {
        self.prepare(gpu, b, t)?;
        let w =
            self.weights.p.blocks.get(layer).ok_or_else(|| {
                Error::constraint(format!("a layer below {}", self.cfg.layers), format!("layer {layer}"))
            })?;
        let l = Layer { w, index: layer };
        let ctx = Whole { w: &self.weights, ids: None, fill: None, logits: Logits::All, b, t, c: self.cfg.c };
        match self.prepared.get_mut(&(b, t)).expect("prepared above") {
            Prepared::F32(op) => block(s, &mut Sequence { op: op.as_mut(), ctx }, l),
            Prepared::Bf16(op) => block(s, &mut Sequence { op: op.as_mut(), ctx }, l),
            Prepared::Fp8(op) => block(s, &mut Sequence { op: op.as_mut(), ctx }, l),
        }
    }
}

/// What a whole-sequence pass of (B, T) runs with besides its stages: the weights, the token ids,
/// where its keys and values go (`fill`, a prefill into the KV cache) and which logits it ends in.
struct Whole<'a, 'f> {
    w: &'a DeviceWeights,
    /// `None`: a block alone ([`Model::enqueue_one_block`]), which embeds nothing.
    ids: Option<&'a TokenIds>,
    fill: Option<Fill<'f>>,
    logits: Logits,
    b: usize,
    t: usize,
    c: usize,
}

impl Whole<'_, '_> {
    /// `x = wte[token] + wpe[position]` for the pass's tokens.
    fn embed(&self, s: &Arc<CudaStream>, encoder: &encoder::Prepared, x: &mut CudaSlice<f32>) -> Result<()> {
        let tokens = self.ids.ok_or_else(|| Error::constraint("token ids for a pass that embeds", "a block alone"))?;
        encoder.enqueue(s, EncoderArgs { out: x, tokens, wte: &self.w.p.wte, wpe: &self.w.p.wpe })
    }
}

/// The whole-sequence pass of one (B, T) as a [`Pass`], on the fp32 stages ([`Stages32`]) or the
/// bf16 ones ([`Stages16`]).
struct Sequence<'a, 'f, S> {
    op: &'a mut S,
    ctx: Whole<'a, 'f>,
}

impl Sequence<'_, '_, Stages32> {
    /// Linear `which` of block `l` with its bias, into its own output (no tail).
    fn linear(&mut self, s: &Arc<CudaStream>, which: BlockLinear, l: &Block<CudaSlice<f32>>) -> Result<()> {
        let (weight, bias) = which.params(l);
        let (out, inp) = self.op.acts.linear_io(which, false);
        self.op.linears[which as usize].enqueue(s, LinearArgs { out, inp, weight, bias: Some(bias) })
    }
}

impl Pass for Sequence<'_, '_, Stages32> {
    fn embed(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        self.ctx.embed(s, &self.op.encoder, &mut self.op.acts.x)
    }

    fn layernorm(&mut self, s: &Arc<CudaStream>, w: &CudaSlice<f32>, b: &CudaSlice<f32>) -> Result<()> {
        let a = &mut self.op.acts;
        let stats = (&mut a.mean, &mut a.rstd);
        enqueue_layernorm(s, &self.op.layernorm, ActMut::F32(&mut a.ln), stats, &a.x, (w, b))
    }

    fn qkv(&mut self, s: &Arc<CudaStream>, l: Layer) -> Result<()> {
        self.linear(s, BlockLinear::Qkv, l.w)
    }

    fn attention(&mut self, s: &Arc<CudaStream>, layer: usize) -> Result<()> {
        let a = &mut self.op.acts;
        if let Some(f) = self.ctx.fill.as_mut() {
            f.append(s, layer, Act::F32(&a.qkv))?;
        }
        self.op.attention.enqueue(s, PrefillArgs { out: &mut a.att, lse: Some(&mut a.att_lse), qkv: &a.qkv })
    }

    /// The projection, then the residual add.
    fn linear_residual(&mut self, s: &Arc<CudaStream>, which: BlockLinear, l: Layer) -> Result<()> {
        self.linear(s, which, l.w)?;
        let a = &mut self.op.acts;
        self.op.residual.enqueue_in_place(s, &mut a.x, &a.proj)
    }

    /// The MLP up, then GELU.
    fn linear_gelu(&mut self, s: &Arc<CudaStream>, l: Layer) -> Result<()> {
        self.linear(s, BlockLinear::Fc, l.w)?;
        let a = &mut self.op.acts;
        self.op.gelu.enqueue(s, &mut a.gelu, &a.fc, None)
    }

    fn lm_head(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        let (op, Whole { w, logits, b, t, c, .. }) = (&mut *self.op, &self.ctx);
        let (a, head) = (&mut op.acts, &w.lm_head);
        match logits {
            Logits::All => {
                op.lm_head.enqueue(s, LinearArgs { out: &mut a.logits, inp: &a.ln, weight: head, bias: None })
            }
            Logits::Last => {
                let last = &mut op.last;
                gather_last(s, &a.ln, &mut last.ln, (*b, *t, *c))?;
                last.lm_head.enqueue(s, LinearArgs { out: &mut last.logits, inp: &last.ln, weight: head, bias: None })
            }
        }
    }
}

impl<L: PassLinear> Sequence<'_, '_, Stages16<L>> {
    /// Block linear `which` with its tail, on the pass's activations ([`PassLinear::block`]).
    fn block_linear(&mut self, s: &Arc<CudaStream>, which: BlockLinear, l: Layer) -> Result<()> {
        self.op.linears[which as usize].block(s, which, &mut self.op.acts, self.ctx.w, l)
    }
}

impl<L: PassLinear> Pass for Sequence<'_, '_, Stages16<L>> {
    fn embed(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        self.ctx.embed(s, &self.op.encoder, &mut self.op.acts.x)
    }

    /// Nothing where the linears after it take it in.
    fn layernorm(&mut self, s: &Arc<CudaStream>, w: &CudaSlice<f32>, b: &CudaSlice<f32>) -> Result<()> {
        if self.op.lm_head.takes_layernorm() {
            return Ok(());
        }
        let a = &mut self.op.acts;
        let stats = (&mut a.mean, &mut a.rstd);
        enqueue_layernorm(s, &self.op.layernorm, ActMut::Bf16(&mut a.ln), stats, &a.x, (w, b))
    }

    fn qkv(&mut self, s: &Arc<CudaStream>, l: Layer) -> Result<()> {
        self.block_linear(s, BlockLinear::Qkv, l)
    }

    /// One kernel: the linear adds into the residual stream in its tail.
    fn linear_residual(&mut self, s: &Arc<CudaStream>, which: BlockLinear, l: Layer) -> Result<()> {
        self.block_linear(s, which, l)
    }

    /// One kernel: the MLP up applies GELU in its tail.
    fn linear_gelu(&mut self, s: &Arc<CudaStream>, l: Layer) -> Result<()> {
        self.block_linear(s, BlockLinear::Fc, l)
    }

    fn attention(&mut self, s: &Arc<CudaStream>, layer: usize) -> Result<()> {
        let a = &mut self.op.acts;
        if let Some(f) = self.ctx.fill.as_mut() {
            f.append(s, layer, Act::Bf16(&a.qkv))?;
        }
        self.op.attention.enqueue(s, PrefillBf16Args { out: &mut a.att, lse: &mut a.att_lse, qkv: &a.qkv })
    }

    fn lm_head(&mut self, s: &Arc<CudaStream>) -> Result<()> {
        let (op, Whole { w, logits, b, t, c, .. }) = (&mut *self.op, &self.ctx);
        let (a, stream) = (&mut op.acts, op.lm_head.takes_layernorm());
        match logits {
            Logits::All if stream => op.lm_head.head(s, &mut a.logits, HeadInput::Stream(&a.x), w),
            Logits::All => op.lm_head.head(s, &mut a.logits, HeadInput::LayerNorm(&a.ln), w),
            Logits::Last => {
                let last = &mut op.last;
                let inp = if stream {
                    gather_last(s, &a.x, &mut last.stream, (*b, *t, *c))?;
                    HeadInput::Stream(&last.stream)
                } else {
                    gather_last(s, &a.ln, &mut last.ln, (*b, *t, *c))?;
                    HeadInput::LayerNorm(&last.ln)
                };
                last.lm_head.head(s, &mut last.logits, inp, w)
            }
        }
    }
}

/// Where a prefill writes its keys and values.
pub(super) struct Fill<'a> {
    pub(super) cache: &'a mut KvCache,
    pub(super) cells: &'a Cells,
    pub(super) kv: &'a kv_append::Prepared,
    pub(super) q16: &'a mut CudaSlice<u16>,
}

impl Fill<'_> {
    /// Layer `layer`'s keys and values from `qkv` into the cache.
    fn append(&mut self, s: &Arc<CudaStream>, layer: usize, qkv: Act) -> Result<()> {
        let cache = self.cache.layers[layer].target();
        self.kv.enqueue(s, KvAppendArgs { q_out: &mut *self.q16, cache, qkv, cells: self.cells })
    }
}
