//! The runner's interleaved rounds on the GPU (`ladder run --rounds`): every stage of a table is
//! checked, then timed in turns, its samples pooled over the rounds and its output checked again
//! after its last round; the table records the mode.

use std::process::ExitCode;

use common::ceilings::Ceilings;
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

fn main() -> ExitCode {
    Suite::new().gpu("rounds_pool_every_stages_samples", rounds_pool_every_stages_samples).main()
}
