//! kernel-ladder: the registry of kernel families that the `ladder` CLI, the cross-family benches
//! and the workspace tests read, and the CLI's instruments over saved tables and compiled stages
//! (charts, matrices, sweeps, baselines, comparisons, ptxas resources, SASS), which no family needs.

use common::Family;

pub mod baseline;
pub mod chart;
pub mod compare;
pub mod matrix;
pub mod overhead;
pub mod resources;
pub mod sass;
pub mod sweep;

/// Every family, in the order the CLI lists them. Adding a family is one line here.
pub fn families() -> Vec<&'static dyn Family> {
    vec![&norm::Norm, &matmul::Matmul, &attention::Attention, &quant_int4::QuantInt4, &gpt2::Gpt2]
}

/// The family called `name`.
pub fn family(name: &str) -> common::Result<&'static dyn Family> {
    families().into_iter().find(|f| f.name() == name).ok_or_else(|| common::Error::Unknown {
        what: "family",
        name: name.to_string(),
        known: families().iter().map(|f| f.name()).collect::<Vec<_>>().join(", "),
    })
}
