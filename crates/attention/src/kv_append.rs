//! KV append: from a fused QKV projection's rows `[q | k | v]` (fp32 or bf16) to decode attention's inputs —
//! q as bf16 `[R, C]`, and k and v written as bf16 into cells `(seq[r], pos[r])` of contiguous
//! `[B, Tmax, H, D]` caches or of a paged cache (the decode op's [`PagedCache`]) — plus the widening
//! of decode attention's bf16 output back to fp32. What a model runs around the `decode` op.
//!
//! Shape keys: `R` (rows), `B`, `Tmax`, `C`, `D` (head size, for the paged layout; default 64),
//! `bs` (0: contiguous, 16 or 32: a paged cache of that block size; default 0), `in` (the QKV rows'
//! element bits: 32, the default, or 16 for bf16).

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::data::{rng, uniform};
use common::{
    require, require_len, Act, ActBuf, ActType, Arg, Bound, DriverContext, Error, Gpu, Launch, LaunchShape, Limit, Op,
    Precision, Prepared as Current, PreparedStage, Problem, ResourceUse, Result, Shape, Variant, Workload,
};
use half::bf16;
use rand::seq::SliceRandom;

use crate::decode::{paged_offsets, Heads, PagedCache};
use crate::{FAMILY, SOURCES};

const OP: &str = "kv-append";

common::declare_op! {
    pub struct KvAppend {
        name: OP,
        description:
            "QKV rows (fp32 or bf16) to bf16 q and to their (seq, pos) cells of bf16 K/V caches (contiguous or paged)",
        shape_keys: ["R", "B", "Tmax", "C", "D", "bs", "in"],
        stages: stages,
    }
}

const THREADS: u32 = 256;
const CACHE: &str = "B * Tmax * C < 2^31";
const ROWS: &str = "R * 3C < 2^31";
const HEADS: &str = "D % 8 == 0 and D divides C";
const BLOCK: &str = "bs in {0, 16, 32}";

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
    /// The head size (the paged layout splits C into heads of `head` elements).
    pub head: usize,
    /// 0: contiguous caches; 16 or 32: a paged cache of that block size.
    pub block_size: usize,
    /// The QKV rows' element type.
    pub input: ActType,
}

impl KvAppendDims {
    /// A contiguous cache of 64-element heads.
    pub fn contiguous(rows: usize, b: usize, tmax: usize, c: usize) -> KvAppendDims {
        KvAppendDims { rows, b, tmax, c, head: 64, block_size: 0, input: ActType::F32 }
    }

    fn heads(&self) -> Heads {
        let h = self.c / self.head;
        Heads { hq: h, hkv: h, d: self.head }
    }
}

pub fn check_shape(d: KvAppendDims) -> Result<()> {
    for (k, v) in [("R", d.rows), ("B", d.b), ("Tmax", d.tmax), ("C", d.c), ("D", d.head)] {
        require(v >= 1, &format!("{k} >= 1"), || format!("{k} = {v}"))?;
    }
    let n = d.b.checked_mul(d.tmax).and_then(|x| x.checked_mul(d.c));
    require(n.is_some_and(|n| n < 1 << 31), CACHE, || format!("B = {}, Tmax = {}, C = {}", d.b, d.tmax, d.c))?;
    require(d.rows.checked_mul(3 * d.c).is_some_and(|n| n < 1 << 31), ROWS, || format!("R = {}", d.rows))?;
    require([0, 16, 32].contains(&d.block_size), BLOCK, || format!("bs = {}", d.block_size))?;
    if d.block_size > 0 {
        require(d.head.is_multiple_of(8) && d.c.is_multiple_of(d.head), HEADS, || {
            format!("C = {}, D = {}", d.c, d.head)
        })?;
    }
    Ok(())
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

    /// Each row's sequence and position, on the device: for a kernel that writes the cells itself
    /// (the decode step's QKV linear with the append in its epilogue), which may trust them.
    pub fn device(&self) -> (&CudaSlice<i32>, &CudaSlice<i32>) {
        (&self.seq, &self.pos)
    }

    /// The cells' positions on the device, for a kernel that moves them on itself (the decode step's
    /// greedy loop): it must keep every position below `Tmax`.
    pub fn positions_mut(&mut self) -> &mut CudaSlice<i32> {
        &mut self.pos
    }

    /// The `(B, Tmax)` every cell lies below.
    pub fn bounds(&self) -> (usize, usize) {
        (self.b, self.tmax)
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
    let layout = if d.block_size > 0 { "kv_append_paged_bf16" } else { "kv_append_bf16" };
    let entry = if d.input == ActType::Bf16 { format!("{layout}_in16") } else { layout.to_string() };
    Ok(Prepared {
        append: gpu.prepare_launch(&SOURCES, v, &entry, lin(d.rows * d.c))?,
        widen: gpu.prepare_launch(&SOURCES, v, "kv_out_f32", lin(d.rows * d.c))?,
        d,
    })
}

/// The cache an append writes: contiguous `[B, Tmax, C]` K and V (bf16 bit patterns), or a paged one.
pub enum KvTarget<'a> {
    Contiguous { k: &'a mut CudaSlice<u16>, v: &'a mut CudaSlice<u16> },
    Paged(&'a mut PagedCache),
}

/// The buffers of one append: `q_out` `[R, C]`, the cache, the QKV rows (of the prepared type) and
/// their cells.
pub struct KvAppendArgs<'a> {
    pub q_out: &'a mut CudaSlice<u16>,
    pub cache: KvTarget<'a>,
    pub qkv: Act<'a>,
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
        require(a.qkv.ty() == d.input, "qkv of the type prepared (in = 32: f32, in = 16: bf16)", || {
            format!("{:?} rows for {:?}", a.qkv.ty(), d.input)
        })?;
        require_len("qkv", a.qkv.len(), d.rows * 3 * d.c)?;
        let (q, qkv, seq, pos) =
            (Arg::buf(a.q_out), Arg::Ptr(a.qkv.ptr()), Arg::buf(&a.cells.seq), Arg::buf(&a.cells.pos));
        let (rows, c) = (Arg::int(d.rows), Arg::int(d.c));
        match a.cache {
            KvTarget::Contiguous { k, v } => {
                require(d.block_size == 0, "a paged cache for an append prepared paged", || "contiguous".into())?;
                require_len("K cache", k.len(), d.b * d.tmax * d.c)?;
                require_len("V cache", v.len(), d.b * d.tmax * d.c)?;
                let args = [q, Arg::buf(k), Arg::buf(v), qkv, seq, pos, rows, c, Arg::int(d.tmax)];
                // SAFETY: the arguments follow kv_append_bf16's signature; lengths checked above,
                // every cell was checked against B and Tmax when uploaded.
                unsafe { self.append.enqueue(stream, &args) }
            }
            KvTarget::Paged(p) => {
                let (bs, max_blocks) = (p.block_size(), p.max_blocks());
                require(
                    (bs, p.batch(), p.heads()) == (d.block_size, d.b, d.heads()) && d.tmax <= max_blocks * bs,
                    "paged cache of the prepared block size, B and heads, with Tmax <= max_blocks * bs",
                    || format!("bs {bs}, B {}, {:?}, max_blocks {max_blocks}", p.batch(), p.heads()),
                )?;
                let (k, v, tables) = p.buffers();
                let args = [
                    q,
                    Arg::buf(k),
                    Arg::buf(v),
                    qkv,
                    seq,
                    pos,
                    Arg::buf(tables),
                    rows,
                    c,
                    Arg::int(d.head),
                    Arg::int(bs),
                    Arg::int(max_blocks),
                ];
                // SAFETY: the arguments follow kv_append_paged_bf16's signature; every cell lies in
                // [0, B) x [0, Tmax) (checked at upload), Tmax <= max_blocks * bs (above), so every
                // table index is in the table, whose entries were checked to lie in the pool.
                unsafe { self.append.enqueue(stream, &args) }
            }
        }
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

fn shape(r: i64, b: i64, tmax: i64, c: i64, bs: i64) -> Shape {
    Shape::new(&[("R", r), ("B", b), ("Tmax", tmax), ("C", c), ("D", 64), ("bs", bs)])
}

/// [`shape`] from bf16 QKV rows (`in` = 16).
fn shape_bf16_in(r: i64, b: i64, tmax: i64, c: i64, bs: i64) -> Shape {
    let mut s = shape(r, b, tmax, c, bs);
    s.set("in", 16);
    s
}

fn dims(s: &Shape) -> Result<KvAppendDims> {
    let big = i32::MAX as i64;
    let bs = s.get("bs").unwrap_or(0);
    require([0, 16, 32].contains(&bs), BLOCK, || format!("bs = {bs}"))?;
    Ok(KvAppendDims {
        rows: s.dim("R", big)?,
        b: s.dim("B", big)?,
        tmax: s.dim("Tmax", big)?,
        c: s.dim("C", big)?,
        head: if s.get("D").is_some() { s.dim("D", big)? } else { 64 },
        block_size: bs as usize,
        input: ActType::from_key(s, "in")?,
    })
}

impl Op for KvAppend {
    fn default_shapes(&self) -> Vec<Shape> {
        // GPT-2 decode at batch 8 (one row per sequence), and a 1024-token prefill of one sequence,
        // into contiguous and into paged caches (a ragged context: not a multiple of the block); the
        // prefill again from a bf16 model's QKV rows.
        vec![
            shape(8, 8, 1024, 768, 0),
            shape(1024, 8, 1024, 768, 0),
            shape(8, 8, 1000, 768, 16),
            shape(1000, 8, 1000, 768, 16),
            shape_bf16_in(1024, 8, 1024, 768, 0),
            shape_bf16_in(1000, 8, 1000, 768, 16),
        ]
    }
    fn validate(&self, _v: &Variant, s: &Shape) -> Result<()> {
        let d = dims(s)?;
        check_shape(d)?;
        require(d.rows <= d.b * d.tmax, "R <= B * Tmax (distinct cells)", || format!("R = {}", d.rows))
    }
    fn limits(&self, _v: &Variant) -> Vec<Limit> {
        vec![
            Limit { constraint: CACHE, past: shape(1, 1 << 11, 1 << 10, 1 << 10, 0), inside: None },
            Limit { constraint: ROWS, past: shape(1 << 20, 1 << 20, 1, 1 << 10, 0), inside: None },
            Limit { constraint: BLOCK, past: shape(8, 8, 64, 128, 8), inside: Some(shape(8, 8, 64, 128, 16)) },
            Limit {
                constraint: HEADS,
                past: Shape::new(&[("R", 8), ("B", 8), ("Tmax", 64), ("C", 120), ("D", 12), ("bs", 16)]),
                inside: Some(Shape::new(&[("R", 8), ("B", 8), ("Tmax", 64), ("C", 120), ("D", 24), ("bs", 16)])),
            },
        ]
    }
    fn problem(&self, gpu: &Gpu, s: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        self.validate(&stages()[0], s)?;
        let d = dims(s)?;
        let mut all: Vec<(usize, usize)> = (0..d.b).flat_map(|b| (0..d.tmax).map(move |t| (b, t))).collect();
        all.shuffle(&mut rng(seed));
        all.truncate(d.rows);
        // bf16 rows: rounded once at upload; the reference holds exactly those values.
        let (qkv_dev, qkv) = ActBuf::upload(gpu, d.input, &uniform(d.rows * 3 * d.c, -2.0, 2.0, seed ^ 1))?;
        let cache = if d.block_size == 0 {
            Cache::Contiguous { k: gpu.zeros(d.b * d.tmax * d.c)?, v: gpu.zeros(d.b * d.tmax * d.c)? }
        } else {
            // Every sequence's blocks scattered over a pool with a few spare blocks.
            let max_blocks = d.tmax.div_ceil(d.block_size);
            let num_blocks = d.b * max_blocks + 3;
            let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
            ids.shuffle(&mut rng(seed ^ 2));
            ids.truncate(d.b * max_blocks);
            Cache::Paged(PagedCache::zeroed(gpu, num_blocks, &ids, d.b, d.block_size, d.heads())?)
        };
        Ok(Box::new(KvAppendProblem {
            d,
            cells: Cells::upload(gpu, &all, d.b, d.tmax)?,
            cell_list: all,
            qkv_dev,
            qkv,
            q: gpu.zeros(d.rows * d.c)?,
            cache,
            prepared: Current::default(),
        }))
    }
}

struct KvAppendProblem {
    d: KvAppendDims,
    cells: Cells,
    cell_list: Vec<(usize, usize)>,
    qkv: Vec<f32>,
    qkv_dev: ActBuf,
    q: CudaSlice<u16>,
    cache: Cache,
    prepared: Current<Prepared>,
}

enum Cache {
    Contiguous { k: CudaSlice<u16>, v: CudaSlice<u16> },
    Paged(PagedCache),
}

/// Where channel `ch` of cell `(seq, pos)` lives in the downloaded K and in the downloaded V.
type CellIndex = dyn Fn(usize, usize, usize) -> (usize, usize);

impl Problem for KvAppendProblem {
    fn workload(&self) -> Workload {
        let n = (self.d.rows * self.d.c) as u64;
        let read = 3 * self.d.input.bytes() as u64 * n;
        Workload { bytes: read + 6 * n + 8 * self.d.rows as u64, flops: 0, bound: Bound::Memory }
    }
    fn copies(&self) -> usize {
        1
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        gpu.poison(&mut self.q)?;
        let (k, v) = match &mut self.cache {
            Cache::Contiguous { k, v } => (k, v),
            Cache::Paged(p) => {
                let (k, v, _) = p.buffers();
                (k, v)
            }
        };
        gpu.poison(k)?;
        gpu.poison(v)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        Ok(self.prepared.set(v, prepare(gpu, v, self.d)?))
    }
    fn enqueue(&mut self, stream: &CudaStream, _copy: usize) -> Result<()> {
        let (_, p) = self.prepared.get()?;
        let cache = match &mut self.cache {
            Cache::Contiguous { k, v } => KvTarget::Contiguous { k, v },
            Cache::Paged(p) => KvTarget::Paged(p),
        };
        p.enqueue(stream, KvAppendArgs { q_out: &mut self.q, cache, qkv: self.qkv_dev.act(), cells: &self.cells })
    }
    fn verify(&mut self, gpu: &Gpu, _copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        let (c, d) = (self.d.c, self.d);
        let q = gpu.download(&self.q)?;
        let f = |x: u16| bf16::from_bits(x).to_f32();
        // Where channel `ch` of cell (s, p) lives in the downloaded K and V.
        let (k, vv, at): (_, _, Box<CellIndex>) = match &self.cache {
            Cache::Contiguous { k, v } => {
                let at = move |s: usize, p: usize, ch: usize| ((s * d.tmax + p) * c + ch, (s * d.tmax + p) * c + ch);
                (gpu.download(k)?, gpu.download(v)?, Box::new(at))
            }
            Cache::Paged(pc) => {
                let (k, v) = pc.download_pools(gpu)?;
                let table = pc.tables_host().to_vec();
                let (bs, mb) = (d.block_size, pc.max_blocks());
                let at = move |s: usize, p: usize, ch: usize| {
                    let phys = table[s * mb + p / bs] as usize;
                    paged_offsets(d.heads(), bs, phys, p % bs, ch / d.head, ch % d.head)
                };
                (k, v, Box::new(at))
            }
        };
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for (r, &(s, p)) in self.cell_list.iter().enumerate() {
            got.extend(q[r * c..][..c].iter().map(|&x| f(x)));
            for ch in 0..c {
                let (ki, vi) = at(s, p, ch);
                got.push(f(k[ki]));
                got.push(f(vv[vi]));
            }
            want.extend(self.qkv[r * 3 * c..][..c].iter().map(|&x| x as f64));
            for ch in 0..c {
                want.push(self.qkv[(r * 3 + 1) * c + ch] as f64);
                want.push(self.qkv[(r * 3 + 2) * c + ch] as f64);
            }
        }
        Ok(Verification::new(v.tolerance()).add("q, k, v", &got, &want))
    }
}
