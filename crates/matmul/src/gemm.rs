//! What both ops share: the size checks and limits, each GEMM stage's prepared kernel sequence (with
//! its scratch buffers), the element-wise kernels and the library calls. The ops' `prepare`
//! functions build these once; their `enqueue` functions validate buffers and come here with raw
//! device addresses.

use common::blas::{self, Blas, GemmPrecision};
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::{require, Arg, Gpu, Launch, LaunchShape, Limit, Precision, Result, Shape, Variant};

use crate::{FAMILY, SOURCES};
use common::lt::{Lt, LtEpilogue, LtOperands, Output};

/// The WMMA tile edge; the WMMA stages pad M, N and K to multiples of it.
pub const WMMA_TILE: usize = 16;
/// Grid y and z limit.
const GRID_Y: usize = 65535;
/// Threads per block of the element-wise kernels.
const ELEMENTWISE_THREADS: u32 = 256;

pub(crate) const ELEMS_MK: &str = "M * K < 2^31";
pub(crate) const ELEMS_NK: &str = "N * K < 2^31";
pub(crate) const ELEMS_MN: &str = "M * N < 2^31";
/// The transpose kernels of the WMMA stages put Kp/32 blocks on grid y.
pub(crate) const WMMA_K: &str = "K <= 65535 * 32";

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
    /// The same sizes as cuBLASLt's wrapper takes them.
    pub fn lt(self) -> common::lt::LtDims {
        common::lt::LtDims { m: self.m, n: self.n, k: self.k }
    }

    /// Each size rounded up to the WMMA tile.
    pub fn padded(self) -> Dims {
        Dims { m: round16(self.m), n: round16(self.n), k: round16(self.k) }
    }

    pub fn macs(self) -> u64 {
        self.m as u64 * self.n as u64 * self.k as u64
    }
}

/// How a stage computes the GEMM: the linear op's plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gemm {
    /// One thread per output, 16 x 16 blocks.
    Naive,
    /// `MM_TILE` x `MM_TILE` shared-memory tiles.
    SmemTiled,
    /// `MM_RT_TILE` block tiles of 2 * `MM_RT_TILE` threads.
    RegisterTiled,
    WmmaM2,
    /// Stage 4; its preprocessing (fused or not) follows the variant's `FUSED_PREP` switch.
    WmmaM3,
    Cublas(GemmPrecision),
}

impl Gemm {
    /// The grid-y limit on M, as the constraint its header states and the bound.
    fn max_m(self, v: &Variant) -> Result<Option<(&'static str, usize)>> {
        Ok(match self {
            Gemm::Naive | Gemm::WmmaM2 => Some(("M <= 65535 * 16", GRID_Y * 16)),
            Gemm::SmemTiled => Some(("M <= 65535 * MM_TILE", GRID_Y * v.tunable("MM_TILE")? as usize)),
            Gemm::RegisterTiled => Some(("M <= 65535 * MM_RT_TILE", GRID_Y * v.tunable("MM_RT_TILE")? as usize)),
            Gemm::WmmaM3 | Gemm::Cublas(_) => None,
        })
    }

    fn uses_wmma_prep(self) -> bool {
        matches!(self, Gemm::WmmaM2 | Gemm::WmmaM3)
    }
}

/// The constraints every stage shares: M, N, K ≥ 1 and every matrix (padded to 16 for the WMMA
/// stages) indexable with 32-bit element offsets.
pub fn check_dims(d: Dims) -> Result<()> {
    for (name, v) in [("M", d.m), ("N", d.n), ("K", d.k)] {
        require(v >= 1, &format!("{name} >= 1"), || format!("{name} = {v}"))?;
    }
    let p = d.padded();
    for (name, a, b) in [(ELEMS_MK, p.m, p.k), (ELEMS_NK, p.n, p.k), (ELEMS_MN, p.m, p.n)] {
        let ok = a.checked_mul(b).is_some_and(|x| x < 1 << 31);
        require(ok, name, || format!("{a} * {b} with M, N, K rounded up to 16 (32-bit element offsets)"))?;
    }
    Ok(())
}

/// The shape constraints of GEMM plan `g` of `v`: the shared ones, its grid limit on M and, for
/// the WMMA stages, the transpose kernels' limit on K.
pub(crate) fn check_gemm(v: &Variant, g: Gemm, d: Dims) -> Result<()> {
    check_dims(d)?;
    if let Some((constraint, max)) = g.max_m(v)? {
        require(d.m <= max, constraint, || format!("M = {}", d.m))?;
    }
    if g.uses_wmma_prep() {
        require(d.k <= GRID_Y * 32, WMMA_K, || format!("K = {}", d.k))?;
    }
    Ok(())
}

/// The limits of GEMM plan `g`, probed at shapes made by `shape(m, n, k)`.
pub(crate) fn gemm_limits(v: &Variant, g: Gemm, shape: impl Fn(i64, i64, i64) -> Shape) -> Vec<Limit> {
    let mut limits = vec![
        Limit { constraint: ELEMS_MK, past: shape(1 << 16, 1, 1 << 15), inside: None },
        Limit { constraint: ELEMS_NK, past: shape(1, 1 << 16, 1 << 15), inside: None },
        Limit { constraint: ELEMS_MN, past: shape(1 << 16, 1 << 15, 1), inside: None },
    ];
    if let Ok(Some((constraint, max))) = g.max_m(v) {
        limits.push(Limit { constraint, past: shape(max as i64 + 1, 1, 1), inside: Some(shape(max as i64, 3, 5)) });
    }
    if g.uses_wmma_prep() {
        let max = (GRID_Y * 32) as i64;
        limits.push(Limit { constraint: WMMA_K, past: shape(1, 1, max + 1), inside: Some(shape(2, 3, max)) });
    }
    limits
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

/// One thread per element over `count` elements, 256 to a block.
pub(crate) fn elementwise(count: usize) -> LaunchShape {
    elementwise_in(count, ELEMENTWISE_THREADS)
}

/// One thread per element over `count` elements, `block` to a block.
pub(crate) fn elementwise_in(count: usize, block: u32) -> LaunchShape {
    LaunchShape::linear((count as u32).div_ceil(block), block)
}

/// The module the library rows borrow their helper kernels from (bias, conversions): every stage
/// file of `linear` includes matmul_aux.cuh, and the naive one is the cheapest to compile.
fn aux() -> Variant {
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

fn i(x: usize) -> Arg<'static> {
    Arg::int(x)
}

/// The dynamic shared memory of the block-tiled stage-4 kernel from its tunables: `stages` pipeline
/// stages (3 with `DOUBLE_BUFFER`, else 1) of one fp16 A tile (BM × (BK+8)) and one B tile
/// (BK × (BN+8)). The kernel traps if it is launched with less than its own `MM_BT_SMEM_BYTES`.
pub fn m3_block_tile_smem_bytes(v: &Variant) -> Result<u32> {
    let (bm, bn, bk) = (v.tunable("MM_BT_BM")?, v.tunable("MM_BT_BN")?, v.tunable("MM_BT_BK")?);
    let stages = if v.has("DOUBLE_BUFFER") { 3 } else { 1 };
    Ok(stages * 2 * (bm * (bk + 8) + bk * (bn + 8)))
}

/// The tunables of the stage-4 WMMA kernel as declared: the flat variant's warps and the block
/// tile (128 x 128 x 32 of 2 x 4 warps).
pub(crate) const M3_TUNABLES: [(&str, u32); 6] = [
    ("MM_M3_WARPS", 32),
    ("MM_BT_BM", 128),
    ("MM_BT_BN", 128),
    ("MM_BT_BK", 32),
    ("MM_BT_WARPS_M", 2),
    ("MM_BT_WARPS_N", 4),
];

fn alloc_u16(gpu: &Gpu, len: usize) -> Result<CudaSlice<u16>> {
    gpu.zeros(len)
}

/// The WMMA stages' preprocessing and GEMM: `inp` to fp16 (Mp × Kp) and the weights transposed to
/// fp16 (Kp × Np) into owned scratch, by one fused kernel or by a transpose and a conversion, then
/// the GEMM entry.
pub(crate) struct Wmma {
    a16: CudaSlice<u16>,
    b16: CudaSlice<u16>,
    /// The fp32 transposed weights of the unfused preprocessing.
    wt32: Option<CudaSlice<f32>>,
    transpose: Launch,
    convert_w: Option<Launch>,
    convert_a: Launch,
    gemm: Launch,
    /// The stage-4 kernel (takes a residual), not stage 3's.
    m3: bool,
    d: Dims,
}

impl Wmma {
    /// `m3`: the stage-4 kernel through `entry` (plain or an epilogue instantiation, which read
    /// `residual`); else stage 3's `linear_wmma_m2`.
    pub(crate) fn prepare(gpu: &Gpu, v: &Variant, d: Dims, m3: bool, entry: &str) -> Result<Wmma> {
        let q = d.padded();
        let fused = m3 && v.has("FUSED_PREP");
        let transpose_shape = LaunchShape::new((q.n.div_ceil(32) as u32, q.k.div_ceil(32) as u32, 1), (32, 8, 1));
        let (transpose, convert_w, wt32) = if fused {
            (gpu.prepare_launch(&SOURCES, v, "mm_transpose_convert_f16", transpose_shape)?, None, None)
        } else {
            (
                gpu.prepare_launch(&SOURCES, v, "mm_transpose_f32", transpose_shape)?,
                Some(gpu.prepare_launch(&SOURCES, v, "mm_convert_f16", elementwise(q.k * q.n))?),
                Some(gpu.zeros::<f32>(q.k * q.n)?),
            )
        };
        let convert_a = gpu.prepare_launch(&SOURCES, v, "mm_convert_f16", elementwise(q.m * q.k))?;
        let shape = if !m3 {
            LaunchShape::new(((q.n / WMMA_TILE) as u32, (q.m / WMMA_TILE) as u32, 1), (32, 1, 1))
        } else if v.has("BLOCK_TILE") {
            let (bm, bn) = (v.tunable("MM_BT_BM")? as usize, v.tunable("MM_BT_BN")? as usize);
            let threads = 32 * v.tunable("MM_BT_WARPS_M")? * v.tunable("MM_BT_WARPS_N")?;
            // 1-D grid, M tiles fastest; check_dims bounds M·N, so the count fits easily in u32.
            let blocks = d.m.div_ceil(bm) * q.n.div_ceil(bn);
            LaunchShape::linear(blocks as u32, threads).with_shared(m3_block_tile_smem_bytes(v)?)
        } else {
            let warps = v.tunable("MM_M3_WARPS")?;
            LaunchShape::new(((q.m / WMMA_TILE) as u32, ((q.n / WMMA_TILE) as u32).div_ceil(warps), 1), (32, warps, 1))
        };
        let gemm = gpu.prepare_launch(&SOURCES, v, entry, shape)?;
        Ok(Wmma {
            a16: alloc_u16(gpu, q.m * q.k)?,
            b16: alloc_u16(gpu, q.k * q.n)?,
            wt32,
            transpose,
            convert_w,
            convert_a,
            gemm,
            m3,
            d,
        })
    }

    /// # Safety
    /// `p` addresses buffers of the prepared sizes (checked by the op's enqueue).
    pub(crate) unsafe fn enqueue(&self, stream: &CudaStream, p: Ptrs) -> Result<()> {
        let (d, q) = (self.d, self.d.padded());
        let (a16, b16) = (Arg::buf(&self.a16), Arg::buf(&self.b16));
        match (&self.convert_w, &self.wt32) {
            (Some(convert), Some(wt32)) => {
                let wt = Arg::buf(wt32);
                self.transpose.enqueue(stream, &[Arg::Ptr(p.w), wt, i(d.n), i(d.k), i(q.n), i(q.k)])?;
                convert.enqueue(stream, &[wt, b16, i(q.k), i(q.n), i(q.k), i(q.n)])?;
            }
            _ => self.transpose.enqueue(stream, &[Arg::Ptr(p.w), b16, i(d.n), i(d.k), i(q.n), i(q.k)])?,
        }
        self.convert_a.enqueue(stream, &[Arg::Ptr(p.inp), a16, i(d.m), i(d.k), i(q.m), i(q.k)])?;
        let (out, bias) = (Arg::Ptr(p.out), Arg::Ptr(p.bias));
        if self.m3 {
            self.gemm.enqueue(stream, &[out, a16, b16, bias, Arg::Ptr(p.residual), i(d.m), i(d.n), i(q.k), i(q.n)])
        } else {
            self.gemm.enqueue(stream, &[out, a16, b16, bias, i(d.m), i(d.n), i(q.k), i(q.n)])
        }
    }

    pub(crate) fn launches(&self) -> Vec<&Launch> {
        [Some(&self.transpose), self.convert_w.as_ref(), Some(&self.convert_a), Some(&self.gemm)]
            .into_iter()
            .flatten()
            .collect()
    }
}

/// `inp` and `w` converted to fp16 without padding into owned scratch (for the libraries).
pub(crate) struct HalfOperands {
    a16: CudaSlice<u16>,
    b16: CudaSlice<u16>,
    convert_a: Launch,
    convert_b: Launch,
    d: Dims,
}

impl HalfOperands {
    /// `block`: threads per block of the two conversion kernels.
    pub(crate) fn prepare(gpu: &Gpu, d: Dims, block: u32) -> Result<HalfOperands> {
        let aux = aux();
        Ok(HalfOperands {
            a16: alloc_u16(gpu, d.m * d.k)?,
            b16: alloc_u16(gpu, d.n * d.k)?,
            convert_a: gpu.prepare_launch(&SOURCES, &aux, "mm_convert_f16", elementwise_in(d.m * d.k, block))?,
            convert_b: gpu.prepare_launch(&SOURCES, &aux, "mm_convert_f16", elementwise_in(d.n * d.k, block))?,
            d,
        })
    }

    /// Enqueues both conversions; returns the fp16 copies' addresses (a16, b16).
    ///
    /// # Safety
    /// `p.inp`, `p.w` address M·K and N·K fp32 values.
    pub(crate) unsafe fn enqueue(&self, stream: &CudaStream, p: Ptrs) -> Result<(u64, u64)> {
        let d = self.d;
        let (a16, b16) = (Arg::buf(&self.a16), Arg::buf(&self.b16));
        self.convert_a.enqueue(stream, &[Arg::Ptr(p.inp), a16, i(d.m), i(d.k), i(d.m), i(d.k)])?;
        self.convert_b.enqueue(stream, &[Arg::Ptr(p.w), b16, i(d.n), i(d.k), i(d.n), i(d.k)])?;
        Ok((common::device_ptr(&self.a16), common::device_ptr(&self.b16)))
    }

    pub(crate) fn launches(&self) -> Vec<&Launch> {
        vec![&self.convert_a, &self.convert_b]
    }
}

/// A cuBLAS row: `cublasGemmEx` then, with a bias, the bias kernel. The fp16 row converts both
/// operands first and converts the fp16 product back to fp32 with the bias: all of it is timed.
pub(crate) struct Cublas {
    precision: GemmPrecision,
    blas: Blas,
    bias: Launch,
    /// The fp16 row's operand conversion, fp16 product and fp16 -> fp32 + bias kernel.
    half: Option<(HalfOperands, CudaSlice<u16>, Launch)>,
    d: Dims,
}

impl Cublas {
    /// `aux_block`: threads per block of the helper kernels (bias, conversions): the report's
    /// "prepare out" and conversion block sizes, a tunable of the library rows.
    pub(crate) fn prepare(gpu: &Gpu, precision: GemmPrecision, d: Dims, aux_block: u32) -> Result<Cublas> {
        let aux = aux();
        let half = match precision {
            GemmPrecision::Fp16 => Some((
                HalfOperands::prepare(gpu, d, aux_block)?,
                alloc_u16(gpu, d.m * d.n)?,
                gpu.prepare_launch(&SOURCES, &aux, "mm_half_to_float_bias", elementwise_in(d.m * d.n, aux_block))?,
            )),
            GemmPrecision::Fp32 | GemmPrecision::Tf32 => None,
            GemmPrecision::Bf16 => {
                return Err(common::Error::constraint("cuBLAS row precision is fp32, tf32 or fp16", "bf16"))
            }
        };
        Ok(Cublas {
            precision,
            blas: Blas::new(gpu.stream())?,
            bias: gpu.prepare_launch(&SOURCES, &aux, "mm_bias_add", elementwise_in(d.m * d.n, aux_block))?,
            half,
            d,
        })
    }

    /// # Safety
    /// `p` addresses fp32 buffers of the prepared sizes.
    pub(crate) unsafe fn enqueue(&self, stream: &CudaStream, p: Ptrs) -> Result<()> {
        let d = self.d;
        match &self.half {
            None => {
                blas::linear(&self.blas, stream, self.precision, d.m, d.n, d.k, p.inp, p.w, p.out)?;
                if p.bias != 0 {
                    self.bias.enqueue(stream, &[Arg::Ptr(p.out), Arg::Ptr(p.bias), i(d.m), i(d.n)])?;
                }
                Ok(())
            }
            Some((operands, c16, to_float)) => {
                let (a16, b16) = operands.enqueue(stream, p)?;
                let c = common::device_ptr(c16);
                blas::linear(&self.blas, stream, GemmPrecision::Fp16, d.m, d.n, d.k, a16, b16, c)?;
                to_float.enqueue(stream, &[Arg::Ptr(c), Arg::Ptr(p.bias), Arg::Ptr(p.out), i(d.m), i(d.n)])
            }
        }
    }

    pub(crate) fn launches(&self) -> Vec<&Launch> {
        let mut l = vec![&self.bias];
        if let Some((operands, _, to_float)) = &self.half {
            l.extend(operands.launches());
            l.push(to_float);
        }
        l
    }
}

/// cuBLASLt with its BIAS or GELU_BIAS epilogue; a residual enters as C with β = 1. Fp16 operands
/// are converted first (timed); the output, bias and residual stay fp32.
pub(crate) struct CublasLt {
    lt: Lt,
    half: Option<HalfOperands>,
}

impl CublasLt {
    pub(crate) fn prepare(gpu: &Gpu, ops: LtOperands, epi: LtEpilogue, d: Dims) -> Result<CublasLt> {
        let half = match ops {
            LtOperands::Fp32 | LtOperands::Tf32 => None,
            LtOperands::Fp16 => Some(HalfOperands::prepare(gpu, d, ELEMENTWISE_THREADS)?),
            LtOperands::Bf16 | LtOperands::E4m3 | LtOperands::E4m3Blocks => {
                return Err(common::Error::constraint(
                    "fp32 operands for the fp32 linear ops' cuBLASLt rows",
                    format!("{ops:?}"),
                ))
            }
        };
        Ok(CublasLt { lt: Lt::prepare(gpu, ops, Output::F32, epi, d.lt())?, half })
    }

    /// # Safety
    /// `p` addresses fp32 buffers of the prepared sizes (bias non-zero).
    pub(crate) unsafe fn enqueue(&self, stream: &CudaStream, p: Ptrs) -> Result<()> {
        let (a, b) = match &self.half {
            None => (p.inp, p.w),
            Some(h) => h.enqueue(stream, p)?,
        };
        self.lt.enqueue(stream, a, b, p.bias, p.residual, p.out, None)
    }

    pub(crate) fn launches(&self) -> Vec<&Launch> {
        self.half.as_ref().map(|h| h.launches()).unwrap_or_default()
    }
}
