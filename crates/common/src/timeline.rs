//! `ladder timeline`: where one launch of a stage spends its time, from stamps the kernel writes
//! itself. A kernel that includes `ladder_timeline.cuh` calls `ladder_stamp(slot)` at the points
//! that divide its work into phases, and names the slots on one `// Timeline:` line of its sources.
//! The instrument compiles the stage with `-DLADDER_TIMELINE=1` (the stamps are nothing otherwise),
//! verifies it, then times runs one at a time (each between its own pair of events, enqueued behind
//! a gate so that the events time the device, the inputs rotated over the problem's copies) and
//! reads every block's stamps back after each run. A run follows the gate's spinning kernel, not
//! the run before it, so its event time is close to the default table's but not the same. A phase's time is read from the run's first block start: the first block, the
//! mean over blocks and the last block to reach it, each the median over runs.

use serde::Serialize;

use crate::error::{DriverContext, Error, Result};
use crate::family::{Op, Problem};
use crate::gpu::Gpu;
use crate::module::Sources;
use crate::report::Format;
use crate::shape::Shape;
use crate::timing::Timing;
use crate::variant::{Source, Variant};

/// `LADDER_TIMELINE_SLOTS` and `LADDER_TIMELINE_BLOCKS` of `ladder_timeline.cuh`.
pub const SLOTS: usize = 32;
pub const BLOCKS: usize = 1024;
/// The switch that turns the stamps on, and the device array they go to.
pub const SWITCH: &str = "LADDER_TIMELINE";
const SYMBOL: &str = "ladder_timeline";
const MARKER: &str = "// Timeline:";

/// A stamped slot and its name, from the `// Timeline:` line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Slot {
    pub slot: usize,
    pub name: String,
}

/// Parses a `// Timeline:` line's slots ("0 name; 1 other name; ...").
pub fn parse_slots(line: &str) -> Result<Vec<Slot>> {
    let body = line.trim().strip_prefix(MARKER).unwrap_or(line).trim();
    let mut slots: Vec<Slot> = Vec::new();
    for item in body.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let (num, name) = item.split_once(' ').unwrap_or((item, ""));
        let slot = num
            .parse::<usize>()
            .ok()
            .filter(|&s| s < SLOTS && !name.trim().is_empty() && !slots.iter().any(|o| o.slot == s))
            .ok_or_else(|| {
                Error::constraint(format!("a timeline slot is 'N name' with N < {SLOTS}, each N once"), item)
            })?;
        slots.push(Slot { slot, name: name.trim().to_string() });
    }
    if slots.is_empty() {
        return Err(Error::constraint("a `// Timeline:` line names at least one slot", line.trim()));
    }
    Ok(slots)
}

/// The slots of `variant`'s kernel: the `// Timeline:` line of its `.cu` file or of a header it
/// includes (directly or through other headers), the first one found walking the includes in order.
pub fn slots(sources: &Sources, variant: &Variant) -> Result<Vec<Slot>> {
    let Source::Kernel(path) = variant.source else {
        return Err(Error::constraint("a timeline needs a kernel stage", variant.id()));
    };
    let headers = sources.headers()?;
    let mut queue = vec![sources.find(path)?.text];
    let mut seen: Vec<&str> = Vec::new();
    while let Some(text) = queue.pop() {
        if let Some(line) = text.lines().find(|l| l.trim_start().starts_with(MARKER)) {
            return parse_slots(line);
        }
        // Depth first, in include order: push the includes in reverse.
        let includes: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("#include \"")?.strip_suffix('"'))
            .filter(|name| !seen.contains(name))
            .collect();
        for name in includes.iter().rev() {
            seen.push(name);
            if let Some(h) = headers.iter().find(|h| h.path == *name || h.path.ends_with(&format!("/{name}"))) {
                queue.push(h.text);
            }
        }
    }
    Err(Error::constraint(
        "the stage's sources stamp a timeline (a `// Timeline:` line naming its slots)",
        format!("none in {} or the headers it includes", variant.id()),
    ))
}

/// One phase over the runs, in microseconds from the run's first block start.
#[derive(Clone, Debug, Serialize)]
pub struct Phase {
    pub slot: usize,
    pub name: String,
    /// Blocks that stamped the slot (the median over runs).
    pub blocks: usize,
    pub first_us: f64,
    pub mean_us: f64,
    pub last_us: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Timeline {
    pub stage: String,
    pub shape: String,
    pub config: Vec<(String, u32)>,
    pub device: String,
    pub runs: usize,
    /// Blocks that stamped slot 0 (the median over runs); blocks past [`BLOCKS`] are not stamped.
    pub blocks: usize,
    /// Each run between its own pair of events, as the default table times it.
    pub event: Timing,
    /// From the first block start to the last stamp of any block (the median over runs).
    pub span_us: f64,
    /// The smallest step seen between two different stamps: the timer's resolution, or finer.
    pub tick_ns: Option<u64>,
    pub phases: Vec<Phase>,
}

/// One slot in one run: the blocks that stamped it and, in microseconds from the run's first block
/// start, the first, mean and last of their stamps (NaN where no block stamped it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlotRun {
    pub blocks: usize,
    pub first_us: f64,
    pub mean_us: f64,
    pub last_us: f64,
}

/// One run: the blocks that stamped slot 0, the span from the first block start to the last stamp,
/// and each named slot.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    pub blocks: usize,
    pub span_us: f64,
    pub slots: Vec<SlotRun>,
}

/// One run's stamps (`BLOCKS` x `SLOTS`, 0 where not stamped) reduced per named slot, in
/// microseconds from the earliest stamp of slot 0; `None` where no block stamped slot 0.
pub fn reduce(stamps: &[u64], slots: &[Slot]) -> Option<Run> {
    let rows: Vec<&[u64]> = stamps.chunks(SLOTS).filter(|row| row[0] != 0).collect();
    let t0 = rows.iter().map(|r| r[0]).min()?;
    let us = |t: u64| t.saturating_sub(t0) as f64 * 1e-3;
    let span_us = rows.iter().flat_map(|r| r.iter().copied().filter(|&t| t != 0)).max().map_or(0.0, us);
    let slots = slots
        .iter()
        .map(|s| {
            let times: Vec<f64> = rows.iter().map(|r| r[s.slot]).filter(|&t| t != 0).map(us).collect();
            if times.is_empty() {
                return SlotRun { blocks: 0, first_us: f64::NAN, mean_us: f64::NAN, last_us: f64::NAN };
            }
            SlotRun {
                blocks: times.len(),
                first_us: times.iter().copied().fold(f64::INFINITY, f64::min),
                mean_us: times.iter().sum::<f64>() / times.len() as f64,
                last_us: times.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            }
        })
        .collect();
    Some(Run { blocks: rows.len(), span_us, slots })
}

/// The smallest positive difference between two stamps of one run.
pub fn tick(stamps: &[u64]) -> Option<u64> {
    let mut t: Vec<u64> = stamps.iter().copied().filter(|&t| t != 0).collect();
    t.sort_unstable();
    t.dedup();
    t.windows(2).map(|w| w[1] - w[0]).min()
}

/// The median of the values that are not NaN (NaN when none is).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| !x.is_nan());
    if v.is_empty() {
        return f64::NAN;
    }
    Timing::from_samples(&mut v).median_ms
}

/// Prepares `v` at `shape` and checks one run of it: a timeline reads only a verified stage (`with`
/// names what the build adds, for the error).
pub(crate) fn prepare_verified(
    gpu: &Gpu,
    op: &dyn Op,
    problem: &mut dyn Problem,
    v: &Variant,
    shape: &Shape,
    with: &str,
) -> Result<()> {
    op.validate(v, shape)?;
    problem.prepare(gpu, v)?;
    let check = crate::runner::verify_once(gpu, problem)?;
    if !check.passed() {
        return Err(Error::Verification(format!("{} with {with}: {}", v.id(), check.summary())));
    }
    Ok(())
}

/// Verifies `variant` with its stamps on at `shape` (whose inputs `problem` holds), then records
/// `runs` runs (after `warmup`).
pub fn record(
    gpu: &Gpu,
    op: &dyn Op,
    problem: &mut dyn Problem,
    variant: &Variant,
    shape: &Shape,
    runs: usize,
    warmup: usize,
) -> Result<Timeline> {
    crate::require(runs >= 1, "runs >= 1", || runs.to_string())?;
    let mut v = variant.clone();
    v.switch_on(SWITCH);
    let slots = slots(op.sources(), &v)?;
    prepare_verified(gpu, op, problem, &v, shape, "its timeline stamps")?;
    let Source::Kernel(path) = v.source else { unreachable!("slots() found the stage's kernel file") };
    // The module the prepared stage launches (its defines may differ from the stage list's).
    let modules = gpu.loaded_with(op.sources(), path, SWITCH);
    let stream = gpu.stream();
    let mut symbols = Vec::new();
    for m in &modules {
        let symbol = m.get_global(SYMBOL, stream).ctx("the timeline's device array")?;
        crate::require(symbol.len() == BLOCKS * SLOTS * 8, "ladder_timeline holds BLOCKS x SLOTS u64", || {
            format!("{} bytes", symbol.len())
        })?;
        symbols.push(symbol);
    }
    let copies = problem.copies().max(1);
    let mut host = vec![0u64; BLOCKS * SLOTS];
    let (mut event_ms, mut reduced, mut tick_ns) = (Vec::new(), Vec::new(), None::<u64>);
    for run in 0..warmup + runs {
        for symbol in symbols.iter_mut() {
            stream.memset_zeros(symbol).ctx("zeroing the timeline")?;
        }
        // Behind a gate, so that the events time the device and not the host's launch (as the
        // table's runs, enqueued ahead of the first).
        let ms = crate::timing::time_gated(gpu, |stream| problem.enqueue(stream, run % copies))?;
        // The stamps of the module the run launched: the only one not left all zero.
        let mut stamped = 0;
        for symbol in &symbols {
            let mut bytes = vec![0u8; BLOCKS * SLOTS * 8];
            stream.memcpy_dtoh(symbol, &mut bytes).ctx("reading the timeline")?;
            stream.synchronize().ctx("a timeline run (a kernel may have faulted)")?;
            if bytes.iter().any(|&b| b != 0) {
                stamped += 1;
                host.iter_mut()
                    .zip(bytes.chunks_exact(8))
                    .for_each(|(h, b)| *h = u64::from_le_bytes(b.try_into().unwrap()));
            }
        }
        if stamped != 1 {
            return Err(Error::Verification(format!(
                "{}: {stamped} of {} timeline modules stamped",
                v.id(),
                symbols.len()
            )));
        }
        if run < warmup {
            continue;
        }
        event_ms.push(ms);
        if let Some(t) = tick(&host) {
            tick_ns = Some(tick_ns.map_or(t, |o| o.min(t)));
        }
        reduced.push(
            reduce(&host, &slots).ok_or_else(|| {
                Error::Verification(format!("{}: no block stamped slot 0 ({})", v.id(), slots[0].name))
            })?,
        );
    }
    let phases = slots
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let pick = |f: fn(&SlotRun) -> f64| median(reduced.iter().map(|r: &Run| f(&r.slots[i])).collect());
            Phase {
                slot: s.slot,
                name: s.name.clone(),
                blocks: pick(|p| p.blocks as f64) as usize,
                first_us: pick(|p| p.first_us),
                mean_us: pick(|p| p.mean_us),
                last_us: pick(|p| p.last_us),
            }
        })
        .collect();
    Ok(Timeline {
        stage: format!("{}:{}", variant.stage, variant.name),
        shape: shape.to_string(),
        config: variant.config(),
        device: gpu.info().name.clone(),
        runs,
        blocks: median(reduced.iter().map(|r| r.blocks as f64).collect()) as usize,
        event: Timing::from_samples(&mut event_ms),
        span_us: median(reduced.iter().map(|r| r.span_us).collect()),
        tick_ns,
        phases,
    })
}

/// The timeline as text, Markdown (a caption and a table) or JSON.
pub fn render(t: &Timeline, format: Format) -> String {
    if format == Format::Json {
        return serde_json::to_string_pretty(t).unwrap_or_default() + "\n";
    }
    let config: Vec<String> = t.config.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let tick = t.tick_ns.map_or("none seen".to_string(), |n| format!("{n} ns"));
    let caption = format!(
        "{} at {} [{}] on {}: {} runs, {} blocks stamped. Event time median {:.2} us (min {:.2}, max {:.2}); \
         stamps span {:.2} us from the first block start; smallest timer step seen {tick}.",
        t.stage,
        t.shape,
        config.join(","),
        t.device,
        t.runs,
        t.blocks,
        t.event.median_ms * 1e3,
        t.event.min_ms * 1e3,
        t.event.max_ms * 1e3,
        t.span_us,
    );
    let us = |x: f64| if x.is_nan() { "-".to_string() } else { format!("{x:.2}") };
    let rows = t.phases.iter().map(|p| {
        vec![p.slot.to_string(), p.name.clone(), p.blocks.to_string(), us(p.first_us), us(p.mean_us), us(p.last_us)]
    });
    let head = ["slot", "phase", "blocks", "first block (us)", "mean (us)", "last block (us)"];
    if format == Format::Csv {
        return crate::report::csv_text(std::iter::once(head.iter().map(|s| s.to_string()).collect()).chain(rows));
    }
    format!("{caption}\n\n{}\n\n", crate::report::text_table(format, head, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_parse_and_bad_lines_are_typed_errors() {
        let s = parse_slots("// Timeline: 0 block start; 2 producer's last load; 15 end").unwrap();
        assert_eq!(s.iter().map(|s| s.slot).collect::<Vec<_>>(), [0, 2, 15]);
        assert_eq!(s[1].name, "producer's last load");
        for bad in
            ["// Timeline:", "// Timeline: x start", "// Timeline: 32 past", "// Timeline: 0 a; 0 b", "// Timeline: 3"]
        {
            assert!(matches!(parse_slots(bad), Err(Error::Constraint { .. })), "{bad}");
        }
    }

    #[test]
    fn reduce_reads_from_the_first_block_start_and_skips_unstamped() {
        let slots = parse_slots("// Timeline: 0 start; 1 mid; 2 never").unwrap();
        let mut stamps = vec![0u64; 4 * SLOTS];
        // Block 0 starts at 10 us, block 1 at 11 us, block 2 never ran, block 3 at 10.5 us.
        for (b, start, mid) in [(0usize, 10_000u64, 13_000u64), (1, 11_000, 15_000), (3, 10_500, 12_500)] {
            stamps[b * SLOTS] = start;
            stamps[b * SLOTS + 1] = mid;
        }
        let run = reduce(&stamps, &slots).unwrap();
        assert_eq!(run.blocks, 3);
        assert!((run.span_us - 5.0).abs() < 1e-9);
        let [start, mid, never] = [run.slots[0], run.slots[1], run.slots[2]];
        assert_eq!(start.blocks, 3);
        assert!(
            start.first_us.abs() < 1e-9 && (start.last_us - 1.0).abs() < 1e-9 && (start.mean_us - 0.5).abs() < 1e-9
        );
        assert!((mid.first_us - 2.5).abs() < 1e-9 && (mid.last_us - 5.0).abs() < 1e-9);
        assert_eq!(never.blocks, 0);
        assert!(never.mean_us.is_nan());
        assert_eq!(tick(&stamps), Some(500));
        assert!(reduce(&[0u64; SLOTS], &slots).is_none());
    }
}
