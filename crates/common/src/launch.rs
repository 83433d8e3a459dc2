//! The one launch path: a [`Launch`] is prepared once (module compiled or loaded, function resolved,
//! attributes and parameter layout read, the configuration checked against the function's and the
//! device's limits, the dynamic shared-memory cap raised) and then enqueued any number of times on
//! any stream with [`Launch::enqueue`], which only fills the parameter array and calls
//! `cuLaunchKernelEx` (thread-block clusters and by-value structs such as a `CUtensorMap` included).
//! Preparing is [`crate::Gpu::prepare_launch`] (in `gpu.rs`, with the device's other methods).

use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr};
use serde::Serialize;

use crate::error::{DriverContext, Error, Result};

/// Most parameters any entry point takes.
pub const MAX_ARGS: usize = 24;

/// The define that builds a stage as a link of a programmatic-dependent chain
/// (`ladder_dependent.cuh`: its kernels wait for the previous grid before touching what it writes)
/// and makes [`crate::Gpu::prepare_launch`] launch it as a dependent ([`LaunchShape::dependent`]):
/// one switch for both sides. A host turns it on with [`crate::Variant::switch_on`].
pub const DEPENDENT_LAUNCH: &str = "LADDER_DEPENDENT";

/// The define that adds the chain's timeline stamps to a dependent build (`ladder_dependent.cuh`);
/// [`crate::Gpu::set_chain_timeline`] adds it to every dependent launch prepared while it is on.
pub const CHAIN_TIMELINE: &str = "LADDER_CHAIN_TIMELINE";

/// What a stage's own file must call for [`DEPENDENT_LAUNCH`] to be safe.
pub const DEPENDENT_WAIT: &str = "ladder_wait_prerequisites()";

/// Grid, block, dynamic shared memory and (optionally) thread-block cluster of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchShape {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub dynamic_shared_bytes: u32,
    /// Thread-block cluster dimensions (`sm_90`); `None` launches without clusters.
    pub cluster: Option<(u32, u32, u32)>,
    /// Programmatic dependent launch (`sm_90`): the grid may start while the kernel before it in the
    /// stream is still running, once every block of that kernel has executed
    /// `griddepcontrol.launch_dependents` (or exited). Only for a kernel that executes
    /// `griddepcontrol.wait` before it touches memory the previous kernel may write or read.
    pub dependent: bool,
    /// A cooperative launch: every block resident at once (the driver refuses a grid that does not
    /// fit), as a kernel with grid-wide barriers needs.
    pub cooperative: bool,
}

/// What the device and a compiled function allow a launch ([`LaunchShape::check`]).
#[derive(Clone, Copy, Debug)]
pub struct LaunchLimits {
    /// The function's most threads a block (its registers and `__launch_bounds__`).
    pub max_threads: u32,
    /// The function's static shared memory, bytes.
    pub static_shared: u32,
    /// The device's most shared memory a block with the opt-in, bytes.
    pub shared_optin: u32,
    pub compute_capability: (u32, u32),
}

impl LaunchShape {
    /// Why this shape cannot launch under `limits`, if it cannot: a zero dimension, a grid past
    /// (2^31 - 1, 65535, 65535), more threads a block than the function allows (or z past 64), more
    /// shared memory (static and dynamic) than the device's opt-in, a cluster that does not divide
    /// the grid or holds more than 8 blocks, or clusters or dependent launch before compute
    /// capability 9.0. What only the driver's occupancy queries can tell is checked at prepare.
    pub fn check(&self, limits: &LaunchLimits) -> std::result::Result<(), String> {
        let (gx, gy, gz) = self.grid;
        let (bx, by, bz) = self.block;
        if [gx, gy, gz, bx, by, bz].contains(&0) {
            return Err(format!("zero dimension in grid {:?} or block {:?}", self.grid, self.block));
        }
        if gx > i32::MAX as u32 || gy > 65535 || gz > 65535 {
            return Err(format!("grid {:?} exceeds (2^31-1, 65535, 65535)", self.grid));
        }
        let threads = self.block_threads();
        if threads > limits.max_threads as u64 || bz > 64 {
            return Err(format!(
                "block {:?} = {threads} threads; this function allows {}",
                self.block, limits.max_threads
            ));
        }
        let shared = limits.static_shared as u64 + self.dynamic_shared_bytes as u64;
        if shared > limits.shared_optin as u64 {
            return Err(format!(
                "{shared} bytes of shared memory per block; the device allows {}",
                limits.shared_optin
            ));
        }
        let hopper = limits.compute_capability >= (9, 0);
        if let Some((cx, cy, cz)) = self.cluster {
            if !hopper {
                return Err("thread-block clusters need compute capability 9.0".into());
            }
            if [cx, cy, cz].contains(&0) || gx % cx != 0 || gy % cy != 0 || gz % cz != 0 || cx * cy * cz > 8 {
                return Err(format!(
                    "cluster {:?} must divide grid {:?} and hold at most 8 blocks",
                    (cx, cy, cz),
                    self.grid
                ));
            }
        }
        if self.dependent && !hopper {
            return Err("programmatic dependent launch needs compute capability 9.0".into());
        }
        Ok(())
    }

    pub fn linear(grid: u32, block: u32) -> LaunchShape {
        LaunchShape::new((grid, 1, 1), (block, 1, 1))
    }

    pub fn new(grid: (u32, u32, u32), block: (u32, u32, u32)) -> LaunchShape {
        LaunchShape { grid, block, dynamic_shared_bytes: 0, cluster: None, dependent: false, cooperative: false }
    }

    pub fn with_shared(mut self, bytes: u32) -> LaunchShape {
        self.dynamic_shared_bytes = bytes;
        self
    }

    pub fn with_cluster(mut self, cluster: (u32, u32, u32)) -> LaunchShape {
        self.cluster = Some(cluster);
        self
    }

    /// Launched as a programmatic dependent of the previous kernel in the stream ([`Self::dependent`]).
    pub fn with_dependent_launch(mut self) -> LaunchShape {
        self.dependent = true;
        self
    }

    /// Launched cooperatively ([`Self::cooperative`]).
    pub fn with_cooperative(mut self) -> LaunchShape {
        self.cooperative = true;
        self
    }

    pub(crate) fn block_threads(&self) -> u64 {
        self.block.0 as u64 * self.block.1 as u64 * self.block.2 as u64
    }
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

/// One kernel argument. Scalars are held by value; [`Arg::value`] passes any plain struct (a
/// `CUtensorMap`, say) by value through a reference that lives as long as the argument list.
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    /// A device address.
    Ptr(u64),
    I32(i32),
    U32(u32),
    F32(f32),
    /// `size` bytes at `ptr`, copied into the parameter buffer by the launch.
    Value {
        ptr: *const c_void,
        size: usize,
        _borrow: PhantomData<&'a ()>,
    },
}

impl<'a> Arg<'a> {
    /// The device address of `buf` (read or written by the kernel).
    pub fn buf<T>(buf: &CudaSlice<T>) -> Arg<'static> {
        Arg::Ptr(device_ptr(buf))
    }

    /// A count or index as the kernels' `int`; sizes were bounded by the shape checks.
    pub fn int(v: usize) -> Arg<'static> {
        Arg::I32(v as i32)
    }

    pub fn value<T: Copy>(v: &'a T) -> Arg<'a> {
        Arg::Value { ptr: v as *const T as *const c_void, size: std::mem::size_of::<T>(), _borrow: PhantomData }
    }

    fn size(&self) -> usize {
        match self {
            Arg::Ptr(_) => 8,
            Arg::I32(_) | Arg::U32(_) | Arg::F32(_) => 4,
            Arg::Value { size, .. } => *size,
        }
    }

    fn param(&self) -> *mut c_void {
        match self {
            Arg::Ptr(p) => p as *const u64 as *mut c_void,
            Arg::I32(v) => v as *const i32 as *mut c_void,
            Arg::U32(v) => v as *const u32 as *mut c_void,
            Arg::F32(v) => v as *const f32 as *mut c_void,
            Arg::Value { ptr, .. } => *ptr as *mut c_void,
        }
    }
}

/// The raw device address of `buf`. The harness disables cudarc's event tracking, so this is a
/// plain field read.
pub fn device_ptr<T>(buf: &CudaSlice<T>) -> u64 {
    buf.device_ptr(buf.stream()).0
}

/// A kernel entry point prepared for one launch configuration.
#[derive(Debug)]
pub struct Launch {
    /// Keeps the module loaded.
    pub(crate) func: CudaFunction,
    pub(crate) shape: LaunchShape,
    /// The byte size of each parameter, from the driver (`cuFuncGetParamInfo`): every enqueue's
    /// argument list is checked against it.
    pub(crate) params: Vec<usize>,
    pub(crate) resources: ResourceUse,
    /// With clusters: how many fit on the device at once (`cuOccupancyMaxActiveClusters`).
    pub(crate) max_active_clusters: Option<u32>,
}

impl Launch {
    pub fn shape(&self) -> LaunchShape {
        self.shape
    }

    pub fn resources(&self) -> &ResourceUse {
        &self.resources
    }

    pub fn name(&self) -> &str {
        &self.resources.kernel
    }

    /// With clusters: how many of them the device runs at once (`None` without clusters).
    pub fn max_active_clusters(&self) -> Option<u32> {
        self.max_active_clusters
    }

    /// Enqueues the kernel on `stream`: fills the parameter array and launches, nothing else (no
    /// lookup, no attribute query, no allocation). The argument count and sizes must match the
    /// entry point's parameters, or this returns an error and launches nothing.
    ///
    /// # Safety
    /// The arguments must be what the kernel expects: device addresses of buffers large enough for
    /// the extent the kernel touches at the prepared configuration, and the scalars it indexes with.
    pub unsafe fn enqueue(&self, stream: &CudaStream, args: &[Arg]) -> Result<()> {
        if args.len() != self.params.len() || args.iter().zip(&self.params).any(|(a, &p)| a.size() != p) {
            return Err(self.signature_error(args));
        }
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (slot, a) in params.iter_mut().zip(args) {
            *slot = a.param();
        }
        let mut attrs: [sys::CUlaunchAttribute; 3] = std::mem::zeroed();
        let config = launch_config(&self.shape, stream.cu_stream(), &mut attrs);
        stream.context().bind_to_thread().ctx("bind the context")?;
        sys::cuLaunchKernelEx(&config, self.func.cu_function(), params.as_mut_ptr(), std::ptr::null_mut())
            .result()
            .map_err(|source| Error::Driver { context: format!("launch {}", self.resources.kernel), source })
    }

    #[cold]
    fn signature_error(&self, args: &[Arg]) -> Error {
        Error::Launch {
            kernel: self.resources.kernel.clone(),
            reason: format!(
                "arguments of {:?} bytes; the entry point takes {:?}",
                args.iter().map(Arg::size).collect::<Vec<_>>(),
                self.params
            ),
        }
    }
}

/// The driver's launch configuration of `s` on `stream`, its attributes (cluster, dependent launch)
/// written into `attrs`, which the configuration points at.
pub(crate) fn launch_config(
    s: &LaunchShape,
    stream: sys::CUstream,
    attrs: &mut [sys::CUlaunchAttribute; 3],
) -> sys::CUlaunchConfig {
    let mut count = 0;
    if let Some((x, y, z)) = s.cluster {
        attrs[count].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attrs[count].value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x, y, z };
        count += 1;
    }
    if s.dependent {
        attrs[count].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[count].value.programmaticStreamSerializationAllowed = 1;
        count += 1;
    }
    if s.cooperative {
        attrs[count].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        attrs[count].value.cooperative = 1;
        count += 1;
    }
    sys::CUlaunchConfig {
        gridDimX: s.grid.0,
        gridDimY: s.grid.1,
        gridDimZ: s.grid.2,
        blockDimX: s.block.0,
        blockDimY: s.block.1,
        blockDimZ: s.block.2,
        sharedMemBytes: s.dynamic_shared_bytes,
        hStream: stream,
        attrs: attrs.as_mut_ptr(),
        numAttrs: count as u32,
    }
}

/// The size of each kernel parameter, in order (the driver answers an invalid index past the last).
pub(crate) fn param_sizes(func: &CudaFunction) -> std::result::Result<Vec<usize>, cudarc::driver::DriverError> {
    let mut sizes = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: writes two usize values for a valid function handle.
        let r = unsafe { sys::cuFuncGetParamInfo(func.cu_function(), sizes.len(), &mut offset, &mut size) };
        match r {
            sys::CUresult::CUDA_SUCCESS => sizes.push(size),
            sys::CUresult::CUDA_ERROR_INVALID_VALUE => return Ok(sizes),
            other => return Err(cudarc::driver::DriverError(other)),
        }
    }
}

/// How many ways to split each of `units` independent work items over `resident` blocks (what fits
/// on the device at once), at most `max`: the fewest splits whose time, taken as the grid's waves per
/// split (`ceil(units * s / resident) / s`), comes within 5% of the best. Fewer splits mean less to
/// merge; a grid a few blocks past a whole wave costs a whole extra wave.
pub fn wave_splits(units: usize, resident: usize, max: usize) -> usize {
    let (units, resident, max) = (units.max(1), resident.max(1), max.max(1));
    let cost = |s: usize| (units * s).div_ceil(resident) as f64 / s as f64;
    let best = (1..=max).map(cost).fold(f64::INFINITY, f64::min);
    (1..=max).find(|&s| cost(s) <= best * 1.05).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    fn h100() -> LaunchLimits {
        LaunchLimits { max_threads: 1024, static_shared: 1024, shared_optin: 227 * 1024, compute_capability: (9, 0) }
    }

    #[test]
    fn shapes_past_the_limits_are_refused_with_the_reason() {
        let ok = LaunchShape::new((132, 1, 1), (384, 1, 1)).with_shared(200 * 1024);
        assert_eq!(ok.check(&h100()), Ok(()));
        let cases = [
            (LaunchShape::new((0, 1, 1), (32, 1, 1)), "zero dimension"),
            (LaunchShape::new((1, 65536, 1), (32, 1, 1)), "exceeds"),
            (LaunchShape::linear(1, 2048), "threads"),
            (LaunchShape::new((1, 1, 1), (1, 1, 65)), "threads"),
            (LaunchShape::linear(1, 32).with_shared(227 * 1024), "shared memory"),
            (LaunchShape::linear(3, 32).with_cluster((2, 1, 1)), "cluster"),
            (LaunchShape::linear(16, 32).with_cluster((16, 1, 1)), "cluster"),
        ];
        for (shape, why) in cases {
            let err = shape.check(&h100()).expect_err(why);
            assert!(err.contains(why), "{err}");
        }
        let ampere = LaunchLimits { compute_capability: (8, 0), ..h100() };
        assert!(LaunchShape::linear(2, 32).with_cluster((2, 1, 1)).check(&ampere).is_err());
        assert!(LaunchShape::linear(2, 32).with_cluster((2, 1, 1)).check(&h100()).is_ok());
        assert!(LaunchShape::linear(2, 32).with_dependent_launch().check(&ampere).is_err());
    }

    use super::*;

    #[test]
    fn wave_splits_fill_whole_waves() {
        // GPT-2's 12 heads on 132 blocks: 11 ways (132 units); 96 pairs 4 ways (3 waves, 3% from the
        // best); 384 not at all.
        assert_eq!(wave_splits(12, 132, 16), 11);
        assert_eq!(wave_splits(96, 132, 16), 4);
        assert_eq!(wave_splits(384, 132, 16), 1);
        assert_eq!(wave_splits(1, 1, 16), 1);
        // 32 sequences on 528 places (4 an SM): 16 ways, one wave; 17 would be 544 blocks, two.
        assert_eq!(wave_splits(32, 528, 128), 16);
        assert_eq!(wave_splits(32, 396, 128), 12);
        // 512 sequences on 396 places: 3 ways (4 waves of 1536 blocks, 1.33 against 1.29 at best),
        // not 1 (2 waves, the second three quarters empty).
        assert_eq!(wave_splits(512, 396, 128), 3);
        assert_eq!(wave_splits(512, 528, 128), 1);
        assert_eq!(wave_splits(0, 0, 0), 1);
    }

    #[test]
    fn arg_sizes_and_params_point_at_the_values() {
        let v = [7u8; 128];
        let args = [Arg::Ptr(5), Arg::int(3), Arg::F32(1.5), Arg::value(&v)];
        assert_eq!(args.iter().map(Arg::size).collect::<Vec<_>>(), [8, 4, 4, 128]);
        // SAFETY: each param points at a live value of the argument's own type.
        unsafe {
            assert_eq!(*(args[0].param() as *const u64), 5);
            assert_eq!(*(args[1].param() as *const i32), 3);
            assert_eq!(*(args[2].param() as *const f32), 1.5);
            assert_eq!(*(args[3].param() as *const [u8; 128]), v);
        }
    }
}
