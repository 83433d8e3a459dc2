//! `matmul/linear-fp8`: the linear layer on e4m3 tensor cores (issue 48, item 2), `out[M, N] =
//! dequant(A)[M, K] · dequant(W)[N, K]ᵀ (+ bias)` with A and W in [`crate::fp8`]'s format: activations
//! with one fp32 scale per row per 128 channels, weights one per 128 × 128 block (DeepGEMM's scheme).
//! A stage is checked against the f64 product of the dequantized operands, so the kernel's error
//! stands apart from the format's; the format's (the same product on the unquantized operands
//! against the exact layer) is the check's note.
//!
//! Shape keys: `M`, `N`, `K`, `bias` (0/1).
//!
//! The stages carry the bf16 precision preset: its tolerance (1e-2, which the exact e4m3 products
//! and fp32 promotion meet by two orders) and, until an FP8 GEMM ceiling is measured, its ceiling: a
//! table's `% ceil` reads an FP8 row against the bf16 GEMM rate.

use common::check::{compare, Verification};
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rotation_copies, Rotated};
use common::{
    require, require_len, Arg, Bound, Gpu, Launch, LaunchShape, Limit, Op, OpInfo, Precision, Prepared as Current,
    PreparedStage, Problem, Requirements, ResourceUse, Result, Shape, Variant, Workload,
};

use crate::gemm::Dims;
use crate::linear::{inputs, verify_rows};
use crate::reference::{linear_rows, sampled_rows};
use crate::{fp8, FAMILY, SOURCES};

const OP: &str = "linear-fp8";
const TILE: usize = 128;
const K_ALIGN: &str = "K % 16 == 0";
const ROWS: &str = "M <= 65535 * 128";

/// How a stage runs its K loop; the entry and the block size follow from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Two consumer warpgroups, one of whose threads also refills the ring after a block barrier.
    Cooperative,
    /// A producer warpgroup and two consumers on full/empty barriers.
    WarpSpecialized,
}

impl Plan {
    fn entry(self) -> &'static str {
        match self {
            Plan::Cooperative => "linear_fp8_wgmma",
            Plan::WarpSpecialized => "linear_fp8_ws",
        }
    }
    fn threads(self) -> u32 {
        match self {
            Plan::Cooperative => 256,
            Plan::WarpSpecialized => 384,
        }
    }
    /// Mbarriers a ring stage: `full`, and with a producer `empty`.
    fn barriers(self) -> u32 {
        match self {
            Plan::Cooperative => 1,
            Plan::WarpSpecialized => 2,
        }
    }
}

fn stages() -> Vec<Variant> {
    let k = |stage, name, file, plan: Plan, summary| {
        Variant::kernel(FAMILY, OP, stage, name, file, Precision::Bf16, summary)
            .with_plan(plan)
            .with_tunables(&[("WG_STAGES", 4)])
            .with_requirements(Requirements::SM90A)
    };
    vec![
        k(
            0,
            "wgmma-scaled",
            "linear-fp8/00_wgmma_scaled.cu",
            Plan::Cooperative,
            "linear-bf16 stage 7's frame on e4m3: TMA tiles of 128 x 128 codes, 4 wgmma.m64n128k32.e4m3 a K step into a fresh tile, promoted into fp32 times the step's row and block scales",
        ),
        k(
            1,
            "warp-specialized",
            "linear-fp8/01_warp_specialized.cu",
            Plan::WarpSpecialized,
            "stage 0 with a producer warpgroup on full/empty barriers: no block barrier in the K loop, a stage refilled as soon as both consumers let it go",
        ),
    ]
}

/// The sizes of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearFp8Dims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub bias: bool,
}

impl LinearFp8Dims {
    fn of(s: &Shape) -> Result<LinearFp8Dims> {
        let big = i32::MAX as i64;
        let bias = s.get("bias").unwrap_or(1);
        require(bias == 0 || bias == 1, "bias in {0, 1}", || format!("bias = {bias}"))?;
        Ok(LinearFp8Dims { m: s.dim("M", big)?, n: s.dim("N", big)?, k: s.dim("K", big)?, bias: bias == 1 })
    }
}

pub fn check_shape(d: LinearFp8Dims) -> Result<()> {
    for (key, x) in [("M", d.m), ("N", d.n), ("K", d.k)] {
        require(x >= 1, &format!("{key} >= 1"), || format!("{key} = {x}"))?;
    }
    for (what, a, b) in [("M * K < 2^31", d.m, d.k), ("N * K < 2^31", d.n, d.k), ("M * N < 2^31", d.m, d.n)] {
        require(a.checked_mul(b).is_some_and(|x| x < 1 << 31), what, || format!("{a} x {b}"))?;
    }
    require(d.m <= 65535 * TILE, ROWS, || format!("M = {}", d.m))?;
    require(d.k.is_multiple_of(16), K_ALIGN, || format!("K = {}", d.k))
}

/// A stage prepared for one size.
pub struct Prepared {
    launch: Launch,
    d: LinearFp8Dims,
}

pub fn prepare(gpu: &Gpu, v: &Variant, d: LinearFp8Dims) -> Result<Prepared> {
    check_shape(d)?;
    let plan = v.plan::<Plan>()?;
    let stages = v.tunable("WG_STAGES")?;
    // Two operand tiles of 128 x 128 codes a stage, 1 KiB for the swizzle's alignment, the barriers.
    let shared = stages * 2 * (TILE * TILE) as u32 + 1024 + 8 * plan.barriers() * stages;
    let grid = (d.n.div_ceil(TILE) as u32, d.m.div_ceil(TILE) as u32, 1);
    let shape = LaunchShape::new(grid, (plan.threads(), 1, 1)).with_shared(shared);
    Ok(Prepared { launch: gpu.prepare_launch(&SOURCES, v, plan.entry(), shape)?, d })
}

/// The buffers of one call: `out` M·N; A's codes M·K and scales `[M, ceil(K / 128)]`
/// ([`fp8::Fp8Rows`]); W's codes N·K and scales `[ceil(N / 128), ceil(K / 128)]`
/// ([`fp8::Fp8Blocks`]); `bias` N.
pub struct LinearFp8Args<'a> {
    pub out: &'a mut CudaSlice<f32>,
    pub a_codes: &'a CudaSlice<u8>,
    pub a_scales: &'a CudaSlice<f32>,
    pub w_codes: &'a CudaSlice<u8>,
    pub w_scales: &'a CudaSlice<f32>,
    pub bias: Option<&'a CudaSlice<f32>>,
}

impl Prepared {
    pub fn enqueue(&self, stream: &CudaStream, a: LinearFp8Args) -> Result<()> {
        let d = self.d;
        let g = fp8::groups(d.k);
        require_len("out", a.out.len(), d.m * d.n)?;
        require_len("a_codes", a.a_codes.len(), d.m * d.k)?;
        require_len("a_scales", a.a_scales.len(), d.m * g)?;
        require_len("w_codes", a.w_codes.len(), d.n * d.k)?;
        require_len("w_scales", a.w_scales.len(), fp8::groups(d.n) * g)?;
        require(a.bias.is_some() == d.bias, "bias given exactly when prepared with one", || {
            format!("bias given: {}", a.bias.is_some())
        })?;
        if let Some(b) = a.bias {
            require_len("bias", b.len(), d.n)?;
        }
        let map_a = common::tma::e4m3_map(common::device_ptr(a.a_codes), d.m, d.k, TILE as u32)?;
        let map_b = common::tma::e4m3_map(common::device_ptr(a.w_codes), d.n, d.k, TILE as u32)?;
        let args = [
            Arg::value(&map_a),
            Arg::value(&map_b),
            Arg::buf(a.out),
            Arg::buf(a.a_scales),
            Arg::buf(a.w_scales),
            Arg::Ptr(a.bias.map_or(0, common::device_ptr)),
            Arg::int(d.m),
            Arg::int(d.n),
            Arg::int(d.k),
        ];
        // SAFETY: the arguments follow both entries' signature; lengths checked above, the maps
        // cover exactly the codes (K % 16 == 0 at prepare: 16-byte row strides).
        unsafe { self.launch.enqueue(stream, &args) }
    }
}

impl PreparedStage for Prepared {
    fn resources(&self) -> Vec<ResourceUse> {
        vec![self.launch.resources().clone()]
    }
}

pub fn shape(m: i64, n: i64, k: i64, bias: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("bias", bias)])
}

static INFO: OpInfo = OpInfo {
    family: FAMILY,
    name: OP,
    description: "linear layer on e4m3 tensor cores: out = dequant(A) . dequant(W)^T + bias, A with 1 x 128 row scales, W with 128 x 128 block scales",
    sources: &SOURCES,
    shape_keys: &["M", "N", "K", "bias"],
    stages,
};

pub struct LinearFp8;

impl Op for LinearFp8 {
    fn info(&self) -> &'static OpInfo {
        &INFO
    }
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2's four block linears at B = 4, T = 1024, its LM head, and the square 4096^3 and 8192^3.
        vec![
            shape(4096, 2304, 768, 1),
            shape(4096, 768, 768, 1),
            shape(4096, 3072, 768, 1),
            shape(4096, 768, 3072, 1),
            shape(4096, 50257, 768, 0),
            shape(4096, 4096, 4096, 0),
            shape(8192, 8192, 8192, 0),
        ]
    }
    fn validate(&self, _: &Variant, s: &Shape) -> Result<()> {
        check_shape(LinearFp8Dims::of(s)?)
    }
    fn limits(&self, _: &Variant) -> Vec<Limit> {
        vec![
            Limit { constraint: K_ALIGN, past: shape(3, 40, 40, 1), inside: Some(shape(3, 40, 48, 1)) },
            Limit { constraint: ROWS, past: shape(65535 * 128 + 1, 1, 16, 1), inside: None },
            Limit { constraint: "M * K < 2^31", past: shape(1 << 16, 8, 1 << 15, 1), inside: None },
            Limit { constraint: "N * K < 2^31", past: shape(8, 1 << 16, 1 << 15, 1), inside: None },
            Limit { constraint: "M * N < 2^31", past: shape(1 << 16, 1 << 15, 16, 1), inside: None },
        ]
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        let d = LinearFp8Dims::of(s)?;
        check_shape(d)?;
        let (x, w, b) = inputs(Dims { m: d.m, n: d.n, k: d.k }, seed);
        let (qa, qw) = (fp8::quantize_rows(&x, d.m, d.k), fp8::quantize_blocks(&w, d.n, d.k));
        let rows = sampled_rows(d.m, d.n, d.k, seed ^ 4);
        let bias = d.bias.then_some(&b[..]);
        let reference = linear_rows(&qa.dequantize(), &qw.dequantize(), bias, d.n, d.k, &rows);
        let exact = linear_rows(&x, &w, bias, d.n, d.k, &rows);
        let format_error = compare("format", &reference, &exact).rel_l2;
        let copies = rotation_copies(gpu, (d.m * d.k + d.n * d.k + 4 * d.m * d.n) as u64);
        Ok(Box::new(LinearFp8Problem {
            d,
            a_codes: Rotated::upload(gpu, &qa.codes, copies)?,
            a_scales: Rotated::upload(gpu, &qa.scales, copies)?,
            w_codes: Rotated::upload(gpu, &qw.codes, copies)?,
            w_scales: Rotated::upload(gpu, &qw.scales, copies)?,
            bias: if d.bias { Some(gpu.upload(&b)?) } else { None },
            out: Rotated::outputs(gpu, d.m * d.n, copies)?,
            rows,
            reference,
            format_error,
            copies,
            prepared: Current::default(),
        }))
    }
}

struct LinearFp8Problem {
    d: LinearFp8Dims,
    a_codes: Rotated<u8>,
    a_scales: Rotated<f32>,
    w_codes: Rotated<u8>,
    w_scales: Rotated<f32>,
    bias: Option<CudaSlice<f32>>,
    out: Rotated<f32>,
    rows: Vec<usize>,
    /// The f64 product of the dequantized operands on `rows`: what the kernel must match.
    reference: Vec<f64>,
    /// That product's relative L2 distance from the layer on unquantized operands.
    format_error: f64,
    copies: usize,
    prepared: Current<Prepared>,
}

impl Problem for LinearFp8Problem {
    fn workload(&self) -> Workload {
        let LinearFp8Dims { m, n, k, bias } = self.d;
        let g = fp8::groups(k);
        let scales = 4 * (m * g + fp8::groups(n) * g);
        let bytes = m * k + n * k + scales + 4 * m * n + if bias { 4 * n } else { 0 };
        Workload { bytes: bytes as u64, flops: (2 * m * n * k) as u64, bound: Bound::Compute(Precision::Bf16) }
    }
    fn copies(&self) -> usize {
        self.copies
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out.poison(gpu)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        Ok(self.prepared.set(v, prepare(gpu, v, self.d)?))
    }
    fn enqueue(&mut self, stream: &CudaStream, copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let args = LinearFp8Args {
            out: self.out.get_mut(copy),
            a_codes: self.a_codes.get(copy),
            a_scales: self.a_scales.get(copy),
            w_codes: self.w_codes.get(copy),
            w_scales: self.w_scales.get(copy),
            bias: self.bias.as_ref(),
        };
        p.enqueue(stream, args)
    }
    fn verify(&mut self, gpu: &Gpu, copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        let d = Dims { m: self.d.m, n: self.d.n, k: self.d.k };
        let out = self.out.get(copy).as_view();
        Ok(verify_rows(gpu, v, &out, &self.reference, &self.rows, d)?
            .with_note(format!("format: e4m3 A and W against the unquantized layer, rel L2 {:.2e}", self.format_error)))
    }
}
