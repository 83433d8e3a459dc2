//! The host cost of one launch: a prepared trivial stage enqueued many times through [`common::Launch`]
//! (`cuLaunchKernelEx` with parameter checks), beside the same kernel launched through cudarc's own
//! builder (`cuLaunchKernel`) in the same process. Launches go in batches with a synchronisation
//! between them, and only the host time of the enqueue loops is counted, so a full launch queue
//! never turns the figure into GPU time.
//!
//! And the device cost of a kernel boundary in a CUDA graph ([`graph_node`]): a graph of empty
//! kernels in one stream (each starts after the one before ends), replayed and timed with events;
//! what a decode step composed of kernels pays per kernel before any of its work.

use std::time::Instant;

use common::cudarc::driver::{LaunchConfig, PushKernelArg};
use serde::Serialize;

use common::harness::{noop, SOURCES};
use common::{require, Arg, DriverContext, Gpu, LaunchShape, Result};

/// Host microseconds per launch: median, min and max over the batches.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PerLaunch {
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
}

/// Device microseconds per node of a replayed graph of empty kernels: median, min and max over replays.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct GraphNode {
    pub nodes: usize,
    /// Blocks of 256 threads per empty kernel.
    pub blocks: u32,
    pub per_node: PerLaunch,
}

#[derive(Clone, Debug, Serialize)]
pub struct Overhead {
    pub launches: usize,
    pub batch: usize,
    /// `Launch::enqueue` of a prepared stage.
    pub prepared: PerLaunch,
    /// cudarc's `launch_builder` + `launch` of the same function.
    pub raw: PerLaunch,
}

impl Overhead {
    pub fn ratio(&self) -> f64 {
        self.prepared.median_us / self.raw.median_us
    }
}

fn per_launch(mut batches: Vec<f64>) -> PerLaunch {
    batches.sort_by(|a, b| a.partial_cmp(b).unwrap());
    PerLaunch { median_us: batches[batches.len() / 2], min_us: batches[0], max_us: batches[batches.len() - 1] }
}

/// Enqueues the empty kernel `launches` times each way (in batches of `batch`, interleaved, after a
/// warm-up) and returns the host time per launch.
pub fn measure(gpu: &Gpu, launches: usize, batch: usize) -> Result<Overhead> {
    let variant = noop();
    let launch = gpu.prepare_launch(&SOURCES, &variant, "ladder_noop", LaunchShape::linear(1, 32))?;
    let func = gpu.module(&SOURCES, &variant)?.load_function("ladder_noop").ctx("load ladder_noop")?;
    let out = gpu.zeros::<f32>(1)?;
    let stream = gpu.stream();
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
    let n = 1i32;
    let prepared_batch = || -> Result<f64> {
        let t = Instant::now();
        for _ in 0..batch {
            // SAFETY: ladder_noop(float*, int) never writes for n >= 0.
            unsafe { launch.enqueue(stream, &[Arg::buf(&out), Arg::I32(n)]) }?;
        }
        Ok(t.elapsed().as_secs_f64() * 1e6 / batch as f64)
    };
    let raw_batch = || -> Result<f64> {
        let t = Instant::now();
        for _ in 0..batch {
            let mut b = stream.launch_builder(&func);
            b.arg(&out).arg(&n);
            // SAFETY: as above.
            unsafe { b.launch(cfg) }.ctx("launch ladder_noop")?;
        }
        Ok(t.elapsed().as_secs_f64() * 1e6 / batch as f64)
    };
    // Warm-up: first launches pay for lazy loading in the driver.
    prepared_batch()?;
    raw_batch()?;
    gpu.synchronize()?;
    let (mut prepared, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..launches.div_ceil(batch).max(1) {
        prepared.push(prepared_batch()?);
        gpu.synchronize()?;
        raw.push(raw_batch()?);
        gpu.synchronize()?;
    }
    Ok(Overhead { launches, batch, prepared: per_launch(prepared), raw: per_launch(raw) })
}

/// A graph of `nodes` launches of the empty kernel on `blocks` blocks of 256 threads, captured once
/// and replayed `replays` times (after a warm-up), each replay between its own pair of events:
/// device time per node.
pub fn graph_node(gpu: &Gpu, nodes: usize, blocks: u32, replays: usize) -> Result<GraphNode> {
    require(nodes >= 1 && replays >= 1, "nodes >= 1 and replays >= 1", || format!("{nodes}, {replays}"))?;
    let launch = gpu.prepare_launch(&SOURCES, &noop(), "ladder_noop", LaunchShape::linear(blocks, 256))?;
    let out = gpu.zeros::<f32>(1)?;
    let graph = common::timing::capture(gpu.stream(), |s| {
        for _ in 0..nodes {
            // SAFETY: ladder_noop(float*, int) never writes for n >= 0.
            unsafe { launch.enqueue(s, &[Arg::buf(&out), Arg::I32(1)]) }?;
        }
        Ok(())
    })?;
    let timed = Some(common::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (start, end) = (gpu.context().new_event(timed).ctx("event")?, gpu.context().new_event(timed).ctx("event")?);
    let stream = gpu.stream();
    let mut per_node = Vec::with_capacity(replays);
    for i in 0..replays + 3 {
        start.record(stream).ctx("record")?;
        graph.launch().ctx("replay the graph of empty kernels")?;
        end.record(stream).ctx("record")?;
        stream.synchronize().ctx("the replay")?;
        if i >= 3 {
            per_node.push(start.elapsed_ms(&end).ctx("elapsed")? as f64 * 1e3 / nodes as f64);
        }
    }
    Ok(GraphNode { nodes, blocks, per_node: per_launch(per_node) })
}
