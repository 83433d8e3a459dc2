//! `ladder timeline` on a composed stage: where a chain of dependent launches spends its time, kernel
//! by kernel, from stamps each kernel of the chain writes itself (`ladder_dependent.cuh`). Every
//! dependent build is compiled with [`crate::launch::CHAIN_TIMELINE`] on while the stage is prepared
//! and run; thread 0 of each block records when the block started, entered and left its
//! `griddepcontrol.wait`, reached the kernel's two marks and returned. Each module's blocks take
//! tickets in order, so its records fall into launches by their grid sizes; the launches of all the
//! modules, sorted by when they left their wait, are the chain.
//!
//! For each kernel: `resident` is how long its first block had started before the kernel ahead of it
//! returned its last block (the launch hidden under the previous kernel); `release` is from that last
//! return to this kernel's first block leaving its wait (the grid's completion reaching the
//! dependent); the marks and returns are from this kernel's first block leaving its wait. Three more
//! read a kernel's tail: when its last block started, when 90% of its blocks had returned, and when
//! the first SM had returned all of its blocks (blocks that started late against SMs that ran slow).

use serde::Serialize;

use crate::error::{DriverContext, Error, Result};
use crate::family::{Op, Problem};
use crate::gpu::Gpu;
use crate::report::Format;
use crate::shape::Shape;
use crate::timeline::median;
use crate::timing::Timing;
use crate::variant::Variant;

/// `LADDER_CHAIN_RECORDS` and `LADDER_CHAIN_FIELDS` of `ladder_dependent.cuh`.
pub const RECORDS: usize = 65536;
const FIELDS: usize = 8;
const TICKETS: &str = "ladder_chain_tickets";
const SYMBOL: &str = "ladder_chain";

/// One block's record (ns of %globaltimer; 0 where the block did not reach the point).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRecord {
    pub start: u64,
    pub wait_entered: u64,
    pub wait_left: u64,
    pub marks: [u64; 2],
    pub done: u64,
    pub blocks: u64,
    pub sm: u64,
}

impl BlockRecord {
    fn from_fields(f: &[u64]) -> BlockRecord {
        BlockRecord {
            start: f[0],
            wait_entered: f[1],
            wait_left: f[2],
            marks: [f[3], f[4]],
            done: f[5],
            blocks: f[6],
            sm: f[7],
        }
    }
}

/// One launch in one run: the module's name, its blocks and their stamps reduced (ns).
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchRun {
    pub module: String,
    pub blocks: usize,
    pub first_start: u64,
    pub first_wait_left: u64,
    pub last_wait_left: u64,
    /// The mean over blocks that reached mark i, in ns after `first_wait_left`.
    pub marks: [Option<f64>; 2],
    pub mean_done: f64,
    pub last_done: u64,
    /// The last block's start, the 90th-percentile return and the earliest time an SM had returned
    /// all of its blocks, in ns after `first_wait_left` (the start may be before it).
    pub last_start: f64,
    pub p90_done: f64,
    pub first_sm_done: f64,
}

/// A module's records in ticket order, cut into launches by their grid sizes: an error where a
/// launch's records disagree on its size or a record misses a stamp every block makes.
pub fn launches(module: &str, records: &[BlockRecord]) -> Result<Vec<LaunchRun>> {
    let bad = |what: String| Error::Verification(format!("{module}: chain records out of order: {what}"));
    let mut out = Vec::new();
    let mut rest = records;
    while let Some(first) = rest.first() {
        let n = first.blocks as usize;
        if n == 0 || n > rest.len() {
            return Err(bad(format!("a launch of {n} blocks with {} records left", rest.len())));
        }
        let (launch, tail) = rest.split_at(n);
        rest = tail;
        if let Some(r) = launch.iter().find(|r| r.blocks != first.blocks || r.wait_left == 0 || r.done == 0) {
            return Err(bad(format!("{r:?} in a launch of {n} blocks")));
        }
        let t0 = launch.iter().map(|r| r.wait_left).min().unwrap_or(0);
        let after = |t: u64| t.saturating_sub(t0) as f64;
        let mark = |i: usize| {
            let reached: Vec<f64> = launch.iter().filter(|r| r.marks[i] != 0).map(|r| after(r.marks[i])).collect();
            (!reached.is_empty()).then(|| reached.iter().sum::<f64>() / reached.len() as f64)
        };
        // Every block's return after t0, sorted: their mean and 90th percentile.
        let mut done: Vec<f64> = launch.iter().map(|r| after(r.done)).collect();
        done.sort_by(f64::total_cmp);
        let mut sm_done = std::collections::BTreeMap::new();
        for r in launch {
            let last = sm_done.entry(r.sm).or_insert(0);
            *last = r.done.max(*last);
        }
        out.push(LaunchRun {
            module: module.to_string(),
            blocks: n,
            first_start: launch.iter().map(|r| r.start).min().unwrap_or(0),
            first_wait_left: t0,
            last_wait_left: launch.iter().map(|r| r.wait_left).max().unwrap_or(0),
            marks: [mark(0), mark(1)],
            mean_done: done.iter().sum::<f64>() / n as f64,
            last_done: launch.iter().map(|r| r.done).max().unwrap_or(0),
            last_start: launch.iter().map(|r| r.start).max().unwrap_or(0) as f64 - t0 as f64,
            p90_done: done[(n - 1) * 9 / 10],
            first_sm_done: sm_done.values().min().map_or(0.0, |&t| after(t)),
        });
    }
    Ok(out)
}

/// One kernel of the chain, the median over runs (µs; NaN where not stamped).
#[derive(Clone, Debug, Serialize)]
pub struct ChainKernel {
    pub index: usize,
    pub module: String,
    pub blocks: usize,
    /// How long its first block had started before the previous kernel's last block returned.
    pub resident_us: f64,
    /// From the previous kernel's last block return to this kernel's first block leaving its wait.
    pub release_us: f64,
    /// From the first block leaving its wait: the last block leaving it, the two marks (mean over
    /// blocks), the mean and the last return.
    pub last_wait_us: f64,
    pub marks_us: [f64; 2],
    pub mean_done_us: f64,
    pub last_done_us: f64,
    /// From the first block leaving its wait: the last block's start, the 90th-percentile return,
    /// the first SM to have returned all of its blocks.
    pub last_start_us: f64,
    pub p90_done_us: f64,
    pub first_sm_done_us: f64,
}

/// The kernels of one module with one grid size, their per-kernel medians averaged.
#[derive(Clone, Debug, Serialize)]
pub struct ChainGroup {
    pub module: String,
    pub blocks: usize,
    pub kernels: usize,
    pub release_us: f64,
    pub last_done_us: f64,
    /// release + last return: the group's share of the chain, a kernel.
    pub link_us: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChainTimeline {
    pub stage: String,
    pub shape: String,
    pub device: String,
    pub runs: usize,
    /// Each run between its own pair of events (the gate's), as the default table times it.
    pub event: Timing,
    /// From the first kernel's first block leaving its wait to the last kernel's last return.
    pub span_us: f64,
    pub kernels: Vec<ChainKernel>,
    pub groups: Vec<ChainGroup>,
}

/// The chain of one run: every module's launches, sorted by when their first block left its wait.
pub fn chain(modules: &[(String, Vec<BlockRecord>)]) -> Result<Vec<LaunchRun>> {
    let mut all = Vec::new();
    for (name, records) in modules {
        all.extend(launches(name, records)?);
    }
    all.sort_by_key(|l| l.first_wait_left);
    Ok(all)
}

/// The per-kernel medians over runs of equal chains (the same modules and grids in the same order).
pub fn kernels(runs: &[Vec<LaunchRun>]) -> Result<Vec<ChainKernel>> {
    let first = runs.first().ok_or_else(|| Error::constraint("at least one run", "none"))?;
    let same = |r: &Vec<LaunchRun>| {
        r.len() == first.len() && r.iter().zip(first).all(|(a, b)| a.module == b.module && a.blocks == b.blocks)
    };
    if !runs.iter().all(same) {
        return Err(Error::Verification("the chain's launches differ between runs".into()));
    }
    let us = |ns: f64| ns * 1e-3;
    Ok((0..first.len())
        .map(|i| {
            let pick = |f: &dyn Fn(&LaunchRun, Option<&LaunchRun>) -> f64| {
                median(runs.iter().map(|r| f(&r[i], i.checked_sub(1).map(|p| &r[p]))).collect())
            };
            // From the previous kernel's last return to `t` (none before the first kernel).
            let since_prev = |p: Option<&LaunchRun>, t: u64| p.map_or(f64::NAN, |p| us(t as f64 - p.last_done as f64));
            ChainKernel {
                index: i,
                module: first[i].module.clone(),
                blocks: first[i].blocks,
                resident_us: pick(&|l, p| -since_prev(p, l.first_start)),
                release_us: pick(&|l, p| since_prev(p, l.first_wait_left)),
                last_wait_us: pick(&|l, _| us((l.last_wait_left - l.first_wait_left) as f64)),
                marks_us: [0, 1].map(|m| pick(&|l, _| l.marks[m].map_or(f64::NAN, us))),
                mean_done_us: pick(&|l, _| us(l.mean_done)),
                last_done_us: pick(&|l, _| us((l.last_done - l.first_wait_left) as f64)),
                last_start_us: pick(&|l, _| us(l.last_start)),
                p90_done_us: pick(&|l, _| us(l.p90_done)),
                first_sm_done_us: pick(&|l, _| us(l.first_sm_done)),
            }
        })
        .collect())
}

/// The kernels grouped by module and grid size, in order of first appearance.
pub fn groups(kernels: &[ChainKernel]) -> Vec<ChainGroup> {
    let mut keys: Vec<(&str, usize)> = Vec::new();
    for k in kernels {
        if !keys.contains(&(k.module.as_str(), k.blocks)) {
            keys.push((k.module.as_str(), k.blocks));
        }
    }
    keys.into_iter()
        .map(|(module, blocks)| {
            let members: Vec<&ChainKernel> =
                kernels.iter().filter(|k| k.module == module && k.blocks == blocks).collect();
            // The mean over the members that have the value (the chain's first kernel has no release).
            let mean = |f: fn(&ChainKernel) -> f64| {
                let v: Vec<f64> = members.iter().map(|k| f(k)).filter(|x| !x.is_nan()).collect();
                if v.is_empty() {
                    f64::NAN
                } else {
                    v.iter().sum::<f64>() / v.len() as f64
                }
            };
            let (release_us, last_done_us) = (mean(|k| k.release_us), mean(|k| k.last_done_us));
            ChainGroup {
                module: module.to_string(),
                blocks,
                kernels: members.len(),
                release_us,
                last_done_us,
                link_us: if release_us.is_nan() { last_done_us } else { release_us + last_done_us },
            }
        })
        .collect()
}

/// Restores the device's ordinary builds however the recording ends.
struct ChainBuilds<'a>(&'a Gpu);
impl Drop for ChainBuilds<'_> {
    fn drop(&mut self) {
        self.0.set_chain_timeline(false);
    }
}

/// Verifies `variant` (a stage whose problem launches a dependent chain) with the chain's stamps on
/// at `shape`, then records `runs` runs after `warmup`.
pub fn record(
    gpu: &Gpu,
    op: &dyn Op,
    problem: &mut dyn Problem,
    variant: &Variant,
    shape: &Shape,
    runs: usize,
    warmup: usize,
) -> Result<ChainTimeline> {
    crate::require(runs >= 1, "runs >= 1", || runs.to_string())?;
    let _builds = ChainBuilds(gpu);
    gpu.set_chain_timeline(true);
    crate::timeline::prepare_verified(gpu, op, problem, variant, shape, "its chain stamps")?;
    let modules = gpu.loaded_with_switch(crate::launch::CHAIN_TIMELINE);
    crate::require(!modules.is_empty(), "a stage whose launches include dependent ones", || variant.id())?;
    let stream = gpu.stream();
    let copies = problem.copies().max(1);
    let (mut event_ms, mut chains) = (Vec::new(), Vec::new());
    for run in 0..warmup + runs {
        for (_, m) in &modules {
            let mut tickets = m.get_global(TICKETS, stream).ctx("the chain's ticket counter")?;
            stream.memset_zeros(&mut tickets).ctx("zeroing the chain's tickets")?;
        }
        let ms = crate::timing::time_gated(gpu, |stream| problem.enqueue(stream, run % copies))?;
        let mut recorded = Vec::new();
        for (name, m) in &modules {
            let tickets = m.get_global(TICKETS, stream).ctx("the chain's ticket counter")?;
            let mut count = [0u8; 4];
            stream.memcpy_dtoh(&tickets, &mut count).ctx("reading the chain's tickets")?;
            stream.synchronize().ctx("a chain timeline run (a kernel may have faulted)")?;
            let n = u32::from_le_bytes(count) as usize;
            crate::require(n <= RECORDS, &format!("at most {RECORDS} blocks a module a run"), || {
                format!("{n} in {name}")
            })?;
            let symbol = m.get_global(SYMBOL, stream).ctx("the chain's records")?;
            let mut bytes = vec![0u8; n * FIELDS * 8];
            stream.memcpy_dtoh(&symbol.slice(..bytes.len()), &mut bytes).ctx("reading the chain's records")?;
            stream.synchronize().ctx("reading the chain's records")?;
            let fields: Vec<u64> = bytes.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).collect();
            recorded.push((name.clone(), fields.chunks_exact(FIELDS).map(BlockRecord::from_fields).collect()));
        }
        if run < warmup {
            continue;
        }
        event_ms.push(ms);
        chains.push(chain(&recorded)?);
    }
    crate::require(chains.iter().all(|c| !c.is_empty()), "a run that records its chain", || variant.id())?;
    let span = |c: &Vec<LaunchRun>| {
        let (first, last) = (c.first().unwrap(), c.iter().map(|l| l.last_done).max().unwrap());
        last.saturating_sub(first.first_wait_left) as f64 * 1e-3
    };
    let span_us = median(chains.iter().map(span).collect());
    let kernels = kernels(&chains)?;
    Ok(ChainTimeline {
        stage: format!("{}:{}", variant.stage, variant.name),
        shape: shape.to_string(),
        device: gpu.info().name.clone(),
        runs,
        event: Timing::from_samples(&mut event_ms),
        span_us,
        groups: groups(&kernels),
        kernels,
    })
}

/// The chain as text, Markdown or CSV (the kernels, then the groups) or JSON.
pub fn render(t: &ChainTimeline, format: Format) -> String {
    if format == Format::Json {
        return serde_json::to_string_pretty(t).unwrap_or_default() + "\n";
    }
    let us = |x: f64| if x.is_nan() { "-".to_string() } else { format!("{x:.2}") };
    let caption = format!(
        "{} at {} on {}: {} runs, {} dependent kernels. Event time median {:.2} us (min {:.2}, max {:.2}); \
         the chain spans {:.2} us from its first kernel's first wait left to its last return.",
        t.stage,
        t.shape,
        t.device,
        t.runs,
        t.kernels.len(),
        t.event.median_ms * 1e3,
        t.event.min_ms * 1e3,
        t.event.max_ms * 1e3,
        t.span_us,
    );
    let head = [
        "#",
        "module",
        "blocks",
        "resident (us)",
        "release (us)",
        "last wait left",
        "mark 0",
        "mark 1",
        "mean return",
        "last return",
        "last start",
        "p90 return",
        "first SM done",
    ];
    let rows = t.kernels.iter().map(|k| {
        vec![
            k.index.to_string(),
            k.module.clone(),
            k.blocks.to_string(),
            us(k.resident_us),
            us(k.release_us),
            us(k.last_wait_us),
            us(k.marks_us[0]),
            us(k.marks_us[1]),
            us(k.mean_done_us),
            us(k.last_done_us),
            us(k.last_start_us),
            us(k.p90_done_us),
            us(k.first_sm_done_us),
        ]
    });
    let group_head = ["module", "blocks", "kernels", "release (us)", "last return (us)", "link (us)"];
    let group_rows = t.groups.iter().map(|g| {
        vec![
            g.module.clone(),
            g.blocks.to_string(),
            g.kernels.to_string(),
            us(g.release_us),
            us(g.last_done_us),
            us(g.link_us),
        ]
    });
    if format == Format::Csv {
        let text = |h: &[&str]| h.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        return crate::report::csv_text(std::iter::once(text(&head)).chain(rows))
            + &crate::report::csv_text(std::iter::once(text(&group_head)).chain(group_rows));
    }
    format!(
        "{caption}\n\n{}\n\nBy module and grid (means over the kernels of each):\n\n{}\n\n",
        crate::report::text_table(format, head, rows),
        crate::report::text_table(format, group_head, group_rows)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(blocks: u64, wait_left: u64, done: u64) -> BlockRecord {
        BlockRecord {
            start: wait_left - 500,
            wait_entered: wait_left - 400,
            wait_left,
            marks: [0, wait_left + 100],
            done,
            blocks,
            sm: done / 100 % 2,
        }
    }

    #[test]
    fn records_cut_into_launches_and_sort_into_a_chain() {
        // Module a: a launch of 2 blocks, then one of 3 (a later link of the chain); module b: one of 1.
        let a = vec![
            rec(2, 1_000, 2_000),
            rec(2, 1_100, 2_500),
            rec(3, 5_000, 6_000),
            rec(3, 5_000, 6_300),
            rec(3, 5_200, 6_100),
        ];
        let b = vec![rec(1, 3_000, 4_000)];
        let c = chain(&[("a".into(), a.clone()), ("b".into(), b)]).unwrap();
        assert_eq!(c.iter().map(|l| (l.module.as_str(), l.blocks)).collect::<Vec<_>>(), [("a", 2), ("b", 1), ("a", 3)]);
        assert_eq!((c[0].first_wait_left, c[0].last_wait_left, c[0].last_done), (1_000, 1_100, 2_500));
        assert!((c[0].mean_done - 1_250.0).abs() < 1e-9);
        assert_eq!(c[0].marks[0], None);
        assert!((c[0].marks[1].unwrap() - 150.0).abs() < 1e-9);
        // The tail: a's second launch's last start (5_200 - 500 after 5_000), its 90th-percentile
        // return (the second of three, sorted: 1_000, 1_100, 1_300) and its first SM done (SM 0's one
        // block returned at 6_000; SM 1's at 6_100 and 6_300).
        assert!((c[2].last_start + 300.0).abs() < 1e-9);
        assert!((c[2].p90_done - 1_100.0).abs() < 1e-9);
        assert!((c[2].first_sm_done - 1_000.0).abs() < 1e-9);
        let k = kernels(&[c.clone(), c]).unwrap();
        // b left its wait 0.5 us after a's last return, and had started 1.0 us before it.
        assert!((k[1].release_us - 0.5).abs() < 1e-9 && (k[1].resident_us - 0.0).abs() < 1e-9);
        assert!((k[2].release_us - 1.0).abs() < 1e-9 && (k[2].last_done_us - 1.3).abs() < 1e-9);
        assert!(k[0].release_us.is_nan());
        let g = groups(&k);
        assert_eq!(g.iter().map(|g| (g.blocks, g.kernels)).collect::<Vec<_>>(), [(2, 1), (1, 1), (3, 1)]);
        // A launch whose records disagree on its size, or a record that never left its wait, is an error.
        let mut broken = a;
        broken[1].blocks = 3;
        assert!(matches!(launches("a", &broken), Err(Error::Verification(_))));
        assert!(matches!(launches("a", &[rec(2, 1_000, 2_000)]), Err(Error::Verification(_))));
    }
}
