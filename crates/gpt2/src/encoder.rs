//! The encoder: token embedding plus position embedding, `out[b,t,:] = wte[tok[b,t],:] + wpe[t,:]`.

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rng, rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, DriverContext, Error, Gpu, Launch, LaunchShape, Limit, Op, Precision,
    Prepared as Current, Problem, Result, Shape, Variant, Workload,
};
use rand::Rng;

use crate::{FAMILY, SOURCES};

const OP: &str = "encoder";

common::declare_op! {
    pub struct Encoder {
        name: OP,
        description: "token + position embedding (fp32): out[b,t,:] = wte[tok,:] + wpe[t,:]",
        shape_keys: ["B", "T", "C", "V"],
        stages: stages,
    }
}

const ELEMS: &str = "B * T * C < 2^31";

fn stages() -> Vec<Variant> {
    vec![Variant::kernel(
        FAMILY,
        OP,
        0,
        "naive",
        "encoder/00_naive.cu",
        Precision::Fp32,
        "one thread per output element, scalar loads",
    )
    .with_tunables(&[("ENC_THREADS", 256)])
    // The thread counts of the report's encoder blocks, 3x3x3 to 10x10x10 (ours is one-dimensional).
    .with_sweep("ENC_THREADS", &[27, 64, 125, 216, 343, 512, 729, 1000])]
}

/// The sizes of one encoder call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncoderDims {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub vocab: usize,
    /// The longest sequence `wpe` covers (its rows).
    pub max_t: usize,
}

/// Token ids on the device, checked on the host to lie in `[0, vocab)` when uploaded: the only way
/// to make one, so the kernel can index `wte` with them unchecked.
pub struct TokenIds {
    ids: CudaSlice<i32>,
    vocab: usize,
}

impl TokenIds {
    pub fn upload(gpu: &Gpu, ids: &[i32], vocab: usize) -> Result<TokenIds> {
        if let Some((i, &id)) = ids.iter().enumerate().find(|(_, &id)| id < 0 || id as usize >= vocab) {
            return Err(Error::constraint(format!("0 <= token < V = {vocab}"), format!("tokens[{i}] = {id}")));
        }
        Ok(TokenIds { ids: gpu.upload(ids)?, vocab })
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// The ids on the device.
    pub(crate) fn device(&self) -> &CudaSlice<i32> {
        &self.ids
    }

    /// The ids on the device, for a kernel that writes the next ones itself (the decode step's
    /// greedy loop: an argmax index, below V by construction).
    pub(crate) fn device_mut(&mut self) -> &mut CudaSlice<i32> {
        &mut self.ids
    }

    /// New ids for as many rows, checked as in [`TokenIds::upload`], copied into place.
    pub fn set(&mut self, gpu: &Gpu, ids: &[i32]) -> Result<()> {
        require_len("tokens", ids.len(), self.ids.len())?;
        let fresh = TokenIds::upload(gpu, ids, self.vocab)?;
        gpu.stream().memcpy_dtod(&fresh.ids, &mut self.ids).ctx("copy token ids")
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// Each row's position, checked on the host to lie below the rows of `wpe` when uploaded.
pub struct Positions {
    pos: CudaSlice<i32>,
    max_t: usize,
}

impl Positions {
    pub fn upload(gpu: &Gpu, pos: &[usize], max_t: usize) -> Result<Positions> {
        if let Some((i, &p)) = pos.iter().enumerate().find(|(_, &p)| p >= max_t) {
            return Err(Error::constraint(format!("position < context {max_t}"), format!("positions[{i}] = {p}")));
        }
        Ok(Positions { pos: gpu.upload(&pos.iter().map(|&p| p as i32).collect::<Vec<i32>>())?, max_t })
    }

    /// The positions on the device.
    pub(crate) fn device(&self) -> &CudaSlice<i32> {
        &self.pos
    }

    /// The positions on the device, for a kernel that moves them on itself (the decode step's
    /// greedy loop, which keeps them below the context).
    pub(crate) fn device_mut(&mut self) -> &mut CudaSlice<i32> {
        &mut self.pos
    }

    /// New positions for as many rows, checked as in [`Positions::upload`], copied into place.
    pub fn set(&mut self, gpu: &Gpu, pos: &[usize]) -> Result<()> {
        require_len("positions", pos.len(), self.pos.len())?;
        let fresh = Positions::upload(gpu, pos, self.max_t)?;
        gpu.stream().memcpy_dtod(&fresh.pos, &mut self.pos).ctx("copy positions")
    }
}

/// Shape constraints: what the stage header's `Limits:` line documents, and `T <= max_T`.
pub fn check_shape(d: EncoderDims) -> Result<()> {
    for (k, v) in [("B", d.b), ("T", d.t), ("C", d.c), ("V", d.vocab)] {
        require(v >= 1, &format!("{k} >= 1"), || format!("{k} = {v}"))?;
    }
    let n = d.b.checked_mul(d.t).and_then(|n| n.checked_mul(d.c));
    require(n.is_some_and(|n| n < 1 << 31), ELEMS, || format!("B = {}, T = {}, C = {}", d.b, d.t, d.c))?;
    require(d.t <= d.max_t, "T <= max_T (rows of wpe)", || format!("T = {}, max_T = {}", d.t, d.max_t))
}

/// An encoder stage prepared for one size: `B x T` rows by position, or `B` rows at given positions.
pub struct Prepared {
    launch: Launch,
    at: Launch,
    d: EncoderDims,
}

pub struct EncoderArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub tokens: &'a TokenIds,
    pub wte: &'a CudaSlice<f32>,
    pub wpe: &'a CudaSlice<f32>,
}

pub fn prepare(gpu: &Gpu, v: &Variant, d: EncoderDims) -> Result<Prepared> {
    check_shape(d)?;
    let n = (d.b * d.t * d.c) as u32;
    let block = v.tunable("ENC_THREADS")?;
    let shape = LaunchShape::linear(n.div_ceil(block), block);
    let at = LaunchShape::linear(((d.b * d.c) as u32).div_ceil(block), block);
    Ok(Prepared {
        launch: gpu.prepare_launch(&SOURCES, v, "encoder_forward", shape)?,
        at: gpu.prepare_launch(&SOURCES, v, "encoder_at", at)?,
        d,
    })
}

impl Prepared {
    /// Enqueues the stage after checking every length (token ids were range-checked on upload).
    pub fn enqueue(&self, stream: &CudaStream, a: EncoderArgs) -> Result<()> {
        let d = self.d;
        require(a.tokens.vocab == d.vocab, "token ids checked against this V", || {
            format!("checked against V = {}, prepared for V = {}", a.tokens.vocab, d.vocab)
        })?;
        for (name, len, want) in [
            ("out", a.out.len(), d.b * d.t * d.c),
            ("tokens", a.tokens.len(), d.b * d.t),
            ("wte", a.wte.len(), d.vocab * d.c),
            ("wpe", a.wpe.len(), d.max_t * d.c),
        ] {
            require_len(name, len, want)?;
        }
        let args = [
            Arg::buf(a.out),
            Arg::buf(&a.tokens.ids),
            Arg::buf(a.wte),
            Arg::buf(a.wpe),
            Arg::int(d.b),
            Arg::int(d.t),
            Arg::int(d.c),
        ];
        // SAFETY: arguments match the kernel signature; lengths checked above, B*T*C < 2^31, and
        // every token id was checked against V when its TokenIds was made.
        unsafe { self.launch.enqueue(stream, &args) }
    }
}

impl Prepared {
    /// One row per sequence (`B` rows, `T` ignored), row b at `positions[b]`.
    pub fn enqueue_at(&self, stream: &CudaStream, a: EncoderArgs, positions: &Positions) -> Result<()> {
        let d = self.d;
        require(
            a.tokens.vocab == d.vocab && positions.max_t == d.max_t,
            "ids and positions checked for this V and context",
            || format!("V {}, context {}", a.tokens.vocab, positions.max_t),
        )?;
        for (name, len, want) in [
            ("out", a.out.len(), d.b * d.c),
            ("tokens", a.tokens.len(), d.b),
            ("positions", positions.pos.len(), d.b),
            ("wte", a.wte.len(), d.vocab * d.c),
            ("wpe", a.wpe.len(), d.max_t * d.c),
        ] {
            require_len(name, len, want)?;
        }
        let args = [
            Arg::buf(a.out),
            Arg::buf(&a.tokens.ids),
            Arg::buf(&positions.pos),
            Arg::buf(a.wte),
            Arg::buf(a.wpe),
            Arg::int(d.b),
            Arg::int(d.c),
        ];
        // SAFETY: arguments match encoder_at; lengths checked above; ids and positions were checked
        // against V and the context when uploaded.
        unsafe { self.at.enqueue(stream, &args) }
    }
}

common::single_launch_stage!(Prepared);

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

fn shape(b: i64, t: i64, c: i64, v: i64) -> Shape {
    Shape::new(&[("B", b), ("T", t), ("C", c), ("V", v)])
}

/// The problem's dimensions (`wpe` holds exactly T rows).
fn dims(shape: &Shape) -> Result<EncoderDims> {
    let t = shape.dim("T", 1 << 20)?;
    Ok(EncoderDims {
        b: shape.dim("B", 1 << 20)?,
        t,
        c: shape.dim("C", 1 << 20)?,
        vocab: shape.dim("V", i32::MAX as i64)?,
        max_t: t,
    })
}

impl Op for Encoder {
    fn default_shapes(&self) -> Vec<Shape> {
        vec![shape(4, 1024, 768, 50257)]
    }
    fn validate(&self, _v: &Variant, shape: &Shape) -> Result<()> {
        check_shape(dims(shape)?)
    }
    fn limits(&self, _v: &Variant) -> Vec<Limit> {
        vec![Limit { constraint: ELEMS, past: shape(1 << 11, 1 << 10, 1 << 10, 7), inside: None }]
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let d = dims(shape)?;
        check_shape(d)?;
        let mut r = rng(seed);
        let ids: Vec<i32> = (0..d.b * d.t).map(|_| r.random_range(0..d.vocab as i32)).collect();
        let wte = uniform(d.vocab * d.c, -1.0, 1.0, seed ^ 1);
        let wpe = uniform(d.t * d.c, -1.0, 1.0, seed ^ 2);
        let reference = reference(&ids, &wte, &wpe, d.t, d.c);
        // wte is shared (it is the model's table); tokens and outputs rotate.
        let copies = rotation_copies(gpu, (d.b * d.t * d.c * 4 * 2) as u64);
        Ok(Box::new(EncoderProblem {
            d,
            tokens: (0..copies).map(|_| TokenIds::upload(gpu, &ids, d.vocab)).collect::<Result<_>>()?,
            wte: gpu.upload(&wte)?,
            wpe: gpu.upload(&wpe)?,
            out: Rotated::outputs(gpu, d.b * d.t * d.c, copies)?,
            reference,
            copies,
            prepared: Current::default(),
        }))
    }
}

struct EncoderProblem {
    d: EncoderDims,
    tokens: Vec<TokenIds>,
    wte: CudaSlice<f32>,
    wpe: CudaSlice<f32>,
    out: Rotated<f32>,
    reference: Vec<f64>,
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for EncoderProblem {
    fn workload(&self) -> Workload {
        let n = (self.d.b * self.d.t * self.d.c) as u64;
        // One wte row and one wpe row read and one out row written per token, plus the token ids.
        Workload { bytes: 12 * n + 4 * (self.d.b * self.d.t) as u64, flops: n, bound: Bound::Memory }
    }
    common::problem_plumbing!(out);
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let tokens = &self.tokens[copy % self.tokens.len()];
        p.enqueue(stream, EncoderArgs { out: self.out.get_mut(copy), tokens, wte: &self.wte, wpe: &self.wpe })
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        Ok(Verification::new(v.tolerance()).add("out", &gpu.download(self.out.get(copy))?, &self.reference))
    }
}
