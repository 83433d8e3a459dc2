//! Activations in one of two element types: fp32, or bf16 held as its bit patterns in `u16` (as the
//! bf16 kernels take them). Ops whose stages read or write either name the type with a shape key
//! of the element's bits (`in`, `out`: 32 or 16) and take the buffer as an [`Act`] or [`ActMut`].

use cudarc::driver::CudaSlice;

use crate::check::Verification;
use crate::data::Rotated;
use crate::{device_ptr, Error, Gpu, Result, Shape};

/// The element type of an activation buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActType {
    F32,
    /// bf16 bit patterns.
    Bf16,
}

impl ActType {
    /// The type shape key `key` names by its bits (32 or 16; absent: 32).
    pub fn from_key(s: &Shape, key: &str) -> Result<ActType> {
        match s.get(key).unwrap_or(32) {
            32 => Ok(ActType::F32),
            16 => Ok(ActType::Bf16),
            b => Err(Error::constraint(format!("{key} in {{32, 16}} (the element's bits)"), format!("{key} = {b}"))),
        }
    }

    /// Bytes of one element.
    pub fn bytes(self) -> usize {
        match self {
            ActType::F32 => 4,
            ActType::Bf16 => 2,
        }
    }
}

/// An activation buffer read by a kernel.
#[derive(Clone, Copy)]
pub enum Act<'a> {
    F32(&'a CudaSlice<f32>),
    /// bf16 bit patterns.
    Bf16(&'a CudaSlice<u16>),
}

impl Act<'_> {
    pub fn len(&self) -> usize {
        match self {
            Act::F32(x) => x.len(),
            Act::Bf16(x) => x.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn ty(&self) -> ActType {
        match self {
            Act::F32(_) => ActType::F32,
            Act::Bf16(_) => ActType::Bf16,
        }
    }

    pub fn ptr(&self) -> u64 {
        match self {
            Act::F32(x) => device_ptr(*x),
            Act::Bf16(x) => device_ptr(*x),
        }
    }
}

/// An activation buffer written by a kernel.
pub enum ActMut<'a> {
    F32(&'a mut CudaSlice<f32>),
    /// bf16 bit patterns.
    Bf16(&'a mut CudaSlice<u16>),
}

impl ActMut<'_> {
    pub fn len(&self) -> usize {
        match self {
            ActMut::F32(x) => x.len(),
            ActMut::Bf16(x) => x.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn ty(&self) -> ActType {
        match self {
            ActMut::F32(_) => ActType::F32,
            ActMut::Bf16(_) => ActType::Bf16,
        }
    }

    pub fn ptr(&self) -> u64 {
        match self {
            ActMut::F32(x) => device_ptr(*x),
            ActMut::Bf16(x) => device_ptr(*x),
        }
    }
}

/// An activation buffer owned in its element type.
pub enum ActBuf {
    F32(CudaSlice<f32>),
    /// bf16 bit patterns.
    Bf16(CudaSlice<u16>),
}

impl ActBuf {
    /// `n` zeros of type `ty`.
    pub fn zeros(gpu: &Gpu, ty: ActType, n: usize) -> Result<ActBuf> {
        Ok(match ty {
            ActType::F32 => ActBuf::F32(gpu.zeros(n)?),
            ActType::Bf16 => ActBuf::Bf16(gpu.zeros(n)?),
        })
    }

    /// `x` in type `ty` (bf16: each value rounded to nearest even), and the values as uploaded.
    pub fn upload(gpu: &Gpu, ty: ActType, x: &[f32]) -> Result<(ActBuf, Vec<f32>)> {
        Ok(match ty {
            ActType::F32 => (ActBuf::F32(gpu.upload(x)?), x.to_vec()),
            ActType::Bf16 => {
                let bits: Vec<u16> = x.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
                let rounded = bits.iter().map(|&b| half::bf16::from_bits(b).to_f32()).collect();
                (ActBuf::Bf16(gpu.upload(&bits)?), rounded)
            }
        })
    }

    pub fn act(&self) -> Act<'_> {
        match self {
            ActBuf::F32(x) => Act::F32(x),
            ActBuf::Bf16(x) => Act::Bf16(x),
        }
    }

    pub fn act_mut(&mut self) -> ActMut<'_> {
        match self {
            ActBuf::F32(x) => ActMut::F32(x),
            ActBuf::Bf16(x) => ActMut::Bf16(x),
        }
    }

    /// Every element as fp32.
    pub fn download(&self, gpu: &Gpu) -> Result<Vec<f32>> {
        Ok(match self {
            ActBuf::F32(x) => gpu.download(x)?,
            ActBuf::Bf16(x) => gpu.download(x)?.into_iter().map(|b| half::bf16::from_bits(b).to_f32()).collect(),
        })
    }

    /// Fills the buffer with NaN bit patterns (an unwritten element then fails any check).
    pub fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        match self {
            ActBuf::F32(x) => gpu.poison(x),
            ActBuf::Bf16(x) => gpu.poison(x),
        }
    }
}

/// A problem's output in its element type, at `copies` addresses ([`Rotated`]).
pub enum RotatedAct {
    F32(Rotated<f32>),
    /// bf16 bit patterns.
    Bf16(Rotated<u16>),
}

impl RotatedAct {
    /// `copies` poisoned outputs of `len` elements of type `ty`.
    pub fn outputs(gpu: &Gpu, ty: ActType, len: usize, copies: usize) -> Result<RotatedAct> {
        Ok(match ty {
            ActType::F32 => RotatedAct::F32(Rotated::outputs(gpu, len, copies)?),
            ActType::Bf16 => RotatedAct::Bf16(Rotated::outputs(gpu, len, copies)?),
        })
    }

    pub fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        match self {
            RotatedAct::F32(x) => x.poison(gpu),
            RotatedAct::Bf16(x) => x.poison(gpu),
        }
    }

    pub fn get_mut(&mut self, copy: usize) -> ActMut<'_> {
        match self {
            RotatedAct::F32(x) => ActMut::F32(x.get_mut(copy)),
            RotatedAct::Bf16(x) => ActMut::Bf16(x.get_mut(copy)),
        }
    }

    /// `v` with copy `copy`'s `rows` (of `dims` = (rows, C)) compared with `reference`
    /// ([`Verification::add_device_rows`]; bf16 read as bf16).
    #[allow(clippy::too_many_arguments)]
    pub fn add_device_rows(
        &self,
        v: Verification,
        gpu: &Gpu,
        name: &str,
        copy: usize,
        dims: (usize, usize),
        rows: &[usize],
        reference: &[f64],
    ) -> Result<Verification> {
        match self {
            RotatedAct::F32(x) => v.add_device_rows(gpu, name, &x.get(copy).as_view(), dims, rows, reference),
            RotatedAct::Bf16(x) => {
                let out = x.get(copy);
                // SAFETY: u16 and bf16 have one size and alignment; the buffer holds bf16 bit patterns.
                let view = unsafe { out.transmute::<half::bf16>(out.len()) }
                    .ok_or_else(|| Error::constraint("a bf16 view of the output", "none"))?;
                v.add_device_rows(gpu, name, &view, dims, rows, reference)
            }
        }
    }
}
