//! The runner on the GPU: its interleaved rounds (`ladder run --rounds`: every stage of a table is
//! checked, then timed in turns, its samples pooled over the rounds and its output checked again
//! after its last round; the table records the mode), the device-side check of sampled
//! outputs against the host's, and `ladder launch-overhead`'s replayed graph of empty kernels.

use std::process::ExitCode;

use rand::Rng;

use common::ceilings::Ceilings;
use common::check::{device_non_finite, Element, NonFinite, Verification};
use common::runner::{run_op, RunOptions, Status};
use common::testing::Suite;
use common::timing::TimingConfig;
use common::Gpu;

const ROUNDS: usize = 3;

fn rounds_pool_every_stages_samples(gpu: &Gpu) {
    let ceilings = Ceilings::get(gpu).unwrap();
    let op = kernel_ladder::family("norm").unwrap().ops()[0];
    let shape = op.default_shapes()[0].clone();
    let timing = TimingConfig { rounds: ROUNDS, ..TimingConfig::quick() };
    let per_round = timing.round().min_reps;
    let opts = RunOptions { timing, ..RunOptions::default() };
    let (mut stages, mut done) = (0, 0);
    let table = run_op(gpu, &ceilings, op, &shape, &opts, &mut |p| match p {
        common::runner::Progress::Stage { .. } => stages += 1,
        common::runner::Progress::StageDone => done += 1,
        common::runner::Progress::Inputs { .. } => {}
    })
    .unwrap();
    assert_eq!(table.rounds, ROUNDS);
    assert_eq!(done, table.rows.len(), "one StageDone per row");
    let timed: Vec<_> = table.rows.iter().filter(|r| r.status == Status::Passed).collect();
    assert!(timed.len() >= 2, "at least two stages to interleave at {shape}");
    // Each passed stage: announced once to be checked and once a round; samples from every round.
    assert!(stages >= table.rows.len() + ROUNDS * timed.len(), "{stages} stage events");
    for r in &timed {
        let t = r.timing.expect("a passed row is timed");
        assert!(t.reps >= ROUNDS * per_round, "{}: {} samples, want {ROUNDS} rounds of {per_round}", r.name, t.reps);
        assert!(t.min_ms > 0.0 && t.min_ms <= t.median_ms && t.median_ms <= t.max_ms, "{}: {t:?}", r.name);
    }
}

/// `values` with NaN, +Inf and -Inf planted at random places (the last element among them), as
/// `T`; and the host's count and first index of them.
fn planted<T: Element>(values: &[f32], seed: u64, to: fn(f32) -> T) -> (Vec<T>, NonFinite) {
    let mut rng = common::data::rng(seed);
    let mut out: Vec<T> = values.iter().map(|&v| to(v)).collect();
    let mut spots: Vec<usize> = (0..5).map(|_| rng.random_range(0..values.len())).collect();
    spots.push(values.len() - 1);
    for (i, &at) in spots.iter().enumerate() {
        out[at] = to([f32::NAN, f32::INFINITY, f32::NEG_INFINITY][i % 3]);
    }
    spots.sort_unstable();
    spots.dedup();
    (out, NonFinite { count: spots.len(), first: spots.first().copied() })
}

fn device_check_matches_the_host_for<T: Element>(gpu: &Gpu, seed: u64, to: fn(f32) -> T) {
    // A ragged row length and row count: rows do not line up with the kernel's threads.
    let (total, row_len) = (1013, 997);
    let values = common::data::uniform(total * row_len, -4.0, 4.0, seed);
    let clean: Vec<T> = values.iter().map(|&v| to(v)).collect();
    let dev = gpu.upload(&clean).unwrap();
    assert_eq!(device_non_finite(gpu, &dev.as_view()).unwrap(), NonFinite { count: 0, first: None }, "seed {seed}");
    let (dirty, expected) = planted(&values, seed ^ 1, to);
    let dev = gpu.upload(&dirty).unwrap();
    assert_eq!(device_non_finite(gpu, &dev.as_view()).unwrap(), expected, "seed {seed}");
    // The sampled check on the device and on the host agree, failure included.
    let rows = common::check::sample_rows(total, 64, seed ^ 2);
    let reference: Vec<f64> =
        common::check::gather_rows(&dirty, row_len, &rows).iter().map(|x| x.to_f64() + 1e-3).collect();
    let on_host = Verification::new(1e-2).add_rows("out", &dirty, (total, row_len), &rows, &reference);
    let on_device = Verification::new(1e-2)
        .add_device_rows(gpu, "out", &dev.as_view(), (total, row_len), &rows, &reference)
        .unwrap();
    assert!(!on_device.passed(), "planted NaN/Inf must fail (seed {seed})");
    assert_eq!(on_device.outputs, on_host.outputs, "seed {seed}");
}

fn device_check_matches_the_host(gpu: &Gpu) {
    let seed = common::data::fresh_seed();
    device_check_matches_the_host_for(gpu, seed, |v| v);
    device_check_matches_the_host_for(gpu, seed, half::bf16::from_f32);
    device_check_matches_the_host_for(gpu, seed, half::f16::from_f32);
    device_check_matches_the_host_for(gpu, seed, |v| v as f64);
}

fn graph_node_times_a_replayed_chain(gpu: &Gpu) {
    // The chain's time grows with its nodes: 40 nodes take longer than 4 (a replay is one launch
    // either way, so a per-node figure that ignored the nodes could not pass).
    let short = kernel_ladder::overhead::graph_node(gpu, 4, 1, 20).unwrap();
    let long = kernel_ladder::overhead::graph_node(gpu, 40, 264, 20).unwrap();
    for g in [short, long] {
        let p = g.per_node;
        assert!(p.min_us > 0.0 && p.min_us <= p.median_us && p.median_us <= p.max_us, "{g:?}");
    }
    assert!(40.0 * long.per_node.median_us > 4.0 * short.per_node.median_us, "{short:?} {long:?}");
    assert!(kernel_ladder::overhead::graph_node(gpu, 0, 1, 20).is_err(), "nodes >= 1");
}

fn main() -> ExitCode {
    Suite::new()
        .gpu("rounds_pool_every_stages_samples", rounds_pool_every_stages_samples)
        .gpu("device_check_matches_the_host", device_check_matches_the_host)
        .gpu("graph_node_times_a_replayed_chain", graph_node_times_a_replayed_chain)
        .main()
}
