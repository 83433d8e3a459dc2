//! norm on the GPU: every LayerNorm and softmax stage against the f64 reference at the default
//! shapes and at ragged property-test shapes, the documented limits, and a graph replay. Ignored
//! (not passed) without a GPU; failing with `LADDER_REQUIRE_GPU=1`.

use common::testing::{assert_graph_replay_passes, assert_limits_on_gpu, assert_stages_pass, proptest, Suite};
use common::{Op, Shape};
use norm::layernorm::LayerNorm;
use norm::softmax::Softmax;
use proptest::prelude::*;

/// Sizes that hit every raggedness: 1, odd, not multiples of 4, 32 or 128, and the boundaries
/// around them, up to 8192.
fn ragged() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        Just(3),
        Just(31),
        Just(33),
        Just(127),
        Just(129),
        Just(770),
        Just(8191),
        Just(8192),
        1usize..=8192,
    ]
}

fn main() -> std::process::ExitCode {
    Suite::new()
        .gpu("layernorm_default_shapes", |gpu| {
            for s in LayerNorm.default_shapes() {
                assert_stages_pass(gpu, &LayerNorm, &s, &LayerNorm.variants());
            }
        })
        .gpu("softmax_default_shapes", |gpu| {
            for s in Softmax.default_shapes() {
                assert_stages_pass(gpu, &Softmax, &s, &Softmax.variants());
            }
        })
        .gpu("layernorm_ragged", |gpu| {
            proptest(24, (1usize..=4096, ragged(), any::<bool>()), |(rows, c, bf16)| {
                let rows = rows.min((1 << 22) / c).max(1);
                let out = if bf16 { 16 } else { 32 };
                let shape = Shape::new(&[("rows", rows as i64), ("C", c as i64), ("out", out)]);
                assert_stages_pass(gpu, &LayerNorm, &shape, &LayerNorm.variants());
            })
        })
        .gpu("softmax_ragged", |gpu| {
            let strategy = (1usize..=8, ragged(), any::<bool>(), any::<bool>());
            proptest(24, strategy, |(blocks, t, causal, big)| {
                // Causal shapes come in whole blocks of T rows; non-causal ones take any row count.
                let rows = if causal { blocks * t } else { blocks * 97 % 4096 + 1 };
                let rows = if rows * t > 1 << 23 {
                    if causal {
                        t
                    } else {
                        1
                    }
                } else {
                    rows
                };
                let shape = Shape::new(&[
                    ("rows", rows as i64),
                    ("T", t as i64),
                    ("causal", causal as i64),
                    ("magnitude", if big { 10_000 } else { 8 }),
                ]);
                assert_stages_pass(gpu, &Softmax, &shape, &Softmax.variants());
            })
        })
        .gpu("limits_past_refused_inside_verified", |gpu| assert_limits_on_gpu(gpu, &norm::Norm))
        .gpu("graph_replay_every_stage", |gpu| {
            for op in [&LayerNorm as &dyn Op, &Softmax] {
                for v in op.variants() {
                    // The first default shape the stage runs (stage 7 stores bf16: `out` = 16).
                    let shapes = op.default_shapes();
                    let shape = shapes.iter().find(|s| op.validate(&v, s).is_ok()).expect("a shape for every stage");
                    assert_graph_replay_passes(gpu, op, shape, &v);
                }
            }
        })
        .main()
}
