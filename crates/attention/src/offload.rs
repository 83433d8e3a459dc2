//! Decode attention over a KV cache that lives in host memory (`decode-offload`).
//!
//! A cache larger than the GPU holds stays in host memory and is brought over for each decode step.
//! The op is one decode step of B sequences of `seq` tokens each (the decode op's contiguous layout
//! `[B, seq, HKV, D]`, bf16) whose K and V start in host memory; the output is the decode op's
//! (O and lse). Every stage computes with the decode op's fused-combine stage (07); they differ in how the
//! bytes cross the host link:
//!
//! 0. pageable: ordinary host memory, one stream, copy then compute (the driver stages the copy
//!    through its own pinned buffer);
//! 1. pinned: page-locked host memory, the copy engine reads it directly;
//! 2. streams: the sequence in `chunks` slices on as many streams, chunk i+1 copying while chunk i
//!    computes, the chunks merged by logsumexp (`kernels/decode-offload/02_streams.cu`);
//! 3. mapped: no copy: the decode kernel reads the page-locked cache in place over the host link.
//!
//! The ceiling is the measured pinned host-to-device bandwidth (`ladder device`), and each row's
//! note gives its copy-only and compute-only times beside the overlapped one.
//!
//! Shape keys: `B`, `HQ`, `HKV`, `D`, `seq`, `alibi` (0/1) and `chunks` (stage 2's slices).

use std::sync::Arc;

use common::check::Verification;
use common::cudarc::driver::{CudaSlice, CudaStream};
use common::timing::{self, TimingConfig};
use common::{
    copy_htod_2d, require, Arg, Bound, DriverContext, Error, Gpu, Launch, LaunchShape, Limit, Op, Precision,
    Prepared as Current, PreparedStage, Problem, Requirements, ResourceUse, Result, Shape, Variant, Workload,
};

use crate::decode::{
    self, upload_slopes, ContiguousInputs, DecodeArgs, DecodeDims, Dtype, Heads, HostCache, KvCache, SeqLens,
};
use crate::{FAMILY, SOURCES};

const OP: &str = "decode-offload";

common::declare_op! {
    pub struct DecodeOffload {
        name: OP,
        description: "one decode step over a bf16 KV cache [B,seq,HKV,D] held in host memory: pageable, pinned, \
                      chunked over streams, or read in place (mapped); every stage computes with decode stage 07",
        shape_keys: ["B", "HQ", "HKV", "D", "seq", "alibi", "chunks"],
        stages: stages,
    }
}

/// The decode stage every offload stage computes with.
pub const COMPUTE_STAGE: &str = "fused-combine";
pub const MAX_CHUNKS: usize = 16;
const CHUNKS: &str = "1 <= chunks <= 16";
const CHUNK_LEN: &str = "chunks <= seq";

/// How a stage brings the cache over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    Pageable,
    Pinned,
    Streams,
    Mapped,
}

fn stages() -> Vec<Variant> {
    let host = |stage, name, what, plan: Plan, summary| {
        Variant::host(FAMILY, OP, stage, name, what, Precision::Bf16, summary)
            .with_plan(plan)
            .with_requirements(Requirements::SM80)
    };
    vec![
        host(
            0,
            "pageable",
            "pageable copy + decode/07",
            Plan::Pageable,
            "cache in pageable host memory: one stream, copy the whole cache, then decode",
        ),
        host(
            1,
            "pinned",
            "pinned copy + decode/07",
            Plan::Pinned,
            "cache in page-locked host memory: the copy engine reads it directly, then decode",
        ),
        Variant::kernel(
            FAMILY,
            OP,
            2,
            "streams",
            "decode-offload/02_streams.cu",
            Precision::Bf16,
            "the sequence in chunks on as many streams: chunk i+1 copies while chunk i decodes; logsumexp merge",
        )
        .with_plan(Plan::Streams)
        .with_requirements(Requirements::SM80),
        host(
            3,
            "mapped",
            "decode/07 on mapped host memory",
            Plan::Mapped,
            "no copy: the decode kernel reads the page-locked cache in place over the host link",
        ),
    ]
}

/// The decode stage the offload stages compute with.
pub fn compute_stage() -> Result<Variant> {
    decode::Decode
        .variants()
        .into_iter()
        .find(|v| v.name == COMPUTE_STAGE)
        .ok_or_else(|| Error::MissingSource(format!("decode stage {COMPUTE_STAGE}")))
}

/// The sizes of one offload call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffloadDims {
    pub b: usize,
    pub heads: Heads,
    /// Every sequence's length (and the cache's capacity).
    pub seq: usize,
    /// Stage 2's slices along the sequence.
    pub chunks: usize,
}

impl OffloadDims {
    fn decode(&self, tmax: usize) -> DecodeDims {
        DecodeDims { b: self.b, heads: self.heads, tmax, dtype: Dtype::Bf16, block_size: 16, splits: 0, warps: 0 }
    }

    /// Chunk c's tokens `[c*seq/chunks, (c+1)*seq/chunks)`: balanced, none empty when chunks <= seq.
    fn chunk(&self, c: usize) -> (usize, usize) {
        (c * self.seq / self.chunks, (c + 1) * self.seq / self.chunks)
    }

    /// The most tokens a chunk holds (its device cache's capacity).
    fn chunk_len(&self) -> usize {
        self.seq.div_ceil(self.chunks)
    }

    fn cache_len(&self) -> usize {
        self.b * self.seq * self.heads.hkv * self.heads.d
    }
}

/// The limits of `v` at `d`: the compute stage's, and for the chunked stage the chunk count.
pub fn check_shape(v: &Variant, d: OffloadDims) -> Result<()> {
    decode::check_shape(&compute_stage()?, d.decode(d.seq))?;
    if v.plan::<Plan>()? == Plan::Streams {
        require((1..=MAX_CHUNKS).contains(&d.chunks), CHUNKS, || format!("chunks = {}", d.chunks))?;
        require(d.chunks <= d.seq, CHUNK_LEN, || format!("chunks = {}, seq = {}", d.chunks, d.seq))?;
    }
    Ok(())
}

/// The host copies of one cache: ordinary (pageable) memory and mapped page-locked memory.
pub struct HostKv {
    pub k: Vec<u16>,
    pub v: Vec<u16>,
    pub pinned: HostCache,
}

/// The buffers of one call.
pub struct OffloadArgs<'a> {
    pub out: &'a mut CudaSlice<u16>,
    pub lse: &'a mut CudaSlice<f32>,
    pub q: &'a CudaSlice<u16>,
    pub cache: &'a HostKv,
    pub alibi: Option<&'a CudaSlice<f32>>,
}

/// One slice of the sequence of the chunked stage: its device cache `[B, len, HKV, D]` and results.
struct Chunk {
    t0: usize,
    len: usize,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    lens: SeqLens,
    out: CudaSlice<u16>,
    lse: CudaSlice<f32>,
    stream: Arc<CudaStream>,
    /// Its own prepared decode: the chunks run at once on their streams, so each needs its own
    /// workspace (split partials, tickets).
    decode: decode::Prepared,
}

enum Stage {
    /// The whole cache copied into `k`, `v`, then decoded.
    Whole {
        k: CudaSlice<u16>,
        v: CudaSlice<u16>,
        lens: SeqLens,
        decode: decode::Prepared,
        pinned: bool,
    },
    Chunked {
        chunks: Vec<Chunk>,
        merge: Launch,
    },
    Mapped {
        lens: SeqLens,
        decode: decode::Prepared,
    },
}

/// What part of a stage's work to enqueue: all of it, or only its copies or only its kernels (to
/// show how much the overlap won).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    All,
    Copies,
    Kernels,
}

pub struct Prepared {
    stage: Stage,
    d: OffloadDims,
}

pub fn prepare(gpu: &Gpu, v: &Variant, d: OffloadDims) -> Result<Prepared> {
    check_shape(v, d)?;
    let compute = compute_stage()?;
    let whole = |gpu: &Gpu| -> Result<(CudaSlice<u16>, CudaSlice<u16>)> {
        // Poisoned, so a copy that did not happen fails verification.
        Ok((gpu.alloc_poisoned(d.cache_len())?, gpu.alloc_poisoned(d.cache_len())?))
    };
    let lens = |tmax: usize, len: usize| SeqLens::new(gpu, &vec![len; d.b], tmax);
    let stage = match v.plan::<Plan>()? {
        plan @ (Plan::Pageable | Plan::Pinned) => {
            let (k, v) = whole(gpu)?;
            let decode = decode::prepare(gpu, &compute, d.decode(d.seq))?;
            Stage::Whole { k, v, lens: lens(d.seq, d.seq)?, decode, pinned: plan == Plan::Pinned }
        }
        Plan::Streams => {
            let tc = d.chunk_len();
            let rows = d.b * d.heads.hq;
            let chunks = (0..d.chunks)
                .map(|c| {
                    let (t0, t1) = d.chunk(c);
                    let n = t1 - t0;
                    let len = d.b * tc * d.heads.hkv * d.heads.d;
                    Ok(Chunk {
                        t0,
                        len: n,
                        k: gpu.alloc_poisoned(len)?,
                        v: gpu.alloc_poisoned(len)?,
                        lens: lens(tc, n)?,
                        out: gpu.zeros(rows * d.heads.d)?,
                        lse: gpu.zeros(rows)?,
                        stream: gpu.new_stream()?,
                        decode: decode::prepare(gpu, &compute, d.decode(tc))?,
                    })
                })
                .collect::<Result<Vec<Chunk>>>()?;
            let shape = LaunchShape::new((rows as u32, 1, 1), (d.heads.d as u32, 1, 1));
            Stage::Chunked { chunks, merge: gpu.prepare_launch(&SOURCES, v, "offload_merge_bf16", shape)? }
        }
        Plan::Mapped => {
            let decode = decode::prepare(gpu, &compute, d.decode(d.seq))?;
            Stage::Mapped { lens: lens(d.seq, d.seq)?, decode }
        }
    };
    Ok(Prepared { stage, d })
}

impl Prepared {
    /// Enqueues the whole stage on `stream` (the chunked stage forks onto its own streams and joins
    /// back, so `stream` still orders everything).
    pub fn enqueue(&mut self, stream: &CudaStream, a: OffloadArgs) -> Result<()> {
        self.run(stream, a, Part::All)
    }

    fn run(&mut self, stream: &CudaStream, a: OffloadArgs, part: Part) -> Result<()> {
        let d = self.d;
        let n = d.cache_len();
        common::require_len("K cache", a.cache.k.len(), n)?;
        common::require_len("V cache", a.cache.v.len(), n)?;
        let (pk, pv) = a.cache.pinned.host();
        common::require_len("pinned K cache", pk.len(), n)?;
        let rows = d.b * d.heads.hq;
        common::require_len("q", a.q.len(), rows * d.heads.d)?;
        common::require_len("out", a.out.len(), rows * d.heads.d)?;
        common::require_len("lse", a.lse.len(), rows)?;
        let row = d.heads.hkv * d.heads.d * 2; // bytes of one token of one sequence
        let (copies, kernels) = (part != Part::Kernels, part != Part::Copies);
        match &mut self.stage {
            Stage::Whole { k, v, lens, decode, pinned } => {
                if copies {
                    let (sk, sv) = if *pinned {
                        (pk.as_ptr().ctx("host cache")?, pv.as_ptr().ctx("host cache")?)
                    } else {
                        (a.cache.k.as_ptr(), a.cache.v.as_ptr())
                    };
                    let bytes = 2 * n;
                    // SAFETY: host and device caches each hold n elements (checked above and at prepare).
                    unsafe {
                        copy_htod_2d(stream, common::device_ptr(k), bytes, sk as *const u8, bytes, bytes, 1)?;
                        copy_htod_2d(stream, common::device_ptr(v), bytes, sv as *const u8, bytes, bytes, 1)?;
                    }
                }
                if kernels {
                    let cache = KvCache::Contiguous { k, v };
                    decode.enqueue(
                        stream,
                        DecodeArgs { out: a.out, lse: a.lse, q: a.q, cache, seq_lens: lens, alibi: a.alibi },
                    )?;
                }
            }
            Stage::Mapped { lens, decode } => {
                if kernels {
                    let cache = KvCache::HostMapped(&a.cache.pinned);
                    decode.enqueue(
                        stream,
                        DecodeArgs { out: a.out, lse: a.lse, q: a.q, cache, seq_lens: lens, alibi: a.alibi },
                    )?;
                }
            }
            Stage::Chunked { chunks, merge } => {
                let (sk, sv) =
                    (pk.as_ptr().ctx("host cache")? as *const u8, pv.as_ptr().ctx("host cache")? as *const u8);
                // All copies first, each chunk's after the previous chunk's: copies on several
                // streams at once would share the link and all finish together, so no chunk could
                // start computing early. The decodes are enqueued after, so each join below waits
                // for the previous chunk's copies only.
                for i in 0..chunks.len() {
                    chunks[i].stream.join(stream).ctx("host cache")?;
                    if i > 0 && copies {
                        chunks[i].stream.join(&chunks[i - 1].stream).ctx("host cache")?;
                    }
                    let c = &chunks[i];
                    if copies {
                        // Rows [t0, t0 + len) of every sequence: B rows of len tokens, seq tokens apart.
                        let (width, pitch, off) = (c.len * row, d.seq * row, c.t0 * row);
                        // SAFETY: the source rectangle lies inside the n-element host caches (t0 + len
                        // <= seq), the destination holds B rows of chunk_len tokens.
                        unsafe {
                            let tc = d.chunk_len() * row;
                            copy_htod_2d(&c.stream, common::device_ptr(&c.k), tc, sk.add(off), pitch, width, d.b)?;
                            copy_htod_2d(&c.stream, common::device_ptr(&c.v), tc, sv.add(off), pitch, width, d.b)?;
                        }
                    }
                }
                for c in chunks.iter_mut() {
                    if kernels {
                        let cache = KvCache::Contiguous { k: &c.k, v: &c.v };
                        let args = DecodeArgs {
                            out: &mut c.out,
                            lse: &mut c.lse,
                            q: a.q,
                            cache,
                            seq_lens: &c.lens,
                            alibi: a.alibi,
                        };
                        c.decode.enqueue(&c.stream, args)?;
                    }
                    stream.join(&c.stream).ctx("host cache")?;
                }
                if kernels {
                    // The chunks' addresses by value, as the kernel's OffloadChunks struct.
                    let parts = MergeChunks::new(chunks);
                    let slopes = Arg::Ptr(a.alibi.map_or(0, common::device_ptr));
                    let args = [
                        Arg::buf(a.out),
                        Arg::buf(a.lse),
                        Arg::value(&parts),
                        Arg::int(chunks.len()),
                        slopes,
                        Arg::int(d.heads.hq),
                        Arg::int(d.seq),
                    ];
                    // SAFETY: the arguments follow offload_merge_bf16's signature; every chunk's out
                    // and lse hold B*HQ*D and B*HQ elements, as do out and lse (checked by decode).
                    unsafe { merge.enqueue(stream, &args)? };
                }
            }
        }
        Ok(())
    }
}

/// The kernel's `OffloadChunks`: each chunk's out and lse addresses and its end token.
#[repr(C)]
#[derive(Clone, Copy)]
struct MergeChunks {
    out: [u64; MAX_CHUNKS],
    lse: [u64; MAX_CHUNKS],
    end: [i32; MAX_CHUNKS],
}

impl MergeChunks {
    fn new(chunks: &[Chunk]) -> MergeChunks {
        let mut m = MergeChunks { out: [0; MAX_CHUNKS], lse: [0; MAX_CHUNKS], end: [0; MAX_CHUNKS] };
        for (i, c) in chunks.iter().enumerate() {
            m.out[i] = common::device_ptr(&c.out);
            m.lse[i] = common::device_ptr(&c.lse);
            m.end[i] = (c.t0 + c.len) as i32;
        }
        m
    }
}

impl PreparedStage for Prepared {
    fn resources(&self) -> Vec<ResourceUse> {
        match &self.stage {
            Stage::Whole { decode, .. } | Stage::Mapped { decode, .. } => decode.resources(),
            Stage::Chunked { chunks, merge } => {
                chunks.iter().take(1).flat_map(|c| c.decode.resources()).chain([merge.resources().clone()]).collect()
            }
        }
    }
}

// ---------------------------------------------------------------- the op

pub fn shape(b: i64, hq: i64, hkv: i64, d: i64, seq: i64, chunks: i64) -> Shape {
    Shape::new(&[("B", b), ("HQ", hq), ("HKV", hkv), ("D", d), ("seq", seq), ("alibi", 0), ("chunks", chunks)])
}

/// A parsed offload shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffloadShape {
    pub dims: OffloadDims,
    pub alibi: bool,
}

impl OffloadShape {
    pub fn parse(s: &Shape) -> Result<OffloadShape> {
        let big = i32::MAX as i64;
        let alibi = s.get("alibi").unwrap_or(0);
        require(alibi == 0 || alibi == 1, "alibi in {0, 1}", || format!("alibi = {alibi}"))?;
        let dims = OffloadDims {
            b: s.dim("B", big)?,
            heads: Heads { hq: s.dim("HQ", big)?, hkv: s.dim("HKV", big)?, d: s.dim("D", big)? },
            seq: s.dim("seq", big)?,
            chunks: s.dim("chunks", big)?,
        };
        Ok(OffloadShape { dims, alibi: alibi == 1 })
    }
}

impl Op for DecodeOffload {
    fn default_shapes(&self) -> Vec<Shape> {
        vec![
            // GPT-2 124M, 8 sequences of its full context (25 MB of cache).
            shape(8, 12, 12, 64, 1024, 4),
            // Long-context MHA (537 MB).
            shape(4, 32, 32, 128, 8192, 4),
            // GQA 8:1 (537 MB).
            shape(32, 32, 4, 128, 8192, 4),
        ]
    }
    fn validate(&self, v: &Variant, s: &Shape) -> Result<()> {
        check_shape(v, OffloadShape::parse(s)?.dims)
    }
    fn limits(&self, v: &Variant) -> Vec<Limit> {
        let Ok(plan) = v.plan::<Plan>() else { return Vec::new() };
        let at = shape;
        let mut l = vec![
            Limit { constraint: decode::HEAD_DIM, past: at(2, 4, 2, 96, 40, 4), inside: Some(at(2, 4, 2, 128, 40, 4)) },
            Limit { constraint: decode::GROUPS, past: at(2, 6, 4, 64, 40, 4), inside: Some(at(2, 8, 4, 64, 40, 4)) },
            Limit {
                constraint: decode::GRID_B,
                past: at(65536, 1, 1, 64, 1, 1),
                inside: Some(at(65535, 1, 1, 64, 1, 1)),
            },
            Limit { constraint: decode::ELEMS, past: at(1024, 64, 64, 64, 32768, 4), inside: None },
            Limit {
                constraint: decode::MMA_GROUP,
                past: at(2, 17, 1, 64, 40, 4),
                inside: Some(at(2, 16, 1, 64, 40, 4)),
            },
        ];
        if plan == Plan::Streams {
            l.push(Limit { constraint: CHUNKS, past: at(2, 4, 2, 64, 40, 17), inside: Some(at(2, 4, 2, 64, 40, 16)) });
            l.push(Limit { constraint: CHUNK_LEN, past: at(2, 4, 2, 64, 7, 8), inside: Some(at(2, 4, 2, 64, 8, 8)) });
        }
        l
    }
    fn problem(&self, gpu: &Gpu, shape: &Shape, seed: u64) -> Result<Box<dyn Problem>> {
        OffloadProblem::new(gpu, OffloadShape::parse(shape)?, seed).map(|p| Box::new(p) as Box<dyn Problem>)
    }
}

struct OffloadProblem {
    s: OffloadShape,
    cache: HostKv,
    q: CudaSlice<u16>,
    alibi: Option<CudaSlice<f32>>,
    out: CudaSlice<u16>,
    lse: CudaSlice<f32>,
    reference: (Vec<f64>, Vec<f64>),
    checked: Vec<usize>,
    /// The copy-only and compute-only times of the prepared stage, measured once at its first check.
    parts_ms: Option<(Option<f64>, f64)>,
    prepared: Current<Prepared>,
}

impl OffloadProblem {
    fn new(gpu: &Gpu, s: OffloadShape, seed: u64) -> Result<OffloadProblem> {
        let d = s.dims;
        let Heads { hq, hkv, d: dim } = d.heads;
        require(hkv >= 1 && hq.is_multiple_of(hkv), decode::GROUPS, || format!("HQ = {hq}, HKV = {hkv}"))?;
        let n = d.b.checked_mul(d.seq).and_then(|x| x.checked_mul(hkv * dim));
        require(n.is_some_and(|n| n < 1 << 32), "B * seq * HKV * D < 2^32 (the problem's host memory)", || {
            format!("B = {}, seq = {}", d.b, d.seq)
        })?;
        let lens = vec![d.seq; d.b];
        let ContiguousInputs { q, k, v, slopes, checked, reference } =
            ContiguousInputs::new(&d.decode(d.seq), &lens, s.alibi, seed);
        let alibi = upload_slopes(gpu, slopes.as_deref())?;
        let pinned = HostCache::new(gpu, &k, &v)?;
        Ok(OffloadProblem {
            s,
            cache: HostKv { k, v, pinned },
            q: gpu.upload(&q)?,
            alibi,
            out: gpu.zeros(d.b * hq * dim)?,
            lse: gpu.zeros(d.b * hq)?,
            reference,
            checked,
            parts_ms: None,
            prepared: Current::default(),
        })
    }

    fn run(&mut self, stream: &CudaStream, part: Part) -> Result<()> {
        let (_, p) = self.prepared.get_mut()?;
        let args = OffloadArgs {
            out: &mut self.out,
            lse: &mut self.lse,
            q: &self.q,
            cache: &self.cache,
            alibi: self.alibi.as_ref(),
        };
        p.run(stream, args, part)
    }
}

impl Problem for OffloadProblem {
    fn workload(&self) -> Workload {
        let d = self.s.dims;
        let Heads { hq, hkv, d: dim } = d.heads;
        // The cache crosses the host link once; q, out and lse are device-resident.
        let tokens = d.b * d.seq;
        Workload {
            bytes: (2 * 2 * tokens * hkv * dim) as u64,
            flops: (4 * tokens * hq * dim) as u64,
            bound: Bound::HostLink,
        }
    }
    fn copies(&self) -> usize {
        1
    }
    fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        gpu.poison(&mut self.out)?;
        gpu.poison(&mut self.lse)
    }
    fn prepare(&mut self, gpu: &Gpu, v: &Variant) -> Result<Vec<ResourceUse>> {
        self.parts_ms = None;
        Ok(self.prepared.set(v, prepare(gpu, v, self.s.dims)?))
    }
    fn enqueue(&mut self, stream: &CudaStream, _copy: usize) -> Result<()> {
        self.run(stream, Part::All)
    }
    fn verify(&mut self, gpu: &Gpu, _copy: usize) -> Result<Verification> {
        let (v, _) = self.prepared.get()?;
        let tolerance = v.tolerance();
        let d = self.s.dims;
        let Heads { hq, d: dim, .. } = d.heads;
        let out = gpu.download(&self.out)?;
        let lse = gpu.download(&self.lse)?;
        let value = |x: u16| Dtype::Bf16.value(x);
        let got: Vec<f32> = self
            .checked
            .iter()
            .flat_map(|&b| out[b * hq * dim..(b + 1) * hq * dim].iter().map(|&x| value(x)))
            .collect();
        let got_lse: Vec<f32> = self.checked.iter().flat_map(|&b| lse[b * hq..(b + 1) * hq].iter().copied()).collect();
        let ver =
            Verification::new(tolerance).add("out", &got, &self.reference.0).add("lse", &got_lse, &self.reference.1);
        if self.parts_ms.is_none() {
            self.parts_ms = Some(self.time_parts(gpu)?);
        }
        let (copy, compute) = self.parts_ms.unwrap_or_default();
        let copy = copy.map_or("none (read in place)".to_string(), |c| format!("{c:.3} ms"));
        Ok(ver.with_note(format!("copy-only {copy}, compute-only {compute:.3} ms")))
    }
}

impl OffloadProblem {
    /// The median times of the stage's copies alone and of its kernels alone (on data already on
    /// the device; the mapped stage has no copies and reads host memory in both).
    fn time_parts(&mut self, gpu: &Gpu) -> Result<(Option<f64>, f64)> {
        let cfg = TimingConfig::quick();
        let mapped = matches!(self.prepared.get()?.1.stage, Stage::Mapped { .. });
        let copy =
            if mapped { None } else { Some(timing::time(gpu, 1, &cfg, |s, _| self.run(s, Part::Copies))?.median_ms) };
        let compute = timing::time(gpu, 1, &cfg, |s, _| self.run(s, Part::Kernels))?.median_ms;
        Ok((copy, compute))
    }
}
