//! An SVG chart of one ablation table: each passing stage's median time as a bar on a log axis,
//! labelled with its speedup over the previous stage, and the op's two floors drawn across, the
//! bytes at the copy rate and the flops at the matrix rate of the op's bound (the higher of the two
//! is the op's floor). Outside anchors (PyTorch) are dashed lines. Written beside the JSON and
//! Markdown of `ladder run --out`, and by `ladder chart` from saved JSON.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use common::family::Bound;
use common::report::fmt_time;
use common::runner::{Status, Table};
use common::variant::Precision;
use common::{Error, Result};

const WIDTH: u32 = 960;
const HEIGHT: u32 = 540;

/// The op's floors in ms: (label, time) for the bytes at the bounding bandwidth and the flops at
/// the matrix rate of the op's precision (fp32 for a memory-bound op).
pub fn floors(table: &Table) -> Vec<(String, f64)> {
    let c = &table.ceilings;
    let w = &table.workload;
    let (bytes_rate, bytes_label) = match w.bound {
        Bound::HostLink => (c.h2d_pinned_gbps, "host-to-device"),
        _ => (c.copy_gbps, "copy"),
    };
    let precision = match w.bound {
        Bound::Compute(p) => p,
        _ => Precision::Fp32,
    };
    let mut out = Vec::new();
    if w.bytes > 0 && bytes_rate > 0.0 {
        out.push((format!("bytes at {bytes_label} rate"), w.bytes as f64 / (bytes_rate * 1e9) * 1e3));
    }
    if w.flops > 0 && c.tflops(precision) > 0.0 {
        out.push((
            format!("flops at {} GEMM rate", precision.label()),
            w.flops as f64 / (c.tflops(precision) * 1e12) * 1e3,
        ));
    }
    out
}

fn draw_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> Error {
    Error::constraint("an SVG the chart can draw", e.to_string())
}

/// The table as an SVG document; `None` when no stage passed (nothing to draw).
pub fn svg(table: &Table) -> Result<Option<String>> {
    let bars: Vec<(String, f64, Option<f64>)> = table
        .rows
        .iter()
        .filter(|r| r.status == Status::Passed)
        .filter_map(|r| r.timing.map(|t| (format!("{:02} {}", r.stage, r.name), t.median_ms, r.vs_previous)))
        .collect();
    if bars.is_empty() {
        return Ok(None);
    }
    let floors = floors(table);
    let anchors: Vec<(String, f64)> = table.anchors.iter().map(|a| (a.name.clone(), a.median_ms)).collect();
    let all = bars.iter().map(|b| b.1).chain(floors.iter().map(|f| f.1)).chain(anchors.iter().map(|a| a.1));
    let (lo, hi) = all.fold((f64::INFINITY, 0.0f64), |(lo, hi), t| (lo.min(t), hi.max(t)));
    // A decade of room below the lowest line and above the tallest bar (for its label).
    let (y0, y1) = (10f64.powf((lo.log10() - 0.3).floor()), 10f64.powf((hi.log10() + 0.5).ceil()));

    let mut doc = String::new();
    {
        let root = SVGBackend::with_string(&mut doc, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let title = format!("{}/{}  {}  on {}", table.family, table.op, table.shape, table.device);
        let n = bars.len();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(90)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..n as f64, (y0..y1).log_scale())
            .map_err(draw_err)?;
        let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n * 2 + 1)
            .x_label_formatter(&|x| {
                // Label the bar centres (i + 0.5) only.
                let i = (x - 0.5).round();
                if (x - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
                    names[i as usize].clone()
                } else {
                    String::new()
                }
            })
            .x_label_style(("sans-serif", 12).into_font().transform(FontTransform::Rotate90))
            .y_desc("median time (log scale)")
            .y_label_formatter(&|y| fmt_time(*y))
            .draw()
            .map_err(draw_err)?;
        let bar_style = RGBColor(70, 110, 170).filled();
        chart
            .draw_series(
                bars.iter()
                    .enumerate()
                    .map(|(i, b)| Rectangle::new([(i as f64 + 0.15, y0), (i as f64 + 0.85, b.1)], bar_style)),
            )
            .map_err(draw_err)?;
        let label = ("sans-serif", 12).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
        chart
            .draw_series(bars.iter().enumerate().map(|(i, b)| {
                let text = match b.2 {
                    Some(x) => format!("{} ({x:.2}x)", fmt_time(b.1)),
                    None => fmt_time(b.1),
                };
                Text::new(text, (i as f64 + 0.5, b.1 * 1.08), label.clone())
            }))
            .map_err(draw_err)?;
        let colours = [RGBColor(200, 60, 40), RGBColor(40, 150, 70)];
        for ((name, t), colour) in floors.iter().zip(colours) {
            chart
                .draw_series(LineSeries::new([(0.0, *t), (n as f64, *t)], colour.stroke_width(2)))
                .map_err(draw_err)?
                .label(format!("floor: {name} ({})", fmt_time(*t)))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
        }
        for (name, t) in &anchors {
            let grey = RGBColor(110, 110, 110);
            chart
                .draw_series(DashedLineSeries::new([(0.0, *t), (n as f64, *t)], 6, 4, grey.stroke_width(1)))
                .map_err(draw_err)?
                .label(format!("{name} ({})", fmt_time(*t)))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], grey.stroke_width(1)));
        }
        legend(&mut chart)?;
        root.present().map_err(draw_err)?;
    }
    Ok(Some(doc))
}

/// The series' legend, top right on a translucent white box: the same in every chart.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(chart: &mut ChartContext<'a, DB, CT>) -> Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(draw_err)
}

/// A sweep as an SVG: median time (log axis) against the first swept tunable's values, one line per
/// combination of the other axes; the declared configuration circled in red, the best in green.
/// `None` when no point passed.
pub fn sweep_svg(s: &crate::sweep::SweepSummary) -> Result<Option<String>> {
    let Some(first) = s.axes.first() else { return Ok(None) };
    let value = |r: &common::runner::Row| r.config.iter().find(|(n, _)| n == first).map(|c| c.1);
    let mut xs: Vec<u32> = s.points.iter().filter_map(value).collect();
    xs.sort_unstable();
    xs.dedup();
    let passed: Vec<(&common::runner::Row, f64)> =
        s.points.iter().filter(|r| r.status == Status::Passed).filter_map(|r| Some((r, r.timing?.median_ms))).collect();
    if passed.is_empty() || xs.is_empty() {
        return Ok(None);
    }
    // Series: the other axes' values of a point.
    let rest = |r: &common::runner::Row| -> String {
        let parts: Vec<String> = r
            .config
            .iter()
            .filter(|(n, _)| n != first && s.axes.contains(n))
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        parts.join(",")
    };
    let mut series: Vec<String> = passed.iter().map(|(r, _)| rest(r)).collect();
    series.sort();
    series.dedup();
    let x_of = |r: &common::runner::Row| value(r).and_then(|v| xs.iter().position(|&x| x == v)).map(|i| i as f64);
    let (lo, hi) = passed.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), (_, t)| (lo.min(*t), hi.max(*t)));
    let (y0, y1) = (lo / 1.5, hi * 1.5);
    let mut doc = String::new();
    {
        let root = SVGBackend::with_string(&mut doc, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let title = format!("sweep {}/{}/{:02}-{}  {}  on {}", s.family, s.op, s.stage, s.name, s.shape, s.device);
        let n = xs.len();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(-0.5f64..n as f64 - 0.5, (y0..y1).log_scale())
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < xs.len() {
                    xs[i as usize].to_string()
                } else {
                    String::new()
                }
            })
            .x_desc(first.as_str())
            .y_labels(12)
            .y_desc("median time (log scale)")
            .y_label_formatter(&|y| fmt_time(*y))
            .draw()
            .map_err(draw_err)?;
        for (k, name) in series.iter().enumerate() {
            let colour = Palette99::pick(k).to_rgba();
            let mut line: Vec<(f64, f64)> =
                passed.iter().filter(|(r, _)| &rest(r) == name).filter_map(|(r, t)| Some((x_of(r)?, *t))).collect();
            line.sort_by(|a, b| a.0.total_cmp(&b.0));
            let label = if name.is_empty() { first.clone() } else { name.clone() };
            chart
                .draw_series(LineSeries::new(line.clone(), colour.stroke_width(2)))
                .map_err(draw_err)?
                .label(label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
            chart.draw_series(line.iter().map(|&p| Circle::new(p, 3, colour.filled()))).map_err(draw_err)?;
        }
        let marks = [(s.default_point(), RGBColor(200, 60, 40), "declared"), (s.best(), RGBColor(40, 150, 70), "best")];
        for (row, colour, what) in marks {
            let Some(r) = row.filter(|r| r.status == Status::Passed) else { continue };
            let (Some(x), Some(t)) = (x_of(r), r.timing.map(|t| t.median_ms)) else { continue };
            let text = format!("{what}: {} {}", s.label(r), fmt_time(t));
            let font = ("sans-serif", 12).into_font().color(&colour).pos(Pos::new(HPos::Center, VPos::Bottom));
            chart
                .draw_series([EmptyElement::at((x, t)) + Circle::new((0, 0), 8, colour.stroke_width(2))])
                .map_err(draw_err)?;
            chart.draw_series([Text::new(text, (x, t * 1.12), font)]).map_err(draw_err)?;
        }
        if series.len() > 1 {
            legend(&mut chart)?;
        }
        root.present().map_err(draw_err)?;
    }
    Ok(Some(doc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::ceilings::Ceilings;
    use common::family::Workload;
    use common::runner::{Anchor, Row};
    use common::timing::Timing;

    fn row(stage: u32, ms: f64, status: Status, vs_previous: Option<f64>) -> Row {
        let timing = Timing { median_ms: ms, min_ms: ms, max_ms: ms, reps: 1, last_copy: 0 };
        Row { vs_previous, ..Row::for_tests(stage, format!("stage-{stage}"), status, Some(timing)) }
    }

    fn table(rows: Vec<Row>) -> Table {
        Table {
            family: "fam".into(),
            op: "op".into(),
            shape: "N=1".into(),
            device: "dev".into(),
            seed: 1,
            graph: false,
            batch: 1,
            rounds: 1,
            workload: Workload { bytes: 3_000_000_000, flops: 1_000_000_000_000, bound: Bound::Memory },
            ceilings: Ceilings::for_tests(3000.0),
            rows,
            anchors: vec![Anchor {
                family: "fam".into(),
                op: "op".into(),
                shape: "N=1".into(),
                name: "torch".into(),
                median_ms: 2.0,
                min_ms: 2.0,
                max_ms: 2.0,
            }],
        }
    }

    #[test]
    fn floors_are_bytes_and_flops_at_their_rates() {
        let f = floors(&table(vec![]));
        // 3 GB at 3000 GB/s = 1 ms; 1 TFLOP at the fp32 50 TFLOP/s = 20 ms.
        assert_eq!(f.len(), 2);
        assert!((f[0].1 - 1.0).abs() < 1e-9 && (f[1].1 - 20.0).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn every_passing_stage_is_a_labelled_bar_and_failures_are_left_out() {
        let t = table(vec![
            row(0, 100.0, Status::Passed, None),
            row(1, 10.0, Status::Passed, Some(10.0)),
            row(2, 5.0, Status::Failed("NaN".into()), None),
        ]);
        let doc = svg(&t).unwrap().expect("two stages passed");
        assert!(doc.starts_with("<svg") && doc.trim_end().ends_with("</svg>"));
        assert!(doc.contains("00 stage-0") && doc.contains("01 stage-1") && !doc.contains("02 stage-2"));
        assert!(doc.contains("(10.00x)"), "the speedup over the previous stage labels the bar");
        assert!(doc.contains("floor: bytes at copy rate") && doc.contains("torch"));
        assert!(svg(&table(vec![row(0, 1.0, Status::Skipped("n/a".into()), None)])).unwrap().is_none());
    }
}
