//! A configuration sweep of one stage at one shape (`ladder sweep`): the grid points of its tunables
//! verified and timed on one set of inputs (a [`Table`] whose rows are the points), then read back
//! sorted by time, with the declared configuration marked and the best one's speedup over it.

use serde::Serialize;

use common::report::fmt_time;
use common::runner::{Row, Status, Table};
use common::tuned::Tuned;
use common::variant::Variant;

/// One stage's sweep at one shape, its points sorted: passed ones by median, then the others.
#[derive(Clone, Debug, Serialize)]
pub struct SweepSummary {
    pub family: String,
    pub op: String,
    pub shape: String,
    pub device: String,
    /// How the points were timed ([`crate::matrix::mode`]).
    pub mode: String,
    pub stage: u32,
    /// The declared stage's name.
    pub name: String,
    /// The swept tunables.
    pub axes: Vec<String>,
    /// The declared configuration (all tunables).
    pub default_config: Vec<(String, u32)>,
    pub points: Vec<Row>,
}

fn median(r: &Row) -> Option<f64> {
    r.timing.filter(|_| r.status == Status::Passed).map(|t| t.median_ms)
}

impl SweepSummary {
    /// The rows of `table` that belong to `base`'s sweep over `axes`.
    pub fn new(table: &Table, base: &Variant, axes: &[String]) -> SweepSummary {
        let mut points: Vec<Row> = table
            .rows
            .iter()
            .filter(|r| {
                r.stage == base.stage && (r.name == base.name || r.name.starts_with(&format!("{}[", base.name)))
            })
            .cloned()
            .collect();
        points.sort_by(|a, b| match (median(a), median(b)) {
            (Some(x), Some(y)) => x.total_cmp(&y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        });
        SweepSummary {
            family: table.family.clone(),
            op: table.op.clone(),
            shape: table.shape.clone(),
            device: table.device.clone(),
            mode: crate::matrix::mode(table),
            stage: base.stage,
            name: base.name.to_string(),
            axes: axes.to_vec(),
            default_config: base.config(),
            points,
        }
    }

    pub fn is_default(&self, r: &Row) -> bool {
        r.config == self.default_config
    }

    pub fn default_point(&self) -> Option<&Row> {
        self.points.iter().find(|r| self.is_default(r))
    }

    /// The fastest passing point.
    pub fn best(&self) -> Option<&Row> {
        self.points.first().filter(|r| median(r).is_some())
    }

    /// Default median over best median.
    pub fn speedup(&self) -> Option<f64> {
        Some(median(self.default_point()?)? / median(self.best()?)?)
    }

    /// The swept values of a point, `A=1,B=2`.
    pub fn label(&self, r: &Row) -> String {
        let parts: Vec<String> =
            r.config.iter().filter(|(n, _)| self.axes.contains(n)).map(|(n, v)| format!("{n}={v}")).collect();
        parts.join(",")
    }

    /// The entry `--save-best` stores: the best point's configuration.
    pub fn tuned(&self) -> Option<Tuned> {
        let best = self.best()?;
        Some(Tuned {
            family: self.family.clone(),
            op: self.op.clone(),
            stage: self.stage,
            name: self.name.clone(),
            shape: self.shape.clone(),
            config: best.config.clone(),
            median_ms: median(best)?,
            default_ms: self.default_point().and_then(median),
        })
    }

    fn cells(&self) -> Vec<[String; 7]> {
        let default_ms = self.default_point().and_then(median);
        self.points
            .iter()
            .map(|r| {
                let t = median(r);
                let res = r.resources.as_ref();
                [
                    format!("{}{}", self.label(r), if self.is_default(r) { " *" } else { "" }),
                    r.timing.map_or("-".into(), |t| {
                        format!("{} ({}-{})", fmt_time(t.median_ms), fmt_time(t.min_ms), fmt_time(t.max_ms))
                    }),
                    match (t, default_ms) {
                        (Some(t), Some(d)) => format!("{:.2}", d / t),
                        _ => "-".into(),
                    },
                    r.of_ceiling.map_or("-".into(), |f| format!("{:.1}", f * 100.0)),
                    res.map_or("-".into(), |r| r.registers.to_string()),
                    res.map_or("-".into(), |r| format!("{:.0}%", r.occupancy * 100.0)),
                    match &r.status {
                        Status::Passed => "ok".into(),
                        Status::Failed(why) => format!("FAILED: {why}"),
                        Status::Skipped(why) => format!("n/a: {why}"),
                    },
                ]
            })
            .collect()
    }

    const HEAD: [&'static str; 7] = ["config", "median (min-max)", "x default", "% ceil", "regs", "occ", "status"];

    fn title(&self) -> String {
        format!(
            "sweep {}/{}/{:02}-{} over {}  shape {}  on {} ({})",
            self.family,
            self.op,
            self.stage,
            self.name,
            self.axes.join(" x "),
            self.shape,
            self.device,
            self.mode
        )
    }

    fn verdict(&self) -> String {
        let default = self.default_point().map(|r| self.label(r));
        match (self.best(), self.speedup()) {
            (Some(b), Some(x)) => format!(
                "best {} at {}: {x:.2}x the declared configuration ({}); * marks the declared configuration",
                self.label(b),
                fmt_time(median(b).unwrap_or_default()),
                default.unwrap_or_default()
            ),
            (Some(b), None) => format!(
                "best {} at {}; the declared configuration is not among the points or did not pass",
                self.label(b),
                fmt_time(median(b).unwrap_or_default())
            ),
            (None, _) => "no point passed".into(),
        }
    }

    /// Aligned text, fastest first.
    pub fn text(&self) -> String {
        let body = self.cells();
        let mut widths: Vec<usize> = Self::HEAD.iter().map(|h| h.len()).collect();
        for row in &body {
            for (w, c) in widths.iter_mut().zip(row.iter()).take(6) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cols: &[String]| -> String {
            let mut s = String::new();
            for (i, c) in cols.iter().enumerate() {
                if i + 1 == cols.len() {
                    s.push_str(c);
                } else {
                    s.push_str(&format!("{c:<w$}  ", w = widths[i]));
                }
            }
            s.trim_end().to_string() + "\n"
        };
        let mut out = self.title() + "\n";
        out.push_str(&line(&Self::HEAD.map(String::from)));
        for row in &body {
            out.push_str(&line(row));
        }
        out.push_str(&self.verdict());
        out.push('\n');
        out
    }

    pub fn markdown(&self) -> String {
        let mut out = format!("{}  \n\n| {} |\n|{}\n", self.title(), Self::HEAD.join(" | "), "---|".repeat(7));
        for row in self.cells() {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        out.push_str(&format!("\n{}\n", self.verdict()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::ceilings::Ceilings;
    use common::family::{Bound, Workload};
    use common::timing::Timing;
    use common::variant::{Generator, Grid, Precision, Sweep};

    fn row(v: &Variant, ms: Option<f64>) -> Row {
        let status = if ms.is_some() { Status::Passed } else { Status::Skipped("block too large".into()) };
        let timing = ms.map(|m| Timing { median_ms: m, min_ms: m, max_ms: m, reps: 1, last_copy: 0 });
        Row {
            compared_with: v.compared_with.clone(),
            config: v.config(),
            ..Row::for_tests(v.stage, v.name.to_string(), status, timing)
        }
    }

    #[test]
    fn sorted_by_time_with_default_marked_and_best_saved() {
        let base = Variant::kernel("f", "op", 1, "vec", "op/01_vec.cu", Precision::Fp32, "s")
            .with_tunables(&[("T", 256), ("U", 4)]);
        let grid = Grid { axes: vec![Sweep { tunable: "T".into(), values: vec![64, 256, 1024, 2048] }] };
        let points = grid.derive(&base);
        let times = [Some(3.0), Some(2.0), Some(1.0), None];
        let table = Table {
            family: "f".into(),
            op: "op".into(),
            shape: "N=10".into(),
            device: "gpu".into(),
            seed: 1,
            graph: false,
            batch: 1,
            rounds: 1,
            workload: Workload { bytes: 1, flops: 1, bound: Bound::Memory },
            ceilings: Ceilings::for_tests(3000.0),
            rows: points.iter().zip(times).map(|(v, t)| row(v, t)).collect(),
            anchors: Vec::new(),
        };
        let s = SweepSummary::new(&table, &base, &["T".into()]);
        assert_eq!(s.label(&s.points[0]), "T=1024");
        assert_eq!(s.label(s.default_point().unwrap()), "T=256");
        assert_eq!(s.speedup(), Some(2.0));
        assert!(matches!(s.points[3].status, Status::Skipped(_)), "n/a points last");
        let text = s.text();
        assert!(text.contains("T=256 *") && text.contains("2.00x the declared"), "{text}");
        assert!(text.lines().next().unwrap().ends_with("(each run between its own events)"), "{text}");
        let tuned = s.tuned().unwrap();
        assert_eq!(tuned.config, vec![("T".to_string(), 1024), ("U".to_string(), 4)]);
        assert_eq!(tuned.default_ms, Some(2.0));
        let svg = crate::chart::sweep_svg(&s).unwrap().unwrap();
        assert!(svg.contains("<svg") && svg.contains("declared: T=256"), "the chart marks the declared point");
    }
}
