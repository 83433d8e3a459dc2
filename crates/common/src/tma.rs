//! TMA tensor maps (sm_90): the descriptors `cp.async.bulk.tensor` loads tiles through, encoded on
//! the host and passed to a kernel by value (`Arg::value`), as `ladder_hopper.cuh`'s `TmaMap`.

use cudarc::driver::sys;

use crate::error::{DriverContext, Result};

/// Columns of a box: 64 bf16, the 128 bytes of the 128-byte swizzle (the row of a wgmma atom).
pub const BOX_COLS: u32 = 64;

/// A 2-D tensor map of a row-major `[rows, cols]` bf16 matrix at `ptr`, in boxes of 64 columns
/// (128 bytes) x `box_rows`, in the 128-byte swizzle: the layout wgmma reads. A load zero-fills the
/// parts of a box past the matrix.
pub fn bf16_map(ptr: u64, rows: usize, cols: usize, box_rows: u32) -> Result<sys::CUtensorMap> {
    swizzled_map(ptr, rows, cols, box_rows, sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2)
}

/// [`bf16_map`] for a matrix of 1-byte elements (e4m3 codes): boxes of 128 columns (128 bytes) x
/// `box_rows`, in the 128-byte swizzle; a load zero-fills past the matrix (code 0 is +0).
pub fn e4m3_map(ptr: u64, rows: usize, cols: usize, box_rows: u32) -> Result<sys::CUtensorMap> {
    swizzled_map(ptr, rows, cols, box_rows, sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8, 1)
}

/// [`bf16_map`] for a matrix of fp32 elements: boxes of 32 columns (128 bytes) x `box_rows`, in the
/// 128-byte swizzle; a store through it writes nothing past the matrix. Needs `cols % 4 == 0`
/// (16-byte row strides).
pub fn f32_map(ptr: u64, rows: usize, cols: usize, box_rows: u32) -> Result<sys::CUtensorMap> {
    swizzled_map(ptr, rows, cols, box_rows, sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4)
}

/// A 2-D map of `[rows, cols]` elements of `bytes` bytes in boxes of 128 bytes x `box_rows`.
fn swizzled_map(
    ptr: u64,
    rows: usize,
    cols: usize,
    box_rows: u32,
    dtype: sys::CUtensorMapDataType,
    bytes: usize,
) -> Result<sys::CUtensorMap> {
    use sys::{CUtensorMapFloatOOBfill as F, CUtensorMapInterleave as I};
    use sys::{CUtensorMapL2promotion as L, CUtensorMapSwizzle as S};
    let dims = [cols as u64, rows as u64];
    let strides = [(bytes * cols) as u64];
    let boxes = [(128 / bytes) as u32, box_rows];
    let elements = [1u32, 1];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: the arrays hold rank (2) entries, rank - 1 for the strides; `map` is written by the
    // call; the address is a device allocation of rows * cols elements (checked by the caller),
    // whose row stride the caller checked is a multiple of 16 bytes.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            dtype,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elements.as_ptr(),
            I::CU_TENSOR_MAP_INTERLEAVE_NONE,
            S::CU_TENSOR_MAP_SWIZZLE_128B,
            L::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            F::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()
        .ctx("encode a TMA tensor map")?;
        Ok(map.assume_init())
    }
}
