//! cuBLASLt through cudarc's `cublaslt::result` layer, for the families' library rows and the GEMM
//! ceilings: `out = epilogue(inp · Wᵀ + bias) (+ residual)` with fp32, TF32, fp16 or bf16 operands
//! and an fp32 output, bias and residual; bf16 operands with a bf16 output, bias and residual; or
//! e4m3 operands (per-tensor or DeepSeek's block scales) with an fp32 or bf16 output. cuBLASLt takes
//! a 16-bit output's bias in the output's type only (an fp32 bias beside a bf16 D is
//! `CUBLAS_STATUS_INVALID_VALUE` at the heuristic, H100, CUDA 13). cudarc's safe `Matmul` trait uses
//! one buffer for C and D and one element type for everything, which rules out a residual as C and
//! fp16 operands with an fp32 output; descriptors are therefore built here, once per (operands,
//! epilogue, shape) at prepare, with the heuristic's first algorithm.

use std::ffi::c_void;

use cudarc::cublaslt::{result as ltr, sys};
use cudarc::driver::{CudaSlice, CudaStream};

use crate::error::{DriverContext, Error, Result};
use crate::gpu::Gpu;

/// The sizes of one cuBLASLt call: `out[m, n] = a[m, k] · b[n, k]ᵀ`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LtDims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// The operand precision of a cuBLASLt row (accumulation is fp32 in all).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LtOperands {
    /// fp32 operands and fp32 FMA (`CUBLAS_COMPUTE_32F`): the fp32 GEMM ceiling.
    Fp32,
    /// fp32 operands rounded to TF32 on the tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`).
    Tf32,
    /// fp16 operands (converted by the caller), `CUBLAS_COMPUTE_32F`.
    Fp16,
    /// bf16 operands as given (prepared once by the caller), `CUBLAS_COMPUTE_32F`.
    Bf16,
    /// e4m3 codes with unit per-tensor scales (cuBLASLt's fastest FP8 path, `torch._scaled_mm`'s
    /// per-tensor case), `CUBLAS_COMPUTE_32F`: the FP8 GEMM ceiling.
    E4m3,
    /// e4m3 codes with DeepSeek's fine-grained scales (cuBLAS 12.9+, sm_90): W (cuBLAS's A) one
    /// fp32 scale per 128 x 128 block (`BLK128x128_32F`), the input (cuBLAS's B) one per row per 128
    /// of K (`VEC128_32F`), both in the layouts `matmul::linear_fp8::OperandLayout::CublasLt`
    /// describes; `CUBLAS_COMPUTE_32F` without fast accumulation (cuBLASLt refuses it here). A
    /// 32-bit D takes a bf16 bias.
    E4m3Blocks,
}

/// The element type of `out`, of the bias and of the residual (read as C): the output type of
/// `linear-bf16`'s `out` shape key, and fp32 in the fp32 ops' rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Output {
    F32,
    /// bf16 (bit patterns in `u16`), rounded to nearest even from the fp32 result of the tail.
    Bf16,
    /// e4m3 codes (`u8`) with one fp32 scale per row per 128 columns (`matmul::fp8`'s activation
    /// format): `linear-fp8` stage 7's quantized out, which no cuBLASLt plan here writes.
    E4m3,
}

impl Output {
    pub fn bytes(self) -> u64 {
        match self {
            Output::F32 => 4,
            Output::Bf16 => 2,
            Output::E4m3 => 1,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LtEpilogue {
    /// The bare GEMM.
    None,
    Bias,
    GeluBias,
}

/// The device addresses of [`LtOperands::E4m3Blocks`]' scales: `inputs` for `a` (the activations,
/// cuBLAS's B), `weights` for `b` (cuBLAS's A).
#[derive(Clone, Copy, Debug)]
pub struct LtScales {
    pub inputs: u64,
    pub weights: u64,
}

/// cuBLASLt's recommended workspace on Hopper (32 MiB; 4 MiB would do before it).
const WORKSPACE_BYTES: usize = 32 << 20;

fn lt_err(context: &str) -> impl Fn(ltr::CublasError) -> Error + '_ {
    move |e| Error::Blas { context: format!("cuBLASLt {context}"), message: e.to_string() }
}

struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: Option<sys::cublasLtMatmulAlgo_t>,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle is null or was created by cuBLASLt and is destroyed once here.
        unsafe {
            for l in [self.a, self.b, self.c] {
                if !l.is_null() {
                    let _ = ltr::destroy_matrix_layout(l);
                }
            }
            if !self.desc.is_null() {
                let _ = ltr::destroy_matmul_desc(self.desc);
            }
        }
    }
}

unsafe fn set_desc<T>(desc: sys::cublasLtMatmulDesc_t, attr: sys::cublasLtMatmulDescAttributes_t, v: &T) -> Result<()> {
    ltr::set_matmul_desc_attribute(desc, attr, v as *const T as *const c_void, std::mem::size_of::<T>())
        .map_err(lt_err("set matmul attribute"))
}

/// A cuBLASLt handle, its workspace and one matmul plan (descriptors and the heuristic's first
/// algorithm), prepared for one (operands, epilogue, shape).
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    plan: Option<Plan>,
    d: LtDims,
    ops: LtOperands,
    out: Output,
    epi: LtEpilogue,
}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plan = None;
        if !self.handle.is_null() {
            // SAFETY: the handle was created in `prepare` and is destroyed once.
            let _ = unsafe { ltr::destroy_handle(self.handle) };
        }
    }
}

impl Lt {
    pub fn prepare(gpu: &Gpu, ops: LtOperands, out: Output, epi: LtEpilogue, d: LtDims) -> Result<Lt> {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::Blas {
                context: "creating the cuBLASLt handle".into(),
                message: "libcublasLt.so could not be loaded".into(),
            });
        }
        gpu.context().bind_to_thread().ctx("bind the context")?;
        let workspace = gpu.zeros::<u8>(WORKSPACE_BYTES)?;
        let handle = ltr::create_handle().map_err(lt_err("create handle"))?;
        let mut lt = Lt { handle, workspace, plan: None, d, ops, out, epi };
        lt.plan = Some(lt.plan()?);
        Ok(lt)
    }

    fn plan(&self) -> Result<Plan> {
        let (ops, epi, d) = (self.ops, self.epi, self.d);
        let out_type = match self.out {
            Output::F32 => sys::cudaDataType_t::CUDA_R_32F,
            Output::Bf16 => sys::cudaDataType_t::CUDA_R_16BF,
            Output::E4m3 => return Err(Error::constraint("out fp32 or bf16 (cuBLASLt)", "out = e4m3")),
        };
        let (dtype, compute) = match ops {
            LtOperands::Fp32 => (sys::cudaDataType_t::CUDA_R_32F, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F),
            LtOperands::Tf32 => {
                (sys::cudaDataType_t::CUDA_R_32F, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32)
            }
            LtOperands::Fp16 => (sys::cudaDataType_t::CUDA_R_16F, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F),
            LtOperands::Bf16 => (sys::cudaDataType_t::CUDA_R_16BF, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F),
            LtOperands::E4m3 | LtOperands::E4m3Blocks => {
                (sys::cudaDataType_t::CUDA_R_8F_E4M3, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F)
            }
        };
        // cuBLASLt's FP8 matmul takes a bf16 bias beside an fp32 D; the others take D's type.
        let bias_type = match (ops, self.out) {
            (LtOperands::E4m3 | LtOperands::E4m3Blocks, Output::F32) => sys::cudaDataType_t::CUDA_R_16BF,
            _ => out_type,
        };
        let f32t = sys::cudaDataType_t::CUDA_R_32F;
        let null = std::ptr::null_mut();
        let mut plan = Plan { desc: null as _, a: null as _, b: null as _, c: null as _, algo: None };
        plan.desc = ltr::create_matmul_desc(compute, f32t).map_err(lt_err("create matmul descriptor"))?;
        use sys::cublasLtMatmulDescAttributes_t as A;
        // Row-major out[M,N] is column-major outᵀ[N,M] = op(W)[N,K] · inpᵀ[K,M]: A = W (stored as
        // column-major K × N, transposed), B = inp (column-major K × M), C = D = out (N × M).
        // SAFETY: the descriptor is live; each value has the attribute's documented type.
        unsafe {
            set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?; // CUBLAS_OP_T
            set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?; // CUBLAS_OP_N
            let e = match epi {
                LtEpilogue::None => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
                LtEpilogue::Bias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
                LtEpilogue::GeluBias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
            };
            set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &e)?;
            set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type)?;
            if ops == LtOperands::E4m3Blocks {
                use sys::cublasLtMatmulMatrixScale_t as S;
                set_desc(
                    plan.desc,
                    A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                    &S::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                )?;
                set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F)?;
                // The scale pointers are set at each enqueue (each call's own); until then they
                // address the workspace (device memory, 16-byte aligned) rather than nothing.
                let placeholder = crate::device_ptr(&self.workspace);
                set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &placeholder)?;
                set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &placeholder)?;
            }
        }
        let (m, n, k) = (d.m as u64, d.n as u64, d.k as u64);
        plan.a = ltr::create_matrix_layout(dtype, k, n, k as i64).map_err(lt_err("create layout A"))?;
        plan.b = ltr::create_matrix_layout(dtype, k, m, k as i64).map_err(lt_err("create layout B"))?;
        plan.c = ltr::create_matrix_layout(out_type, n, m, n as i64).map_err(lt_err("create layout C/D"))?;
        let pref = ltr::create_matmul_pref().map_err(lt_err("create preference"))?;
        // SAFETY: all descriptors are live; the preference is destroyed right after the query.
        let heuristic = unsafe {
            let size = WORKSPACE_BYTES;
            let r = ltr::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &size as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            )
            .and_then(|_| ltr::get_matmul_algo_heuristic(self.handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref));
            let _ = ltr::destroy_matmul_pref(pref);
            r
        };
        let heuristic = heuristic
            .map_err(lt_err(&format!("algorithm heuristic for {m}x{n}x{k} {ops:?} {:?} {epi:?}", self.out)))?;
        plan.algo = Some(heuristic.algo);
        Ok(plan)
    }

    /// `out = epi(a · bᵀ + bias) + residual` (residual 0: none) on `stream`.
    ///
    /// # Safety
    /// `a`, `b` must address M·K and N·K elements of the operand type, `out` (and `residual`
    /// when non-zero) M·N of the output type, `bias` N of the bias type (non-zero unless the
    /// epilogue is `None`); `scales` given exactly for [`LtOperands::E4m3Blocks`], each in its
    /// layout and 16-byte aligned.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn enqueue(
        &self,
        stream: &CudaStream,
        a: u64,
        b: u64,
        bias: u64,
        residual: u64,
        out: u64,
        scales: Option<LtScales>,
    ) -> Result<()> {
        let plan = self.plan.as_ref().expect("prepared with its plan");
        // The descriptor is host memory: setting the bias pointer is not a device call.
        set_desc(plan.desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;
        if let Some(scales) = scales {
            use sys::cublasLtMatmulDescAttributes_t as A;
            set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scales.weights)?;
            set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scales.inputs)?;
        }
        let alpha = 1.0f32;
        let beta = if residual != 0 { 1.0f32 } else { 0.0f32 };
        let c = if residual != 0 { residual } else { out };
        let algo = plan.algo.as_ref().expect("plans are stored with their algorithm");
        let d = self.d;
        ltr::matmul(
            self.handle,
            plan.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            b as *const c_void,
            plan.a,
            a as *const c_void,
            plan.b,
            c as *const c_void,
            plan.c,
            out as *mut c_void,
            plan.c,
            algo as *const _,
            crate::device_ptr(&self.workspace) as *mut c_void,
            WORKSPACE_BYTES,
            stream.cu_stream() as *mut _,
        )
        .map_err(lt_err(&format!("matmul {}x{}x{} {:?} {:?}", d.m, d.n, d.k, self.ops, self.epi)))
    }
}
