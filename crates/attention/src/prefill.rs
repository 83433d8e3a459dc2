//! Causal self-attention prefill as GPT-2 runs it: `qkv[B, T, 3C]` (llm.c layout: q in columns
//! `0..C`, k in `C..2C`, v in `2C..3C`, head h owning columns `h*HS..(h+1)*HS` of each) to
//! `out[B, T, C]`, NH heads of size `HS = C / NH`, scale `1/sqrt(HS)`, fp32. The ladder follows the
//! reference report: five-kernel baseline, unrolling, reductions, a fused local window (a different
//! function, checked against a windowed reference) and FlashAttention-2 in two forms.

use common::check::{compare, Verification};
use common::cudarc::driver::{CudaSlice, PushKernelArg};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, Bound, DriverContext, Error, Gpu, LaunchShape, Op, Precision, Problem, Result, Shape, Variant, Workload,
};

use crate::reference::{causal_attention, Dims};
use crate::FAMILY;

const OP: &str = "prefill";

/// The head sizes every stage supports (the flash stages size their tiles at compile time).
pub const HEAD_SIZES: [usize; 3] = [32, 64, 128];
/// The largest window of the local stage: one thread per window position, 1024 threads a block.
pub const MAX_WINDOW: usize = 1024;
/// The window of the local stage when the shape names none (the report's W).
pub const DEFAULT_WINDOW: usize = 128;

/// Threads per block of the elementwise and row-per-thread kernels.
const ROW_BLOCK: u32 = 256;
/// Query rows per block of the flash stages (Br = Bc = 16), and their threads (Br * Bc).
const FLASH_BR: u32 = 16;
const FLASH_THREADS: u32 = 256;
/// Grid y and z limit.
const GRID_YZ: usize = 65535;
const I32: usize = i32::MAX as usize;

/// How a stage runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// permute, preatt, softmax, compute_att, unpermute through the [`Scratch`] buffers. Without
    /// `reduce` preatt and compute_att give one thread each (batch, head) pair; with it, one block
    /// each output element (tree reduction) and softmax one block per row.
    Unfused { reduce: bool },
    /// One fused kernel, one block per (token, head, batch), over a window of W keys.
    Local,
    /// FlashAttention-2, Br = Bc = 16, 256 threads; `tuned` also writes the logsumexp.
    Flash { tuned: bool },
}

impl Plan {
    fn writes_lse(self) -> bool {
        matches!(self, Plan::Flash { tuned: true })
    }
}

/// The stage list: each stage with its launch plan.
fn stages() -> Vec<(Variant, Plan)> {
    let k = |stage, name, file, summary| Variant::kernel(FAMILY, OP, stage, name, file, Precision::Fp32, summary);
    vec![
        (
            k(
                0,
                "baseline",
                "prefill/00_baseline.cu",
                "5 kernels: permute, QK^T, softmax, att.V, unpermute; QK^T and att.V one thread per (batch, head)",
            ),
            Plan::Unfused { reduce: false },
        ),
        (
            k(1, "unrolled", "prefill/01_unrolled.cu", "#pragma unroll 8 on the QK^T and att.V inner loops"),
            Plan::Unfused { reduce: false },
        ),
        (
            k(
                2,
                "reduction",
                "prefill/02_reduction.cu",
                "a block per output element, shared-memory tree over HS (QK^T) or T (att.V); a block per softmax row",
            ),
            Plan::Unfused { reduce: true },
        ),
        (
            k(
                3,
                "local-window",
                "prefill/03_local_window.cu",
                "fused local attention over the last W keys, a block per (token, head, batch); windowed reference",
            ),
            Plan::Local,
        ),
        (
            k(
                4,
                "flash-v2",
                "prefill/04_flash_v2.cu",
                "FlashAttention-2 (online softmax), Br=Bc=16, 256 threads, static shared tiles, tree row max/sum",
            ),
            Plan::Flash { tuned: false },
        ),
        (
            k(
                5,
                "flash-v2-tuned",
                "prefill/05_flash_v2_tuned.cu",
                "one dynamic shared buffer (padded tiles), warp-shuffle row max/sum, O/m/l in registers, fused 1/l store, lse",
            ),
            Plan::Flash { tuned: true },
        ),
    ]
}

fn plan(v: &Variant) -> Result<Plan> {
    let all = stages();
    all.iter().find(|(s, _)| s.name == v.name && s.stage == v.stage).map(|(_, p)| *p).ok_or_else(|| Error::Unknown {
        what: "prefill stage",
        name: v.name.to_string(),
        known: all.iter().map(|(s, _)| s.name.to_string()).collect::<Vec<_>>().join(", "),
    })
}

/// The intermediate buffers of the unfused stages (0–2): q, k, v and the att·V result y as
/// `[B, NH, T, HS]`, the raw scores `preatt` and the probabilities `att` as `[B, NH, T, T]`.
pub struct Scratch {
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    y: CudaSlice<f32>,
    preatt: CudaSlice<f32>,
    att: CudaSlice<f32>,
}

impl Scratch {
    /// Allocates (NaN-poisoned) scratch for `d`; `B*NH*T*T` must stay below 2^31.
    pub fn new(gpu: &Gpu, d: Dims) -> Result<Scratch> {
        let (heads, scores) = Self::lengths(d)?;
        Ok(Scratch {
            q: gpu.alloc_poisoned(heads)?,
            k: gpu.alloc_poisoned(heads)?,
            v: gpu.alloc_poisoned(heads)?,
            y: gpu.alloc_poisoned(heads)?,
            preatt: gpu.alloc_poisoned(scores)?,
            att: gpu.alloc_poisoned(scores)?,
        })
    }

    /// NaN-fills every buffer, so a stage that reads scratch it did not write fails verification.
    pub fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        for buf in [&mut self.q, &mut self.k, &mut self.v, &mut self.y, &mut self.preatt, &mut self.att] {
            gpu.poison(buf)?;
        }
        Ok(())
    }

    /// (`B*T*C`, `B*NH*T*T`) after checking the latter fits the kernels' int indices.
    fn lengths(d: Dims) -> Result<(usize, usize)> {
        let scores = d.b.checked_mul(d.nh).and_then(|x| x.checked_mul(d.t)).and_then(|x| x.checked_mul(d.t));
        require(scores.is_some_and(|n| n <= I32), "B*NH*T*T < 2^31 (the T x T scratch)", || {
            format!("B={}, NH={}, T={}", d.b, d.nh, d.t)
        })?;
        Ok((d.b * d.t * d.c, scores.unwrap_or(0)))
    }

    fn check(&self, d: Dims) -> Result<()> {
        let (heads, scores) = Self::lengths(d)?;
        for (name, len, want) in [
            ("scratch.q", self.q.len(), heads),
            ("scratch.k", self.k.len(), heads),
            ("scratch.v", self.v.len(), heads),
            ("scratch.y", self.y.len(), heads),
            ("scratch.preatt", self.preatt.len(), scores),
            ("scratch.att", self.att.len(), scores),
        ] {
            require_len(name, len, want)?;
        }
        Ok(())
    }
}

/// The buffers and shape of one prefill call.
pub struct PrefillArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    /// Logsumexp of each row's scaled scores, `[B, NH, T]`: required by the stages that write it
    /// (flash-v2-tuned), ignored by the others.
    pub lse: Option<&'a mut CudaSlice<f32>>,
    pub qkv: &'a CudaSlice<f32>,
    /// Required by the unfused stages (0–2), ignored by the others.
    pub scratch: Option<&'a mut Scratch>,
    pub dims: Dims,
    /// The local stage's window W (ignored by the others).
    pub window: usize,
}

fn require_len(name: &str, len: usize, want: usize) -> Result<()> {
    require(len == want, &format!("len({name}) == {want}"), || format!("len({name}) = {len}"))
}

/// The constraints every stage shares: sizes, `C % NH`, the head size, int indices into qkv.
fn check_dims(d: Dims) -> Result<()> {
    let Dims { b, t, c, nh } = d;
    require(b >= 1, "B >= 1", || format!("B = {b}"))?;
    require(t >= 1, "T >= 1", || format!("T = {t}"))?;
    require(nh >= 1, "NH >= 1", || format!("NH = {nh}"))?;
    require(c >= 1 && c % nh == 0, "C % NH == 0", || format!("C = {c}, NH = {nh}"))?;
    let hs = c / nh;
    require(HEAD_SIZES.contains(&hs), "HS = C / NH in {32, 64, 128}", || format!("HS = {hs}"))?;
    let n = b.checked_mul(t).and_then(|x| x.checked_mul(c)).and_then(|x| x.checked_mul(3));
    require(n.is_some_and(|n| n <= I32), "B*T*3C < 2^31", || format!("B={b}, T={t}, C={c}"))
}

/// Shape constraints of stage `v` at `d` with window `window`.
pub fn check_shape(v: &Variant, d: Dims, window: usize) -> Result<()> {
    let plan = plan(v)?;
    check_dims(d)?;
    let Dims { b, t, nh, .. } = d;
    match plan {
        Plan::Unfused { reduce } => {
            Scratch::lengths(d)?;
            if reduce {
                require(t <= GRID_YZ, "T <= 65535 (grid y of the reduction kernels)", || format!("T = {t}"))?;
                require(b * nh <= GRID_YZ, "B*NH <= 65535 (grid z of the reduction kernels)", || {
                    format!("B*NH = {}", b * nh)
                })?;
            }
        }
        Plan::Local | Plan::Flash { .. } => {
            require(nh <= GRID_YZ && b <= GRID_YZ, "NH <= 65535 and B <= 65535 (grid y, z)", || {
                format!("NH = {nh}, B = {b}")
            })?;
        }
    }
    if plan == Plan::Local {
        require((1..=MAX_WINDOW).contains(&window), "1 <= W <= 1024", || format!("W = {window}"))?;
    }
    Ok(())
}

/// Launches kernel `entry` of `v` with `shape` and the listed arguments (in kernel-signature order).
macro_rules! launch {
    ($gpu:expr, $v:expr, $entry:expr, $shape:expr; $($arg:expr),+ $(,)?) => {{
        let entry: &str = $entry;
        let kernel = $gpu.kernel(crate::sources(), $v, entry)?;
        let cfg = kernel.config($gpu, $shape)?;
        let mut builder = $gpu.stream().launch_builder(kernel.function());
        $( builder.arg($arg); )+
        // SAFETY: every call site lists the arguments of `entry`'s signature in order, with buffer
        // lengths checked by `forward` and indices bounded by `check_shape`.
        unsafe { builder.launch(cfg) }.map(|_| ()).ctx(entry)
    }};
}

/// The smallest power of two >= n, clamped to [32, 1024]: the block of a tree reduction over n.
fn tree_block(n: usize) -> u32 {
    n.clamp(32, 1024).next_power_of_two() as u32
}

/// Launches stage `v` (all of its kernels) after checking the shape, the buffers and the window.
pub fn forward(gpu: &Gpu, v: &Variant, a: PrefillArgs) -> Result<()> {
    let d = a.dims;
    check_shape(v, d, a.window)?;
    let plan = plan(v)?;
    let hs = d.hs();
    require_len("qkv", a.qkv.len(), d.b * d.t * 3 * d.c)?;
    require_len("out", a.out.len(), d.b * d.t * d.c)?;
    let scale = 1.0 / (hs as f32).sqrt();
    let (b, t, nh, hs_i) = (d.b as i32, d.t as i32, d.nh as i32, hs as i32);
    let (bu, tu, nhu, hsu) = (d.b as u32, d.t as u32, d.nh as u32, hs as u32);
    match plan {
        Plan::Unfused { reduce } => {
            let s = a.scratch.ok_or_else(|| {
                Error::constraint(format!("{} needs scratch buffers (Scratch::new)", v.id()), "scratch = None")
            })?;
            s.check(d)?;
            let elementwise = LaunchShape::linear(((d.b * d.t * d.c) as u32).div_ceil(ROW_BLOCK), ROW_BLOCK);
            let (preatt, softmax, compute_att) = if reduce {
                let p = tree_block(d.t);
                (
                    LaunchShape { grid: (tu, tu, bu * nhu), block: (hsu, 1, 1), dynamic_shared_bytes: 4 * hsu },
                    LaunchShape { grid: (tu, nhu, bu), block: (p, 1, 1), dynamic_shared_bytes: 4 * p },
                    LaunchShape { grid: (hsu, tu, bu * nhu), block: (p, 1, 1), dynamic_shared_bytes: 4 * p },
                )
            } else {
                let heads = LaunchShape {
                    grid: (nhu.div_ceil(32), bu.div_ceil(32), 1),
                    block: (32, 32, 1),
                    dynamic_shared_bytes: 0,
                };
                let rows = LaunchShape::linear(((d.b * d.nh * d.t) as u32).div_ceil(ROW_BLOCK), ROW_BLOCK);
                (heads, rows, heads)
            };
            launch!(gpu, v, "attention_permute", elementwise; &mut s.q, &mut s.k, &mut s.v, a.qkv, &b, &t, &nh, &hs_i)?;
            launch!(gpu, v, "attention_preatt", preatt; &mut s.preatt, &s.q, &s.k, &b, &t, &nh, &hs_i)?;
            launch!(gpu, v, "attention_softmax", softmax; &mut s.att, &s.preatt, &b, &t, &nh, &scale)?;
            launch!(gpu, v, "attention_compute_att", compute_att; &mut s.y, &s.att, &s.v, &b, &t, &nh, &hs_i)?;
            launch!(gpu, v, "attention_unpermute", elementwise; a.out, &s.y, &b, &t, &nh, &hs_i)
        }
        Plan::Local => {
            let p = tree_block(a.window);
            let w = a.window as i32;
            let shape = LaunchShape { grid: (tu, nhu, bu), block: (p, 1, 1), dynamic_shared_bytes: 4 * (2 * p + hsu) };
            launch!(gpu, v, "attention_local", shape; a.out, a.qkv, &b, &t, &nh, &hs_i, &w, &scale)
        }
        Plan::Flash { tuned } => {
            let grid = (tu.div_ceil(FLASH_BR), nhu, bu);
            if tuned {
                let lse = a.lse.ok_or_else(|| {
                    Error::constraint(format!("{} writes lse: an lse buffer of B*NH*T", v.id()), "lse = None")
                })?;
                require_len("lse", lse.len(), d.b * d.nh * d.t)?;
                let floats = 2 * FLASH_BR * (hsu + 1) + FLASH_BR * hsu + FLASH_BR * FLASH_BR;
                let shape = LaunchShape { grid, block: (FLASH_THREADS, 1, 1), dynamic_shared_bytes: 4 * floats };
                let entry = format!("attention_flash_v2_tuned_hs{hs}");
                launch!(gpu, v, &entry, shape; a.out, lse, a.qkv, &b, &t, &nh, &scale)
            } else {
                let shape = LaunchShape { grid, block: (FLASH_THREADS, 1, 1), dynamic_shared_bytes: 0 };
                let entry = format!("attention_flash_v2_hs{hs}");
                launch!(gpu, v, &entry, shape; a.out, a.qkv, &b, &t, &nh, &scale)
            }
        }
    }
}

/// The op's shape (`C = NH * HS`) and window from shape keys B, T, NH, HS and W (default 128).
pub fn shape_dims(shape: &Shape) -> Result<(Dims, usize)> {
    let b = shape.dim("B", GRID_YZ as i64)?;
    let t = shape.dim("T", I32 as i64)?;
    let nh = shape.dim("NH", GRID_YZ as i64)?;
    let hs = shape.dim("HS", I32 as i64)?;
    let window = match shape.get("W") {
        Some(_) => shape.dim("W", I32 as i64)?,
        None => DEFAULT_WINDOW,
    };
    let c = nh.checked_mul(hs).filter(|&c| c <= I32);
    let c = c.ok_or_else(|| Error::constraint("NH*HS < 2^31", format!("NH = {nh}, HS = {hs}")))?;
    Ok((Dims { b, t, c, nh }, window))
}

pub struct Prefill;

impl Op for Prefill {
    fn family(&self) -> &'static str {
        FAMILY
    }
    fn name(&self) -> &'static str {
        OP
    }
    fn description(&self) -> &'static str {
        "causal self-attention forward (fp32): qkv[B,T,3C] -> out[B,T,C], NH heads of HS, scale 1/sqrt(HS); \
         W = window of the local stage"
    }
    fn sources(&self) -> &'static [common::KernelSource] {
        crate::sources()
    }
    fn variants(&self) -> Vec<Variant> {
        stages().into_iter().map(|(v, _)| v).collect()
    }
    fn shape_keys(&self) -> &'static [&'static str] {
        &["B", "T", "NH", "HS", "W"]
    }
    fn default_shapes(&self) -> Vec<Shape> {
        [1024, 64, 256]
            .iter()
            .map(|&t| Shape::new(&[("B", 4), ("T", t), ("NH", 12), ("HS", 64), ("W", DEFAULT_WINDOW as i64)]))
            .collect()
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        let (d, window) = shape_dims(shape)?;
        check_shape(v, d, window)
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let (dims, window) = shape_dims(shape)?;
        check_dims(dims)?;
        let Dims { b, t, c, nh } = dims;
        // Scores q.k/sqrt(HS) with a spread of ~1.3: softmax rows neither flat nor one-hot.
        let host_qkv = uniform(b * t * 3 * c, -2.0, 2.0, seed);
        let full = causal_attention(&host_qkv, dims, None);
        let copies = rotation_copies(gpu, 4 * (b * t * 4 * c + b * nh * t) as u64);
        // Scratch only where the unfused stages can run at all (B*NH*T*T < 2^31).
        let scratch = match Scratch::lengths(dims) {
            Ok(_) => Some(Scratch::new(gpu, dims)?),
            Err(_) => None,
        };
        Ok(Box::new(PrefillProblem {
            dims,
            window,
            qkv: Rotated::upload(gpu, &host_qkv, copies)?,
            out: Rotated::outputs(gpu, b * t * c, copies)?,
            lse: Rotated::outputs(gpu, b * nh * t, copies)?,
            scratch,
            host_qkv,
            full,
            windowed: None,
            copies,
        }))
    }
}

struct PrefillProblem {
    dims: Dims,
    window: usize,
    qkv: Rotated<f32>,
    out: Rotated<f32>,
    lse: Rotated<f32>,
    scratch: Option<Scratch>,
    host_qkv: Vec<f32>,
    /// Full causal attention: (out, lse).
    full: (Vec<f64>, Vec<f64>),
    /// Windowed attention's out, computed on first use by the local stage.
    windowed: Option<Vec<f64>>,
    copies: usize,
}

impl Problem for PrefillProblem {
    fn workload(&self) -> Workload {
        let Dims { b, t, c, nh } = self.dims;
        let (b, t, c, nh, hs) = (b as u64, t as u64, c as u64, nh as u64, self.dims.hs() as u64);
        // qkv read once, out written once; QK^T and P.V over the causal half: 2 * 2*HS flops per
        // (query, key <= query) pair and head.
        let pairs = t * (t + 1) / 2;
        Workload {
            bytes: 4 * (b * t * 3 * c + b * t * c),
            flops: 4 * hs * pairs * b * nh,
            bound: Bound::Compute(Precision::Fp32),
        }
    }
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)?;
        self.lse.poison(gpu)?;
        match self.scratch.as_mut() {
            Some(s) => s.poison(gpu),
            None => Ok(()),
        }
    }
    fn launch(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<()> {
        forward(
            gpu,
            v,
            PrefillArgs {
                out: self.out.get_mut(copy),
                lse: Some(self.lse.get_mut(copy)),
                qkv: self.qkv.get(copy),
                scratch: self.scratch.as_mut(),
                dims: self.dims,
                window: self.window,
            },
        )
    }
    fn verify(&mut self, gpu: &Gpu, v: &Variant, copy: usize) -> Result<Verification> {
        let out = gpu.download(self.out.get(copy))?;
        let plan = plan(v)?;
        if plan == Plan::Local {
            let (w, dims) = (self.window, self.dims);
            let windowed = self.windowed.get_or_insert_with(|| causal_attention(&self.host_qkv, dims, Some(w)).0);
            let vs_full = compare("out", &out, &self.full.0);
            let note = format!(
                "W={w}: vs full causal attention rel L2 {:.2e}, max abs {:.2e}",
                vs_full.rel_l2, vs_full.max_abs
            );
            return Ok(Verification::new(v.tolerance()).add("out", &out, windowed).with_note(note));
        }
        let mut ver = Verification::new(v.tolerance()).add("out", &out, &self.full.0);
        if plan.writes_lse() {
            ver = ver.add("lse", &gpu.download(self.lse.get(copy))?, &self.full.1);
        }
        Ok(ver)
    }
}
