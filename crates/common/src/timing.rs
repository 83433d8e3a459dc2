//! Timing with CUDA events: warm-up, then many repetitions each bracketed by its own pair of events,
//! rotating through the problem's copies; median, min and max. Optionally each copy's launch
//! sequence is captured once as a CUDA graph and the graph is replayed (for launch-bound ops), or
//! runs go back to back in batches between one pair of events, as a model's layers follow each
//! other (where a kernel's launch may overlap the tail of the one before: `--back-to-back`). The
//! runner may also split a stage's samples into rounds interleaved with the other stages'
//! (`--rounds`), so that the clock's drift under the power cap reaches every stage alike.

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use std::sync::Arc;

use cudarc::driver::{CudaGraph, CudaStream};
use serde::{Deserialize, Serialize};

use crate::error::{DriverContext, Error, Result};
use crate::gpu::Gpu;

#[derive(Clone, Copy, Debug)]
pub struct TimingConfig {
    /// Stop adding repetitions once this much device time is spent (after `min_reps`).
    pub target_ms: f64,
    pub min_reps: usize,
    pub max_reps: usize,
    /// Warm-up runs are added until this much time has passed (at least one).
    pub warmup_ms: f64,
    /// A first warm-up run longer than this ends the warm-up, and the stage is timed over
    /// `long_run_reps` runs in all, that one first (or the runner's checked run, where it was this
    /// long: [`sample_after_check`]): a run of a tenth of a second or more (the
    /// report's naive attention stages take 4 and 7 s at B = 4, T = 1024; the naive LayerNorm and
    /// softmax 150-440 ms) is not worth ten repetitions to rank it, and those runs vary by < 0.1%.
    pub long_run_above_ms: f64,
    /// The runs a stage over `long_run_above_ms` is timed over (its median, min and max).
    pub long_run_reps: usize,
    pub graph: bool,
    /// Runs per sample: 1 brackets each run with its own pair of events (the run alone: an event
    /// sits between it and the run before); more run back to back between one pair, each sample the
    /// batch's mean (what a stream of consecutive launches sustains).
    pub batch: usize,
    /// Rounds a table's stages are timed in: each round times every stage in turn with 1/rounds of
    /// its budget ([`TimingConfig::round`]), and a stage's samples of all rounds are pooled. 1 times
    /// each stage once, all its samples together.
    pub rounds: usize,
}

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig {
            // `ladder run all` verifies and times 834 stage rows within its four minutes (issue 47):
            // 120 ms of samples (at least 10) and 10 ms of warm-up a row (the device is already busy
            // from the row before, so its clocks are up).
            target_ms: 120.0,
            min_reps: 10,
            max_reps: 500,
            warmup_ms: 10.0,
            long_run_above_ms: 100.0,
            long_run_reps: 2,
            graph: false,
            batch: 1,
            rounds: 1,
        }
    }
}

impl TimingConfig {
    /// Fewer, shorter repetitions: for smoke runs and tests of the harness itself.
    pub fn quick() -> Self {
        TimingConfig { target_ms: 20.0, min_reps: 3, max_reps: 20, warmup_ms: 2.0, ..TimingConfig::default() }
    }

    /// One round's share of a stage's budget: `target_ms` and the repetition bounds divided by the
    /// rounds (at least 2 repetitions a round), warm-up as before.
    pub fn round(&self) -> Self {
        let rounds = self.rounds.max(1);
        TimingConfig {
            target_ms: self.target_ms / rounds as f64,
            min_reps: self.min_reps.div_ceil(rounds).max(2),
            max_reps: self.max_reps.div_ceil(rounds).max(2),
            rounds: 1,
            ..*self
        }
    }
}

/// The samples of one timing (milliseconds per run) and the copy the last run wrote.
pub struct Samples {
    pub ms: Vec<f64>,
    pub last_copy: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub reps: usize,
    /// The copy the last run (warm-up and timed runs together) wrote: the one to check afterwards.
    pub last_copy: usize,
}

impl Timing {
    /// The median, min and max of `samples` (pooled over rounds: the last round's last copy).
    pub fn of(mut samples: Samples) -> Timing {
        Timing { last_copy: samples.last_copy, ..Timing::from_samples(&mut samples.ms) }
    }

    pub fn from_samples(samples: &mut [f64]) -> Timing {
        assert!(!samples.is_empty(), "at least one sample");
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let n = samples.len();
        let median = if n % 2 == 1 { samples[n / 2] } else { 0.5 * (samples[n / 2 - 1] + samples[n / 2]) };
        Timing { median_ms: median, min_ms: samples[0], max_ms: samples[n - 1], reps: n, last_copy: 0 }
    }
}

/// Times `run(stream, copy)` for copies `0..copies` in rotation on the harness stream. `run` only
/// enqueues work on the stream it is given. With `cfg.graph`, each copy's work is captured once as a
/// CUDA graph and the replays are timed; a capture that fails is [`Error::Capture`].
pub fn time(
    gpu: &Gpu,
    copies: usize,
    cfg: &TimingConfig,
    run: impl FnMut(&Arc<CudaStream>, usize) -> Result<()>,
) -> Result<Timing> {
    sample(gpu, copies, cfg, run).map(Timing::of)
}

/// [`time`]'s samples, unsummarized (a round of `--rounds`).
pub fn sample(
    gpu: &Gpu,
    copies: usize,
    cfg: &TimingConfig,
    run: impl FnMut(&Arc<CudaStream>, usize) -> Result<()>,
) -> Result<Samples> {
    sample_after_check(gpu, copies, cfg, None, run)
}

/// [`sample`] right after a checked run of the same stage on copy 0 that took `checked_ms` on the
/// device (the runner's first check, [`crate::runner::verify_timed`]): a run over
/// `long_run_above_ms` is the long run's first sample, so a stage of seconds (the report's naive
/// attention stages) runs `long_run_reps` times with its check, not once more. Stream launches one
/// at a time only, as the check's run was: with `graph` or a batch the check is not a sample.
pub fn sample_after_check(
    gpu: &Gpu,
    copies: usize,
    cfg: &TimingConfig,
    checked_ms: Option<f64>,
    mut run: impl FnMut(&Arc<CudaStream>, usize) -> Result<()>,
) -> Result<Samples> {
    let copies = copies.max(1);
    let stream = gpu.stream();
    if cfg.graph {
        let graphs: Vec<CudaGraph> = (0..copies).map(|c| capture(stream, |s| run(s, c))).collect::<Result<_>>()?;
        return time_loop(gpu, copies, cfg, None, |c| graphs[c].launch().ctx("graph launch"));
    }
    let long_first = checked_ms.filter(|&ms| ms > cfg.long_run_above_ms && cfg.batch <= 1);
    time_loop(gpu, copies, cfg, long_first, |c| run(stream, c))
}

/// The device time (ms) of what `run` enqueues on the harness stream, between one pair of events,
/// waited for: the bracket [`time`] puts around each sample, for a caller that picks its own
/// repetitions (criterion's `iter_custom` in `bench`).
pub fn time_once(gpu: &Gpu, run: impl FnOnce(&Arc<CudaStream>) -> Result<()>) -> Result<f64> {
    bracket(gpu, false, run)
}

/// [`time_once`] behind a [`Gate`]: the work starts only once all of it is enqueued, so the events
/// time the device, not the host's launch rate (`ladder timeline`'s runs).
pub fn time_gated(gpu: &Gpu, run: impl FnOnce(&Arc<CudaStream>) -> Result<()>) -> Result<f64> {
    bracket(gpu, true, run)
}

fn bracket(gpu: &Gpu, gated: bool, run: impl FnOnce(&Arc<CudaStream>) -> Result<()>) -> Result<f64> {
    let ctx = gpu.context();
    let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let (start, end) = (ctx.new_event(timed).ctx("event")?, ctx.new_event(timed).ctx("event")?);
    let stream = gpu.stream();
    // A gate left closed by an error below opens when dropped.
    let gate = if gated { Some(Gate::close(gpu)?) } else { None };
    start.record(stream).ctx("record")?;
    run(stream)?;
    end.record(stream).ctx("record")?;
    if let Some(gate) = gate {
        gate.open()?;
    }
    end.synchronize().ctx("synchronize (a kernel may have faulted)")?;
    Ok(start.elapsed_ms(&end).ctx("elapsed")? as f64)
}

/// Host-clock samples (ms) of `reps` calls of `run` after `warmup` untimed ones, summarized as
/// [`time`] summarizes events: for work whose cost includes the host and a synchronisation (a model's
/// decode step with its download), which events on the stream would not see.
pub fn time_host(warmup: usize, reps: usize, mut run: impl FnMut() -> Result<()>) -> Result<Timing> {
    for _ in 0..warmup {
        run()?;
    }
    let mut samples = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let t0 = std::time::Instant::now();
        run()?;
        samples.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Timing::from_samples(&mut samples))
}

/// Captures what `run` enqueues on `stream` as an instantiated graph.
pub fn capture(stream: &Arc<CudaStream>, run: impl FnOnce(&Arc<CudaStream>) -> Result<()>) -> Result<CudaGraph> {
    let capture_err = |e: cudarc::driver::DriverError| Error::Capture(e.to_string());
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(capture_err)?;
    let enqueued = run(stream);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).map_err(capture_err)?;
    enqueued.map_err(|e| Error::Capture(e.to_string()))?;
    graph.ok_or_else(|| Error::Capture("the capture recorded no work".into()))
}

/// Holds the harness stream at a spinning kernel (`harness/01_gate.cu`) until [`Gate::open`]
/// writes its flag in mapped page-locked memory: the work enqueued behind the gate starts only once
/// all of it is enqueued, so events recorded between launches time the device and not the host's
/// launch rate. Keep what goes behind a gate to a few hundred launches: a full launch queue would
/// block the host on a stream that cannot move.
pub struct Gate {
    flag: cudarc::driver::PinnedHostSlice<u32>,
    host: *mut u32,
    stream: Arc<CudaStream>,
    open: bool,
}

impl Gate {
    /// Closes a gate on the harness stream.
    pub fn close(gpu: &Gpu) -> Result<Gate> {
        let variant = crate::harness::gate();
        let sources = &crate::harness::SOURCES;
        let launch = gpu.prepare_launch(sources, &variant, "ladder_gate", crate::launch::LaunchShape::linear(1, 1))?;
        let mut flag = gpu.pinned(&[0u32])?;
        let host = flag.as_mut_ptr().ctx("the gate's flag")?;
        let mut gate = Gate { flag, host, stream: gpu.stream().clone(), open: false };
        let dev = gpu.mapped_ptr(&gate.flag)?;
        // SAFETY: ladder_gate only reads the one mapped u32, which lives as long as the gate, and
        // the gate opens (Drop) before the flag is freed.
        if let Err(e) = unsafe { launch.enqueue(gpu.stream(), &[crate::launch::Arg::Ptr(dev)]) } {
            gate.open = true;
            return Err(e);
        }
        Ok(gate)
    }

    /// Lets the held stream run, and waits for it (the flag must outlive the kernel that reads it).
    pub fn open(mut self) -> Result<()> {
        self.release();
        self.stream.synchronize().ctx("the work behind the gate")
    }

    fn release(&mut self) {
        if !self.open {
            // SAFETY: `host` points at the live one-element page-locked allocation `flag`.
            unsafe { std::ptr::write_volatile(self.host, 1) };
            // Flush the write-combining buffer so the spinning kernel sees the flag.
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            self.open = true;
        }
    }
}

impl Drop for Gate {
    /// A gate dropped on an error path still opens, so the stream never waits forever.
    fn drop(&mut self) {
        self.release();
        // The kernel reads the flag until it sees it: keep the memory until the stream is past it.
        let _ = self.stream.synchronize();
    }
}

/// A long stage's samples: its first run's `first_ms` (on the copy before `copy`), then the rest of
/// `long_run_reps`, each between its own pair of events.
fn long_runs(
    gpu: &Gpu,
    copies: usize,
    cfg: &TimingConfig,
    first_ms: f64,
    mut copy: usize,
    run: &mut impl FnMut(usize) -> Result<()>,
) -> Result<Samples> {
    let mut ms = vec![first_ms];
    for _ in 1..cfg.long_run_reps {
        ms.push(bracket(gpu, false, |_| run(copy % copies))?);
        copy += 1;
    }
    Ok(Samples { ms, last_copy: (copy + copies - 1) % copies })
}

/// Samples of `run(copy)` after a warm-up; `long_first`: a long run of copy 0 already timed (the
/// check's), which ends the warm-up before it starts.
fn time_loop(
    gpu: &Gpu,
    copies: usize,
    cfg: &TimingConfig,
    long_first: Option<f64>,
    mut run: impl FnMut(usize) -> Result<()>,
) -> Result<Samples> {
    if let Some(first_ms) = long_first {
        return long_runs(gpu, copies, cfg, first_ms, 1, &mut run);
    }
    let ctx = gpu.context();
    let stream = gpu.stream();
    let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let pair = || -> Result<_> { Ok((ctx.new_event(timed).ctx("event")?, ctx.new_event(timed).ctx("event")?)) };

    // Warm-up, which also measures one run to size the repetitions.
    let (s, e) = pair()?;
    let mut copy = 0;
    let mut warm_ms = 0.0;
    let mut warm_runs = 0usize;
    let mut estimate = 0.0;
    while warm_runs == 0 || warm_ms < cfg.warmup_ms {
        s.record(stream).ctx("record")?;
        run(copy % copies)?;
        e.record(stream).ctx("record")?;
        e.synchronize().ctx("warm-up (a kernel may have faulted)")?;
        estimate = s.elapsed_ms(&e).ctx("elapsed")? as f64;
        warm_ms += estimate.max(1e-3);
        warm_runs += 1;
        copy += 1;
        if warm_runs == 1 && estimate > cfg.long_run_above_ms {
            return long_runs(gpu, copies, cfg, estimate, copy, &mut run);
        }
        if warm_runs >= 1000 {
            break;
        }
    }
    let batch = cfg.batch.max(1);
    let reps = ((cfg.target_ms / (estimate.max(1e-3) * batch as f64)) as usize).clamp(cfg.min_reps, cfg.max_reps);
    // All events first, then all runs, then one synchronisation: no host gaps are timed.
    let events: Vec<_> = (0..reps).map(|_| pair()).collect::<Result<_>>()?;
    for (start, end) in &events {
        start.record(stream).ctx("record")?;
        for _ in 0..batch {
            run(copy % copies)?;
            copy += 1;
        }
        end.record(stream).ctx("record")?;
    }
    gpu.synchronize()?;
    let ms: Vec<f64> = events
        .iter()
        .map(|(a, b)| a.elapsed_ms(b).map(|t| t as f64 / batch as f64).ctx("elapsed"))
        .collect::<Result<_>>()?;
    Ok(Samples { ms, last_copy: (copy - 1) % copies })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max() {
        let t = Timing::from_samples(&mut [3.0, 1.0, 2.0, 10.0]);
        assert_eq!((t.median_ms, t.min_ms, t.max_ms, t.reps), (2.5, 1.0, 10.0, 4));
        let t = Timing::from_samples(&mut [5.0, 1.0, 3.0]);
        assert_eq!(t.median_ms, 3.0);
    }

    #[test]
    fn a_round_takes_its_share_of_the_budget() {
        let cfg = TimingConfig { rounds: 4, ..TimingConfig::default() };
        let r = cfg.round();
        assert_eq!((r.target_ms, r.min_reps, r.max_reps, r.rounds, r.batch), (30.0, 3, 125, 1, 1));
        // Never fewer than 2 repetitions a round, and one round is the whole budget.
        let quick = TimingConfig { rounds: 10, ..TimingConfig::quick() }.round();
        assert_eq!((quick.min_reps, quick.max_reps), (2, 2));
        let one = TimingConfig::default().round();
        assert_eq!((one.target_ms, one.min_reps, one.max_reps), (120.0, 10, 500));
    }
}
