//! cuBLAS through cudarc: the linear-layer GEMM `out[M,N] = inp[M,K] · W[N,K]ᵀ` (row-major, llm.c's
//! layout) at fp32, TF32, bf16 and fp16. Used for the GEMM ceilings and by families' library rows.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use serde::Serialize;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, CudaStream};

use crate::error::{DriverContext, Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum GemmPrecision {
    /// fp32 operands, fp32 FMA.
    Fp32,
    /// fp32 operands rounded to TF32 on the tensor cores, fp32 accumulation.
    Tf32,
    /// bf16 operands and output, fp32 accumulation.
    Bf16,
    /// fp16 operands and output, fp32 accumulation.
    Fp16,
}

impl GemmPrecision {
    pub const ALL: [GemmPrecision; 4] =
        [GemmPrecision::Fp32, GemmPrecision::Tf32, GemmPrecision::Bf16, GemmPrecision::Fp16];

    fn types(self) -> (cudaDataType, cublasComputeType_t) {
        match self {
            GemmPrecision::Fp32 => (cudaDataType::CUDA_R_32F, cublasComputeType_t::CUBLAS_COMPUTE_32F),
            GemmPrecision::Tf32 => (cudaDataType::CUDA_R_32F, cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32),
            GemmPrecision::Bf16 => (cudaDataType::CUDA_R_16BF, cublasComputeType_t::CUBLAS_COMPUTE_32F),
            GemmPrecision::Fp16 => (cudaDataType::CUDA_R_16F, cublasComputeType_t::CUBLAS_COMPUTE_32F),
        }
    }

    pub fn element_bytes(self) -> usize {
        match self {
            GemmPrecision::Fp32 | GemmPrecision::Tf32 => 4,
            GemmPrecision::Bf16 | GemmPrecision::Fp16 => 2,
        }
    }
}

/// cuBLAS's workspace size that Hopper's kernels ask for (4 MiB serves older chips).
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle with its own workspace, so its GEMMs allocate nothing while a stream is captured
/// into a graph. Not for concurrent use from several threads: a prepared stage owns its own.
pub struct Blas {
    handle: CudaBlas,
    workspace: CudaSlice<u8>,
}

impl Blas {
    /// A handle on `stream` (a `Gpu`'s: `Gpu::blas` keeps one).
    pub fn new(stream: &Arc<CudaStream>) -> Result<Blas> {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(Error::Blas {
                context: "creating the handle".into(),
                message: "libcublas.so could not be loaded".into(),
            });
        }
        let handle = CudaBlas::new(stream.clone())
            .map_err(|e| Error::Blas { context: "creating the handle".into(), message: format!("{e:?}") })?;
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE_BYTES).ctx("allocate the cuBLAS workspace")?;
        let blas = Blas { handle, workspace };
        blas.set_stream(stream)?;
        Ok(blas)
    }

    /// Puts the handle on `stream` with its own workspace again: `cublasSetStream` resets the
    /// workspace to cuBLAS's default pool, which the handle would otherwise use from then on.
    fn set_stream(&self, stream: &CudaStream) -> Result<()> {
        let handle = *self.handle.handle();
        // SAFETY: the handle is live; `stream` outlives the calls enqueued on it through the handle
        // (the callers' contract: a stage's GEMMs run on a stream that outlives them).
        unsafe { cudarc::cublas::result::set_stream(handle, stream.cu_stream() as _) }
            .map_err(|e| Error::Blas { context: "set the stream".into(), message: e.to_string() })?;
        // SAFETY: the workspace outlives the handle (both owned here; the handle field drops first).
        unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                handle,
                crate::device_ptr(&self.workspace) as *mut c_void,
                WORKSPACE_BYTES,
            )
        }
        .result()
        .map_err(|e| Error::Blas { context: "set the workspace".into(), message: e.to_string() })
    }
}

/// `out = inp · Wᵀ` with `inp` M×K, `W` N×K, `out` M×N, all row-major device pointers of the
/// precision's element type; enqueued on `stream` through `blas` (whose stream it sets).
///
/// # Safety
/// The pointers must address at least M·K, N·K and M·N elements of the precision's type, and no
/// other thread may use `blas` meanwhile.
#[allow(clippy::too_many_arguments)]
pub unsafe fn linear(
    blas: &Blas,
    stream: &CudaStream,
    precision: GemmPrecision,
    m: usize,
    n: usize,
    k: usize,
    inp: u64,
    w: u64,
    out: u64,
) -> Result<()> {
    for (name, v) in [("M", m), ("N", n), ("K", k)] {
        if v == 0 || v > i32::MAX as usize {
            return Err(Error::constraint(format!("1 <= {name} <= 2^31-1 for cuBLAS"), format!("{name} = {v}")));
        }
    }
    blas.set_stream(stream)?;
    let handle = *blas.handle.handle();
    let (dtype, compute) = precision.types();
    let (alpha, beta) = (1.0f32, 0.0f32);
    // Row-major out[M,N] is column-major outᵀ[N,M] = W[N,K] · inpᵀ: A = W (transposed), B = inp.
    cudarc::cublas::result::gemm_ex(
        handle,
        cublasOperation_t::CUBLAS_OP_T,
        cublasOperation_t::CUBLAS_OP_N,
        n as i32,
        m as i32,
        k as i32,
        &alpha as *const f32 as *const c_void,
        w as *const c_void,
        dtype,
        k as i32,
        inp as *const c_void,
        dtype,
        k as i32,
        &beta as *const f32 as *const c_void,
        out as *mut c_void,
        dtype,
        n as i32,
        compute,
        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
    )
    .map_err(|e| Error::Blas { context: format!("{precision:?} GEMM {m}x{n}x{k}"), message: e.to_string() })
}
