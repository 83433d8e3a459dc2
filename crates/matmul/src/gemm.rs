//! The launch code both ops share: shape checks, the [`Workspace`] (scratch buffers and library
//! handles), each GEMM stage's kernel sequence, the element-wise kernels and the library calls.
//! The ops' launch functions validate their buffers and then come here with raw device addresses.

use common::blas::{self, GemmPrecision};
use common::cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg, ValidAsZeroBits};
use common::{require, DriverContext, Error, Gpu, LaunchShape, Precision, Result, Variant};

use crate::lt::{Lt, LtEpilogue, LtOperands};
use crate::FAMILY;

/// The WMMA tile edge; the WMMA stages pad M, N and K to multiples of it.
pub const WMMA_TILE: usize = 16;
/// Warps per block of the stage-4 WMMA kernel without `BLOCK_TILE` (`MM_M3_WARPS` in
/// matmul_wmma.cuh).
pub const M3_WARPS: usize = 32;
/// The block-tiled stage-4 kernel (`BLOCK_TILE`), mirroring matmul_wmma.cuh's `MM_BT_*`: block tile
/// `M3_BT_BM × M3_BT_BN`, k-tile `M3_BT_BK`, 256 threads, rows of the shared tiles padded by 8 halves.
pub const M3_BT_BM: usize = 128;
pub const M3_BT_BN: usize = 128;
pub const M3_BT_BK: usize = 32;
pub const M3_BT_THREADS: usize = 256;
const M3_BT_PAD: usize = 8;

/// Dynamic shared memory of the block-tiled stage-4 kernel: `stages` pipeline stages (3 with
/// `DOUBLE_BUFFER`, else 1) of one fp16 A tile (BM × (BK+8)) and one B tile (BK × (BN+8)).
/// The kernel traps if it is launched with less than its own `MM_BT_SMEM_BYTES`.
pub fn m3_block_tile_smem_bytes(stages: usize) -> usize {
    stages * 2 * (M3_BT_BM * (M3_BT_BK + M3_BT_PAD) + M3_BT_BK * (M3_BT_BN + M3_BT_PAD))
}
/// Largest M: the WMMA stage 3 and the naive kernel put M/16 blocks on grid y (at most 65535).
pub const MAX_M: usize = 65535 * 16;
/// Largest K: the transpose kernels put K/32 blocks on grid y.
pub const MAX_K: usize = 65535 * 32;

/// The sizes of one linear call: `out[m, n] = inp[m, k] · w[n, k]ᵀ`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

fn round16(x: usize) -> usize {
    x.div_ceil(WMMA_TILE) * WMMA_TILE
}

impl Dims {
    /// Each size rounded up to the WMMA tile.
    pub fn padded(self) -> Dims {
        Dims { m: round16(self.m), n: round16(self.n), k: round16(self.k) }
    }

    pub fn macs(self) -> u64 {
        self.m as u64 * self.n as u64 * self.k as u64
    }
}

/// The size constraints every stage shares: M, N, K ≥ 1; every matrix (padded to 16 for the WMMA
/// stages) indexable with 32-bit element offsets; grid-dimension limits.
pub fn check_dims(d: Dims) -> Result<()> {
    for (name, v) in [("M", d.m), ("N", d.n), ("K", d.k)] {
        require(v >= 1, &format!("{name} >= 1"), || format!("{name} = {v}"))?;
    }
    let p = d.padded();
    for (name, a, b) in [("M*K", p.m, p.k), ("N*K", p.n, p.k), ("M*N", p.m, p.n)] {
        let ok = a.checked_mul(b).is_some_and(|x| x <= i32::MAX as usize);
        require(ok, &format!("{name} < 2^31 with M, N, K rounded up to 16 (32-bit element offsets)"), || {
            format!("{name} = {a} * {b}")
        })?;
    }
    require(d.m <= MAX_M, &format!("M <= {MAX_M} (grid y limit)"), || format!("M = {}", d.m))?;
    require(d.k <= MAX_K, &format!("K <= {MAX_K} (grid y limit)"), || format!("K = {}", d.k))
}

/// `len(name) == want` as a typed constraint.
pub(crate) fn check_len(name: &str, len: usize, want: usize) -> Result<()> {
    require(len == want, &format!("len({name}) == {want}"), || format!("len({name}) = {len}"))
}

/// How a stage computes the GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gemm {
    Naive,
    SmemTiled,
    RegisterTiled,
    WmmaM2,
    /// Stage 4; its preprocessing (fused or not) follows the variant's `FUSED_PREP` define.
    WmmaM3,
    Cublas(GemmPrecision),
}

/// Device addresses of one call; `bias` and `residual` are 0 when absent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ptrs {
    pub out: u64,
    pub inp: u64,
    pub w: u64,
    pub bias: u64,
    pub residual: u64,
}

/// Scratch buffers (fp16 copies of the operands, the fp32 transposed weights of stage 3, the fp16
/// output of the cuBLAS fp16 row) and the cuBLASLt handle. Owned by the caller and reused across
/// launches; a buffer is only reallocated when a larger problem needs more room.
#[derive(Default)]
pub struct Workspace {
    a16: Option<CudaSlice<u16>>,
    b16: Option<CudaSlice<u16>>,
    c16: Option<CudaSlice<u16>>,
    wt32: Option<CudaSlice<f32>>,
    lt: Option<Lt>,
}

impl Workspace {
    pub fn new() -> Workspace {
        Workspace::default()
    }

    pub(crate) fn lt(&mut self, gpu: &Gpu) -> Result<&mut Lt> {
        if self.lt.is_none() {
            self.lt = Some(Lt::new(gpu)?);
        }
        Ok(self.lt.as_mut().expect("just created"))
    }
}

fn slot<T: DeviceRepr + ValidAsZeroBits>(gpu: &Gpu, slot: &mut Option<CudaSlice<T>>, len: usize) -> Result<u64> {
    let grow = match slot.as_ref() {
        Some(s) => s.len() < len,
        None => true,
    };
    if grow {
        *slot = None;
        *slot = Some(gpu.zeros(len)?);
    }
    Ok(gpu.ptr(slot.as_ref().expect("just allocated")))
}

/// One kernel argument.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    P(u64),
    I(i32),
}

/// Launches `entry` of `v`'s module with `args`, after [`common::Kernel::config`] validated the
/// launch shape.
pub(crate) fn launch(gpu: &Gpu, v: &Variant, entry: &str, shape: LaunchShape, args: &[Arg]) -> Result<()> {
    let kernel = gpu.kernel(crate::sources(), v, entry)?;
    let cfg = kernel.config(gpu, shape)?;
    let mut b = gpu.stream().launch_builder(kernel.function());
    for a in args {
        match a {
            Arg::P(p) => b.arg(p),
            Arg::I(i) => b.arg(i),
        };
    }
    // SAFETY: every entry point's argument list is built to match its signature in kernels/, and
    // the launchers checked the buffer lengths against the sizes passed.
    unsafe { b.launch(cfg) }.map(|_| ()).ctx(entry)
}

/// One thread per element over `count` elements, 256 per block.
pub(crate) fn elementwise(count: usize) -> LaunchShape {
    LaunchShape::linear(count.div_ceil(256) as u32, 256)
}

/// The module the library rows borrow their helper kernels from (bias, conversions): every stage
/// file of `linear` includes matmul_aux.cuh, and the naive one is the cheapest to compile.
pub(crate) fn aux() -> Variant {
    Variant::kernel(
        FAMILY,
        "linear",
        0,
        "aux",
        "linear/00_naive.cu",
        Precision::Fp32,
        "helper kernels (bias, fp16 conversion) for the library rows",
    )
}

fn i(x: usize) -> Arg {
    Arg::I(x as i32)
}

/// Runs GEMM stage `g` of variant `v`: `out = inp · wᵀ (+ bias)`. Sizes and buffers are checked by
/// the caller.
pub(crate) fn run(gpu: &Gpu, v: &Variant, g: Gemm, d: Dims, p: Ptrs, ws: &mut Workspace) -> Result<()> {
    let fp32 = [Arg::P(p.out), Arg::P(p.inp), Arg::P(p.w), Arg::P(p.bias), i(d.m), i(d.n), i(d.k)];
    let grid2 = |tile: usize, bx: u32, by: u32| LaunchShape {
        grid: (d.n.div_ceil(tile) as u32, d.m.div_ceil(tile) as u32, 1),
        block: (bx, by, 1),
        dynamic_shared_bytes: 0,
    };
    match g {
        Gemm::Naive => launch(gpu, v, "linear_naive", grid2(16, 16, 16), &fp32),
        Gemm::SmemTiled => launch(gpu, v, "linear_smem_tiled", grid2(32, 32, 32), &fp32),
        Gemm::RegisterTiled => launch(gpu, v, "linear_register_tiled", grid2(128, 256, 1), &fp32),
        Gemm::WmmaM2 => wmma_m2(gpu, v, d, p, ws),
        Gemm::WmmaM3 => wmma_m3(gpu, v, d, p, ws, "linear_wmma_m3"),
        Gemm::Cublas(prec) => cublas(gpu, prec, d, p, ws),
    }
}

/// Converts `rows × cols` fp32 at `src` to fp16 at `dst`, zero-padded to `rows_p × cols_p`.
fn convert_f16(gpu: &Gpu, v: &Variant, src: u64, dst: u64, size: (usize, usize), padded: (usize, usize)) -> Result<()> {
    let ((rows, cols), (rp, cp)) = (size, padded);
    launch(gpu, v, "mm_convert_f16", elementwise(rp * cp), &[Arg::P(src), Arg::P(dst), i(rows), i(cols), i(rp), i(cp)])
}

/// The WMMA stages' preprocessing: `inp` to fp16 (Mp × Kp) and the weights transposed to fp16
/// (Kp × Np), by one fused kernel or by a transpose and a conversion. Returns (a16, bt16).
fn wmma_prep(gpu: &Gpu, v: &Variant, d: Dims, p: Ptrs, ws: &mut Workspace, fused: bool) -> Result<(u64, u64)> {
    let q = d.padded();
    let a16 = slot(gpu, &mut ws.a16, q.m * q.k)?;
    let b16 = slot(gpu, &mut ws.b16, q.k * q.n)?;
    let transpose = LaunchShape {
        grid: (q.n.div_ceil(32) as u32, q.k.div_ceil(32) as u32, 1),
        block: (32, 8, 1),
        dynamic_shared_bytes: 0,
    };
    if fused {
        launch(
            gpu,
            v,
            "mm_transpose_convert_f16",
            transpose,
            &[Arg::P(p.w), Arg::P(b16), i(d.n), i(d.k), i(q.n), i(q.k)],
        )?;
    } else {
        let wt32 = slot(gpu, &mut ws.wt32, q.k * q.n)?;
        launch(gpu, v, "mm_transpose_f32", transpose, &[Arg::P(p.w), Arg::P(wt32), i(d.n), i(d.k), i(q.n), i(q.k)])?;
        convert_f16(gpu, v, wt32, b16, (q.k, q.n), (q.k, q.n))?;
    }
    convert_f16(gpu, v, p.inp, a16, (d.m, d.k), (q.m, q.k))?;
    Ok((a16, b16))
}

fn wmma_m2(gpu: &Gpu, v: &Variant, d: Dims, p: Ptrs, ws: &mut Workspace) -> Result<()> {
    let (a16, b16) = wmma_prep(gpu, v, d, p, ws, false)?;
    let q = d.padded();
    let shape = LaunchShape {
        grid: ((q.n / WMMA_TILE) as u32, (q.m / WMMA_TILE) as u32, 1),
        block: (32, 1, 1),
        dynamic_shared_bytes: 0,
    };
    let args = [Arg::P(p.out), Arg::P(a16), Arg::P(b16), Arg::P(p.bias), i(d.m), i(d.n), i(q.k), i(q.n)];
    launch(gpu, v, "linear_wmma_m2", shape, &args)
}

/// The stage-4 WMMA GEMM through `entry` (plain, or one of the epilogue instantiations, which read
/// `p.residual`).
pub(crate) fn wmma_m3(gpu: &Gpu, v: &Variant, d: Dims, p: Ptrs, ws: &mut Workspace, entry: &str) -> Result<()> {
    let (a16, b16) = wmma_prep(gpu, v, d, p, ws, v.define("FUSED_PREP").is_some())?;
    let q = d.padded();
    let shape = if v.define("BLOCK_TILE").is_some() {
        // 1-D grid, M tiles fastest; check_dims bounds M·N, so the count fits easily in u32.
        let blocks = d.m.div_ceil(M3_BT_BM) * q.n.div_ceil(M3_BT_BN);
        let stages = if v.define("DOUBLE_BUFFER").is_some() { 3 } else { 1 };
        LaunchShape {
            grid: (blocks as u32, 1, 1),
            block: (M3_BT_THREADS as u32, 1, 1),
            dynamic_shared_bytes: m3_block_tile_smem_bytes(stages) as u32,
        }
    } else {
        LaunchShape {
            grid: ((q.m / WMMA_TILE) as u32, (q.n / WMMA_TILE).div_ceil(M3_WARPS) as u32, 1),
            block: (32, M3_WARPS as u32, 1),
            dynamic_shared_bytes: 0,
        }
    };
    let args =
        [Arg::P(p.out), Arg::P(a16), Arg::P(b16), Arg::P(p.bias), Arg::P(p.residual), i(d.m), i(d.n), i(q.k), i(q.n)];
    launch(gpu, v, entry, shape, &args)
}

/// cuBLAS (`cublasGemmEx`) then, with a bias, the bias kernel. The fp16 row converts both operands
/// first and converts the fp16 product back to fp32 with the bias: all of it is timed.
fn cublas(gpu: &Gpu, prec: GemmPrecision, d: Dims, p: Ptrs, ws: &mut Workspace) -> Result<()> {
    let aux = aux();
    match prec {
        GemmPrecision::Fp32 | GemmPrecision::Tf32 => {
            // SAFETY: the caller checked inp (M·K), w (N·K) and out (M·N) fp32 lengths.
            unsafe { blas::linear(gpu, prec, d.m, d.n, d.k, p.inp, p.w, p.out) }?;
            if p.bias != 0 {
                launch(
                    gpu,
                    &aux,
                    "mm_bias_add",
                    elementwise(d.m * d.n),
                    &[Arg::P(p.out), Arg::P(p.bias), i(d.m), i(d.n)],
                )?;
            }
            Ok(())
        }
        GemmPrecision::Bf16 => Err(Error::constraint("cuBLAS row precision is fp32, tf32 or fp16", "bf16")),
        GemmPrecision::Fp16 => {
            let (a16, b16) = half_operands(gpu, &aux, d, p, ws)?;
            let c16 = slot(gpu, &mut ws.c16, d.m * d.n)?;
            // SAFETY: a16, b16, c16 hold at least M·K, N·K, M·N fp16 elements.
            unsafe { blas::linear(gpu, GemmPrecision::Fp16, d.m, d.n, d.k, a16, b16, c16) }?;
            let args = [Arg::P(c16), Arg::P(p.bias), Arg::P(p.out), i(d.m), i(d.n)];
            launch(gpu, &aux, "mm_half_to_float_bias", elementwise(d.m * d.n), &args)
        }
    }
}

/// `inp` and `w` converted to fp16 without padding (for the libraries): (a16, b16).
fn half_operands(gpu: &Gpu, aux: &Variant, d: Dims, p: Ptrs, ws: &mut Workspace) -> Result<(u64, u64)> {
    let a16 = slot(gpu, &mut ws.a16, d.m * d.k)?;
    let b16 = slot(gpu, &mut ws.b16, d.n * d.k)?;
    convert_f16(gpu, aux, p.inp, a16, (d.m, d.k), (d.m, d.k))?;
    convert_f16(gpu, aux, p.w, b16, (d.n, d.k), (d.n, d.k))?;
    Ok((a16, b16))
}

/// cuBLASLt with its BIAS or GELU_BIAS epilogue; a residual enters as C with β = 1. Fp16 operands
/// are converted first (timed); the output, bias and residual stay fp32.
pub(crate) fn cublaslt(
    gpu: &Gpu,
    ops: LtOperands,
    epi: LtEpilogue,
    d: Dims,
    p: Ptrs,
    ws: &mut Workspace,
) -> Result<()> {
    let (a, b) = match ops {
        LtOperands::Tf32 => (p.inp, p.w),
        LtOperands::Fp16 => half_operands(gpu, &aux(), d, p, ws)?,
    };
    let lt = ws.lt(gpu)?;
    // SAFETY: a, b hold M·K and N·K elements of the operand type, out and residual M·N fp32, bias N.
    unsafe { lt.linear(gpu, ops, epi, d, a, b, p.bias, p.residual, p.out) }
}
