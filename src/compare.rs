//! Two runs of one table side by side: each stage's median before and after, the change, and
//! whether it moved by more than the runs' own spread (the new median outside the old run's
//! min–max and the old median outside the new run's). Rows are matched by stage number and name.

use common::report::fmt_time;
use common::runner::{Status, Table};
use common::{Error, Result};

/// One stage in both runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub stage: u32,
    pub name: String,
    pub before_ms: Option<f64>,
    pub after_ms: Option<f64>,
    /// after / before − 1.
    pub delta: Option<f64>,
    /// Moved by more than the two runs' min–max spread.
    pub moved: bool,
}

fn median_and_range(t: &Table, stage: u32, name: &str) -> Option<(f64, f64, f64)> {
    t.rows
        .iter()
        .find(|r| r.stage == stage && r.name == name && r.status == Status::Passed)
        .and_then(|r| r.timing)
        .map(|t| (t.median_ms, t.min_ms, t.max_ms))
}

/// How a table's runs were timed: as graph replays or not, and how many runs per pair of events
/// (`--back-to-back`). Two modes time different things (a stage launched as a programmatic
/// dependent, or cuBLASLt, starts under the previous run's tail only back to back), so runs in
/// different modes do not compare. The rounds (`--rounds`) only pool samples of the same quantity.
fn timing_mode(t: &Table) -> String {
    let mode = if t.graph { "graph replays" } else { "direct launches" };
    format!("{mode}, {} run(s) per pair of events", t.batch)
}

/// The stages of `after` (and any only `before` has) against `before`. Both must be the same op at
/// the same shape, timed in the same mode.
pub fn compare(before: &Table, after: &Table) -> Result<Vec<Change>> {
    let key = |t: &Table| (t.family.clone(), t.op.clone(), t.shape.clone());
    if key(before) != key(after) {
        return Err(Error::constraint(
            "two runs of one op at one shape",
            format!("{:?} against {:?}", key(before), key(after)),
        ));
    }
    if timing_mode(before) != timing_mode(after) {
        return Err(Error::constraint(
            "two runs timed in one mode (graph or not, runs per pair of events)",
            format!("{} against {}", timing_mode(before), timing_mode(after)),
        ));
    }
    let mut stages: Vec<(u32, String)> = after.rows.iter().map(|r| (r.stage, r.name.clone())).collect();
    for r in &before.rows {
        if !stages.iter().any(|(s, n)| *s == r.stage && *n == r.name) {
            stages.push((r.stage, r.name.clone()));
        }
    }
    // Stage order; a stable sort keeps derived rows (leave-one-out) after their stage as run.
    stages.sort_by_key(|(stage, _)| *stage);
    Ok(stages
        .into_iter()
        .map(|(stage, name)| {
            let b = median_and_range(before, stage, &name);
            let a = median_and_range(after, stage, &name);
            let (delta, moved) = match (b, a) {
                (Some((bm, blo, bhi)), Some((am, alo, ahi))) => {
                    (Some(am / bm - 1.0), (am < blo || am > bhi) && (bm < alo || bm > ahi))
                }
                _ => (None, false),
            };
            Change { stage, name, before_ms: b.map(|x| x.0), after_ms: a.map(|x| x.0), delta, moved }
        })
        .collect())
}

/// The comparison as Markdown, with a header naming both runs.
pub fn markdown(before: &Table, after: &Table, changes: &[Change]) -> String {
    let mut md = format!(
        "{}/{}  shape {}: before on {} (seed {}), after on {} (seed {}); {}, {} and {} round(s)\n\n\
         | stage | name | before | after | change | moved beyond both runs' min-max |\n|---|---|---|---|---|---|\n",
        after.family,
        after.op,
        after.shape,
        before.device,
        before.seed,
        after.device,
        after.seed,
        timing_mode(after),
        before.rounds,
        after.rounds
    );
    for c in changes {
        let t = |x: Option<f64>| x.map_or("-".to_string(), fmt_time);
        let delta = c.delta.map_or("-".to_string(), |d| format!("{:+.1}%", 100.0 * d));
        md.push_str(&format!(
            "| {:02} | {} | {} | {} | {delta} | {} |\n",
            c.stage,
            c.name,
            t(c.before_ms),
            t(c.after_ms),
            if c.moved { "yes" } else { "" }
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::runner::Row;
    use common::timing::Timing;

    fn row(stage: u32, median: f64, lo: f64, hi: f64, status: Status) -> Row {
        let timing = Timing { median_ms: median, min_ms: lo, max_ms: hi, reps: 3, last_copy: 0 };
        Row::for_tests(stage, format!("s{stage}"), status, Some(timing))
    }

    fn table(shape: &str, rows: Vec<Row>) -> Table {
        let json = serde_json::json!({
            "family": "f", "op": "o", "shape": shape, "device": "d", "seed": 1, "graph": false,
            "workload": {"bytes": 1, "flops": 1, "bound": "Memory"},
            "ceilings": {"device": "d", "uuid": "u", "copy_gbps": 1.0, "copy_bytes": 1, "gemm_size": 1,
                         "fp32_tflops": 1.0, "tf32_tflops": 1.0, "bf16_tflops": 1.0, "fp16_tflops": 1.0},
            "rows": [], "anchors": []
        });
        let mut t: Table = serde_json::from_value(json).unwrap();
        t.rows = rows;
        t
    }

    #[test]
    fn a_change_inside_either_runs_spread_is_not_a_move() {
        let before = table("N=1", vec![row(0, 10.0, 9.5, 10.5, Status::Passed), row(1, 5.0, 4.9, 5.1, Status::Passed)]);
        let after = table(
            "N=1",
            vec![
                row(0, 10.3, 9.8, 10.9, Status::Passed),
                row(1, 4.0, 3.9, 4.1, Status::Passed),
                row(2, 1.0, 1.0, 1.0, Status::Passed),
            ],
        );
        let c = compare(&before, &after).unwrap();
        assert_eq!(c.len(), 3);
        assert!(!c[0].moved && (c[0].delta.unwrap() - 0.03).abs() < 1e-12);
        assert!(c[1].moved && (c[1].delta.unwrap() + 0.2).abs() < 1e-12);
        assert_eq!((c[2].before_ms, c[2].delta, c[2].moved), (None, None, false), "a new stage has no change");
        let md = markdown(&before, &after, &c);
        assert!(md.contains("| 01 | s1 | 5.000 ms | 4.000 ms | -20.0% | yes |"), "{md}");
    }

    #[test]
    fn failed_rows_and_other_shapes_do_not_compare() {
        let before = table("N=1", vec![row(0, 10.0, 9.0, 11.0, Status::Failed("NaN".into()))]);
        let after = table("N=1", vec![row(0, 1.0, 1.0, 1.0, Status::Passed)]);
        assert_eq!(compare(&before, &after).unwrap()[0].delta, None);
        assert!(compare(&before, &table("N=2", vec![])).is_err());
    }

    #[test]
    fn runs_in_other_timing_modes_do_not_compare() {
        let before = table("N=1", vec![row(0, 10.0, 9.0, 11.0, Status::Passed)]);
        let mut graph = before.clone();
        graph.graph = true;
        let mut back_to_back = before.clone();
        back_to_back.batch = 20;
        for other in [&graph, &back_to_back] {
            let err = compare(&before, other).unwrap_err().to_string();
            assert!(err.contains("one mode"), "{err}");
        }
        let mut rounds = before.clone();
        rounds.rounds = 5;
        assert!(compare(&before, &rounds).is_ok(), "rounds pool samples of the same quantity");
    }
}
