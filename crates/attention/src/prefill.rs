//! Causal self-attention prefill as GPT-2 runs it: `qkv[B, T, 3C]` (llm.c layout: q in columns
//! `0..C`, k in `C..2C`, v in `2C..3C`, head h owning columns `h*HS..(h+1)*HS` of each) to
//! `out[B, T, C]`, NH heads of size `HS = C / NH`, scale `1/sqrt(HS)`, fp32. The ladder follows the
//! reference report: five-kernel baseline, unrolling, reductions, a fused local window (a different
//! function, checked against a windowed reference) and FlashAttention-2 in two forms.

use common::check::{compare, compare_scaled, Verification};
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, uniform, Rotated};
use common::{
    require, require_len, Arg, Bound, Error, Gpu, Launch, LaunchShape, Limit, Op, Precision, Prepared as Current,
    PreparedStage, Problem, Requirements, ResourceUse, Result, Shape, Variant, Workload,
};

use crate::reference::{causal_attention, score_magnitude, Dims, ELEMS};
use crate::{FAMILY, SOURCES};

const OP: &str = "prefill";

common::declare_op! {
    pub struct Prefill {
        name: OP,
        description: "causal self-attention forward (fp32): qkv[B,T,3C] -> out[B,T,C], NH heads of HS, scale 1/sqrt(HS); \
             W = window of the local stage",
        shape_keys: ["B", "T", "NH", "HS", "W"],
        stages: stages,
    }
}

/// The head sizes every stage supports (the flash stages size their tiles at compile time).
pub const HEAD_SIZES: [usize; 3] = [32, 64, 128];
/// The window of the local stage when the shape names none (the report's W).
pub const DEFAULT_WINDOW: usize = 128;

/// Threads per block of the elementwise and row-per-thread kernels.
const ROW_BLOCK: u32 = 256;
/// Grid y and z limit.
const GRID_YZ: usize = 65535;
const I32: usize = i32::MAX as usize;

const HEAD_SIZE: &str = "HS in {32, 64, 128}";
const SCORES: &str = "B * NH * T * T < 2^31";
const REDUCTION_GRID: &str = "B * NH <= 65535";
const GRID: &str = "NH <= 65535 and B <= 65535";
const WINDOW: &str = "1 <= W <= 1024";

/// How a stage runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// permute, preatt, softmax, compute_att, unpermute through the [`Scratch`] buffers. Without
    /// `reduce` preatt and compute_att give one thread each (batch, head) pair; with it, one block
    /// each output element (tree reduction) and softmax one block per row.
    Unfused { reduce: bool },
    /// One fused kernel, one block per (token, head, batch), over a window of W keys.
    Local,
    /// FlashAttention-2 with `FA_BR` x `FA_BC` tiles of `FA_BR * FA_BC` threads; `tuned` also writes
    /// the logsumexp.
    Flash { tuned: bool },
    /// FlashAttention-2 on `mma.sync` (bf16): `TC_BR` query rows per block of `TC_BR / 16` warps,
    /// key tiles of `TC_BC`; writes the logsumexp.
    TensorCore,
}

impl Plan {
    fn writes_lse(self) -> bool {
        matches!(self, Plan::Flash { tuned: true } | Plan::TensorCore)
    }
}

/// The stage list: each stage with its launch plan.
fn stages() -> Vec<Variant> {
    let k = |stage, name, file, plan: Plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Fp32, summary).with_plan(plan)
    };
    let flash = [("FA_BR", 16), ("FA_BC", 16)];
    vec![
        k(
            0,
            "baseline",
            "prefill/00_baseline.cu",
            Plan::Unfused { reduce: false },
            "5 kernels: permute, QK^T, softmax, att.V, unpermute; QK^T and att.V one thread per (batch, head)",
        ),
        k(
            1,
            "unrolled",
            "prefill/01_unrolled.cu",
            Plan::Unfused { reduce: false },
            "#pragma unroll 8 on the QK^T and att.V inner loops",
        ),
        k(
            2,
            "reduction",
            "prefill/02_reduction.cu",
            Plan::Unfused { reduce: true },
            "a block per output element, shared-memory tree over HS (QK^T) or T (att.V); a block per softmax row",
        ),
        k(
            3,
            "local-window",
            "prefill/03_local_window.cu",
            Plan::Local,
            "fused local attention over the last W keys, a block per (token, head, batch); windowed reference",
        ),
        k(
            4,
            "flash-v2",
            "prefill/04_flash_v2.cu",
            Plan::Flash { tuned: false },
            "FlashAttention-2 (online softmax), Br=Bc=16, 256 threads, static shared tiles, tree row max/sum",
        )
        .with_tunables(&flash),
        k(
            5,
            "flash-v2-tuned",
            "prefill/05_flash_v2_tuned.cu",
            Plan::Flash { tuned: true },
            "one dynamic shared buffer (padded tiles), warp-shuffle row max/sum, O/m/l in registers, fused 1/l store, lse",
        )
        .with_tunables(&flash),
        Variant::kernel(
            FAMILY,
            OP,
            6,
            "tensor-core",
            "prefill/06_tensor_core.cu",
            Precision::Bf16,
            "FlashAttention-2 on mma.sync m16n8k16 (bf16 operands, fp32 softmax): 4 warps x 16 query rows, key tiles of 64, P kept in registers",
        )
        .with_plan(Plan::TensorCore)
        .with_tunables(&[("TC_BR", 64), ("TC_BC", 64)])
        .with_requirements(Requirements::SM80),
    ]
}

/// The intermediate buffers of the unfused stages (0–2): q, k, v and the att·V result y as
/// `[B, NH, T, HS]`, the raw scores `preatt` and the probabilities `att` as `[B, NH, T, T]`.
struct Scratch {
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    y: CudaSlice<f32>,
    preatt: CudaSlice<f32>,
    att: CudaSlice<f32>,
}

impl Scratch {
    /// Allocates NaN-poisoned scratch for `d` (whose `B*NH*T*T` was checked against 2^31).
    fn new(gpu: &Gpu, d: Dims) -> Result<Scratch> {
        let (heads, scores) = (d.b * d.t * d.c, d.b * d.nh * d.t * d.t);
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
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        for buf in [&mut self.q, &mut self.k, &mut self.v, &mut self.y, &mut self.preatt, &mut self.att] {
            gpu.poison(buf)?;
        }
        Ok(())
    }
}

/// The constraints every stage shares: sizes, `C % NH`, the head size, int indices into qkv.
fn check_dims(d: Dims) -> Result<()> {
    d.check(&HEAD_SIZES, HEAD_SIZE)
}

/// The sizes of one prefill call and the local stage's window W (ignored by the others).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillDims {
    pub dims: Dims,
    pub window: usize,
}

/// Shape constraints of stage `v` at `d`: what its header's `Limits:` line documents.
pub fn check_shape(v: &Variant, d: PrefillDims) -> Result<()> {
    let plan = v.plan::<Plan>()?;
    let dims = d.dims;
    check_dims(dims)?;
    let Dims { b, t, nh, .. } = dims;
    match plan {
        Plan::Unfused { reduce } => {
            let scores = b.checked_mul(nh).and_then(|x| x.checked_mul(t)).and_then(|x| x.checked_mul(t));
            require(scores.is_some_and(|n| n <= I32), SCORES, || format!("B={b}, NH={nh}, T={t}"))?;
            if reduce {
                require(b * nh <= GRID_YZ, REDUCTION_GRID, || format!("B*NH = {}", b * nh))?;
            }
        }
        Plan::Local | Plan::Flash { .. } | Plan::TensorCore => {
            require(nh <= GRID_YZ && b <= GRID_YZ, GRID, || format!("NH = {nh}, B = {b}"))?;
        }
    }
    if plan == Plan::Local {
        require((1..=1024).contains(&d.window), WINDOW, || format!("W = {}", d.window))?;
    }
    Ok(())
}

/// The smallest power of two >= n, clamped to [32, 1024]: the block of a tree reduction over n.
fn tree_block(n: usize) -> u32 {
    n.clamp(32, 1024).next_power_of_two() as u32
}

/// The unfused stages' five kernels and their scratch.
struct Unfused {
    permute: Launch,
    preatt: Launch,
    softmax: Launch,
    compute_att: Launch,
    unpermute: Launch,
    scratch: Scratch,
}

/// How a prepared stage runs.
enum Stage {
    Unfused(Box<Unfused>),
    Local(Launch),
    Flash { launch: Launch, lse: bool },
}

/// A prefill stage prepared for one size: its kernels and, for the unfused stages, their scratch.
pub struct Prepared {
    stage: Stage,
    d: PrefillDims,
}

/// The buffers of one prefill call.
pub struct PrefillArgs<'a> {
    pub out: &'a mut CudaSlice<f32>,
    /// Logsumexp of each row's scaled scores, `[B, NH, T]`: required by the stages that write it
    /// (flash-v2-tuned), ignored by the others.
    pub lse: Option<&'a mut CudaSlice<f32>>,
    pub qkv: &'a CudaSlice<f32>,
}

/// Prepares stage `v` for `d`: checks the shape, configures its kernels, allocates its scratch.
pub fn prepare(gpu: &Gpu, v: &Variant, d: PrefillDims) -> Result<Prepared> {
    check_shape(v, d)?;
    let dims = d.dims;
    let hs = dims.hs();
    let (bu, tu, nhu, hsu) = (dims.b as u32, dims.t as u32, dims.nh as u32, hs as u32);
    let launch = |entry: &str, shape: LaunchShape| gpu.prepare_launch(&SOURCES, v, entry, shape);
    let stage = match v.plan::<Plan>()? {
        Plan::Unfused { reduce } => {
            let elementwise = LaunchShape::linear(((dims.b * dims.t * dims.c) as u32).div_ceil(ROW_BLOCK), ROW_BLOCK);
            let (preatt, softmax, compute_att) = if reduce {
                let p = tree_block(dims.t);
                (
                    LaunchShape::new((tu, tu, bu * nhu), (hsu, 1, 1)).with_shared(4 * hsu),
                    LaunchShape::new((tu, nhu, bu), (p, 1, 1)).with_shared(4 * p),
                    LaunchShape::new((hsu, tu, bu * nhu), (p, 1, 1)).with_shared(4 * p),
                )
            } else {
                let heads = LaunchShape::new((nhu.div_ceil(32), bu.div_ceil(32), 1), (32, 32, 1));
                let rows = LaunchShape::linear(((dims.b * dims.nh * dims.t) as u32).div_ceil(ROW_BLOCK), ROW_BLOCK);
                (heads, rows, heads)
            };
            Stage::Unfused(Box::new(Unfused {
                permute: launch("attention_permute", elementwise)?,
                preatt: launch("attention_preatt", preatt)?,
                softmax: launch("attention_softmax", softmax)?,
                compute_att: launch("attention_compute_att", compute_att)?,
                unpermute: launch("attention_unpermute", elementwise)?,
                scratch: Scratch::new(gpu, dims)?,
            }))
        }
        Plan::Local => {
            let p = tree_block(d.window);
            Stage::Local(launch(
                "attention_local",
                LaunchShape::new((tu, nhu, bu), (p, 1, 1)).with_shared(4 * (2 * p + hsu)),
            )?)
        }
        Plan::Flash { tuned } => {
            let (br, bc) = (v.tunable("FA_BR")?, v.tunable("FA_BC")?);
            let shape = LaunchShape::new((tu.div_ceil(br), nhu, bu), (br * bc, 1, 1));
            if tuned {
                // Q and K tiles padded to D+1 floats, the V tile and the score tile.
                let floats = br * (hsu + 1) + bc * (hsu + 1) + bc * hsu + br * bc;
                let entry = format!("attention_flash_v2_tuned_hs{hs}");
                Stage::Flash { launch: launch(&entry, shape.with_shared(4 * floats))?, lse: true }
            } else {
                Stage::Flash { launch: launch(&format!("attention_flash_v2_hs{hs}"), shape)?, lse: false }
            }
        }
        Plan::TensorCore => {
            let (br, bc) = (v.tunable("TC_BR")?, v.tunable("TC_BC")?);
            // bf16 tiles of Q, K and V, each row padded by 8 elements.
            let bytes = 2 * (br + 2 * bc) * (hsu + 8);
            let shape = LaunchShape::new((tu.div_ceil(br), nhu, bu), (br / 16 * 32, 1, 1)).with_shared(bytes);
            Stage::Flash { launch: launch(&format!("attention_flash_tc_hs{hs}"), shape)?, lse: true }
        }
    };
    Ok(Prepared { stage, d })
}

impl Prepared {
    /// NaN-fills the unfused stages' scratch (nothing for the others).
    pub fn poison_scratch(&mut self, gpu: &Gpu) -> Result<()> {
        match &mut self.stage {
            Stage::Unfused(u) => u.scratch.poison(gpu),
            _ => Ok(()),
        }
    }

    /// Enqueues the stage (all of its kernels) on `stream` after checking the buffers.
    pub fn enqueue(&self, stream: &CudaStream, a: PrefillArgs) -> Result<()> {
        let d = self.d.dims;
        require_len("qkv", a.qkv.len(), d.b * d.t * 3 * d.c)?;
        require_len("out", a.out.len(), d.b * d.t * d.c)?;
        let hs = d.hs();
        let scale = Arg::F32(1.0 / (hs as f32).sqrt());
        let (b, t, nh, hs_i) = (Arg::int(d.b), Arg::int(d.t), Arg::int(d.nh), Arg::int(hs));
        let (out, qkv) = (Arg::buf(a.out), Arg::buf(a.qkv));
        // SAFETY: each entry's arguments are listed in its signature's order; qkv and out lengths were
        // checked above, the scratch was allocated for these sizes, and the indices stay below 2^31
        // (check_shape at prepare).
        unsafe {
            match &self.stage {
                Stage::Unfused(u) => {
                    let Unfused { permute, preatt, softmax, compute_att, unpermute, scratch: s } = u.as_ref();
                    let (q, k, v, y) = (Arg::buf(&s.q), Arg::buf(&s.k), Arg::buf(&s.v), Arg::buf(&s.y));
                    let (pre, att) = (Arg::buf(&s.preatt), Arg::buf(&s.att));
                    permute.enqueue(stream, &[q, k, v, qkv, b, t, nh, hs_i])?;
                    preatt.enqueue(stream, &[pre, q, k, b, t, nh, hs_i])?;
                    softmax.enqueue(stream, &[att, pre, b, t, nh, scale])?;
                    compute_att.enqueue(stream, &[y, att, v, b, t, nh, hs_i])?;
                    unpermute.enqueue(stream, &[out, y, b, t, nh, hs_i])
                }
                Stage::Local(l) => l.enqueue(stream, &[out, qkv, b, t, nh, hs_i, Arg::int(self.d.window), scale]),
                Stage::Flash { launch, lse: false } => launch.enqueue(stream, &[out, qkv, b, t, nh, scale]),
                Stage::Flash { launch, lse: true } => {
                    let lse = a.lse.ok_or_else(|| {
                        Error::constraint("an lse buffer of B*NH*T for a stage that writes lse", "lse = None")
                    })?;
                    require_len("lse", lse.len(), d.b * d.nh * d.t)?;
                    launch.enqueue(stream, &[out, Arg::buf(lse), qkv, b, t, nh, scale])
                }
            }
        }
    }
}

impl PreparedStage for Prepared {
    fn resources(&self) -> Vec<ResourceUse> {
        let launches = match &self.stage {
            Stage::Unfused(u) => vec![&u.permute, &u.preatt, &u.softmax, &u.compute_att, &u.unpermute],
            Stage::Local(l) | Stage::Flash { launch: l, .. } => vec![l],
        };
        launches.into_iter().map(|l| l.resources().clone()).collect()
    }
}

/// The op's shape (`C = NH * HS`) and window from shape keys B, T, NH, HS and W (default 128).
pub fn shape_dims(shape: &Shape) -> Result<PrefillDims> {
    let window = match shape.get("W") {
        Some(_) => shape.dim("W", I32 as i64)?,
        None => DEFAULT_WINDOW,
    };
    Ok(PrefillDims { dims: Dims::from_shape(shape)?, window })
}

fn shape(b: i64, t: i64, nh: i64, hs: i64, w: i64) -> Shape {
    Shape::new(&[("B", b), ("T", t), ("NH", nh), ("HS", hs), ("W", w)])
}

impl Op for Prefill {
    fn default_shapes(&self) -> Vec<Shape> {
        [1024, 64, 256].iter().map(|&t| shape(4, t, 12, 64, DEFAULT_WINDOW as i64)).collect()
    }
    fn validate(&self, v: &Variant, shape: &Shape) -> Result<()> {
        check_shape(v, shape_dims(shape)?)
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        let mut limits = vec![
            Limit { constraint: ELEMS, past: shape(1, 1 << 22, 4, 128, 8), inside: None },
            Limit { constraint: HEAD_SIZE, past: shape(1, 8, 2, 256, 8), inside: Some(shape(1, 8, 2, 128, 8)) },
        ];
        match v.plan::<Plan>() {
            Ok(Plan::Unfused { reduce }) => {
                limits.push(Limit { constraint: SCORES, past: shape(1, 46341, 1, 32, 8), inside: None });
                if reduce {
                    let past = shape(1, 1, 65536, 32, 8);
                    limits.push(Limit { constraint: REDUCTION_GRID, past, inside: Some(shape(1, 1, 65535, 32, 8)) });
                }
            }
            Ok(plan) => {
                let (past, inside) = (shape(65536, 1, 1, 32, 8), shape(65535, 1, 1, 32, 8));
                limits.push(Limit { constraint: GRID, past, inside: Some(inside) });
                if plan == Plan::Local {
                    let (past, inside) = (shape(1, 8, 2, 32, 1025), shape(1, 8, 2, 32, 1024));
                    limits.push(Limit { constraint: WINDOW, past, inside: Some(inside) });
                }
            }
            Err(_) => {}
        }
        limits
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let pd = shape_dims(shape)?;
        let (dims, window) = (pd.dims, pd.window);
        check_dims(dims)?;
        let Dims { b, t, c, nh } = dims;
        // Scores q.k/sqrt(HS) with a spread of ~1.3: softmax rows neither flat nor one-hot.
        let host_qkv = uniform(b * t * 3 * c, -2.0, 2.0, seed);
        let full = causal_attention(&host_qkv, dims, None);
        let copies = rotation_copies(gpu, 4 * (b * t * 4 * c + b * nh * t) as u64);
        Ok(Box::new(PrefillProblem {
            dims,
            window,
            qkv: Rotated::upload(gpu, &host_qkv, copies)?,
            out: Rotated::outputs(gpu, b * t * c, copies)?,
            lse: Rotated::outputs(gpu, b * nh * t, copies)?,
            host_qkv,
            full,
            windowed: None,
            lse_magnitude: None,
            copies,
            prepared: Current::default(),
        }))
    }
}

struct PrefillProblem {
    dims: Dims,
    window: usize,
    qkv: Rotated<f32>,
    out: Rotated<f32>,
    lse: Rotated<f32>,
    host_qkv: Vec<f32>,
    /// Full causal attention: (out, lse).
    full: (Vec<f64>, Vec<f64>),
    /// Windowed attention's out, computed on first use by the local stage.
    windowed: Option<Vec<f64>>,
    /// Each row's score magnitude (`reference::score_magnitude`), the scale lse is checked against;
    /// computed on first use by a stage that writes lse.
    lse_magnitude: Option<Vec<f64>>,
    copies: usize,
    prepared: Current<Prepared>,
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
        match self.prepared.get_mut() {
            Ok((_, p)) => p.poison_scratch(gpu),
            Err(_) => Ok(()),
        }
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        let d = PrefillDims { dims: self.dims, window: self.window };
        Ok(self.prepared.set(v, prepare(gpu, v, d)?))
    }
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let args =
            PrefillArgs { out: self.out.get_mut(copy), lse: Some(self.lse.get_mut(copy)), qkv: self.qkv.get(copy) };
        p.enqueue(stream, args)
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        let out = gpu.download(self.out.get(copy))?;
        let plan = v.plan::<Plan>()?;
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
            // lse against the magnitude of its row's scores, not against itself: a row's lse can be
            // ~0 (at T = 1 it is the one score q.k * scale) while its rounding error is not.
            let (qkv, dims) = (&self.host_qkv, self.dims);
            let magnitude = self.lse_magnitude.get_or_insert_with(|| score_magnitude(qkv, dims, None));
            let lse = gpu.download(self.lse.get(copy))?;
            ver.outputs.push(compare_scaled("lse", &lse, &self.full.1, magnitude));
        }
        Ok(ver)
    }
}
