//! The ablation model: one [`Variant`] per stage of an op. A variant is declared once, in its op's
//! stage list, and carries everything needed to run it: the descriptor the tables print, the typed
//! plan its op launches it by, and its launch geometry as [`Tunable`]s, which reach the kernel only
//! as generated `-D` defines. Derived rows (leave-one-out, sweep points) come from [`Generator`]s and
//! name the row they are compared against.

use std::any::Any;
use std::borrow::Cow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The arithmetic a stage computes in; it picks the tolerance preset and the GEMM ceiling that
/// bounds a compute-bound stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Precision {
    Fp32,
    Tf32,
    Fp16,
    Bf16,
    /// INT4 storage dequantised to bf16 for the matrix products, fp32 accumulation.
    Int4Bf16,
    /// e4m3 operands with fp32 scales on the FP8 tensor cores, fp32 accumulation (promoted).
    Fp8,
}

impl Precision {
    /// Relative-L2 tolerance preset against the f64 reference.
    pub fn tolerance(self) -> f64 {
        match self {
            Precision::Fp32 => 1e-5,
            Precision::Tf32 => 1e-3,
            Precision::Fp16 | Precision::Bf16 | Precision::Int4Bf16 | Precision::Fp8 => 1e-2,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Int4Bf16 => "int4/bf16",
            Precision::Fp8 => "fp8",
        }
    }
}

/// A per-variant tolerance that replaces the preset, with the reason it must.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tolerance {
    pub rel_l2: f64,
    pub reason: &'static str,
}

/// A preprocessor define handed to NVRTC as `-DNAME=VALUE`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Define {
    pub name: Cow<'static, str>,
    pub value: Cow<'static, str>,
}

impl Define {
    pub const fn new(name: &'static str, value: &'static str) -> Define {
        Define { name: Cow::Borrowed(name), value: Cow::Borrowed(value) }
    }

    /// An optimization switch: `-DNAME=1`.
    pub const fn on(name: &'static str) -> Define {
        Define::new(name, "1")
    }
}

/// One number of a stage's launch geometry (warps per block, tile edge, threads): the Rust plan
/// reads it to size the launch, and the kernel receives the same value as `-DNAME=value`. A kernel
/// never defaults a tunable itself (`#error` when it is missing), so the two cannot drift apart.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Tunable {
    pub name: Cow<'static, str>,
    pub value: u32,
}

/// Applies `set` to the entry of `list` named `name`; an unknown name is an error listing the
/// known ones (`what`: the kind of entry).
fn set_named<T: Clone>(
    list: &mut Cow<'static, [T]>,
    what: &'static str,
    name: &str,
    name_of: impl Fn(&T) -> &str,
    set: impl FnOnce(&mut T),
) -> Result<()> {
    let Some(i) = list.iter().position(|t| name_of(t) == name) else {
        let known = list.iter().map(&name_of).collect::<Vec<_>>().join(", ");
        return Err(Error::Unknown { what, name: name.to_string(), known });
    };
    set(&mut list.to_mut()[i]);
    Ok(())
}

/// The first stage number of the library rows (`90_cublas` and on): kernel and host stages are
/// numbered below it. Saved tables' rows keep only the number, so this is how a reader of them
/// (`ladder matrix`) tells a library row from a stage; `kernels_compile` checks every stage list.
pub const LIBRARY_STAGES: u32 = 90;

/// Where a stage's code comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Source {
    /// A `.cu` file under the crate's `kernels/`, e.g. `layernorm/00_naive.cu`.
    Kernel(&'static str),
    /// A vendor library call (cuBLAS, cuBLASLt), named for the table.
    Library(&'static str),
    /// Host-side work (copies, streams, memory placement) around kernels of other stages, named for
    /// the table: the stage adds no kernel of its own.
    Host(&'static str),
}

/// What a stage needs from the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Requirements {
    /// Minimum compute capability.
    pub min_cc: (u32, u32),
    /// Compile for `sm_XYa` (Hopper-only instructions such as wgmma); the device must be exactly XY.
    pub arch_specific: bool,
}

impl Requirements {
    pub const ANY: Requirements = Requirements { min_cc: (7, 0), arch_specific: false };
    pub const SM80: Requirements = Requirements { min_cc: (8, 0), arch_specific: false };
    /// Hopper's plain sm_90 features (programmatic dependent launch, clusters, TMA).
    pub const SM90: Requirements = Requirements { min_cc: (9, 0), arch_specific: false };
    pub const SM90A: Requirements = Requirements { min_cc: (9, 0), arch_specific: true };
}

/// An op's typed launch plan, carried by the variant so nothing looks the variant up again.
type PlanBox = Arc<dyn Any + Send + Sync>;

/// One stage of an op's ladder: descriptor, switches, tunables and plan.
#[derive(Clone, Serialize)]
pub struct Variant {
    pub family: &'static str,
    pub op: &'static str,
    pub stage: u32,
    /// Short name, unique within the op (`naive`, `warp-shuffle`, `+1..5`).
    pub name: Cow<'static, str>,
    /// One line: what changed versus the previous stage.
    pub summary: Cow<'static, str>,
    pub precision: Precision,
    pub source: Source,
    /// Optimization switches (`-DNAME=1`) and other non-geometry defines.
    pub defines: Cow<'static, [Define]>,
    /// Launch geometry; see [`Tunable`].
    pub tunables: Cow<'static, [Tunable]>,
    /// Defines that are cumulative optimization switches of one kernel: the leave-one-out generator
    /// removes each in turn from this variant.
    pub toggles: Cow<'static, [&'static str]>,
    /// `(switch, switch it builds on)` pairs among the toggles: leaving a switch out also leaves out
    /// every toggle that builds on it (a kernel's `#error` refuses the combination otherwise).
    pub toggle_bases: Cow<'static, [(&'static str, &'static str)]>,
    pub requires: Requirements,
    pub tolerance: Option<Tolerance>,
    /// For a derived row (a leave-one-out variant, a sweep point): the name of the row its `x prev`
    /// is measured against. `None` for a declared stage, which compares with the previous one.
    pub compared_with: Option<String>,
    /// A configuration-sweep point: a launch the device cannot make at this configuration
    /// (registers, shared memory, block size) is `n/a`, not a failure of the stage.
    pub sweep_point: bool,
    /// The configuration space `ladder sweep` explores for this stage when no `--define` is given:
    /// one axis per tunable, each with the values worth timing.
    pub sweep_space: Cow<'static, [Sweep]>,
    #[serde(skip)]
    plan: Option<PlanBox>,
}

impl std::fmt::Debug for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Variant")
            .field("id", &self.id())
            .field("defines", &self.defines)
            .field("tunables", &self.tunables)
            .field("compared_with", &self.compared_with)
            .finish()
    }
}

impl Variant {
    /// A stage with its own `.cu` file and no defines.
    pub const fn kernel(
        family: &'static str,
        op: &'static str,
        stage: u32,
        name: &'static str,
        source: &'static str,
        precision: Precision,
        summary: &'static str,
    ) -> Variant {
        Variant {
            family,
            op,
            stage,
            name: Cow::Borrowed(name),
            summary: Cow::Borrowed(summary),
            precision,
            source: Source::Kernel(source),
            defines: Cow::Borrowed(&[]),
            tunables: Cow::Borrowed(&[]),
            toggles: Cow::Borrowed(&[]),
            toggle_bases: Cow::Borrowed(&[]),
            requires: Requirements::ANY,
            tolerance: None,
            compared_with: None,
            sweep_point: false,
            sweep_space: Cow::Borrowed(&[]),
            plan: None,
        }
    }

    /// A vendor-library baseline row (numbered from [`LIBRARY_STAGES`]).
    pub const fn library(
        family: &'static str,
        op: &'static str,
        stage: u32,
        name: &'static str,
        library: &'static str,
        precision: Precision,
        summary: &'static str,
    ) -> Variant {
        let mut v = Variant::kernel(family, op, stage, name, "", precision, summary);
        v.source = Source::Library(library);
        v
    }

    /// A stage whose difference is host-side orchestration of other stages' kernels.
    pub const fn host(
        family: &'static str,
        op: &'static str,
        stage: u32,
        name: &'static str,
        what: &'static str,
        precision: Precision,
        summary: &'static str,
    ) -> Variant {
        let mut v = Variant::kernel(family, op, stage, name, "", precision, summary);
        v.source = Source::Host(what);
        v
    }

    /// The op's typed plan for this stage (what its `prepare` dispatches on).
    pub fn with_plan<P: Any + Send + Sync>(mut self, plan: P) -> Variant {
        self.plan = Some(Arc::new(plan));
        self
    }

    pub fn with_defines(mut self, defines: impl Into<Cow<'static, [Define]>>) -> Variant {
        self.defines = defines.into();
        self
    }

    pub fn with_tunables(mut self, tunables: &[(&'static str, u32)]) -> Variant {
        self.tunables =
            Cow::Owned(tunables.iter().map(|&(n, value)| Tunable { name: Cow::Borrowed(n), value }).collect());
        self
    }

    /// Declares the values `ladder sweep` tries for tunable `name` (which the stage must declare
    /// first: a sweep of a tunable the kernel does not read would time one configuration many times).
    pub fn with_sweep(mut self, name: &'static str, values: &[u32]) -> Variant {
        assert!(self.tunable(name).is_ok(), "{}: sweep axis {name} is not a declared tunable", self.id());
        let mut space = self.sweep_space.to_vec();
        space.push(Sweep { tunable: name.to_string(), values: values.to_vec() });
        self.sweep_space = Cow::Owned(space);
        self
    }

    /// This stage with the tunables of `config` set (a sweep point's or a saved configuration);
    /// a name the stage does not declare is an error listing the ones it does.
    pub fn with_config(&self, config: &[(String, u32)]) -> Result<Variant> {
        let mut v = self.clone();
        for (name, value) in config {
            v.set_tunable(name, *value)?;
        }
        Ok(v)
    }

    /// The tunables as `(name, value)` pairs, in declaration order (a row's configuration).
    pub fn config(&self) -> Vec<(String, u32)> {
        self.tunables.iter().map(|t| (t.name.to_string(), t.value)).collect()
    }

    pub fn with_toggles(mut self, toggles: impl Into<Cow<'static, [&'static str]>>) -> Variant {
        self.toggles = toggles.into();
        self
    }

    /// Declares which toggles build on which (`(switch, base)` pairs; see `toggle_bases`).
    pub fn with_toggle_bases(mut self, bases: impl Into<Cow<'static, [(&'static str, &'static str)]>>) -> Variant {
        self.toggle_bases = bases.into();
        self
    }

    pub fn with_requirements(mut self, requires: Requirements) -> Variant {
        self.requires = requires;
        self
    }

    pub fn with_tolerance(mut self, rel_l2: f64, reason: &'static str) -> Variant {
        self.tolerance = Some(Tolerance { rel_l2, reason });
        self
    }

    /// `family/op/NN-name`, used in errors and cache keys.
    pub fn id(&self) -> String {
        format!("{}/{}/{:02}-{}", self.family, self.op, self.stage, self.name)
    }

    pub fn tolerance(&self) -> f64 {
        self.tolerance.map(|t| t.rel_l2).unwrap_or_else(|| self.precision.tolerance())
    }

    /// Whether the switch or define `name` is set.
    pub fn define(&self, name: &str) -> Option<&str> {
        self.defines.iter().find(|d| d.name == name).map(|d| d.value.as_ref())
    }

    pub fn has(&self, switch: &str) -> bool {
        self.define(switch).is_some()
    }

    /// The value of tunable `name`: a typed error when the stage list did not declare it.
    pub fn tunable(&self, name: &str) -> Result<u32> {
        self.tunables
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.value)
            .ok_or_else(|| Error::constraint(format!("stage declares tunable {name}"), self.id()))
    }

    /// Replaces tunable `name` (a sweep point); an unknown name is an error listing the known ones.
    pub fn set_tunable(&mut self, name: &str, value: u32) -> Result<()> {
        set_named(&mut self.tunables, "tunable", name, |t| &t.name, |t| t.value = value)
    }

    /// Replaces the value of stage-list define `name` (what a host sets per shape where a define,
    /// not a tunable, carries it); an unknown name is an error listing the known ones.
    pub fn set_define(&mut self, name: &str, value: u32) -> Result<()> {
        set_named(&mut self.defines, "define", name, |d| &d.name, |d| d.value = Cow::Owned(value.to_string()))
    }

    /// Turns switch `name` on (`-DNAME=1`), added after the stage list's defines: what a host sets
    /// per call where the call, not the stage, decides (an output's type). Already on: unchanged.
    pub fn switch_on(&mut self, name: &str) {
        if !self.has(name) {
            let mut all = self.defines.to_vec();
            all.push(Define { name: Cow::Owned(name.to_string()), value: Cow::Borrowed("1") });
            self.defines = Cow::Owned(all);
        }
    }

    /// Every define NVRTC receives: the switches, then the tunables.
    pub fn compile_defines(&self) -> Vec<Define> {
        let tunables =
            self.tunables.iter().map(|t| Define { name: t.name.clone(), value: Cow::Owned(t.value.to_string()) });
        self.defines.iter().cloned().chain(tunables).collect()
    }

    /// The op's plan, typed: an error (not a panic) when the variant was declared by another op.
    pub fn plan<P: Any + Copy>(&self) -> Result<P> {
        self.plan.as_deref().and_then(|p| p.downcast_ref::<P>()).copied().ok_or_else(|| Error::Unknown {
            what: "plan for stage",
            name: self.id(),
            known: format!("stages declared in {}/{}'s stage list", self.family, self.op),
        })
    }
}

/// Derives rows from a declared stage: each derived variant keeps the stage number, gets its own
/// name and names the row it is compared against.
pub trait Generator {
    fn derive(&self, base: &Variant) -> Vec<Variant>;
}

/// A stage `N` or an inclusive range `A..B` (also `A..=B`) with `A <= B`: how the CLI's `--stages`
/// and the benches' `LADDER_BENCH_STAGES` pick stages.
pub fn parse_stages(s: &str) -> std::result::Result<(u32, u32), String> {
    let bad = || format!("'{s}' is not a stage N or an inclusive range A..B with A <= B");
    let num = |t: &str| t.trim().parse::<u32>().map_err(|_| bad());
    match s.split_once("..") {
        Some((a, b)) => {
            let (a, b) = (num(a)?, num(b.trim_start_matches('='))?);
            if a > b {
                return Err(bad());
            }
            Ok((a, b))
        }
        None => num(s).map(|n| (n, n)),
    }
}

/// All-on minus one: one variant per toggle of `base`, with that switch removed, and with it every
/// toggle that builds on it (`Variant::toggle_bases`, followed transitively).
pub struct LeaveOneOut;

impl LeaveOneOut {
    /// The toggles that build on `t`, directly or through others, in declaration order.
    fn built_on(base: &Variant, t: &str) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        let mut frontier = vec![t];
        while let Some(b) = frontier.pop() {
            for &(switch, on) in base.toggle_bases.iter() {
                if on == b && !out.contains(&switch) {
                    out.push(switch);
                    frontier.push(switch);
                }
            }
        }
        base.toggles.iter().copied().filter(|x| out.contains(x)).collect()
    }
}

impl Generator for LeaveOneOut {
    fn derive(&self, base: &Variant) -> Vec<Variant> {
        base.toggles
            .iter()
            .map(|&t| {
                let dependents = Self::built_on(base, t);
                let gone = |name: &str| name == t || dependents.contains(&name);
                let mut v = base.clone();
                v.defines = Cow::Owned(base.defines.iter().filter(|d| !gone(&d.name)).cloned().collect());
                v.toggles = Cow::Owned(base.toggles.iter().copied().filter(|x| !gone(x)).collect());
                v.name = Cow::Owned(format!("all-{t}"));
                let also = match dependents.as_slice() {
                    [] => String::new(),
                    [one] => format!(" (and {one}, which builds on it)"),
                    many => format!(" (and {}, which build on it)", many.join(", ")),
                };
                v.summary = Cow::Owned(format!("every optimization of {} except {t}{also}", base.name));
                v.compared_with = Some(base.name.to_string());
                v
            })
            .collect()
    }
}

/// One tunable of `base` set to each value in turn (`SM_WARPS=2,4,8`): `ladder run --sweep` rows,
/// and one axis of a [`Grid`]. Values equal to the declared one are kept (the table marks the default).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Sweep {
    pub tunable: String,
    pub values: Vec<u32>,
}

impl Generator for Sweep {
    fn derive(&self, base: &Variant) -> Vec<Variant> {
        Grid { axes: vec![self.clone()] }.derive(base)
    }
}

/// Every combination of several tunables' values (the cartesian product of the axes): the points a
/// configuration sweep verifies and times. A stage that lacks one of the axes' tunables yields none.
#[derive(Clone, Debug, Default)]
pub struct Grid {
    pub axes: Vec<Sweep>,
}

impl Grid {
    /// The grid of `base`'s declared sweep space.
    pub fn declared(base: &Variant) -> Grid {
        Grid { axes: base.sweep_space.to_vec() }
    }

    /// Number of points (before dropping stages that lack an axis).
    pub fn len(&self) -> usize {
        if self.axes.is_empty() {
            0
        } else {
            self.axes.iter().map(|a| a.values.len()).product()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Generator for Grid {
    fn derive(&self, base: &Variant) -> Vec<Variant> {
        if self.is_empty() || self.axes.iter().any(|a| base.tunable(&a.tunable).is_err()) {
            return Vec::new();
        }
        (0..self.len())
            .map(|mut index| {
                let mut v = base.clone();
                let mut parts = Vec::new();
                // Mixed radix, last axis fastest: the points come out in the order the axes list them.
                let mut picks = vec![0; self.axes.len()];
                for (i, axis) in self.axes.iter().enumerate().rev() {
                    picks[i] = axis.values[index % axis.values.len()];
                    index /= axis.values.len();
                }
                for (axis, &value) in self.axes.iter().zip(&picks) {
                    v.set_tunable(&axis.tunable, value).expect("checked above");
                    parts.push(format!("{}={value}", axis.tunable));
                }
                v.name = Cow::Owned(format!("{}[{}]", base.name, parts.join(",")));
                v.summary = Cow::Owned(format!("{} with {}", base.name, parts.join(", ")));
                v.compared_with = Some(base.name.to_string());
                v.sweep_point = true;
                v
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_ranges() {
        assert_eq!(parse_stages("21..90"), Ok((21, 90)));
        assert_eq!(parse_stages("21..=22"), Ok((21, 22)));
        assert_eq!(parse_stages(" 7 "), Ok((7, 7)));
        for bad in ["22..21", "a..3", "", "3..", "-1"] {
            assert!(parse_stages(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Plan {
        A,
    }

    fn base() -> Variant {
        Variant::kernel("f", "op", 3, "all", "op/03_all.cu", Precision::Fp32, "s")
            .with_defines(vec![Define::on("X"), Define::on("Y")])
            .with_toggles(vec!["X", "Y"])
            .with_tunables(&[("WARPS", 4)])
            .with_plan(Plan::A)
    }

    #[test]
    fn plan_is_typed() {
        assert_eq!(base().plan::<Plan>().unwrap(), Plan::A);
        assert!(matches!(base().plan::<u32>(), Err(Error::Unknown { .. })));
    }

    #[test]
    fn tunables_become_defines() {
        let d = base().compile_defines();
        assert!(d.iter().any(|d| d.name == "WARPS" && d.value == "4"));
        assert!(base().tunable("NOPE").is_err());
    }

    #[test]
    fn set_define_replaces_in_place_and_refuses_unknown_names() {
        let mut v = base();
        v.set_define("Y", 192).unwrap();
        let d = v.compile_defines();
        let pairs: Vec<(&str, &str)> = d.iter().map(|d| (d.name.as_ref(), d.value.as_ref())).collect();
        assert_eq!(pairs, [("X", "1"), ("Y", "192"), ("WARPS", "4")]);
        assert!(matches!(v.set_define("WARPS", 8), Err(Error::Unknown { .. })), "a tunable is not a define");
    }

    #[test]
    fn switch_on_adds_a_switch_once() {
        let mut v = base();
        v.switch_on("Z");
        v.switch_on("Z");
        v.switch_on("X");
        let d = v.compile_defines();
        let pairs: Vec<(&str, &str)> = d.iter().map(|d| (d.name.as_ref(), d.value.as_ref())).collect();
        assert_eq!(pairs, [("X", "1"), ("Y", "1"), ("Z", "1"), ("WARPS", "4")]);
    }

    #[test]
    fn leaving_a_switch_out_leaves_out_what_builds_on_it() {
        let v = Variant::kernel("f", "op", 3, "all", "op/03_all.cu", Precision::Fp32, "s")
            .with_defines(vec![Define::on("A"), Define::on("B"), Define::on("C"), Define::on("D")])
            .with_toggles(vec!["A", "B", "C", "D"])
            .with_toggle_bases(vec![("B", "A"), ("C", "B")]);
        let loo = LeaveOneOut.derive(&v);
        let names = |v: &Variant| v.defines.iter().map(|d| d.name.to_string()).collect::<Vec<_>>();
        assert_eq!(names(&loo[0]), ["D"], "A takes B, and C through B");
        assert_eq!(loo[0].summary, "every optimization of all except A (and B, C, which build on it)");
        assert_eq!(names(&loo[1]), ["A", "D"]);
        assert_eq!(loo[1].summary, "every optimization of all except B (and C, which builds on it)");
        assert_eq!(names(&loo[2]), ["A", "B", "D"]);
        assert_eq!(names(&loo[3]), ["A", "B", "C"]);
        assert_eq!(loo[3].toggles.as_ref(), ["A", "B", "C"]);
        assert_eq!(loo[3].summary, "every optimization of all except D");
    }

    #[test]
    fn generators_name_their_reference_row() {
        let loo = LeaveOneOut.derive(&base());
        assert_eq!(loo.len(), 2);
        assert!(loo.iter().all(|v| v.compared_with.as_deref() == Some("all") && v.defines.len() == 1));
        assert_eq!(loo[0].plan::<Plan>().unwrap(), Plan::A, "derived rows keep the plan");
        let sweep = Sweep { tunable: "WARPS".into(), values: vec![2, 8] }.derive(&base());
        assert_eq!(sweep[1].tunable("WARPS").unwrap(), 8);
        assert_eq!(sweep[1].name, "all[WARPS=8]");
        assert!(sweep.iter().all(|v| v.sweep_point) && !base().sweep_point);
        assert!(Sweep { tunable: "NOPE".into(), values: vec![1] }.derive(&base()).is_empty());
    }

    #[test]
    fn grid_is_the_cartesian_product_in_axis_order() {
        let v = base().with_tunables(&[("WARPS", 4), ("UNROLL", 2)]).with_sweep("WARPS", &[2, 4]);
        assert_eq!(Grid::declared(&v).len(), 2);
        let grid = Grid {
            axes: vec![
                Sweep { tunable: "WARPS".into(), values: vec![2, 4] },
                Sweep { tunable: "UNROLL".into(), values: vec![1, 2, 8] },
            ],
        };
        let points = grid.derive(&v);
        assert_eq!(points.len(), 6);
        assert_eq!(points[0].name, "all[WARPS=2,UNROLL=1]");
        assert_eq!(points[5].config(), vec![("WARPS".to_string(), 4), ("UNROLL".to_string(), 8)]);
        assert!(points.iter().all(|p| p.sweep_point && p.compared_with.as_deref() == Some("all")));
        let missing = Grid { axes: vec![Sweep { tunable: "NOPE".into(), values: vec![1] }] };
        assert!(missing.derive(&v).is_empty() && Grid::default().derive(&v).is_empty());
    }

    #[test]
    #[should_panic(expected = "not a declared tunable")]
    fn a_sweep_axis_must_be_a_tunable() {
        let _ = base().with_sweep("NOPE", &[1]);
    }
}
