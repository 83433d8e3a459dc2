//! The encoder: token embedding plus position embedding, `out[b,t,:] = wte[tok[b,t],:] + wpe[t,:]`.

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, PushKernelArg};
use common::data::{rng, rotation_copies, uniform, Rotated};
use common::{
    require, Bound, DriverContext, Gpu, LaunchShape, Op, Precision, Problem, Result, Shape, Variant, Workload,
};
use rand::Rng;

use crate::FAMILY;

const OP: &str = "encoder";

fn stages() -> Vec<Variant> {
    vec![Variant::kernel(
        FAMILY,
        OP,
        0,
        "naive",
        "encoder/00_naive.cu",
        Precision::Fp32,
        "one thread per output element, scalar loads",
    )]
}

pub struct EncoderArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub tokens: &'a CudaSlice<i32>,
    pub wte: &'a CudaSlice<f32>,
    pub wpe: &'a CudaSlice<f32>,
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub vocab: usize,
    /// The longest sequence `wpe` covers.
    pub max_t: usize,
}

pub fn check_shape(b: usize, t: usize, c: usize) -> Result<()> {
    for (k, v) in [("B", b), ("T", t), ("C", c)] {
        require(v >= 1, &format!("{k} >= 1"), || format!("{k} = {v}"))?;
    }
    let n = b.saturating_mul(t).saturating_mul(c);
    require(n < i32::MAX as usize, "B * T * C < 2^31", || format!("B * T * C = {n}"))
}

/// Launches stage `v` after checking shapes and lengths. Token ids are not read back here (that
/// would stall the stream); callers guarantee `0 <= token < vocab`, as [`EncoderProblem`] does.
pub fn forward(gpu: &Gpu, v: &Variant, a: EncoderArgs) -> Result<()> {
    check_shape(a.b, a.t, a.c)?;
    require(a.t <= a.max_t, "T <= max_T (rows of wpe)", || format!("T = {}, max_T = {}", a.t, a.max_t))?;
    let n = a.b * a.t * a.c;
    for (name, len, want) in [
        ("out", a.out.len(), n),
        ("tokens", a.tokens.len(), a.b * a.t),
        ("wte", a.wte.len(), a.vocab * a.c),
        ("wpe", a.wpe.len(), a.max_t * a.c),
    ] {
        require(len == want, &format!("len({name}) == {want}"), || format!("len({name}) = {len}"))?;
    }
    let kernel = gpu.kernel(crate::sources(), v, "encoder_forward")?;
    let cfg = kernel.config(gpu, LaunchShape::linear((n as u32).div_ceil(256), 256))?;
    let (b, t, c) = (a.b as i32, a.t as i32, a.c as i32);
    let mut l = gpu.stream().launch_builder(kernel.function());
    l.arg(a.out).arg(a.tokens).arg(a.wte).arg(a.wpe).arg(&b).arg(&t).arg(&c);
    // SAFETY: arguments match the kernel signature; lengths checked above.
    unsafe { l.launch(cfg) }.map(|_| ()).ctx("launch encoder_forward")
}

pub fn reference(tokens: &[i32], wte: &[f32], wpe: &[f32], t: usize, c: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(tokens.len() * c);
    for (bt, &tok) in tokens.iter().enumerate() {
        let pos = bt % t;
        for i in 0..c {
            out.push(wte[tok as usize * c + i] as f64 + wpe[pos * c + i] as f64);
        }
    }
    out
}

pub struct Encoder;

impl Op for Encoder {
    fn family(&self) -> &'static str {
        FAMILY
    }
    fn name(&self) -> &'static str {
        OP
    }
    fn description(&self) -> &'static str {
        "token + position embedding (fp32): out[b,t,:] = wte[tok,:] + wpe[t,:]"
    }
    fn sources(&self) -> &'static [common::KernelSource] {
        crate::sources()
    }
    fn variants(&self) -> Vec<Variant> {
        stages()
    }
    fn shape_keys(&self) -> &'static [&'static str] {
        &["B", "T", "C", "V"]
    }
    fn default_shapes(&self) -> Vec<Shape> {
        vec![Shape::new(&[("B", 4), ("T", 1024), ("C", 768), ("V", 50257)])]
    }
    fn validate(&self, _v: &Variant, shape: &Shape) -> Result<()> {
        check_shape(shape.dim("B", 1 << 20)?, shape.dim("T", 1 << 20)?, shape.dim("C", 1 << 20)?)?;
        shape.dim("V", i32::MAX as i64).map(|_| ())
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        self.validate(&stages()[0], shape)?;
        let (b, t, c, vocab) =
            (shape.req("B")? as usize, shape.req("T")? as usize, shape.req("C")? as usize, shape.req("V")? as usize);
        let mut r = rng(seed);
        let tokens: Vec<i32> = (0..b * t).map(|_| r.random_range(0..vocab as i32)).collect();
        let wte = uniform(vocab * c, -1.0, 1.0, seed ^ 1);
        let wpe = uniform(t * c, -1.0, 1.0, seed ^ 2);
        let reference = reference(&tokens, &wte, &wpe, t, c);
        // wte is shared (it is the model's table); tokens and outputs rotate.
        let copies = rotation_copies(gpu, (b * t * c * 4 * 2) as u64);
        Ok(Box::new(EncoderProblem {
            b,
            t,
            c,
            vocab,
            tokens: Rotated::upload(gpu, &tokens, copies)?,
            wte: gpu.upload(&wte)?,
            wpe: gpu.upload(&wpe)?,
            out: Rotated::outputs(gpu, b * t * c, copies)?,
            reference,
            copies,
        }))
    }
}

struct EncoderProblem {
    b: usize,
    t: usize,
    c: usize,
    vocab: usize,
    tokens: Rotated<i32>,
    wte: CudaSlice<f32>,
    wpe: CudaSlice<f32>,
    out: Rotated<f32>,
    reference: Vec<f64>,
    copies: usize,
}

impl Problem for EncoderProblem {
    fn workload(&self) -> Workload {
        let n = (self.b * self.t * self.c) as u64;
        // One wte row and one wpe row read and one out row written per token, plus the token ids.
        Workload { bytes: 12 * n + 4 * (self.b * self.t) as u64, flops: n, bound: Bound::Memory }
    }
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)
    }
    fn launch(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<()> {
        forward(
            gpu,
            v,
            EncoderArgs {
                out: self.out.get_mut(copy),
                tokens: self.tokens.get(copy),
                wte: &self.wte,
                wpe: &self.wpe,
                b: self.b,
                t: self.t,
                c: self.c,
                vocab: self.vocab,
                max_t: self.t,
            },
        )
    }
    fn verify(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<Verification> {
        Ok(Verification::new(v.tolerance()).add("out", &gpu.download(self.out.get(copy))?, &self.reference))
    }
}
