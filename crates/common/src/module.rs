//! Kernel modules: embedded sources compiled lazily per (variant, defines, arch), loaded once per
//! process, and launch configurations validated against the function's and the device's limits.

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum as FnAttr;
use cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};
use cudarc::nvrtc::Ptx;
use serde::Serialize;

use crate::error::{DriverContext, Error, Result};
use crate::gpu::Gpu;
use crate::variant::{Source, Variant};

/// A `.cu` or `.cuh` file embedded in a crate at build time; `path` is relative to its `kernels/`.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    pub path: &'static str,
    pub text: &'static str,
}

impl KernelSource {
    pub fn is_header(&self) -> bool {
        self.path.ends_with(".cuh")
    }

    /// The source of `path` among `sources`.
    pub fn find(sources: &'static [KernelSource], path: &str) -> Result<&'static KernelSource> {
        sources.iter().find(|s| s.path == path).ok_or_else(|| Error::MissingSource(path.to_string()))
    }
}

/// The headers NVRTC sees: common's shared ones plus the family's own `.cuh` files.
pub fn headers_for(family_sources: &'static [KernelSource]) -> Vec<KernelSource> {
    crate::common_sources().iter().chain(family_sources).filter(|s| s.is_header()).copied().collect()
}

pub(crate) struct LoadedModule {
    module: Arc<CudaModule>,
    variant: String,
}

/// The driver's view of one kernel function.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct FunctionAttributes {
    pub registers: u32,
    pub static_shared_bytes: u32,
    pub local_bytes: u32,
    pub max_threads_per_block: u32,
}

/// A kernel's resources at one launch configuration: what the runner's table shows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ResourceUse {
    pub kernel: String,
    pub registers: u32,
    pub static_shared_bytes: u32,
    pub dynamic_shared_bytes: u32,
    /// Per-thread local memory: register spills and arrays indexed at run time.
    pub local_bytes: u32,
    pub block_threads: u32,
    pub blocks_per_sm: u32,
    /// Active warps over the SM's maximum, 0..=1.
    pub occupancy: f64,
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchShape {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub dynamic_shared_bytes: u32,
}

impl LaunchShape {
    pub fn linear(grid: u32, block: u32) -> LaunchShape {
        LaunchShape { grid: (grid, 1, 1), block: (block, 1, 1), dynamic_shared_bytes: 0 }
    }

    pub fn with_shared(mut self, bytes: u32) -> LaunchShape {
        self.dynamic_shared_bytes = bytes;
        self
    }

    fn block_threads(&self) -> u64 {
        self.block.0 as u64 * self.block.1 as u64 * self.block.2 as u64
    }
}

/// A loaded kernel function of a variant.
#[derive(Clone, Debug)]
pub struct Kernel {
    func: CudaFunction,
    name: String,
    pub attributes: FunctionAttributes,
}

impl Kernel {
    pub fn function(&self) -> &CudaFunction {
        &self.func
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Checks `shape` against the function's and the device's limits (zero or oversized
    /// dimensions, threads per block, shared memory), raises the dynamic shared-memory cap when a
    /// launch needs more than 48 KiB, logs the resources for the ablation table, and returns the
    /// launch configuration. Nothing is launched on error.
    pub fn config(&self, gpu: &Gpu, shape: LaunchShape) -> Result<LaunchConfig> {
        let fail = |reason: String| Error::Launch { kernel: self.name.clone(), reason };
        let (gx, gy, gz) = shape.grid;
        let (bx, by, bz) = shape.block;
        if [gx, gy, gz, bx, by, bz].contains(&0) {
            return Err(fail(format!("zero dimension in grid {:?} or block {:?}", shape.grid, shape.block)));
        }
        if gx > i32::MAX as u32 || gy > 65535 || gz > 65535 {
            return Err(fail(format!("grid {:?} exceeds (2^31-1, 65535, 65535)", shape.grid)));
        }
        let threads = shape.block_threads();
        if threads > self.attributes.max_threads_per_block as u64 || bz > 64 {
            return Err(fail(format!(
                "block {:?} = {threads} threads; this function allows {}",
                shape.block, self.attributes.max_threads_per_block
            )));
        }
        let info = gpu.info();
        let total_smem = self.attributes.static_shared_bytes as u64 + shape.dynamic_shared_bytes as u64;
        if total_smem > info.shared_memory_per_block_optin as u64 {
            return Err(fail(format!(
                "{total_smem} bytes of shared memory per block; the device allows {}",
                info.shared_memory_per_block_optin
            )));
        }
        if shape.dynamic_shared_bytes > 48 * 1024 {
            self.func
                .set_attribute(
                    FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shape.dynamic_shared_bytes as i32,
                )
                .ctx("raise the dynamic shared-memory limit")?;
        }
        let blocks_per_sm = self
            .func
            .occupancy_max_active_blocks_per_multiprocessor(threads as u32, shape.dynamic_shared_bytes as usize, None)
            .ctx("occupancy query")?;
        if blocks_per_sm == 0 {
            return Err(fail("no block of this shape fits on an SM (registers or shared memory)".into()));
        }
        let warps_per_block = threads.div_ceil(32) as f64;
        gpu.log_resource(ResourceUse {
            kernel: self.name.clone(),
            registers: self.attributes.registers,
            static_shared_bytes: self.attributes.static_shared_bytes,
            dynamic_shared_bytes: shape.dynamic_shared_bytes,
            local_bytes: self.attributes.local_bytes,
            block_threads: threads as u32,
            blocks_per_sm,
            occupancy: (blocks_per_sm as f64 * warps_per_block / (info.max_threads_per_sm as f64 / 32.0)).min(1.0),
        });
        Ok(LaunchConfig { grid_dim: shape.grid, block_dim: shape.block, shared_mem_bytes: shape.dynamic_shared_bytes })
    }
}

impl Gpu {
    /// The entry point `entry` of `variant`, compiling (or reading from the disk cache) and loading
    /// its module on first use. `sources` is the family's embedded `KERNEL_SOURCES`.
    pub fn kernel(&self, sources: &'static [KernelSource], variant: &Variant, entry: &str) -> Result<Kernel> {
        let module = self.load(sources, variant)?;
        let func = module.module.load_function(entry).map_err(|e| Error::Launch {
            kernel: entry.into(),
            reason: format!("not found in {}: {e}", module.variant),
        })?;
        let attr = |a: FnAttr| func.get_attribute(a).ctx("cuFuncGetAttribute").map(|v| v as u32);
        let attributes = FunctionAttributes {
            registers: attr(FnAttr::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            static_shared_bytes: attr(FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            local_bytes: attr(FnAttr::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            max_threads_per_block: attr(FnAttr::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        };
        Ok(Kernel { func, name: format!("{}:{entry}", variant.id()), attributes })
    }

    /// Copies `data` into the `__constant__` (or `__device__`) symbol `symbol` of `variant`'s module,
    /// after checking it fits. Enqueued on the harness stream.
    pub fn write_symbol<T: cudarc::driver::DeviceRepr>(
        &self,
        sources: &'static [KernelSource],
        variant: &Variant,
        symbol: &str,
        data: &[T],
    ) -> Result<()> {
        let module = self.load(sources, variant)?;
        let stream = self.stream();
        let mut global = module.module.get_global(symbol, stream).ctx("find the module symbol")?;
        let bytes = std::mem::size_of_val(data);
        if bytes > global.len() {
            return Err(Error::constraint(
                format!("data fits the {}-byte symbol {symbol}", global.len()),
                format!("{bytes} bytes"),
            ));
        }
        // SAFETY: T is plain data; the view covers `bytes` bytes of the symbol.
        let src = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, bytes) };
        let mut dst = global.slice_mut(0..bytes);
        stream.memcpy_htod(src, &mut dst).ctx("copy to the module symbol")
    }

    /// Fails unless this device can run `variant`.
    pub fn supports(&self, variant: &Variant) -> Result<()> {
        let cc = self.info().compute_capability;
        let need = variant.requires.min_cc;
        let exact = variant.requires.arch_specific;
        if cc < need || (exact && cc != need) {
            return Err(Error::Unsupported {
                variant: variant.id(),
                needed: format!("{}{}.{}", if exact { "exactly " } else { "" }, need.0, need.1),
                found: format!("{}.{}", cc.0, cc.1),
            });
        }
        Ok(())
    }

    fn load(&self, sources: &'static [KernelSource], variant: &Variant) -> Result<Arc<LoadedModule>> {
        let Source::Kernel(path) = variant.source else {
            return Err(Error::MissingSource(format!("{} is a library call, not a kernel", variant.id())));
        };
        self.supports(variant)?;
        let arch = self.arch(variant.requires.arch_specific);
        let key = format!("{path}|{:?}|{arch}", variant.defines);
        if let Some(m) = self.module_cache().lock().unwrap().get(&key) {
            return Ok(m.clone());
        }
        let source = KernelSource::find(sources, path)?;
        let compiled =
            self.toolchain()?.compile(&variant.id(), source, &headers_for(sources), &variant.defines, arch)?;
        let module = self.context().load_module(Ptx::from_binary(compiled.image)).ctx("load the compiled module")?;
        let loaded = Arc::new(LoadedModule { module, variant: variant.id() });
        self.module_cache().lock().unwrap().insert(key, loaded.clone());
        Ok(loaded)
    }
}
