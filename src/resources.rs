//! The resource report without a GPU (`ladder resources`): every stage of an op compiled by NVRTC
//! for one architecture with ptxas reporting, one row per entry point: registers, spills, stack,
//! static shared memory and named barriers. The table's own `regs`/`spill` columns come from the
//! loaded module on a device; this report is the same reading before any device time is spent.
//! An NVRTC whose log holds no ptxas report is a typed error naming its version and options.

use serde::Serialize;

use common::family::Op;
use common::nvrtc::{Arch, EntryResources, Toolchain};
use common::report::Format;
use common::variant::{Source, Variant};

/// One stage (or leave-one-out row, or sweep point) of an op, compiled for `arch`.
#[derive(Clone, Debug, Serialize)]
pub struct StageResources {
    pub family: String,
    pub op: String,
    pub stage: u32,
    pub name: String,
    /// What it was compiled with beside its switches: the stage list's numeric defines (a tile
    /// shape), then the tunables in declaration order.
    pub config: Vec<(String, u32)>,
    pub arch: String,
    /// What ptxas allocated per entry point, or why there is nothing: a compile error, or a
    /// stage that needs another architecture.
    pub entries: std::result::Result<Vec<EntryResources>, String>,
}

impl StageResources {
    /// Whether any entry point spills registers to local memory.
    pub fn spills(&self) -> bool {
        self.entries.as_ref().is_ok_and(|e| e.iter().any(|e| e.spill_store_bytes + e.spill_load_bytes > 0))
    }
}

/// Compiles each kernel stage of `variants` (library rows have no kernel of ours and are left out)
/// for `arch`, in parallel.
pub fn measure(tc: &Toolchain, op: &dyn Op, variants: &[Variant], arch: Arch) -> Vec<StageResources> {
    let kernels: Vec<(&Variant, &str)> = variants
        .iter()
        .filter_map(|v| match v.source {
            Source::Kernel(path) => Some((v, path)),
            _ => None,
        })
        .collect();
    common::nvrtc::compile_on_every_core(
        kernels,
        |(v, _)| v.stage,
        |(v, path)| {
            let entries = if v.requires.arch_specific && !arch.arch_specific {
                Err(format!("n/a: Hopper-only instructions, built for {} alone", Arch::SM90A))
            } else {
                op.sources()
                    .find(path)
                    .and_then(|src| {
                        let headers = op.sources().headers()?;
                        tc.resources(&v.id(), src, &headers, &v.compile_defines(), arch)
                    })
                    .map_err(|e| e.to_string())
            };
            StageResources {
                family: v.family.to_string(),
                op: v.op.to_string(),
                stage: v.stage,
                name: v.name.to_string(),
                config: v
                    .defines
                    .iter()
                    .filter(|d| d.value != "1")
                    .filter_map(|d| Some((d.name.to_string(), d.value.parse().ok()?)))
                    .chain(v.config())
                    .collect(),
                arch: arch.name(),
                entries,
            }
        },
    )
}

/// The entry points a PTX module declares (`.visible .entry name(`), in its order.
pub fn entry_names(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|l| l.split('(').next().unwrap_or_default().trim())
        .collect()
}

const HEAD: [&str; 9] = ["stage", "name", "config", "entry", "regs", "spill st/ld", "stack", "smem", "barriers"];

fn cells(r: &StageResources) -> Vec<Vec<String>> {
    let config = r.config.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(" ");
    let stage = [format!("{:02}", r.stage), r.name.clone(), config];
    match &r.entries {
        Ok(entries) => entries
            .iter()
            .map(|e| {
                let spill = if e.spill_store_bytes + e.spill_load_bytes == 0 {
                    "0".to_string()
                } else {
                    format!("{}/{}", e.spill_store_bytes, e.spill_load_bytes)
                };
                let own = [
                    e.entry.clone(),
                    e.registers.to_string(),
                    spill,
                    e.stack_bytes.to_string(),
                    e.static_shared_bytes.to_string(),
                    e.barriers.to_string(),
                ];
                stage.iter().cloned().chain(own).collect()
            })
            .collect(),
        Err(why) => {
            let first = why.lines().next().unwrap_or_default().to_string();
            vec![stage.iter().cloned().chain([first]).chain(std::iter::repeat_n("-".to_string(), 5)).collect()]
        }
    }
}

/// The report of one op's rows: aligned text or Markdown (a caption, then a row per entry point),
/// CSV, or JSON (every field).
pub fn render(rows: &[StageResources], format: Format) -> String {
    let Some(first) = rows.first() else { return String::new() };
    let caption = format!(
        "{}/{}: ptxas resources for {} (registers per thread as compiled; dynamic shared memory is sized at launch)",
        first.family, first.op, first.arch
    );
    let body: Vec<Vec<String>> = rows.iter().flat_map(cells).collect();
    match format {
        Format::Json => serde_json::to_string_pretty(rows).unwrap_or_default() + "\n",
        Format::Csv => {
            let head: Vec<String> = ["family", "op", "arch"].iter().chain(HEAD.iter()).map(|s| s.to_string()).collect();
            let rows = body.into_iter().map(|row| {
                [&first.family, &first.op, &first.arch].into_iter().cloned().chain(row).collect::<Vec<String>>()
            });
            common::report::csv_text(std::iter::once(head).chain(rows))
        }
        Format::Table | Format::Markdown => {
            format!("{caption}\n\n{}\n\n", common::report::text_table(format, HEAD, body))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(stage: u32, entries: std::result::Result<Vec<EntryResources>, String>) -> StageResources {
        StageResources {
            family: "matmul".into(),
            op: "linear-bf16".into(),
            stage,
            name: format!("s{stage}"),
            config: vec![("WS_BN".into(), 192), ("WG_STAGES".into(), 4)],
            arch: "sm_90a".into(),
            entries,
        }
    }

    #[test]
    fn one_line_per_entry_and_the_reason_for_none() {
        let lean = EntryResources { entry: "lean".into(), registers: 168, barriers: 16, ..Default::default() };
        let spilling = EntryResources {
            entry: "lean_residual".into(),
            registers: 168,
            spill_store_bytes: 624,
            spill_load_bytes: 456,
            stack_bytes: 624,
            ..Default::default()
        };
        let rows =
            [row(30, Ok(vec![lean.clone(), spilling])), row(31, Ok(vec![lean])), row(7, Err("n/a: sm_90a".into()))];
        assert!(rows[0].spills() && !rows[1].spills() && !rows[2].spills());
        let text = render(&rows, Format::Table);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(lines[0].starts_with("matmul/linear-bf16: ptxas resources for sm_90a"), "{text}");
        assert!(lines[1].split_whitespace().eq(HEAD.join(" ").split_whitespace()), "{text}");
        let words = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            words(lines[3]),
            ["30", "s30", "WS_BN=192", "WG_STAGES=4", "lean_residual", "168", "624/456", "624", "0", "0"]
        );
        assert_eq!(
            words(lines[5]),
            ["07", "s7", "WS_BN=192", "WG_STAGES=4", "n/a:", "sm_90a", "-", "-", "-", "-", "-"]
        );
        let md = render(&rows, Format::Markdown);
        assert!(md.contains("| 31 "), "{md}");
        let csv = render(&rows, Format::Csv);
        assert_eq!(csv.lines().count(), 1 + 4, "{csv}");
        assert!(csv
            .lines()
            .nth(2)
            .unwrap()
            .starts_with("matmul,linear-bf16,sm_90a,30,s30,WS_BN=192 WG_STAGES=4,lean_residual,168,624/456"));
        let json: serde_json::Value = serde_json::from_str(&render(&rows, Format::Json)).unwrap();
        assert_eq!(json[0]["entries"]["Ok"][1]["spill_load_bytes"], 456);
    }

    #[test]
    fn entry_names_come_from_the_ptx() {
        let ptx = ".version 8.8\n.visible .entry a_hs32(\n.param .u64 p\n)\n.func helper()\n  .visible .entry b(\n";
        assert_eq!(entry_names(ptx), ["a_hs32", "b"]);
    }
}
