//! The bad-input generator shared by the host fuzz (`bad_shapes.rs`: validation only, every edge)
//! and the GPU fuzz (`gpu_fuzz.rs`: the same edges, small enough to launch and verify).

use common::{Op, Shape, Variant};
use rand::Rng;

pub fn every_stage() -> Vec<(&'static dyn Op, Vec<Variant>)> {
    kernel_ladder::families()
        .iter()
        .flat_map(|f| f.ops())
        .map(|op| (op, op.variants().into_iter().chain(op.leave_one_out()).collect()))
        .collect()
}

/// The edges a launch can afford: on and just past the multiples of 2, 4, 8, 16, 32 and 64 that
/// tiles and vector widths are written against, and the invalid ones below 1.
pub const SMALL_EDGES: [i64; 16] = [-1, 0, 1, 2, 3, 5, 7, 8, 9, 17, 31, 33, 63, 64, 65, 129];

/// `base` with each key redrawn: an edge (`edges`), a random value in `1..=max`, or (when its
/// default is at most `max`) the default kept, so that shapes reach the stages' valid region too.
pub fn draw(rng: &mut impl Rng, op: &dyn Op, base: &Shape, edges: &[i64], max: i64) -> Shape {
    let mut s = base.clone();
    for key in op.shape_keys() {
        let default = base.get(key).unwrap_or(1);
        let value = match rng.random_range(0..3) {
            0 => edges[rng.random_range(0..edges.len())],
            1 => rng.random_range(1..=max),
            _ if default <= max => default,
            _ => rng.random_range(1..=max),
        };
        s.set(key, value);
    }
    s
}
