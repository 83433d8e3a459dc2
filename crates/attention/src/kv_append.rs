//! KV append: from a fused QKV projection's fp32 rows `[q | k | v]` to decode attention's inputs —
//! q as bf16 `[R, C]`, and k and v written as bf16 into cells `(seq[r], pos[r])` of contiguous
//! `[B, Tmax, H, D]` caches — plus the widening of decode attention's bf16 output back to fp32.
//! What a model runs around the `decode` op.
//!
//! Shape keys: `R` (rows), `B`, `Tmax`, `C`.

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rng, uniform};
use common::{
    require, require_len, Arg, Bound, DriverContext, Error, Gpu, Launch, LaunchShape, Limit, Op, OpInfo, Precision,
    Prepared as Current, PreparedStage, Problem, ResourceUse, Result, Shape, Variant, Workload,
};
use half::bf16;
use rand::seq::SliceRandom;

use crate::{FAMILY, SOURCES};

const OP: &str = "kv-append";
const THREADS: u32 = 256;
const CACHE: &str = "B * Tmax * C < 2^31";
const ROWS: &str = "R * 3C < 2^31";

fn stages() -> Vec<Variant> {
    vec![Variant::kernel(
        FAMILY,
        OP,
        0,
        "naive",
        "kv-append/00_naive.cu",
        Precision::Bf16,
        "one thread per (row, channel): q to bf16, k and v to their cache cells",
    )]
}

/// The sizes of one append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvAppendDims {
    pub rows: usize,
    pub b: usize,
    pub tmax: usize,
    pub c: usize,
}

pub fn check_shape(d: KvAppendDims) -> Result<()> {
    for (k, v) in [("R", d.rows), ("B", d.b), ("Tmax", d.tmax), ("C", d.c)] {
        require(v >= 1, &format!("{k} >= 1"), || format!("{k} = {v}"))?;
    }
    let n = d.b.checked_mul(d.tmax).and_then(|x| x.checked_mul(d.c));
    require(n.is_some_and(|n| n < 1 << 31), CACHE, || format!("B = {}, Tmax = {}, C = {}", d.b, d.tmax, d.c))?;
    require(d.rows.checked_mul(3 * d.c).is_some_and(|n| n < 1 << 31), ROWS, || format!("R = {}", d.rows))
}

/// Each row's cache cell, checked on the host to lie in `[0, B) x [0, Tmax)` when uploaded: the only
/// way to make one, so the kernel can index the cache with them unchecked.
pub struct Cells {
    seq: CudaSlice<i32>,
    pos: CudaSlice<i32>,
    b: usize,
    tmax: usize,
}

impl Cells {
    pub fn upload(gpu: &Gpu, cells: &[(usize, usize)], b: usize, tmax: usize) -> Result<Cells> {
        if let Some((i, c)) = cells.iter().enumerate().find(|(_, &(s, p))| s >= b || p >= tmax) {
            return Err(Error::constraint(
                format!("cell (seq, pos) in [0, {b}) x [0, {tmax})"),
                format!("row {i}: {c:?}"),
            ));
        }
        let seq: Vec<i32> = cells.iter().map(|c| c.0 as i32).collect();
        let pos: Vec<i32> = cells.iter().map(|c| c.1 as i32).collect();
        Ok(Cells { seq: gpu.upload(&seq)?, pos: gpu.upload(&pos)?, b, tmax })
    }

    /// New cells for as many rows, checked as in [`Cells::upload`], copied into the same buffers.
    pub fn set(&mut self, gpu: &Gpu, cells: &[(usize, usize)]) -> Result<()> {
        let fresh = Cells::upload(gpu, cells, self.b, self.tmax)?;
        require_len("cells", cells.len(), self.seq.len())?;
        let copy =
            |dst: &mut CudaSlice<i32>, src: &CudaSlice<i32>| gpu.stream().memcpy_dtod(src, dst).ctx("copy cells");
        copy(&mut self.seq, &fresh.seq)?;
        copy(&mut self.pos, &fresh.pos)
    }
}

pub struct Prepared {
    append: Launch,
    widen: Launch,
    d: KvAppendDims,
}

pub fn prepare(gpu: &Gpu, v: &Variant, d: KvAppendDims) -> Result<Prepared> {
    check_shape(d)?;
    let lin = |n: usize| LaunchShape::linear((n as u32).div_ceil(THREADS), THREADS);
    Ok(Prepared {
        append: gpu.prepare_launch(&SOURCES, v, "kv_append_bf16", lin(d.rows * d.c))?,
        widen: gpu.prepare_launch(&SOURCES, v, "kv_out_f32", lin(d.rows * d.c))?,
        d,
    })
}

/// The buffers of one append: `q_out` `[R, C]` and the caches `[B, Tmax, C]` as bf16 bit patterns.
pub struct KvAppendArgs<'a> {
    pub q_out: &'a mut CudaSlice<u16>,
    pub k_cache: &'a mut CudaSlice<u16>,
    pub v_cache: &'a mut CudaSlice<u16>,
    pub qkv: &'a CudaSlice<f32>,
    pub cells: &'a Cells,
}

impl Prepared {
    pub fn enqueue(&self, stream: &CudaStream, a: KvAppendArgs) -> Result<()> {
        let d = self.d;
        require((a.cells.b, a.cells.tmax) == (d.b, d.tmax), "cells checked against this B and Tmax", || {
            format!("({}, {})", a.cells.b, a.cells.tmax)
        })?;
        require_len("cells", a.cells.seq.len(), d.rows)?;
        require_len("q_out", a.q_out.len(), d.rows * d.c)?;
        require_len("qkv", a.qkv.len(), d.rows * 3 * d.c)?;
        require_len("K cache", a.k_cache.len(), d.b * d.tmax * d.c)?;
        require_len("V cache", a.v_cache.len(), d.b * d.tmax * d.c)?;
        let args = [
            Arg::buf(a.q_out),
            Arg::buf(a.k_cache),
            Arg::buf(a.v_cache),
            Arg::buf(a.qkv),
            Arg::buf(&a.cells.seq),
            Arg::buf(&a.cells.pos),
            Arg::int(d.rows),
            Arg::int(d.c),
            Arg::int(d.tmax),
        ];
        // SAFETY: the arguments follow kv_append_bf16's signature; lengths checked above, every
        // cell was checked against B and Tmax when uploaded.
        unsafe { self.append.enqueue(stream, &args) }
    }

    /// `out = float(inp)` over `[R, C]` (decode attention's bf16 output, for the next fp32 GEMM).
    pub fn enqueue_widen(&self, stream: &CudaStream, out: &mut CudaSlice<f32>, inp: &CudaSlice<u16>) -> Result<()> {
        let n = self.d.rows * self.d.c;
        require_len("out", out.len(), n)?;
        require_len("in", inp.len(), n)?;
        // SAFETY: kv_out_f32(out, in, n); both hold n elements.
        unsafe { self.widen.enqueue(stream, &[Arg::buf(out), Arg::buf(inp), Arg::int(n)]) }
    }
}

impl PreparedStage for Prepared {
    fn resources(&self) -> Vec<ResourceUse> {
        vec![self.append.resources().clone(), self.widen.resources().clone()]
    }
}

fn shape(r: i64, b: i64, tmax: i64, c: i64) -> Shape {
    Shape::new(&[("R", r), ("B", b), ("Tmax", tmax), ("C", c)])
}

fn dims(s: &Shape) -> Result<KvAppendDims> {
    let big = i32::MAX as i64;
    Ok(KvAppendDims { rows: s.dim("R", big)?, b: s.dim("B", big)?, tmax: s.dim("Tmax", big)?, c: s.dim("C", big)? })
}

static INFO: OpInfo = OpInfo {
    family: FAMILY,
    name: OP,
    description: "QKV rows (fp32) to bf16 q and to their (seq, pos) cells of bf16 [B,Tmax,C] K/V caches",
    sources: &SOURCES,
    shape_keys: &["R", "B", "Tmax", "C"],
    stages,
};

pub struct KvAppend;

impl Op for KvAppend {
    fn info(&self) -> &'static OpInfo {
        &INFO
    }
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2 decode at batch 8 (one row per sequence), and a 1024-token prefill of one sequence.
        vec![shape(8, 8, 1024, 768), shape(1024, 8, 1024, 768)]
    }
    fn validate(&self, _v: &Variant, s: &Shape) -> Result<()> {
        let d = dims(s)?;
        check_shape(d)?;
        require(d.rows <= d.b * d.tmax, "R <= B * Tmax (distinct cells)", || format!("R = {}", d.rows))
    }
    fn limits(&self, _v: &Variant) -> Vec<Limit> {
        vec![
            Limit { constraint: CACHE, past: shape(1, 1 << 11, 1 << 10, 1 << 10), inside: None },
            Limit { constraint: ROWS, past: shape(1 << 20, 1 << 20, 1, 1 << 10), inside: None },
        ]
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        self.validate(&stages()[0], s)?;
        let d = dims(s)?;
        let mut all: Vec<(usize, usize)> = (0..d.b).flat_map(|b| (0..d.tmax).map(move |t| (b, t))).collect();
        all.shuffle(&mut rng(seed));
        all.truncate(d.rows);
        let qkv = uniform(d.rows * 3 * d.c, -2.0, 2.0, seed ^ 1);
        Ok(Box::new(KvAppendProblem {
            d,
            cells: Cells::upload(gpu, &all, d.b, d.tmax)?,
            cell_list: all,
            qkv_dev: gpu.upload(&qkv)?,
            qkv,
            q: gpu.zeros(d.rows * d.c)?,
            k: gpu.zeros(d.b * d.tmax * d.c)?,
            v: gpu.zeros(d.b * d.tmax * d.c)?,
            prepared: Current::default(),
        }))
    }
}

struct KvAppendProblem {
    d: KvAppendDims,
    cells: Cells,
    cell_list: Vec<(usize, usize)>,
    qkv: Vec<f32>,
    qkv_dev: CudaSlice<f32>,
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    prepared: Current<Prepared>,
}

impl Problem for KvAppendProblem {
    fn workload(&self) -> Workload {
        let n = (self.d.rows * self.d.c) as u64;
        Workload { bytes: 12 * n + 6 * n + 8 * self.d.rows as u64, flops: 0, bound: Bound::Memory }
    }
    fn copies(&self) -> usize {
        1
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        gpu.poison(&mut self.q)?;
        gpu.poison(&mut self.k)?;
        gpu.poison(&mut self.v)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        Ok(self.prepared.set(v, prepare(gpu, v, self.d)?))
    }
    fn enqueue(&mut self, stream: &CudaStream, _copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let args = KvAppendArgs {
            q_out: &mut self.q,
            k_cache: &mut self.k,
            v_cache: &mut self.v,
            qkv: &self.qkv_dev,
            cells: &self.cells,
        };
        p.enqueue(stream, args)
    }
    fn verify(&mut self, gpu: &Gpu, _copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        let c = self.d.c;
        let (q, k, vv) = (gpu.download(&self.q)?, gpu.download(&self.k)?, gpu.download(&self.v)?);
        let f = |x: u16| bf16::from_bits(x).to_f32();
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for (r, &(s, p)) in self.cell_list.iter().enumerate() {
            let cell = (s * self.d.tmax + p) * c;
            for (part, buf, off) in [(0, &q, r * c), (1, &k, cell), (2, &vv, cell)] {
                got.extend(buf[off..off + c].iter().map(|&x| f(x)));
                want.extend(self.qkv[(r * 3 + part) * c..][..c].iter().map(|&x| x as f64));
            }
        }
        Ok(Verification::new(v.tolerance()).add("q, k, v", &got, &want))
    }
}
