//! Helpers both matmul test binaries use.
#![allow(dead_code)] // each binary uses its own subset

use common::{Op, Shape, Variant};

pub fn all_variants(op: &dyn Op) -> Vec<Variant> {
    op.variants().into_iter().chain(op.leave_one_out()).collect()
}

pub fn lin(m: i64, n: i64, k: i64, bias: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("bias", bias)])
}

pub fn epi(m: i64, n: i64, k: i64, e: i64) -> Shape {
    Shape::new(&[("M", m), ("N", n), ("K", k), ("epi", e)])
}

/// The text of a typed constraint error; anything else fails the test.
pub fn constraint(r: common::Result<()>) -> String {
    match r {
        Err(e @ common::Error::Constraint { .. }) => e.to_string(),
        other => panic!("expected a constraint error, got {other:?}"),
    }
}
