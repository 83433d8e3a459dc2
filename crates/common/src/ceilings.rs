//! The ceilings every result is read against, measured once per device and cached on disk:
//! device-to-device copy bandwidth (bytes read + written) and cuBLASLt's GEMM rate at fp32, TF32,
//! bf16, fp16 and FP8 (e4m3, per-tensor scales) on random data. The rates go through cuBLASLt with
//! its own 32 MiB workspace: cublasGemmEx measured bf16 and fp16 at 17-20 TFLOP/s on some H100
//! runs and ~800 on others (the same machine, one run after another), cuBLASLt never.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::blas::GemmPrecision;
use crate::error::{DriverContext, Error, Result};
use crate::family::Bound;
use crate::gpu::Gpu;
use crate::lt::{Lt, LtDims, LtEpilogue, LtOperands, Output};
use crate::timing::{self, TimingConfig};
use crate::variant::Precision;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ceilings {
    pub device: String,
    pub uuid: String,
    /// Bytes read plus bytes written per second by `cuMemcpyDtoD` of `copy_bytes`.
    pub copy_gbps: f64,
    pub copy_bytes: u64,
    /// Host-to-device bytes per second of `cuMemcpyHtoDAsync` of `h2d_bytes`, from pinned and from
    /// pageable host memory (0 in tables saved before they were measured).
    #[serde(default)]
    pub h2d_pinned_gbps: f64,
    #[serde(default)]
    pub h2d_pageable_gbps: f64,
    #[serde(default)]
    pub h2d_bytes: u64,
    pub gemm_size: usize,
    pub fp32_tflops: f64,
    pub tf32_tflops: f64,
    pub bf16_tflops: f64,
    pub fp16_tflops: f64,
    /// cuBLASLt's e4m3 GEMM with unit per-tensor scales and a bf16 output (0 in tables saved
    /// before it was measured).
    #[serde(default)]
    pub fp8_tflops: f64,
}

impl Ceilings {
    /// Ceilings for the report modules' unit tests (here and in the CLI's instruments): an H100-like
    /// device with copy bandwidth `copy_gbps`.
    #[doc(hidden)]
    pub fn for_tests(copy_gbps: f64) -> Ceilings {
        Ceilings {
            device: "test".into(),
            uuid: "0".into(),
            copy_gbps,
            copy_bytes: 1,
            h2d_pinned_gbps: 50.0,
            h2d_pageable_gbps: 20.0,
            h2d_bytes: 1 << 28,
            gemm_size: 1,
            fp32_tflops: 50.0,
            tf32_tflops: 400.0,
            bf16_tflops: 800.0,
            fp16_tflops: 800.0,
            fp8_tflops: 1600.0,
        }
    }
}

/// Bump when the measurement changes, so old cache files are not trusted.
const CACHE_VERSION: u32 = 3;

fn cache_file(gpu: &Gpu) -> Option<PathBuf> {
    crate::nvrtc::cache_dir().map(|d| d.join(format!("ceilings-v{CACHE_VERSION}-{}.json", gpu.info().uuid)))
}

impl Ceilings {
    /// The cached ceilings of this device, measuring them first if there are none (or if
    /// `$LADDER_REMEASURE` is set).
    pub fn get(gpu: &Gpu) -> Result<Ceilings> {
        let file = cache_file(gpu);
        if std::env::var_os("LADDER_REMEASURE").is_none() {
            if let Some(c) =
                file.as_ref().and_then(|f| std::fs::read(f).ok()).and_then(|b| serde_json::from_slice(&b).ok())
            {
                return Ok(c);
            }
        }
        let c = Ceilings::measure(gpu)?;
        if let Some(f) = file {
            if let Some(dir) = f.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = std::fs::write(f, serde_json::to_vec_pretty(&c).unwrap_or_default());
        }
        Ok(c)
    }

    pub fn measure(gpu: &Gpu) -> Result<Ceilings> {
        let info = gpu.info();
        let cfg =
            TimingConfig { target_ms: 200.0, min_reps: 10, max_reps: 100, warmup_ms: 20.0, ..TimingConfig::default() };

        // Copy: 1 GiB (or an eighth of memory) each way, far beyond L2.
        let copy_bytes = (1u64 << 30).min(info.total_memory_bytes / 8) & !255;
        let n = (copy_bytes / 4) as usize;
        let src = gpu.upload(&crate::data::uniform(n, -1.0, 1.0, 1))?;
        let mut dst = gpu.zeros::<f32>(n)?;
        let t = timing::time(gpu, 1, &cfg, |stream, _| stream.memcpy_dtod(&src, &mut dst).ctx("memcpy DtoD"))?;
        let copy_gbps = 2.0 * copy_bytes as f64 / (t.median_ms * 1e-3) / 1e9;
        drop(src);

        // Host to device: 256 MiB from page-locked and from ordinary (pageable) host memory.
        let h2d_bytes = (256u64 << 20).min(copy_bytes) & !255;
        let h2d_n = (h2d_bytes / 4) as usize;
        let pageable = crate::data::uniform(h2d_n, -1.0, 1.0, 4);
        let pinned = gpu.pinned(&pageable)?;
        let to = gpu.ptr(&dst);
        let h2d = |src: *const f32| {
            // SAFETY: src and dst each hold h2d_bytes; both outlive the timed copies.
            let t = timing::time(gpu, 1, &cfg, |stream, _| unsafe {
                let n = h2d_bytes as usize;
                crate::gpu::copy_htod_2d(stream, to, n, src as *const u8, n, n, 1)
            })?;
            Ok::<f64, Error>(h2d_bytes as f64 / (t.median_ms * 1e-3) / 1e9)
        };
        let h2d_pinned_gbps = h2d(pinned.as_ptr().ctx("page-locked host memory")?)?;
        let h2d_pageable_gbps = h2d(pageable.as_ptr())?;
        drop((pinned, dst));

        let size = 8192usize;
        let mut rates = std::collections::HashMap::new();
        let a32 = crate::data::uniform(size * size, -1.0, 1.0, 2);
        let b32 = crate::data::uniform(size * size, -1.0, 1.0, 3);
        for p in GemmPrecision::ALL {
            let (a, b, c) = match p {
                GemmPrecision::Fp32 | GemmPrecision::Tf32 => {
                    (bytes_of(gpu, &a32)?, bytes_of(gpu, &b32)?, gpu.zeros::<u8>(size * size * 4)?)
                }
                GemmPrecision::Bf16 => {
                    let conv = |v: &[f32]| v.iter().map(|x| half::bf16::from_f32(*x).to_bits()).collect::<Vec<u16>>();
                    (bytes_of(gpu, &conv(&a32))?, bytes_of(gpu, &conv(&b32))?, gpu.zeros::<u8>(size * size * 2)?)
                }
                GemmPrecision::Fp16 => {
                    let conv = |v: &[f32]| v.iter().map(|x| half::f16::from_f32(*x).to_bits()).collect::<Vec<u16>>();
                    (bytes_of(gpu, &conv(&a32))?, bytes_of(gpu, &conv(&b32))?, gpu.zeros::<u8>(size * size * 4)?)
                }
            };
            let (pa, pb, pc) = (gpu.ptr(&a), gpu.ptr(&b), gpu.ptr(&c));
            let (ops, out) = match p {
                GemmPrecision::Fp32 => (LtOperands::Fp32, Output::F32),
                GemmPrecision::Tf32 => (LtOperands::Tf32, Output::F32),
                GemmPrecision::Bf16 => (LtOperands::Bf16, Output::Bf16),
                GemmPrecision::Fp16 => (LtOperands::Fp16, Output::F32),
            };
            let lt = Lt::prepare(gpu, ops, out, LtEpilogue::None, LtDims { m: size, n: size, k: size })?;
            // SAFETY: a and b hold size² elements of p's type, c size² of the output's.
            let t = timing::time(gpu, 1, &cfg, |stream, _| unsafe { lt.enqueue(stream, pa, pb, 0, 0, pc, None) })?;
            rates.insert(p, 2.0 * (size as f64).powi(3) / (t.median_ms * 1e-3) / 1e12);
        }
        Ok(Ceilings {
            device: info.name.clone(),
            uuid: info.uuid.clone(),
            copy_gbps,
            copy_bytes,
            h2d_pinned_gbps,
            h2d_pageable_gbps,
            h2d_bytes,
            gemm_size: size,
            fp32_tflops: rates[&GemmPrecision::Fp32],
            tf32_tflops: rates[&GemmPrecision::Tf32],
            bf16_tflops: rates[&GemmPrecision::Bf16],
            fp16_tflops: rates[&GemmPrecision::Fp16],
            fp8_tflops: fp8_rate(gpu, &cfg, size)?,
        })
    }

    /// The matrix rate that bounds work at `precision` (INT4-dequantised work runs on bf16 MMA).
    pub fn tflops(&self, precision: Precision) -> f64 {
        match precision {
            Precision::Fp32 => self.fp32_tflops,
            Precision::Tf32 => self.tf32_tflops,
            Precision::Bf16 | Precision::Int4Bf16 => self.bf16_tflops,
            Precision::Fp16 => self.fp16_tflops,
            Precision::Fp8 => self.fp8_tflops,
        }
    }

    /// The achieved fraction of the ceiling that bounds `bound`, given GB/s and TFLOP/s.
    pub fn fraction(&self, bound: Bound, gbps: f64, tflops: f64) -> f64 {
        match bound {
            Bound::Memory => gbps / self.copy_gbps,
            Bound::HostLink => gbps / self.h2d_pinned_gbps,
            Bound::Compute(p) => tflops / self.tflops(p),
        }
    }
}

/// cuBLASLt's e4m3 GEMM rate at size³: finite codes of both signs up to 1.875 (any code would do
/// for the rate; NaN codes are left out), unit per-tensor scales, a bf16 output.
fn fp8_rate(gpu: &Gpu, cfg: &TimingConfig, size: usize) -> Result<f64> {
    let codes: Vec<u8> =
        crate::data::uniform(size * size, 0.0, 256.0, 5).iter().map(|&x| (x as u32 & 0xBF) as u8).collect();
    let (a, b, c) = (gpu.upload(&codes)?, gpu.upload(&codes)?, gpu.zeros::<u16>(size * size)?);
    let lt = Lt::prepare(gpu, LtOperands::E4m3, Output::Bf16, LtEpilogue::None, LtDims { m: size, n: size, k: size })?;
    let (pa, pb, pc) = (gpu.ptr(&a), gpu.ptr(&b), gpu.ptr(&c));
    // SAFETY: a and b hold size² codes, c size² bf16 values; no bias, residual or block scales.
    let t = timing::time(gpu, 1, cfg, |stream, _| unsafe { lt.enqueue(stream, pa, pb, 0, 0, pc, None) })?;
    Ok(2.0 * (size as f64).powi(3) / (t.median_ms * 1e-3) / 1e12)
}

/// Uploads any plain slice as bytes (u16 bit patterns of bf16/fp16 included).
fn bytes_of<T: Copy>(gpu: &Gpu, v: &[T]) -> Result<cudarc::driver::CudaSlice<u8>> {
    // SAFETY: T is a plain numeric type (f32 or u16); its bytes are a valid [u8].
    let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) };
    gpu.upload(bytes).map_err(|e| match e {
        Error::Driver { source, .. } => Error::Driver { context: "upload GEMM operand".into(), source },
        other => other,
    })
}
