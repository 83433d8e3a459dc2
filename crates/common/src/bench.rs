//! Criterion benchmarks over an op's stages: one group per shape, one benchmark per stage. Every
//! stage is verified on the same inputs before it is timed; a stage that fails is reported and left
//! out, never timed as if it were fine. Times come from CUDA events over launches rotated across the
//! problem's copies (so L2 does not flatter), handed to criterion through `iter_custom`.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};

use crate::family::Op;
use crate::gpu::Gpu;
use crate::runner::verify_once;
use crate::shape::Shape;
use crate::variant::Variant;
use crate::Result;

/// How criterion should sample a group: slow stages (tens of ms and up) get fewer samples.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    pub sample_size: usize,
    pub measurement: Duration,
    pub warm_up: Duration,
    /// Criterion's flat sampling (the same iteration count in every sample): for stages that take
    /// tens of milliseconds or more, where linear sampling would need minutes.
    pub flat: bool,
}

impl Sampling {
    /// For stages of 10 ms and up: 10 flat samples.
    pub fn slow() -> Sampling {
        Sampling {
            sample_size: 10,
            measurement: Duration::from_secs(3),
            warm_up: Duration::from_millis(100),
            flat: true,
        }
    }

    /// `LADDER_BENCH_SMOKE=1`: 10 short samples per stage, so a whole crate's bench proves it runs
    /// (every stage verified, then timed) in about a minute. Numbers from it are rough.
    pub fn smoke() -> Sampling {
        Sampling {
            sample_size: 10,
            measurement: Duration::from_millis(150),
            warm_up: Duration::from_millis(20),
            flat: true,
        }
    }
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            sample_size: 30,
            measurement: Duration::from_secs(2),
            warm_up: Duration::from_millis(300),
            flat: false,
        }
    }
}

/// Benchmarks `variants` of `op` at each of `shapes`; `sampling` may pick fewer samples per
/// (shape, stage) for slow stages.
pub fn bench_op(
    c: &mut Criterion,
    op: &dyn Op,
    shapes: &[Shape],
    variants: &[Variant],
    sampling: impl Fn(&Shape, &Variant) -> Sampling,
) {
    let gpu = match crate::testing::open_gpu() {
        Ok(g) => g,
        Err(reason) => {
            eprintln!("bench {}/{}: not run: {reason}", op.family(), op.name());
            return;
        }
    };
    let smoke = std::env::var("LADDER_BENCH_SMOKE").is_ok_and(|v| v == "1");
    let sampling = |shape: &Shape, v: &Variant| if smoke { Sampling::smoke() } else { sampling(shape, v) };
    // `LADDER_BENCH_STAGES=A..B`: only those stages (a criterion filter still verifies every stage).
    let variants: Vec<Variant> = match std::env::var("LADDER_BENCH_STAGES") {
        Ok(range) => match crate::variant::parse_stages(&range) {
            Ok((lo, hi)) => variants.iter().filter(|v| (lo..=hi).contains(&v.stage)).cloned().collect(),
            Err(e) => {
                eprintln!("bench {}/{}: not run: LADDER_BENCH_STAGES: {e}", op.family(), op.name());
                return;
            }
        },
        Err(_) => variants.to_vec(),
    };
    for shape in shapes {
        if let Err(e) = bench_shape(c, &gpu, op, shape, &variants, &sampling) {
            eprintln!("bench {}/{} {shape}: {e}", op.family(), op.name());
        }
    }
}

fn bench_shape(
    c: &mut Criterion,
    gpu: &Gpu,
    op: &dyn Op,
    shape: &Shape,
    variants: &[Variant],
    sampling: &impl Fn(&Shape, &Variant) -> Sampling,
) -> Result<()> {
    let mut problem = op.problem(gpu, shape, crate::data::fresh_seed())?;
    let workload = problem.workload();
    let copies = problem.copies();
    let mut group = c.benchmark_group(format!("{}/{}/{shape}", op.family(), op.name()));
    group.throughput(Throughput::Bytes(workload.bytes));
    for v in variants {
        if let Err(e) = gpu.supports(v).and_then(|_| op.validate(v, shape)) {
            eprintln!("skip {}: {e}", v.id());
            continue;
        }
        match problem.prepare(gpu, v).and_then(|_| verify_once(gpu, problem.as_mut())) {
            Ok(ver) if ver.passed() => {}
            Ok(ver) => {
                eprintln!("FAILED {} at {shape}: {} (not benchmarked)", v.id(), ver.summary());
                continue;
            }
            Err(e) => {
                eprintln!("FAILED {} at {shape}: {e} (not benchmarked)", v.id());
                continue;
            }
        }
        let s = sampling(shape, v);
        group.sample_size(s.sample_size.max(10)).measurement_time(s.measurement).warm_up_time(s.warm_up);
        group.sampling_mode(if s.flat { SamplingMode::Flat } else { SamplingMode::Auto });
        let mut copy = 0usize;
        let mut failure = None;
        group.bench_function(BenchmarkId::from_parameter(format!("{:02}-{}", v.stage, v.name)), |b| {
            b.iter_custom(|iters| match time_iters(gpu, problem.as_mut(), iters, copies, &mut copy) {
                Ok(d) => d,
                Err(e) => {
                    failure.get_or_insert(e.to_string());
                    Duration::from_nanos(1)
                }
            })
        });
        if let Some(e) = failure {
            eprintln!("FAILED {} at {shape} while timing: {e}", v.id());
        }
    }
    group.finish();
    Ok(())
}

fn time_iters(
    gpu: &Gpu,
    problem: &mut dyn crate::Problem,
    iters: u64,
    copies: usize,
    copy: &mut usize,
) -> Result<Duration> {
    let ms = crate::timing::time_once(gpu, |stream| {
        for _ in 0..iters {
            problem.enqueue(stream, *copy % copies)?;
            *copy += 1;
        }
        Ok(())
    })?;
    Ok(Duration::from_secs_f64(ms * 1e-3))
}
