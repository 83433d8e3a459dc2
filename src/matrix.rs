//! The stage × shape matrix of saved tables (`ladder matrix`): one line per shape, each stage's
//! rate (TFLOP/s at a compute-bound shape, GB/s otherwise) from the table as it was run, the
//! fastest stage (library rows aside) and its ratio to a library row of the same table. This is the
//! summary a family's notes give for a whole ladder; reading it off the saved tables keeps it from
//! being copied by hand.

use common::family::Bound;
use common::report::{fmt_time, Format};
use common::runner::{Row, Status, Table};
use common::variant::LIBRARY_STAGES;

/// The stages' rates at one shape.
struct Line<'a> {
    table: &'a Table,
    /// Per column: the row of that stage in this table, if it ran there.
    rows: Vec<Option<&'a Row>>,
    /// The fastest passed stage below the library rows.
    best: Option<&'a Row>,
    /// The library row the ratio is taken against.
    anchor: Option<&'a Row>,
}

fn time_ms(row: &Row) -> Option<f64> {
    (row.status == Status::Passed).then_some(row.timing.map(|t| t.median_ms)).flatten()
}

fn rate(table: &Table, row: &Row) -> Option<f64> {
    time_ms(row)?;
    match table.workload.bound {
        Bound::Compute(_) => row.tflops,
        Bound::Memory | Bound::HostLink => row.gbps,
    }
}

fn unit(table: &Table) -> &'static str {
    match table.workload.bound {
        Bound::Compute(_) => "TFLOP/s",
        Bound::Memory | Bound::HostLink => "GB/s",
    }
}

/// The stages of one op's tables, in stage order: every row that is a stage of its own (not a
/// leave-one-out or sweep row, which name the row they are compared with).
fn columns(tables: &[&Table]) -> Vec<(u32, String)> {
    let mut cols: Vec<(u32, String)> = Vec::new();
    for row in tables.iter().flat_map(|t| &t.rows).filter(|r| r.compared_with.is_none()) {
        if !cols.iter().any(|(s, n)| *s == row.stage && *n == row.name) {
            cols.push((row.stage, row.name.clone()));
        }
    }
    cols.sort();
    cols
}

fn line<'a>(table: &'a Table, cols: &[(u32, String)], anchor: Option<u32>) -> Line<'a> {
    let rows: Vec<Option<&Row>> = cols
        .iter()
        .map(|(s, n)| table.rows.iter().find(|r| r.compared_with.is_none() && r.stage == *s && r.name == *n))
        .collect();
    let faster = |a: &&Row, b: &&Row| time_ms(a).partial_cmp(&time_ms(b)).unwrap_or(std::cmp::Ordering::Equal);
    let passed = || rows.iter().flatten().copied().filter(|r| time_ms(r).is_some());
    let best = passed().filter(|r| r.stage < LIBRARY_STAGES).min_by(faster);
    let anchor = match anchor {
        Some(stage) => passed().find(|r| r.stage == stage),
        None => passed().filter(|r| r.stage >= LIBRARY_STAGES).min_by_key(|r| r.stage),
    };
    Line { table, rows, best, anchor }
}

fn cell(line: &Line, row: Option<&Row>, markdown: bool) -> String {
    let Some(row) = row else { return "–".into() };
    match (&row.status, rate(line.table, row)) {
        (Status::Skipped(_), _) => "n/a".into(),
        (Status::Failed(_), _) => "FAIL".into(),
        (Status::Passed, Some(v)) => {
            let v = if v >= 100.0 { format!("{v:.0}") } else { format!("{v:.1}") };
            let best = line.best.is_some_and(|b| std::ptr::eq(b, row));
            match (best, markdown) {
                (true, true) => format!("**{v}**"),
                (true, false) => format!("{v}*"),
                (false, _) => v,
            }
        }
        (Status::Passed, None) => "-".into(),
    }
}

fn summary_cells(line: &Line) -> [String; 3] {
    let best = line.best.and_then(|b| Some(format!("{:02}: {}", b.stage, fmt_time(time_ms(b)?))));
    let ratio = match (line.best.and_then(time_ms), line.anchor) {
        (Some(best), Some(a)) => time_ms(a).map(|ms| format!("{:.2}x vs {:02}", ms / best, a.stage)),
        _ => None,
    };
    [unit(line.table).to_string(), best.unwrap_or_else(|| "-".into()), ratio.unwrap_or_else(|| "-".into())]
}

/// How a table's times were taken: `each run between its own events`, `CUDA-graph replays` or
/// `N runs back to back per pair of events`, and `, N interleaved rounds` past one.
pub fn mode(t: &Table) -> String {
    let mode = match (t.graph, t.batch > 1) {
        (false, false) => "each run between its own events".to_string(),
        (true, false) => "CUDA-graph replays".to_string(),
        (graph, true) => {
            format!("{}{} runs back to back per pair of events", if graph { "graph replays, " } else { "" }, t.batch)
        }
    };
    let rounds = if t.rounds > 1 { format!(", {} interleaved rounds", t.rounds) } else { String::new() };
    format!("{mode}{rounds}")
}

/// The caption of one op's matrix: the op, the device and how its times were taken.
fn caption(t: &Table) -> String {
    format!("{}/{} on {} ({})", t.family, t.op, t.device, mode(t))
}

/// The matrices of `tables`: one per op and timing mode, in the order the tables come, each line a
/// shape. `anchor` picks the library row the ratio is taken against (default: the table's lowest
/// passed library row). `Format::Json` is not a matrix format; it renders as `Format::Table`.
pub fn render(tables: &[Table], format: Format, anchor: Option<u32>) -> String {
    let mut groups: Vec<Vec<&Table>> = Vec::new();
    for t in tables {
        let same = |g: &Vec<&Table>| {
            let h = g[0];
            h.family == t.family
                && h.op == t.op
                && h.graph == t.graph
                && h.batch == t.batch
                && h.rounds == t.rounds
                && h.device == t.device
        };
        match groups.iter_mut().find(|g| same(g)) {
            Some(g) => g.push(t),
            None => groups.push(vec![t]),
        }
    }
    let mut out = String::new();
    for group in groups {
        let cols = columns(&group);
        let lines: Vec<Line> = group.iter().map(|t| line(t, &cols, anchor)).collect();
        let markdown = format == Format::Markdown;
        let head: Vec<String> = ["shape".to_string()]
            .into_iter()
            .chain(cols.iter().map(|(s, _)| format!("{s:02}")))
            .chain(["unit", "best (time)", "ratio"].map(String::from))
            .collect();
        let body: Vec<Vec<String>> = lines
            .iter()
            .map(|l| {
                [l.table.shape.clone()]
                    .into_iter()
                    .chain(l.rows.iter().map(|r| cell(l, *r, markdown)))
                    .chain(summary_cells(l))
                    .collect()
            })
            .collect();
        match format {
            Format::Csv => {
                let names = cols.iter().map(|(s, n)| format!("{s:02}-{n}"));
                let head = ["family", "op", "mode", "shape"].map(String::from).into_iter().chain(names);
                let head: Vec<String> = head.chain(["unit", "best", "ratio"].map(String::from)).collect();
                let rows = lines.iter().zip(body).map(|(l, row)| {
                    let t = l.table;
                    [t.family.clone(), t.op.clone(), caption(t)].into_iter().chain(row).collect::<Vec<String>>()
                });
                out.push_str(&common::report::csv_text(std::iter::once(head).chain(rows)));
            }
            Format::Markdown => {
                out.push_str(&format!("{}\n\n", caption(group[0])));
                out.push_str(&format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len())));
                for row in body {
                    out.push_str(&format!("| {} |\n", row.join(" | ")));
                }
                out.push('\n');
            }
            Format::Table | Format::Json => {
                let mut widths: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
                for row in &body {
                    for (w, c) in widths.iter_mut().zip(row) {
                        *w = (*w).max(c.chars().count());
                    }
                }
                let text = |cells: &[String]| {
                    let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
                    padded.join("  ").trim_end().to_string() + "\n"
                };
                out.push_str(&format!("{}  (* the fastest stage)\n", caption(group[0])));
                out.push_str(&text(&head));
                for row in &body {
                    out.push_str(&text(row));
                }
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::ceilings::Ceilings;
    use common::family::Workload;
    use common::timing::Timing;
    use common::variant::Precision;

    fn table(shape: &str, rows: &[(u32, &str, Option<f64>)]) -> Table {
        let rows = rows
            .iter()
            .map(|&(stage, name, ms)| {
                let timing = ms.map(|m| Timing { median_ms: m, min_ms: m, max_ms: m, reps: 3, last_copy: 0 });
                let status = if ms.is_some() { Status::Passed } else { Status::Skipped("shape".into()) };
                let mut row = Row::for_tests(stage, name, status, timing);
                row.tflops = ms.map(|m| 1.0 / m);
                row
            })
            .collect();
        Table {
            family: "f".into(),
            op: "op".into(),
            shape: shape.into(),
            device: "gpu".into(),
            seed: 1,
            graph: false,
            batch: 1,
            rounds: 1,
            workload: Workload { bytes: 1, flops: 1_000_000_000, bound: Bound::Compute(Precision::Bf16) },
            ceilings: Ceilings::for_tests(1000.0),
            rows,
            anchors: Vec::new(),
        }
    }

    #[test]
    fn best_stage_and_ratio_to_the_library_row() {
        let tables = [
            table("N=1", &[(1, "a", Some(0.002)), (2, "b", Some(0.001)), (90, "lib", Some(0.0015))]),
            // A stage the other table lacks, a stage not applicable here, a second library row.
            table("N=2", &[(1, "a", Some(0.004)), (2, "b", None), (3, "c", Some(0.003)), (90, "lib", Some(0.006))]),
        ];
        let text = render(&tables, Format::Table, None);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("f/op on gpu (each run between its own events)"), "{text}");
        assert!(lines[1].split_whitespace().eq(["shape", "01", "02", "03", "90", "unit", "best", "(time)", "ratio"]));
        // 1 / ms TFLOP/s: 500, 1000* (the best), absent, 667; best stage 2 at 1 µs, 1.50x faster than stage 90.
        assert!(lines[2]
            .split_whitespace()
            .eq(["N=1", "500", "1000*", "–", "667", "TFLOP/s", "02:", "1.00", "us", "1.50x", "vs", "90"]));
        assert!(lines[3]
            .split_whitespace()
            .eq(["N=2", "250", "n/a", "333*", "167", "TFLOP/s", "03:", "3.00", "us", "2.00x", "vs", "90"]));
        let md = render(&tables, Format::Markdown, None);
        assert!(md.contains("| N=1 | 500 | **1000** | – | 667 | TFLOP/s | 02: 1.00 us | 1.50x vs 90 |"), "{md}");
    }

    #[test]
    fn an_anchor_that_did_not_run_gives_no_ratio_and_modes_split_groups() {
        let a = table("N=1", &[(1, "a", Some(0.002)), (90, "lib", Some(0.001))]);
        let mut b = a.clone();
        b.batch = 20;
        let mut c = a.clone();
        c.rounds = 5;
        let text = render(&[a, b, c], Format::Table, Some(91));
        assert_eq!(text.matches("f/op on gpu").count(), 3, "{text}");
        assert!(text.contains("20 runs back to back per pair of events"), "{text}");
        assert!(text.contains("(each run between its own events, 5 interleaved rounds)"), "{text}");
        assert!(text.lines().nth(2).unwrap().trim_end().ends_with('-'), "{text}");
    }

    #[test]
    fn csv_has_one_record_per_shape() {
        let t = table("N=1,K=2", &[(1, "a", Some(0.002)), (90, "lib", Some(0.001))]);
        let csv = render(&[t], Format::Csv, None);
        let mut r = csv::Reader::from_reader(csv.as_bytes());
        assert_eq!(r.headers().unwrap().iter().collect::<Vec<_>>()[3..6], ["shape", "01-a", "90-lib"]);
        let records: Vec<_> = r.records().map(|x| x.unwrap()).collect();
        assert_eq!(records.len(), 1);
        assert_eq!(&records[0][3], "N=1,K=2");
    }
}
