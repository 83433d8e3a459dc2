//! kernel-ladder: the registry of kernel families that the `ladder` CLI, the cross-family benches
//! and the workspace tests read.

use common::Family;

pub mod sass;

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
