//! The device, [`Gpu`], and all of its methods in one place: opening it and its facts, buffers
//! (upload, download, poison), modules ([`Gpu::module`], [`Gpu::load_modules`]: compiled by NVRTC and
//! loaded once per process) and launches ([`Gpu::prepare_launch`]). `launch.rs` holds the prepared
//! [`Launch`] and its enqueue path, `module.rs` the embedded sources, `nvrtc.rs` the compiler; none
//! of them depends on this file.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{self, CUdevice_attribute as Attr, CUfunction_attribute_enum as FnAttr};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, DeviceRepr, PinnedHostSlice, ValidAsZeroBits};
use cudarc::nvrtc::Ptx;
use serde::Serialize;

use cudarc::driver::CudaModule;

use crate::error::{require, DriverContext, Error, Result};
use crate::launch::{launch_config, param_sizes, Launch, LaunchLimits, LaunchShape, ResourceUse, MAX_ARGS};
use crate::module::{KernelSource, Sources};
use crate::nvrtc::{Arch, Compiled, Toolchain};
use crate::variant::{Define, Source, Variant};

/// The oldest driver the default bindings load against (CUDA 13.0 = 13000; 12.x bindings: 12000).
#[cfg(not(feature = "cuda-12"))]
const REQUIRED_DRIVER: i32 = 13000;
#[cfg(feature = "cuda-12")]
const REQUIRED_DRIVER: i32 = 12000;

/// Facts about the device read from the driver when it is opened.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceInfo {
    pub index: usize,
    pub name: String,
    pub uuid: String,
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    pub l2_bytes: u64,
    pub total_memory_bytes: u64,
    pub shared_memory_per_block: u32,
    pub shared_memory_per_block_optin: u32,
    pub shared_memory_per_sm: u32,
    pub max_threads_per_sm: u32,
    pub registers_per_sm: u32,
    pub driver_version: i32,
}

/// An open CUDA device: its context, the stream the harness (runner, checks, timing) works on, and
/// the cached modules. The stream is a created, non-blocking one, so work on it can be captured into
/// a CUDA graph; every public `enqueue` takes the stream to use, this one or the caller's own.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    modules: Mutex<HashMap<ModuleKey, Arc<CudaModule>>>,
    blas: OnceLock<std::result::Result<Arc<crate::blas::Blas>, String>>,
    /// Whether dependent launches are built with the chain's timeline stamps
    /// ([`crate::launch::CHAIN_TIMELINE`]).
    chain_timeline: AtomicBool,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish()
    }
}

fn driver_version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

impl Gpu {
    /// Opens the device named by `LADDER_DEVICE` (default 0).
    pub fn open() -> Result<Arc<Gpu>> {
        let index = match std::env::var("LADDER_DEVICE") {
            Ok(s) => s
                .trim()
                .parse::<usize>()
                .map_err(|_| Error::constraint("LADDER_DEVICE is a device index (0, 1, ...)", format!("'{s}'")))?,
            Err(_) => 0,
        };
        Self::open_index(index)
    }

    pub fn open_index(index: usize) -> Result<Arc<Gpu>> {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoDriver("libcuda.so could not be loaded (no NVIDIA driver on this machine)".into()));
        }
        cudarc::driver::result::init().map_err(|e| Error::NoDriver(format!("cuInit failed: {e}")))?;
        let mut version = 0;
        // SAFETY: writes one int.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(|e| Error::NoDriver(format!("cuDriverGetVersion failed: {e}")))?;
        if version < REQUIRED_DRIVER {
            return Err(Error::DriverTooOld {
                found: driver_version_string(version),
                required: driver_version_string(REQUIRED_DRIVER),
            });
        }
        let count = cudarc::driver::result::device::get_count()
            .map_err(|e| Error::NoDevice { index, reason: e.to_string() })? as usize;
        if index >= count {
            return Err(Error::NoDevice { index, reason: format!("the driver sees {count} device(s)") });
        }
        let ctx = CudaContext::new(index).map_err(|e| Error::NoDevice { index, reason: e.to_string() })?;
        // Streams are ordered by whoever owns them: cudarc's per-buffer event tracking only adds
        // work to every launch (and breaks graph capture).
        // SAFETY: the harness orders its own work on `stream`; a caller that enqueues on several
        // streams orders them itself, as with any CUDA library.
        unsafe { ctx.disable_event_tracking() };
        // A created stream, not the legacy NULL stream, which cannot be captured into a graph.
        let stream = ctx.new_stream().ctx("create the harness stream")?;
        let attr = |a: Attr| ctx.attribute(a).ctx("cuDeviceGetAttribute").map(|v| v as u32);
        let uuid = ctx.uuid().ctx("cuDeviceGetUuid")?;
        let info = DeviceInfo {
            index,
            name: ctx.name().ctx("cuDeviceGetName")?,
            uuid: uuid.bytes.iter().map(|b| format!("{:02x}", *b as u8)).collect(),
            compute_capability: (
                attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64,
            total_memory_bytes: ctx.total_mem().ctx("cuDeviceTotalMem")? as u64,
            shared_memory_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
            shared_memory_per_block_optin: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            shared_memory_per_sm: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
            max_threads_per_sm: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
            registers_per_sm: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)?,
            driver_version: version,
        };
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            info,
            modules: Mutex::new(HashMap::new()),
            blas: OnceLock::new(),
            chain_timeline: AtomicBool::new(false),
        }))
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's exact architecture, `sm_XY`, or `sm_XYa` when `arch_specific` (Hopper-only
    /// instructions such as wgmma need `sm_90a`).
    pub fn arch(&self, arch_specific: bool) -> Arch {
        let (major, minor) = self.info.compute_capability;
        Arch { major, minor, arch_specific }
    }

    /// NVRTC and the CUDA headers, located once per process.
    pub fn toolchain(&self) -> Result<Arc<Toolchain>> {
        crate::nvrtc::toolchain()
    }

    /// A cuBLAS handle on the harness's stream, created on first use (for the ceilings; a prepared
    /// library stage owns its own).
    pub fn blas(&self) -> Result<Arc<crate::blas::Blas>> {
        self.blas
            .get_or_init(|| crate::blas::Blas::new(&self.stream).map(Arc::new).map_err(|e| e.to_string()))
            .clone()
            .map_err(|message| Error::Blas { context: "creating the handle".into(), message })
    }

    pub(crate) fn module_cache(&self) -> &Mutex<HashMap<ModuleKey, Arc<CudaModule>>> {
        &self.modules
    }

    /// The raw device address of `buf` (for library calls that take pointers).
    pub fn ptr<T>(&self, buf: &CudaSlice<T>) -> u64 {
        crate::launch::device_ptr(buf)
    }

    /// A new stream of this device's context, for callers that order their own work.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx.new_stream().ctx("create a stream")
    }

    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().ctx("synchronize (a kernel may have faulted)")
    }

    /// Runs `work` with the profiler open (`cuProfilerStart` .. `cuProfilerStop`) and the stream
    /// drained on both sides, so a tool started with `--profile-from-start off` (ncu) sees exactly
    /// the launches `work` makes.
    pub fn profiled<T>(&self, work: impl FnOnce() -> Result<T>) -> Result<T> {
        self.synchronize()?;
        self.ctx.bind_to_thread().ctx("bind the context")?;
        cudarc::driver::profiler_start().ctx("cuProfilerStart")?;
        let out = work().and_then(|t| self.synchronize().map(|_| t));
        let stop = cudarc::driver::profiler_stop().ctx("cuProfilerStop");
        let t = out?;
        stop?;
        Ok(t)
    }

    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        self.stream.clone_htod(host).ctx("copy to device")
    }

    /// A page-locked host copy of `host`: write-combined (fast to send, slow for the CPU to read)
    /// and mapped into the device's address space, so a kernel can also read it in place over the
    /// host link (see [`Gpu::mapped_ptr`]).
    pub fn pinned<T: DeviceRepr + ValidAsZeroBits + Copy>(&self, host: &[T]) -> Result<PinnedHostSlice<T>> {
        use cudarc::driver::sys::{CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_WRITECOMBINED};
        // SAFETY: every element is written below before the slice is used.
        let mut p = unsafe {
            self.ctx.alloc_pinned_with_flags::<T>(
                host.len().max(1),
                CU_MEMHOSTALLOC_WRITECOMBINED | CU_MEMHOSTALLOC_DEVICEMAP,
            )
        }
        .ctx("allocate page-locked host memory")?;
        let ptr = p.as_mut_ptr().ctx("page-locked host memory")?;
        // SAFETY: `ptr` holds at least host.len() elements and does not overlap `host`.
        unsafe { std::ptr::copy_nonoverlapping(host.as_ptr(), ptr, host.len()) };
        Ok(p)
    }

    /// The device address of mapped page-locked memory from [`Gpu::pinned`]: a kernel reading it
    /// reads host memory over the host link.
    pub fn mapped_ptr<T: ValidAsZeroBits>(&self, p: &PinnedHostSlice<T>) -> Result<u64> {
        let host = p.as_ptr().ctx("page-locked host memory")?;
        let mut dev = 0;
        // SAFETY: `host` is the start of a live allocation made with CU_MEMHOSTALLOC_DEVICEMAP.
        unsafe { cudarc::driver::sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut _, 0) }
            .result()
            .ctx("cuMemHostGetDevicePointer")?;
        Ok(dev)
    }

    pub fn download<T: DeviceRepr + Default + Clone>(&self, dev: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream.clone_dtoh(dev).ctx("copy to host")
    }

    /// The first `width` elements of each of `rows` rows that lie `pitch` elements apart in `dev`,
    /// packed (`[rows, width]`), in one strided copy: padding columns never cross to the host.
    pub fn download_rows<T: DeviceRepr + Default + Clone>(
        &self,
        dev: &CudaSlice<T>,
        rows: usize,
        width: usize,
        pitch: usize,
    ) -> Result<Vec<T>> {
        use cudarc::driver::sys::{cuMemcpy2DAsync_v2, CUmemorytype, CUDA_MEMCPY2D};
        require(width <= pitch, "width <= pitch", || format!("width {width}, pitch {pitch}"))?;
        if rows == 0 || width == 0 {
            return Ok(Vec::new());
        }
        crate::error::require_len("rows to download", dev.len(), rows * pitch)?;
        let mut out = vec![T::default(); rows * width];
        let size = std::mem::size_of::<T>();
        let p = CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: crate::device_ptr(dev),
            srcArray: std::ptr::null_mut(),
            srcPitch: pitch * size,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: CUmemorytype::CU_MEMORYTYPE_HOST,
            dstHost: out.as_mut_ptr() as *mut _,
            dstDevice: 0,
            dstArray: std::ptr::null_mut(),
            dstPitch: width * size,
            WidthInBytes: width * size,
            Height: rows,
        };
        // SAFETY: the source holds rows * pitch elements (checked) and `out` rows * width; the host
        // waits for the copy below before `out` is used or dropped.
        unsafe { cuMemcpy2DAsync_v2(&p, self.stream.cu_stream()) }.result().ctx("cuMemcpy2DAsync (device to host)")?;
        self.synchronize()?;
        Ok(out)
    }

    /// The rows `rows` (ascending) of `dev`, whose rows are `row_len` elements, packed in that
    /// order: one copy per run of consecutive rows, so a sample of an output leaves the rest on
    /// the device.
    pub fn download_row_set<T: DeviceRepr + Default + Clone>(
        &self,
        dev: &CudaView<T>,
        row_len: usize,
        rows: &[usize],
    ) -> Result<Vec<T>> {
        let mut out = vec![T::default(); rows.len() * row_len];
        let Some(&last) = rows.last() else { return Ok(out) };
        crate::error::require_len("rows to download", dev.len(), (last + 1) * row_len)?;
        let mut start = 0;
        while start < rows.len() {
            let run = rows[start..].iter().enumerate().take_while(|&(i, &r)| r == rows[start] + i).count();
            let (from, to) = (rows[start] * row_len, (rows[start] + run) * row_len);
            let dst = &mut out[start * row_len..(start + run) * row_len];
            self.stream.memcpy_dtoh(&dev.slice(from..to), dst).ctx("copy rows to host")?;
            start += run;
        }
        self.synchronize()?;
        Ok(out)
    }

    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        self.stream.alloc_zeros(len.max(1)).ctx("allocate")
    }

    /// An allocation of `len` elements filled with all-ones bytes: NaN for f32, f16 and bf16.
    pub fn alloc_poisoned<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        let mut buf = self.zeros(len)?;
        self.poison(&mut buf)?;
        Ok(buf)
    }

    /// Fills `buf` with 0xFF bytes, so any element a kernel does not write reads back as NaN.
    pub fn poison<T: DeviceRepr>(&self, buf: &mut CudaSlice<T>) -> Result<()> {
        use cudarc::driver::DevicePtrMut;
        let bytes = buf.num_bytes();
        let (ptr, _guard) = buf.device_ptr_mut(&self.stream);
        // SAFETY: ptr..ptr+bytes is the allocation owned by `buf`.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0xFF, bytes, self.stream.cu_stream()) }
            .ctx("poison (memset 0xFF)")
    }
}

/// A rectangle of host memory to device memory on `stream`: `height` rows of `width` bytes, rows
/// `src_pitch` bytes apart at `src` and `dst_pitch` bytes apart at device address `dst` (a plain
/// copy is one row). From page-locked memory the copy is asynchronous; from pageable memory the
/// driver stages it and the host waits.
///
/// # Safety
/// `src` must hold `(height - 1) * src_pitch + width` readable bytes for as long as the copy runs,
/// and `dst` as many writable bytes with `dst_pitch`.
pub unsafe fn copy_htod_2d(
    stream: &CudaStream,
    dst: u64,
    dst_pitch: usize,
    src: *const u8,
    src_pitch: usize,
    width: usize,
    height: usize,
) -> Result<()> {
    use cudarc::driver::sys::{cuMemcpy2DAsync_v2, CUmemorytype, CUDA_MEMCPY2D};
    let p = CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: CUmemorytype::CU_MEMORYTYPE_HOST,
        srcHost: src as *const _,
        srcDevice: 0,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: height,
    };
    cuMemcpy2DAsync_v2(&p, stream.cu_stream()).result().ctx("cuMemcpy2DAsync (host to device)")
}

impl Gpu {
    /// Prepares entry point `entry` of `variant` (from `sources`) for `shape`: compiles or loads the
    /// module, resolves the function, reads its attributes and parameter sizes, checks the
    /// configuration ([`LaunchShape::check`], then what the driver's occupancy queries say: a block
    /// that fits on an SM, a cluster and a cooperative grid that fit on the device), raises the
    /// dynamic shared-memory limit when static plus dynamic shared memory passes 48 KiB, and records
    /// the resources the table shows. Nothing is launched.
    pub fn prepare_launch(
        &self,
        sources: &Sources,
        variant: &Variant,
        entry: &str,
        shape: LaunchShape,
    ) -> Result<Launch> {
        let mut shape = shape;
        let name = format!("{}:{entry}", variant.id());
        if variant.has(crate::launch::DEPENDENT_LAUNCH) {
            // A dependent launch of a kernel that never waits would race the kernel before it.
            let waits = match &variant.source {
                crate::Source::Kernel(path) => sources.find(path)?.text.contains(crate::launch::DEPENDENT_WAIT),
                _ => false,
            };
            if !waits {
                return Err(Error::Launch {
                    kernel: name,
                    reason: format!(
                        "{} is on, but the stage's file never calls {}",
                        crate::launch::DEPENDENT_LAUNCH,
                        crate::launch::DEPENDENT_WAIT
                    ),
                });
            }
            shape.dependent = true;
        }
        let module = self.module(sources, variant)?;
        let func = module
            .load_function(entry)
            .map_err(|e| Error::Launch { kernel: name.clone(), reason: format!("entry point not found: {e}") })?;
        let attr = |a: FnAttr| func.get_attribute(a).ctx("cuFuncGetAttribute").map(|v| v as u32);
        let (registers, static_shared, local, max_threads) = (
            attr(FnAttr::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            attr(FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            attr(FnAttr::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            attr(FnAttr::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        );
        let fail = |reason: String| Error::Launch { kernel: name.clone(), reason };
        let info = self.info();
        let limits = LaunchLimits {
            max_threads,
            static_shared,
            shared_optin: info.shared_memory_per_block_optin,
            compute_capability: info.compute_capability,
        };
        shape.check(&limits).map_err(fail)?;
        let threads = shape.block_threads();
        let total_smem = static_shared as u64 + shape.dynamic_shared_bytes as u64;
        // The limit belongs to the function, which every launch prepared from the module shares:
        // only ever raised, so that a smaller launch prepared later cannot lower it under an earlier
        // larger one (a graph capture of the two then fails at the larger).
        let limit = attr(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?;
        if total_smem > 48 * 1024 && shape.dynamic_shared_bytes > limit {
            func.set_attribute(
                FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shape.dynamic_shared_bytes as i32,
            )
            .ctx("raise the dynamic shared-memory limit")?;
        }
        // With clusters (queried after raising the shared-memory limit, which the query reads): at
        // least one must fit on the device at once, and how many do bounds a persistent grid (more
        // would wait for a second round).
        let max_active_clusters = match shape.cluster {
            Some(_) => {
                // SAFETY: plain C structs for which all-zero bytes are a valid value.
                let mut attrs: [sys::CUlaunchAttribute; 3] = unsafe { std::mem::zeroed() };
                let config = launch_config(&shape, std::ptr::null_mut(), &mut attrs);
                let mut n = 0i32;
                // SAFETY: a valid function handle and a configuration whose attribute outlives the call.
                unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, func.cu_function(), &config) }
                    .result()
                    .ctx("cuOccupancyMaxActiveClusters")?;
                if n == 0 {
                    return Err(fail(format!("no cluster of {:?} blocks fits on the device at once", shape.cluster)));
                }
                Some(n as u32)
            }
            None => None,
        };
        let blocks_per_sm = func
            .occupancy_max_active_blocks_per_multiprocessor(threads as u32, shape.dynamic_shared_bytes as usize, None)
            .ctx("occupancy query")?;
        if blocks_per_sm == 0 {
            return Err(fail(format!(
                "no block of this shape fits on an SM (registers or shared memory): {threads} threads x \
                 {registers} registers, {static_shared} + {} bytes of shared memory",
                shape.dynamic_shared_bytes
            )));
        }
        let resident = blocks_per_sm as u64 * info.sm_count as u64;
        let (gx, gy, gz) = shape.grid;
        if shape.cooperative && gx as u64 * gy as u64 * gz as u64 > resident {
            return Err(fail(format!(
                "a cooperative grid of {:?} blocks; {resident} fit on the device at once ({blocks_per_sm} an SM)",
                shape.grid
            )));
        }
        let params = param_sizes(&func).map_err(|e| fail(format!("reading the parameter layout: {e}")))?;
        if params.len() > MAX_ARGS {
            return Err(fail(format!("{} parameters; the launch path passes at most {MAX_ARGS}", params.len())));
        }
        let warps_per_block = threads.div_ceil(32) as f64;
        let resources = ResourceUse {
            kernel: name,
            registers,
            static_shared_bytes: static_shared,
            dynamic_shared_bytes: shape.dynamic_shared_bytes,
            local_bytes: local,
            block_threads: threads as u32,
            blocks_per_sm,
            occupancy: (blocks_per_sm as f64 * warps_per_block / (info.max_threads_per_sm as f64 / 32.0)).min(1.0),
        };
        Ok(Launch { func, shape, params, resources, max_active_clusters })
    }
}

/// What tells one compiled module from another in the process-wide cache: the family (two families'
/// `op/NN_x.cu` never collide), the file, the defines (switches and tunables) and the architecture.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ModuleKey {
    family: &'static str,
    path: &'static str,
    defines: Vec<Define>,
    arch: Arch,
}

/// One module as [`Gpu::module`] compiles it: its key in the process-wide cache and NVRTC's inputs.
struct ModuleJob {
    key: ModuleKey,
    variant: String,
    stage: u32,
    source: &'static KernelSource,
    headers: Vec<KernelSource>,
    defines: Vec<Define>,
    arch: Arch,
}

impl ModuleJob {
    fn compile(&self, tc: &Toolchain) -> Result<Compiled> {
        tc.compile(&self.variant, self.source, &self.headers, &self.defines, self.arch)
    }
}

impl Gpu {
    /// The compiled module of `variant` (its `.cu`, switches and tunables, for this device's exact
    /// architecture), compiling it or reading the disk cache on first use. The process-wide cache is
    /// keyed by family, path, defines and architecture, so two families' `op/NN_x.cu` never collide.
    pub fn module(&self, sources: &Sources, variant: &Variant) -> Result<Arc<CudaModule>> {
        let job = self.module_job(sources, variant)?;
        if let Some(m) = self.module_cache().lock().unwrap().get(&job.key) {
            return Ok(m.clone());
        }
        let compiled = job.compile(&*self.toolchain()?)?;
        self.load_compiled(job.key, compiled)
    }

    /// Compiles the modules of `variants` that are not loaded yet, all at once on every core (NVRTC
    /// compiles programs in parallel), and loads them: [`Gpu::module`]'s first-use work for a whole
    /// stage list ahead of time, so that a run does not compile one stage at a time. What cannot be
    /// loaded here is left to [`Gpu::module`], which reports it in the stage's own row: a library
    /// row or a stage this device does not support (no module), a compile error, no NVRTC. Returns
    /// how many modules were loaded.
    pub fn load_modules(&self, sources: &Sources, variants: &[Variant]) -> usize {
        let builds: Vec<(&Sources, Variant)> = variants.iter().map(|v| (sources, v.clone())).collect();
        self.load_builds(&builds)
    }

    /// [`Gpu::load_modules`] for variants of several families' sources at once (a composed stage's
    /// builds of other ladders' stages, [`crate::Op::extra_builds`]), all compiled together.
    pub fn load_builds(&self, builds: &[(&Sources, Variant)]) -> usize {
        let Ok(tc) = self.toolchain() else { return 0 };
        let mut jobs: Vec<ModuleJob> = Vec::new();
        {
            let loaded = self.module_cache().lock().unwrap();
            for job in builds.iter().filter_map(|(sources, v)| self.module_job(sources, v).ok()) {
                if !loaded.contains_key(&job.key) && !jobs.iter().any(|j| j.key == job.key) {
                    jobs.push(job);
                }
            }
        }
        let images = crate::nvrtc::compile_on_every_core(
            jobs,
            |job| job.stage,
            |job| Some((job.key.clone(), job.compile(&tc).ok()?)),
        );
        images.into_iter().flatten().map(|(key, image)| self.load_compiled(key, image)).filter(Result::is_ok).count()
    }

    fn module_job(&self, sources: &Sources, variant: &Variant) -> Result<ModuleJob> {
        let Source::Kernel(path) = variant.source else {
            return Err(Error::MissingSource(format!("{} is a library call or host work, not a kernel", variant.id())));
        };
        self.supports(variant)?;
        let arch = self.arch(variant.requires.arch_specific);
        let mut defines = variant.compile_defines();
        if self.chain_timeline.load(Ordering::Relaxed) && variant.has(crate::launch::DEPENDENT_LAUNCH) {
            defines.push(Define::on(crate::launch::CHAIN_TIMELINE));
        }
        Ok(ModuleJob {
            key: ModuleKey { family: sources.family, path, defines: defines.clone(), arch },
            variant: variant.id(),
            stage: variant.stage,
            source: sources.find(path)?,
            headers: sources.headers()?,
            defines,
            arch,
        })
    }

    fn load_compiled(&self, key: ModuleKey, compiled: Compiled) -> Result<Arc<CudaModule>> {
        let module = self.context().load_module(Ptx::from_binary(compiled.image)).ctx("load the compiled module")?;
        self.module_cache().lock().unwrap().insert(key, module.clone());
        Ok(module)
    }

    /// The modules of `sources`' file `path` loaded so far that were compiled with switch `switch` on
    /// (a prepared stage may have set defines per shape, so its module is found by file and switch:
    /// the timeline reads its stamps from whichever of these a run launched).
    pub fn loaded_with(&self, sources: &Sources, path: &str, switch: &'static str) -> Vec<Arc<CudaModule>> {
        let on = Define::on(switch);
        let cache = self.module_cache().lock().unwrap();
        cache
            .iter()
            .filter(|(k, _)| k.family == sources.family && k.path == path && k.defines.contains(&on))
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Builds every later dependent launch with the chain's timeline stamps on (`true`) or off: what
    /// [`crate::chain_timeline::record`] turns on around its runs. Launches prepared before keep
    /// their modules.
    pub fn set_chain_timeline(&self, on: bool) {
        self.chain_timeline.store(on, Ordering::Relaxed);
    }

    /// Every module loaded so far that was compiled with switch `switch` on, with its family and
    /// file.
    pub fn loaded_with_switch(&self, switch: &'static str) -> Vec<(String, Arc<CudaModule>)> {
        let on = Define::on(switch);
        let cache = self.module_cache().lock().unwrap();
        let mut found: Vec<(String, Arc<CudaModule>)> = cache
            .iter()
            .filter(|(k, _)| k.defines.contains(&on))
            .map(|(k, m)| (format!("{}/{}", k.family, k.path), m.clone()))
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found
    }

    /// Copies `data` into the `__constant__` (or `__device__`) symbol `symbol` of `variant`'s module,
    /// after checking it fits; ordered on `stream`.
    pub fn write_symbol<T: cudarc::driver::DeviceRepr>(
        &self,
        sources: &Sources,
        variant: &Variant,
        symbol: &str,
        data: &[T],
    ) -> Result<()> {
        let module = self.module(sources, variant)?;
        let stream = self.stream();
        let mut global = module.get_global(symbol, stream).ctx("find the module symbol")?;
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
}
