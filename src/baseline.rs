//! Saved runs to compare against, and the spread of a run against itself.
//!
//! `ladder run --save-baseline NAME` stores each table's JSON under the cache directory, keyed by
//! device (`baselines/<device uuid>/<NAME>/<family>-<op>-<shape>.json`); `--baseline NAME` sets each
//! new table beside the saved one of the same op and shape ([`crate::compare`]); `--repeat N` times
//! every stage N times in one process and reports, per row, the largest relative difference of a
//! later median from the first: the run-to-run spread that says which moves are noise.

use std::path::{Path, PathBuf};

use common::runner::{Status, Table};
use common::{Error, Result};

/// `family-op-shape` with the shape's `,` and `=` made file-name safe: the stem of a table's files.
pub fn table_stem(table: &Table) -> String {
    format!("{}-{}-{}", table.family, table.op, table.shape.replace([',', '='], "_"))
}

/// The directory of baseline `name` on the device `uuid`.
pub fn dir(uuid: &str, name: &str) -> Result<PathBuf> {
    let ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    common::require(ok, "a baseline name of letters, digits, '-', '_' and '.'", || format!("'{name}'"))?;
    let base = common::nvrtc::cache_dir()
        .ok_or_else(|| Error::constraint("a cache directory (LADDER_CACHE_DIR or HOME)", "none"))?;
    Ok(base.join("baselines").join(uuid).join(name))
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { context, source }
}

/// Writes `table` into the baseline directory `dir`.
pub fn save(dir: &Path, table: &Table) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let path = dir.join(format!("{}.json", table_stem(table)));
    let json = serde_json::to_string_pretty(table)
        .map_err(|e| Error::Io { context: "serializing a table".into(), source: std::io::Error::other(e) })?;
    std::fs::write(&path, json).map_err(io(format!("writing {}", path.display())))?;
    Ok(path)
}

/// A table saved as JSON (`ladder run --out`, a baseline).
pub fn read_table(path: &Path) -> Result<Table> {
    let bytes = std::fs::read(path).map_err(io(format!("reading {}", path.display())))?;
    serde_json::from_slice(&bytes).map_err(|e| Error::Io {
        context: format!("parsing {} as a ladder table", path.display()),
        source: std::io::Error::other(e),
    })
}

/// The saved table of the same op and shape as `table` in `dir`, if there is one.
pub fn load(dir: &Path, table: &Table) -> Result<Option<Table>> {
    let path = dir.join(format!("{}.json", table_stem(table)));
    if !path.exists() {
        return Ok(None);
    }
    read_table(&path).map(Some)
}

/// One row's spread over repeated runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Spread {
    pub stage: u32,
    pub name: String,
    /// Each run's median, the first run first.
    pub medians_ms: Vec<f64>,
    /// The largest |median / first median − 1| over the later runs.
    pub spread: f64,
}

/// Per passing row of `runs[0]`, its medians in every run and the largest relative difference from
/// the first (rows that did not pass in every run are left out).
pub fn spread(runs: &[Table]) -> Vec<Spread> {
    let Some(first) = runs.first() else { return Vec::new() };
    first
        .rows
        .iter()
        .filter_map(|row| {
            let medians: Option<Vec<f64>> = runs
                .iter()
                .map(|t| {
                    t.rows
                        .iter()
                        .find(|r| r.stage == row.stage && r.name == row.name && r.status == Status::Passed)
                        .and_then(|r| r.timing)
                        .map(|t| t.median_ms)
                })
                .collect();
            let medians = medians?;
            let spread = medians[1..].iter().map(|m| (m / medians[0] - 1.0).abs()).fold(0.0, f64::max);
            Some(Spread { stage: row.stage, name: row.name.clone(), medians_ms: medians, spread })
        })
        .collect()
}

/// The spread as Markdown, rows past `limit` (a fraction) marked.
pub fn spread_markdown(table: &Table, rows: &[Spread], limit: f64) -> String {
    let mut md = format!(
        "\nRepeat spread of {}/{} {} ({} runs in one process; rows past ±{:.0}% marked):\n\n| stage | name | medians | spread |\n|---|---|---|---|\n",
        table.family,
        table.op,
        table.shape,
        rows.first().map_or(0, |r| r.medians_ms.len()),
        limit * 100.0
    );
    for r in rows {
        let medians: Vec<String> = r.medians_ms.iter().map(|&m| common::report::fmt_time(m)).collect();
        let mark = if r.spread > limit { " **past**" } else { "" };
        md.push_str(&format!(
            "| {:02} | {} | {} | {:.1}%{mark} |\n",
            r.stage,
            r.name,
            medians.join(", "),
            r.spread * 100.0
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::runner::Row;
    use common::timing::Timing;

    fn table(medians: &[(u32, &str, Option<f64>)]) -> Table {
        let json = serde_json::json!({
            "family": "f", "op": "o", "shape": "N=3,K=4", "device": "d", "seed": 1, "graph": false,
            "workload": {"bytes": 1, "flops": 1, "bound": "Memory"},
            "ceilings": {"device": "d", "uuid": "u", "copy_gbps": 1.0, "copy_bytes": 1, "gemm_size": 1,
                         "fp32_tflops": 1.0, "tf32_tflops": 1.0, "bf16_tflops": 1.0, "fp16_tflops": 1.0},
            "rows": [], "anchors": []
        });
        let mut t: Table = serde_json::from_value(json).unwrap();
        t.rows = medians
            .iter()
            .map(|&(stage, name, m)| {
                let status = if m.is_some() { Status::Passed } else { Status::Failed("x".into()) };
                let timing = m.map(|m| Timing { median_ms: m, min_ms: m, max_ms: m, reps: 1, last_copy: 0 });
                Row::for_tests(stage, name, status, timing)
            })
            .collect();
        t
    }

    #[test]
    fn spread_is_the_largest_move_from_the_first_run() {
        let runs = [
            table(&[(0, "a", Some(1.0)), (1, "b", Some(2.0)), (2, "c", None)]),
            table(&[(0, "a", Some(1.02)), (1, "b", Some(1.9)), (2, "c", Some(1.0))]),
            table(&[(0, "a", Some(0.97)), (1, "b", Some(2.0)), (2, "c", Some(1.0))]),
        ];
        let s = spread(&runs);
        assert_eq!(s.len(), 2, "a row that failed in a run is left out");
        assert!((s[0].spread - 0.03).abs() < 1e-12 && (s[1].spread - 0.05).abs() < 1e-12, "{s:?}");
        let md = spread_markdown(&runs[0], &s, 0.04);
        assert!(md.contains("5.0% **past**") && md.contains("3.0% |"), "{md}");
        assert_eq!(table_stem(&runs[0]), "f-o-N_3_K_4");
    }

    #[test]
    fn baselines_round_trip_and_names_are_checked() {
        let root = std::env::temp_dir().join(format!("ladder-baseline-test-{}", std::process::id()));
        let t = table(&[(0, "a", Some(1.0))]);
        let path = save(&root, &t).unwrap();
        assert!(path.ends_with("f-o-N_3_K_4.json"));
        assert_eq!(load(&root, &t).unwrap().unwrap().rows.len(), 1);
        let other = Table { shape: "N=5".into(), ..t };
        assert!(load(&root, &other).unwrap().is_none());
        std::fs::remove_dir_all(&root).unwrap();
        assert!(dir("uuid", "../x").is_err() && dir("uuid", "").is_err());
    }
}
