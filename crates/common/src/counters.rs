//! Hardware counters of one stage from Nsight Compute (`ladder run --counters`, `ladder profile`).
//!
//! The stage is run in a child process, `ladder verify ... --name STAGE --profiled`, under `ncu
//! --profile-from-start off`: the child opens the profiler (`cuProfilerStart`) around the stage's
//! own launches only, so input generation, the poison fill and other stages are never profiled, and
//! a library row's kernels (cuBLAS picks their names) are caught without knowing them. One launch is
//! enough: counters are per kernel, and ncu replays each kernel as many times as its metrics need.
//! Clocks are left alone (`--clock-control none`), as the timing tables run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The warp-stall reasons Nsight Compute reports, as in its metric names
/// (`smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`: warps stalled for that
/// reason per issued instruction). `selected` is not a stall (the warp issued) and is left out.
pub const STALL_REASONS: [&str; 18] = [
    "barrier",
    "branch_resolving",
    "dispatch_stall",
    "drain",
    "gmma",
    "imc_miss",
    "lg_throttle",
    "long_scoreboard",
    "math_pipe_throttle",
    "membar",
    "mio_throttle",
    "misc",
    "no_instruction",
    "not_selected",
    "short_scoreboard",
    "sleeping",
    "tex_throttle",
    "wait",
];

const DURATION: &str = "gpu__time_duration.sum";
const DRAM: &str = "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed";
const SM: &str = "sm__throughput.avg.pct_of_peak_sustained_elapsed";
const TENSOR: &str = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active";
const OCCUPANCY: &str = "sm__warps_active.avg.pct_of_peak_sustained_active";
const L2_HIT: &str = "lts__t_sector_hit_rate.pct";
/// L2 throughput (the busiest L2 sub-unit), % of peak: the tile loads' ceiling in a GEMM whose
/// operands stay in L2.
const L2: &str = "lts__throughput.avg.pct_of_peak_sustained_elapsed";
/// Kept in the JSON beside the summary: the bytes behind the DRAM figure and the issue rate.
const EXTRA: [&str; 4] = [
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "sm__inst_executed.sum",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
];

fn stall_metric(reason: &str) -> String {
    format!("smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio")
}

/// Every metric `--counters` asks for.
pub fn metrics() -> Vec<String> {
    [DURATION, DRAM, SM, TENSOR, OCCUPANCY, L2_HIT, L2]
        .into_iter()
        .chain(EXTRA)
        .map(String::from)
        .chain(STALL_REASONS.iter().map(|r| stall_metric(r)))
        .collect()
}

/// One kernel launch's metrics, as Nsight Compute printed them (base units: ns, bytes, %).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct KernelCounters {
    pub name: String,
    pub metrics: BTreeMap<String, f64>,
}

impl KernelCounters {
    fn get(&self, metric: &str) -> Option<f64> {
        self.metrics.get(metric).copied()
    }
}

/// A stage's counters: each figure is the duration-weighted mean over its kernels (a library row or
/// a stage with a conversion pass runs several), and the full set per kernel.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Counters {
    pub duration_ns: f64,
    /// DRAM throughput, % of peak.
    pub dram_pct: Option<f64>,
    /// SM throughput (the busiest SM sub-unit), % of peak.
    pub sm_pct: Option<f64>,
    /// Tensor pipe active cycles, % of peak while the SMs were active.
    pub tensor_pct: Option<f64>,
    /// Achieved occupancy: active warps, % of the SM's maximum.
    pub occupancy_pct: Option<f64>,
    pub l2_hit_pct: Option<f64>,
    /// L2 throughput, % of peak.
    #[serde(default)]
    pub l2_pct: Option<f64>,
    /// The two largest stall reasons: (reason, warps stalled per issued instruction).
    pub top_stalls: Vec<(String, f64)>,
    pub kernels: Vec<KernelCounters>,
}

impl Counters {
    /// The summary of `kernels` (none: an error, the profiled range caught no launch).
    pub fn summarize(kernels: Vec<KernelCounters>) -> Result<Counters> {
        if kernels.is_empty() {
            return Err(Error::constraint("ncu profiled at least one kernel of the stage", "no kernel in the range"));
        }
        let weight = |k: &KernelCounters| k.get(DURATION).unwrap_or(0.0);
        let total: f64 = kernels.iter().map(weight).sum();
        let mean = |metric: &str| -> Option<f64> {
            let parts: Vec<(f64, f64)> = kernels.iter().filter_map(|k| Some((weight(k), k.get(metric)?))).collect();
            if parts.is_empty() {
                return None;
            }
            let w: f64 = parts.iter().map(|p| p.0).sum();
            Some(if w > 0.0 {
                parts.iter().map(|(w, v)| w * v).sum::<f64>() / w
            } else {
                parts.iter().map(|p| p.1).sum::<f64>() / parts.len() as f64
            })
        };
        let mut stalls: Vec<(String, f64)> =
            STALL_REASONS.iter().filter_map(|r| Some((r.to_string(), mean(&stall_metric(r))?))).collect();
        stalls.sort_by(|a, b| b.1.total_cmp(&a.1));
        stalls.truncate(2);
        Ok(Counters {
            duration_ns: total,
            dram_pct: mean(DRAM),
            sm_pct: mean(SM),
            tensor_pct: mean(TENSOR),
            occupancy_pct: mean(OCCUPANCY),
            l2_hit_pct: mean(L2_HIT),
            l2_pct: mean(L2),
            top_stalls: stalls,
            kernels,
        })
    }

    /// One line: `DRAM 91% SM 23% tensor 0% occ 87% L2 hit 49% stalls long_scoreboard 12.1, wait 2.0`.
    pub fn line(&self) -> String {
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}%"));
        let stalls: Vec<String> = self.top_stalls.iter().map(|(r, v)| format!("{r} {v:.1}")).collect();
        format!(
            "DRAM {}  SM {}  tensor {}  occupancy {}  L2 {} (hit {})  stalls: {}  ({} kernel{}, {:.1} us profiled)",
            pct(self.dram_pct),
            pct(self.sm_pct),
            pct(self.tensor_pct),
            pct(self.occupancy_pct),
            pct(self.l2_pct),
            pct(self.l2_hit_pct),
            if stalls.is_empty() { "-".to_string() } else { stalls.join(", ") },
            self.kernels.len(),
            if self.kernels.len() == 1 { "" } else { "s" },
            self.duration_ns / 1e3
        )
    }
}

/// Nsight Compute's command line tool: `$LADDER_NCU`, `ncu` on `$PATH`, or `bin/ncu` under the
/// CUDA roots the toolchain searches (`$CUDA_HOME`, `/usr/local/cuda`, ...); a clear error when
/// none exists.
pub fn ncu() -> Result<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("LADDER_NCU") {
        candidates.push(p.into());
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("ncu")));
    }
    candidates.extend(crate::nvrtc::cuda_roots().into_iter().map(|root| root.join("bin").join("ncu")));
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        Error::constraint(
            "Nsight Compute's ncu on $PATH, in $CUDA_HOME/bin or at $LADDER_NCU",
            "not found (install Nsight Compute, or run on the GPU machine where it is)",
        )
    })
}

/// The arguments of the child `ladder verify` that runs one stage with the profiler open.
pub fn verify_args(family: &str, op: &str, shape: &str, name: &str, config: &[(String, u32)]) -> Vec<String> {
    let mut args: Vec<String> =
        ["verify", family, "--op", op, "--shape", shape, "--name", name, "--profiled"].map(String::from).into();
    if !config.is_empty() {
        let pairs: Vec<String> = config.iter().map(|(n, v)| format!("{n}={v}")).collect();
        args.push("--config".into());
        args.push(pairs.join(","));
    }
    args
}

fn ncu_base(ncu: &Path) -> Command {
    let mut c = Command::new(ncu);
    c.args(["--clock-control", "none", "--target-processes", "all", "--profile-from-start", "off"]);
    c
}

fn run_child(mut cmd: Command, what: &str) -> Result<String> {
    let out = cmd.output().map_err(|source| Error::Io { context: format!("starting {what}"), source })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        let tail: Vec<&str> = stdout.lines().chain(stderr.lines()).filter(|l| !l.trim().is_empty()).collect();
        let tail = tail[tail.len().saturating_sub(6)..].join(" | ");
        return Err(Error::constraint(format!("{what} exits with success"), format!("{}: {tail}", out.status)));
    }
    Ok(stdout)
}

/// Runs `exe verify_args` under ncu and returns the stage's counters.
pub fn collect(exe: &Path, verify_args: &[String]) -> Result<Counters> {
    let ncu = ncu()?;
    let log = std::env::temp_dir().join(format!("ladder-ncu-{}-{}.csv", std::process::id(), crate::data::fresh_seed()));
    let mut cmd = ncu_base(&ncu);
    cmd.args(["--csv", "--page", "raw", "--print-units", "base", "--metrics", &metrics().join(",")])
        .arg("--log-file")
        .arg(&log)
        .arg(exe)
        .args(verify_args);
    let result = run_child(cmd, "ncu").and_then(|_| {
        let text = std::fs::read_to_string(&log)
            .map_err(|source| Error::Io { context: format!("reading {}", log.display()), source })?;
        Counters::summarize(parse_csv(&text)?)
    });
    let _ = std::fs::remove_file(&log);
    result
}

/// Runs `exe verify_args` under ncu with every section (`--set full`) into `report` (`.ncu-rep`).
pub fn profile(exe: &Path, verify_args: &[String], report: &Path) -> Result<()> {
    let ncu = ncu()?;
    let mut cmd = ncu_base(&ncu);
    cmd.args(["--set", "full", "--import-source", "no", "--force-overwrite", "--export"])
        .arg(report)
        .arg(exe)
        .args(verify_args);
    run_child(cmd, "ncu").map(|_| ())
}

/// The kernels of ncu's `--csv --page raw` output: a header record of metric names, a units record,
/// then one record per launch. Lines that are not CSV records (`==PROF==` notes) are skipped;
/// non-numeric cells (names, `n/a`) are left out of the metrics, and so are the device attributes.
pub fn parse_csv(text: &str) -> Result<Vec<KernelCounters>> {
    let records: String = text.lines().filter(|l| l.starts_with('"')).map(|l| format!("{l}\n")).collect();
    let mut reader = csv::ReaderBuilder::new().has_headers(true).flexible(true).from_reader(records.as_bytes());
    let bad = |e: csv::Error| Error::Io { context: "parsing ncu's CSV".into(), source: std::io::Error::other(e) };
    let header = reader.headers().map_err(bad)?.clone();
    let name_col = header.iter().position(|h| h == "Kernel Name").ok_or_else(|| {
        Error::constraint("ncu CSV with a \"Kernel Name\" column", format!("{} columns", header.len()))
    })?;
    let mut kernels = Vec::new();
    for record in reader.records() {
        let record = record.map_err(bad)?;
        let name = record.get(name_col).unwrap_or_default();
        // The units record has no kernel name.
        if name.is_empty() {
            continue;
        }
        let metrics = header
            .iter()
            .zip(record.iter())
            .filter(|(h, _)| h.contains("__") && !h.starts_with("device__"))
            .filter_map(|(h, v)| Some((h.to_string(), v.replace(',', "").parse::<f64>().ok()?)))
            .collect();
        kernels.push(KernelCounters { name: name.to_string(), metrics });
    }
    Ok(kernels)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"==PROF== Connected to process 729
"ID","Process ID","Kernel Name","device__attribute_clock_rate","gpu__time_duration.sum","gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","lts__t_sector_hit_rate.pct"
"","","","khz","ns","%","inst","inst","inst","%"
"0","729","convert","1980000","1,000","90","10","1","0","50"
"1","729","gemm","1980000","3000","10","2","4","1","n/a"
==PROF== Disconnected from process 729
"#;

    #[test]
    fn parses_records_and_weights_by_duration() {
        let k = parse_csv(SAMPLE).unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(k[0].name, "convert");
        assert_eq!(k[0].get(DURATION), Some(1000.0), "thousands separators are read");
        assert!(k[0].get("device__attribute_clock_rate").is_none(), "device attributes are not kernel metrics");
        assert!(k[1].get(L2_HIT).is_none(), "n/a is left out");
        let c = Counters::summarize(k).unwrap();
        assert_eq!(c.duration_ns, 4000.0);
        assert_eq!(c.dram_pct, Some((1000.0 * 90.0 + 3000.0 * 10.0) / 4000.0));
        assert_eq!(c.l2_hit_pct, Some(50.0), "a metric one kernel lacks is averaged over the others");
        assert_eq!(c.top_stalls[0].0, "long_scoreboard");
        assert_eq!(c.top_stalls[1].0, "wait");
        assert!(c.line().contains("stalls: long_scoreboard 4.0, wait 3.2"), "{}", c.line());
    }

    #[test]
    fn no_kernel_is_an_error_and_metrics_name_every_stall() {
        assert!(Counters::summarize(Vec::new()).is_err());
        assert!(parse_csv("==PROF== nothing\n").is_err(), "no header record");
        let m = metrics();
        assert!(STALL_REASONS.iter().all(|r| m.contains(&stall_metric(r))));
        assert!(!m.iter().any(|x| x.contains("stalled_selected")));
    }

    #[test]
    fn verify_args_carry_the_configuration() {
        let a = verify_args("norm", "softmax", "rows=8,T=64", "online[SM_WARPS=2]", &[("SM_WARPS".into(), 2)]);
        assert_eq!(a.last().unwrap(), "SM_WARPS=2");
        assert!(a.contains(&"--profiled".to_string()));
    }
}
