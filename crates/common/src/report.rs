//! The ablation table as aligned text, Markdown, CSV or JSON.

use serde::{Deserialize, Serialize};

use crate::family::Bound;
use crate::runner::{Row, Status, Table};

/// How a table is printed (`--format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Aligned text.
    Table,
    /// Markdown, with the header lines and notes.
    Markdown,
    /// One CSV record per row (RFC 4180 quoting).
    Csv,
    /// The whole table, every field.
    Json,
}

pub const COLUMNS: [&str; 14] = [
    "stage",
    "name",
    "median (min-max)",
    "GB/s",
    "TFLOP/s",
    "% ceil",
    "x stage0",
    "x prev",
    "regs",
    "smem",
    "spill",
    "occ",
    "error",
    "status",
];

/// A time in ms, in µs below 1 ms.
pub fn fmt_time(ms: f64) -> String {
    if ms < 1.0 {
        format!("{:.2} us", ms * 1e3)
    } else if ms < 1e3 {
        format!("{ms:.3} ms")
    } else {
        format!("{:.3} s", ms * 1e-3)
    }
}

fn fmt_range(ms: f64, lo: f64, hi: f64) -> String {
    if ms < 1.0 {
        format!("{:.2} us ({:.2}-{:.2})", ms * 1e3, lo * 1e3, hi * 1e3)
    } else {
        format!("{ms:.3} ms ({lo:.3}-{hi:.3})")
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

fn cells(row: &Row) -> Vec<String> {
    let r = row.resources.as_ref();
    let status = match &row.status {
        Status::Passed => "ok".to_string(),
        Status::Failed(why) => format!("FAILED: {why}"),
        Status::Skipped(why) => format!("n/a: {why}"),
    };
    vec![
        format!("{:02}", row.stage),
        row.name.clone(),
        row.timing.map(|t| fmt_range(t.median_ms, t.min_ms, t.max_ms)).unwrap_or_else(|| "-".into()),
        opt(row.gbps, |v| format!("{v:.0}")),
        opt(row.tflops, |v| format!("{v:.2}")),
        opt(row.of_ceiling, |v| format!("{:.1}", v * 100.0)),
        opt(row.vs_stage0, |v| format!("{v:.2}")),
        opt(row.vs_previous, |v| format!("{v:.2}")),
        r.map(|r| r.registers.to_string()).unwrap_or_else(|| "-".into()),
        r.map(|r| r.shared_bytes.to_string()).unwrap_or_else(|| "-".into()),
        r.map(|r| r.local_bytes.to_string()).unwrap_or_else(|| "-".into()),
        r.map(|r| format!("{:.0}%", r.occupancy * 100.0)).unwrap_or_else(|| "-".into()),
        row.verification
            .as_ref()
            .and_then(|v| {
                v.worst().map(|w| if w.non_finite > 0 { "NaN".to_string() } else { format!("{:.1e}", w.rel_l2) })
            })
            .unwrap_or_else(|| "-".into()),
        status,
    ]
}

fn anchor_cells(table: &Table) -> Vec<Vec<String>> {
    table
        .anchors
        .iter()
        .map(|a| {
            let (gbps, tflops, frac) = table.rates(a.median_ms);
            let best = table.best().and_then(|b| b.timing).map(|t| a.median_ms / t.median_ms);
            vec![
                "anchor".into(),
                a.name.clone(),
                fmt_range(a.median_ms, a.min_ms, a.max_ms),
                format!("{gbps:.0}"),
                format!("{tflops:.2}"),
                format!("{:.1}", frac * 100.0),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                best.map(|b| format!("best stage is {b:.2}x this")).unwrap_or_else(|| "-".into()),
            ]
        })
        .collect()
}

fn ceiling_line(table: &Table) -> String {
    let c = &table.ceilings;
    match table.workload.bound {
        Bound::Memory => format!("memory-bound; ceiling {:.0} GB/s (device-to-device copy)", c.copy_gbps),
        Bound::HostLink => {
            format!("host-link-bound; ceiling {:.1} GB/s (host-to-device copy from pinned memory)", c.h2d_pinned_gbps)
        }
        Bound::Compute(p) => format!("compute-bound; ceiling {:.1} TFLOP/s (cuBLASLt {} GEMM)", c.tflops(p), p.label()),
    }
}

/// How the table's times were taken, for its header (nothing for the default).
fn timing_mode(table: &Table) -> String {
    let graph = if table.graph { "; times are CUDA-graph replays" } else { "" };
    let batch = if table.batch > 1 {
        format!("; runs back to back, {} per pair of events (times are the mean per run)", table.batch)
    } else {
        String::new()
    };
    let rounds = if table.rounds > 1 {
        format!("; stages timed in {} interleaved rounds, samples pooled", table.rounds)
    } else {
        String::new()
    };
    format!("{graph}{batch}{rounds}")
}

/// The header lines above the table.
pub fn header(table: &Table) -> Vec<String> {
    vec![
        format!(
            "{}/{}  shape {}  on {}  (seed {}{})",
            table.family,
            table.op,
            table.shape,
            table.device,
            table.seed,
            timing_mode(table)
        ),
        format!(
            "floor: {:.2} MB moved, {:.3} GFLOP; {}",
            table.workload.bytes as f64 / 1e6,
            table.workload.flops as f64 / 1e9,
            ceiling_line(table)
        ),
    ]
}

/// The verification notes, which say what the error column cannot (an approximation's distance from
/// the exact op, a quantization's own cost, how many rows were checked): each note once, after the
/// names of the rows that carry it.
pub fn note_lines(table: &Table) -> Vec<String> {
    let mut notes: Vec<(&str, Vec<&str>)> = Vec::new();
    for row in &table.rows {
        let Some(note) = row.verification.as_ref().and_then(|v| v.note.as_deref()) else { continue };
        match notes.iter_mut().find(|(n, _)| *n == note) {
            Some((_, names)) => names.push(&row.name),
            None => notes.push((note, vec![&row.name])),
        }
    }
    notes.into_iter().map(|(note, names)| format!("note ({}): {note}", names.join(", "))).collect()
}

/// `records` as CSV text (each record a row of fields; the csv crate quotes what needs it).
pub fn csv_text<R, F>(records: impl IntoIterator<Item = R>) -> String
where
    R: IntoIterator<Item = F>,
    F: AsRef<[u8]>,
{
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in records {
        // Writing into a Vec cannot fail.
        let _ = w.write_record(r);
    }
    String::from_utf8(w.into_inner().unwrap_or_default()).unwrap_or_default()
}

/// `head` and `rows` as a comfy table: Markdown's pipes for [`Format::Markdown`], aligned text with
/// no borders otherwise (the caller handles CSV and JSON).
pub fn text_table<H, R>(format: Format, head: H, rows: impl IntoIterator<Item = R>) -> comfy_table::Table
where
    H: Into<comfy_table::Row>,
    R: Into<comfy_table::Row>,
{
    let mut table = comfy_table::Table::new();
    table.load_style(if format == Format::Markdown {
        comfy_table::presets::ASCII_MARKDOWN
    } else {
        comfy_table::presets::NOTHING
    });
    table.set_header(head).add_rows(rows);
    table
}

pub fn render(table: &Table, format: Format) -> String {
    let mut body: Vec<Vec<String>> = table.rows.iter().map(cells).collect();
    body.extend(anchor_cells(table));
    match format {
        Format::Json => serde_json::to_string_pretty(table).unwrap_or_default(),
        Format::Csv => {
            let head = ["family", "op", "shape"].into_iter().chain(COLUMNS);
            let mut records: Vec<Vec<String>> = vec![head.map(String::from).collect()];
            for row in body {
                records.push(
                    [table.family.clone(), table.op.clone(), table.shape.clone()].into_iter().chain(row).collect(),
                );
            }
            csv_text(records)
        }
        Format::Markdown => {
            let mut out = header(table).iter().map(|l| format!("{l}  \n")).collect::<String>();
            out.push('\n');
            out.push_str(&format!("| {} |\n", COLUMNS.join(" | ")));
            out.push_str(&format!("|{}\n", "---|".repeat(COLUMNS.len())));
            for row in body {
                out.push_str(&format!("| {} |\n", row.join(" | ").replace('\n', " ")));
            }
            let notes = note_lines(table);
            if !notes.is_empty() {
                out.push('\n');
                out.extend(notes.iter().map(|n| format!("- {n}\n")));
            }
            out
        }
        Format::Table => {
            let mut widths: Vec<usize> = COLUMNS.iter().map(|c| c.len()).collect();
            for row in &body {
                for (w, c) in widths.iter_mut().zip(row).take(COLUMNS.len() - 1) {
                    *w = (*w).max(c.chars().count());
                }
            }
            let line = |cols: Vec<String>| -> String {
                let mut s = String::new();
                for (i, c) in cols.iter().enumerate() {
                    if i + 1 == cols.len() {
                        s.push_str(c);
                    } else {
                        s.push_str(&format!("{:<w$}  ", c, w = widths[i]));
                    }
                }
                s.trim_end().to_string() + "\n"
            };
            let mut out = header(table).join("\n") + "\n";
            out.push_str(&line(COLUMNS.iter().map(|c| c.to_string()).collect()));
            for row in body {
                out.push_str(&line(row));
            }
            out.extend(note_lines(table).iter().map(|n| format!("{n}\n")));
            out
        }
    }
}

/// Where one family's share of a `ladder run` went, in wall seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FamilyTime {
    pub family: String,
    /// All of it: the parts below, preparing, verifying and timing the stages, and the rest.
    pub total_s: f64,
    /// Compiling the stages' modules ahead of them (NVRTC, every core).
    pub compile_s: f64,
    /// Drawing the inputs and computing the f64 CPU references.
    pub reference_s: f64,
    /// Tables run (op x shape; gpt2's model table counts as one).
    pub tables: usize,
}

/// The time per family of a `ladder run`, in the order the families ran: the summary it ends with.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunTimes {
    pub families: Vec<FamilyTime>,
    /// The whole run's wall time, from the device opened (ceilings included) to the last table.
    pub total_s: f64,
}

impl RunTimes {
    /// `family`'s entry, added (zero) on first use.
    pub fn family(&mut self, family: &str) -> &mut FamilyTime {
        let i = match self.families.iter().position(|f| f.family == family) {
            Some(i) => i,
            None => {
                self.families.push(FamilyTime { family: family.to_string(), ..FamilyTime::default() });
                self.families.len() - 1
            }
        };
        &mut self.families[i]
    }

    /// One row per family and a total row; JSON is every field.
    pub fn render(&self, format: Format) -> String {
        const HEAD: [&str; 6] = ["family", "total s", "compile s", "reference s", "rest s", "tables"];
        let row = |name: &str, total: f64, compile: f64, reference: f64, tables: usize| {
            vec![
                name.to_string(),
                format!("{total:.1}"),
                format!("{compile:.1}"),
                format!("{reference:.1}"),
                format!("{:.1}", total - compile - reference),
                tables.to_string(),
            ]
        };
        let mut rows: Vec<Vec<String>> =
            self.families.iter().map(|f| row(&f.family, f.total_s, f.compile_s, f.reference_s, f.tables)).collect();
        let sum = |part: fn(&FamilyTime) -> f64| self.families.iter().map(part).sum::<f64>();
        let tables = self.families.iter().map(|f| f.tables).sum();
        rows.push(row("all", self.total_s, sum(|f| f.compile_s), sum(|f| f.reference_s), tables));
        match format {
            Format::Json => serde_json::to_string_pretty(self).unwrap_or_default(),
            Format::Csv => csv_text(std::iter::once(HEAD.map(String::from).to_vec()).chain(rows)),
            Format::Table | Format::Markdown => format!("Time per family:\n\n{}\n", text_table(format, HEAD, rows)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ceilings::Ceilings;
    use crate::check::Verification;
    use crate::family::Workload;
    use crate::runner::{fill_rates, Anchor, Resources};
    use crate::timing::Timing;

    fn row(stage: u32, ms: Option<f64>, status: Status) -> Row {
        let timing = ms.map(|m| Timing { median_ms: m, min_ms: m * 0.9, max_ms: m * 1.1, reps: 10, last_copy: 0 });
        Row {
            resources: Some(Resources {
                kernels: 1,
                registers: 32,
                shared_bytes: 128,
                local_bytes: 0,
                blocks_per_sm: 8,
                occupancy: 1.0,
            }),
            verification: Some(Verification::new(1e-5).add("out", &[1.0f32], &[1.0])),
            ..Row::for_tests(stage, format!("s{stage}"), status, timing)
        }
    }

    fn table() -> Table {
        let mut t = Table {
            family: "norm".into(),
            op: "layernorm".into(),
            shape: "rows=4,C=8".into(),
            device: "test".into(),
            seed: 1,
            graph: false,
            batch: 1,
            rounds: 1,
            workload: Workload { bytes: 2_000_000, flops: 1_000_000, bound: Bound::Memory },
            ceilings: Ceilings::for_tests(4000.0),
            rows: vec![
                row(0, Some(4.0), Status::Passed),
                row(1, None, Status::Failed("out: rel L2 1e-1".into())),
                row(2, Some(1.0), Status::Passed),
                row(3, None, Status::Skipped("C <= 8192".into())),
            ],
            anchors: vec![Anchor {
                family: "norm".into(),
                op: "layernorm".into(),
                shape: "rows=4,C=8".into(),
                name: "torch".into(),
                median_ms: 2.0,
                min_ms: 1.9,
                max_ms: 2.1,
            }],
        };
        fill_rates(&mut t);
        t
    }

    #[test]
    fn speedups_skip_failed_rows() {
        let t = table();
        assert_eq!(t.rows[2].vs_stage0, Some(4.0));
        assert_eq!(t.rows[2].vs_previous, Some(4.0), "previous passing row is stage 0");
        assert_eq!(t.rows[1].gbps, None, "a failed row gets no rate");
        approx::assert_relative_eq!(t.rows[2].gbps.unwrap(), 2.0);
        approx::assert_relative_eq!(t.rows[2].of_ceiling.unwrap(), 0.0005);
    }

    #[test]
    fn every_format_shows_every_row() {
        let t = table();
        for f in [Format::Table, Format::Markdown, Format::Csv] {
            let s = render(&t, f);
            for name in ["s0", "s1", "s2", "s3", "torch"] {
                assert!(s.contains(name), "{f:?} lacks {name}:\n{s}");
            }
            assert!(s.contains("FAILED"), "{f:?}");
            assert!(s.contains("best stage is 2.00x this"), "{f:?}:\n{s}");
        }
        let json: serde_json::Value = serde_json::from_str(&render(&t, Format::Json)).unwrap();
        assert_eq!(json["rows"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn notes_follow_the_table_once_each() {
        let mut t = table();
        let note = |v: &mut Option<Verification>, n: &str| *v = v.take().map(|v| v.with_note(n.into()));
        note(&mut t.rows[0].verification, "vs exact: rel L2 1e-1");
        note(&mut t.rows[2].verification, "vs exact: rel L2 1e-1");
        assert_eq!(note_lines(&t), ["note (s0, s2): vs exact: rel L2 1e-1"]);
        for f in [Format::Table, Format::Markdown] {
            assert_eq!(render(&t, f).matches("vs exact").count(), 1, "{f:?}");
        }
    }

    #[test]
    fn leave_one_out_rows_compare_with_their_all_on_stage() {
        let mut t = table();
        // Stage 2 (1.0 ms) minus one toggle, after a later stage 3 row: x prev is against stage 2.
        t.rows.push(Row {
            name: "all-X".into(),
            compared_with: Some("s2".into()),
            ..row(2, Some(2.0), Status::Passed)
        });
        // A sweep point of stage 0 after it: against stage 0, not against the row before it.
        t.rows.push(Row {
            name: "s0[W=2]".into(),
            compared_with: Some("s0".into()),
            ..row(0, Some(8.0), Status::Passed)
        });
        // A declared stage after derived rows compares with the last declared stage (s2).
        t.rows.push(row(5, Some(0.5), Status::Passed));
        fill_rates(&mut t);
        assert_eq!(t.rows[4].vs_previous, Some(0.5));
        assert_eq!(t.rows[4].vs_stage0, Some(2.0));
        assert_eq!(t.rows[5].vs_previous, Some(0.5));
        assert_eq!(t.rows[6].vs_previous, Some(2.0));
    }

    #[test]
    fn the_header_names_the_timing_mode() {
        let mut t = table();
        assert!(!header(&t)[0].contains(';'), "{}", header(&t)[0]);
        t.batch = 20;
        assert!(header(&t)[0].contains("back to back, 20 per pair of events"), "{}", header(&t)[0]);
        t.graph = true;
        assert!(header(&t)[0].contains("CUDA-graph replays; runs back to back"), "{}", header(&t)[0]);
        t.rounds = 5;
        assert!(
            header(&t)[0].ends_with("; stages timed in 5 interleaved rounds, samples pooled)"),
            "{}",
            header(&t)[0]
        );
    }

    #[test]
    fn csv_quotes_fields() {
        let mut t = table();
        t.rows[1].status = Status::Failed("out: \"quoted\", with comma".into());
        let s = render(&t, Format::Csv);
        let mut r = csv::Reader::from_reader(s.as_bytes());
        let rows: Vec<csv::StringRecord> = r.records().map(|r| r.unwrap()).collect();
        assert_eq!(rows.len(), 5);
        assert_eq!(&rows[1][16], "FAILED: out: \"quoted\", with comma");
    }

    #[test]
    fn run_times_sum_per_family_and_serialize() {
        let mut times = RunTimes::default();
        times.family("norm").total_s += 2.0;
        times.family("matmul").total_s += 10.0;
        let norm = times.family("norm");
        norm.total_s += 1.0;
        norm.compile_s = 0.5;
        norm.reference_s = 1.5;
        norm.tables = 4;
        times.total_s = 14.0;
        let names: Vec<&str> = times.families.iter().map(|f| f.family.as_str()).collect();
        assert_eq!(names, ["norm", "matmul"], "in the order the families ran");
        assert_eq!(times.families[0].total_s, 3.0);
        let back: RunTimes = serde_json::from_str(&times.render(Format::Json)).unwrap();
        assert_eq!(back, times);
        let text = times.render(Format::Table);
        let norm_line = text.lines().find(|l| l.trim_start().starts_with("norm")).unwrap();
        let cells: Vec<&str> = norm_line.split_whitespace().collect();
        assert_eq!(cells, ["norm", "3.0", "0.5", "1.5", "1.0", "4"], "{text}");
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["all", "14.0", "0.5", "1.5", "12.0", "4"]),
            "{text}"
        );
        assert_eq!(times.render(Format::Csv).lines().count(), 4, "head, two families, all");
    }

    #[test]
    fn times_switch_units() {
        assert_eq!(fmt_time(0.0191), "19.10 us");
        assert_eq!(fmt_time(31.35), "31.350 ms");
        assert_eq!(fmt_time(50_122.7), "50.123 s");
    }
}
