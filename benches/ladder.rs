//! `cargo bench` at the root: the composition, the way `cargo bench -p <crate>` measures a ladder.
//! Per named plan (`gpt2::plan::PLAN_NAMES`): one GPT-2 124M transformer block of the prefill
//! (B = 4, T = 1024; CUDA events around back-to-back blocks) and one decode step at batch 1 and 8
//! (the host clock around the whole step as generation runs it, CUDA-graph replay, the cache near
//! the end of the 1024-token context). `LADDER_BENCH_SMOKE=1`: 10 short samples each.

use std::time::{Duration, Instant};

use common::cudarc::driver::sys::CUevent_flags;
use common::{DriverContext, Gpu, Result};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use gpt2::config::Config;
use gpt2::fastest;
use gpt2::model::Model;
use gpt2::plan::PLAN_NAMES;
use gpt2::weights::Weights;

/// The decode steps share one cache; it is renewed before it reaches the context.
const CACHE_FROM: usize = 600;
const CACHE_TO: usize = 1000;

fn block_prefill(gpu: &Gpu, model: &mut Model, iters: u64) -> Result<Duration> {
    let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let (start, end) = (gpu.context().new_event(timed).ctx("event")?, gpu.context().new_event(timed).ctx("event")?);
    let s = gpu.stream().clone();
    model.enqueue_one_block(gpu, &s, 4, 1024, 0)?;
    start.record(&s).ctx("record")?;
    for _ in 0..iters {
        model.enqueue_one_block(gpu, &s, 4, 1024, 0)?;
    }
    end.record(&s).ctx("record")?;
    end.synchronize().ctx("blocks")?;
    Ok(Duration::from_secs_f64(start.elapsed_ms(&end).ctx("elapsed")? as f64 * 1e-3))
}

fn decode_steps(gpu: &Gpu, model: &mut Model, b: usize, iters: u64) -> Result<Duration> {
    let tokens: Vec<i32> = (0..b as i32).collect();
    let mut cache = model.timing_cache(gpu, b, CACHE_FROM)?;
    model.decode_step(gpu, &mut cache, &tokens)?;
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        if cache.lens()[0] >= CACHE_TO {
            cache = model.timing_cache(gpu, b, CACHE_FROM)?;
            model.decode_step(gpu, &mut cache, &tokens)?;
        }
        let t0 = Instant::now();
        model.decode_step(gpu, &mut cache, &tokens)?;
        total += t0.elapsed();
    }
    Ok(total)
}

/// A plan that cannot be built or run stops the bench with its error: no row is silently missing.
fn fail<T>(plan: &str, e: common::Error) -> T {
    panic!("bench ladder: plan {plan}: {e}")
}

fn composition(c: &mut Criterion) {
    let gpu = match common::testing::open_gpu() {
        Ok(g) => g,
        Err(why) => {
            eprintln!("bench ladder: not run: {why}");
            return;
        }
    };
    let smoke = std::env::var("LADDER_BENCH_SMOKE").is_ok_and(|v| v == "1");
    let cfg = Config::GPT2;
    let weights = Weights::random(&cfg, 1);
    for name in PLAN_NAMES {
        let plan = fastest::resolve(&gpu, &cfg, name, &mut |op| eprintln!("choosing the fastest stages: {op}"))
            .unwrap_or_else(|e| fail(name, e));
        let mut model = Model::new(&gpu, cfg, &weights, plan).unwrap_or_else(|e| fail(name, e));
        model.set_graph(true);
        let mut group = c.benchmark_group("gpt2/block-prefill/B=4,T=1024");
        group.sampling_mode(SamplingMode::Flat).sample_size(10);
        if smoke {
            group.measurement_time(Duration::from_millis(300)).warm_up_time(Duration::from_millis(50));
        }
        group.bench_function(name, |bn| {
            bn.iter_custom(|iters| block_prefill(&gpu, &mut model, iters).unwrap_or_else(|e| fail(name, e)))
        });
        group.finish();
        for b in [1, 8] {
            let mut group = c.benchmark_group(format!("gpt2/decode-step/b={b}"));
            group.sample_size(if smoke { 10 } else { 30 });
            if smoke {
                group.measurement_time(Duration::from_millis(300)).warm_up_time(Duration::from_millis(50));
            }
            group.bench_function(name, |bn| {
                bn.iter_custom(|iters| decode_steps(&gpu, &mut model, b, iters).unwrap_or_else(|e| fail(name, e)))
            });
            group.finish();
        }
    }
}

criterion_group!(benches, composition);
criterion_main!(benches);
