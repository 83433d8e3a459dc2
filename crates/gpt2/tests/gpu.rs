//! gpt2 on the GPU: the encoder, GELU and residual against the f64 reference at the default and ragged shapes, token
//! ids checked on upload, the documented limits, and a graph replay. Ignored (not passed) without a
//! GPU; failing with `LADDER_REQUIRE_GPU=1`.

use common::testing::{assert_graph_replay_passes, assert_limits_on_gpu, assert_stages_pass, proptest, Suite};
use common::{Op, Shape};
use gpt2::encoder::{Encoder, TokenIds};
use gpt2::pointwise::{Gelu, Residual};

fn main() -> std::process::ExitCode {
    Suite::new()
        .gpu("encoder_default_shape", |gpu| {
            for s in Encoder.default_shapes() {
                assert_stages_pass(gpu, &Encoder, &s, &Encoder.variants());
            }
        })
        .gpu("encoder_ragged", |gpu| {
            proptest(16, (1i64..=4, 1i64..=300, 1i64..=777, 1i64..=1000), |(b, t, c, v)| {
                let shape = Shape::new(&[("B", b), ("T", t), ("C", c), ("V", v)]);
                assert_stages_pass(gpu, &Encoder, &shape, &Encoder.variants());
            })
        })
        .gpu("token_ids_out_of_range_are_refused_on_upload", |gpu| {
            for ids in [[0, 7, 3], [0, -1, 2], [0, 1, 8]] {
                let r = TokenIds::upload(gpu, &ids, 8);
                assert_eq!(r.is_ok(), ids.iter().all(|&i| (0..8).contains(&i)), "{ids:?}");
            }
        })
        .gpu("pointwise_default_and_ragged", |gpu| {
            let ops: [&dyn Op; 2] = [&Gelu, &Residual];
            for op in ops {
                for s in op.default_shapes() {
                    assert_stages_pass(gpu, op, &s, &op.variants());
                }
            }
            // Sizes that are not multiples of 4 (the vectorized stages' tail) or of the block.
            proptest(16, 1i64..=100_003, |n| {
                let s = Shape::new(&[("N", n)]);
                for op in ops {
                    assert_stages_pass(gpu, op, &s, &op.variants());
                }
            })
        })
        .gpu("limits_past_refused_inside_verified", |gpu| assert_limits_on_gpu(gpu, &gpt2::Gpt2))
        .gpu("graph_replay_every_stage", |gpu| {
            for v in Encoder.variants() {
                assert_graph_replay_passes(gpu, &Encoder, &Encoder.default_shapes()[0], &v);
            }
            let ops: [&dyn Op; 2] = [&Gelu, &Residual];
            for op in ops {
                for v in op.variants() {
                    assert_graph_replay_passes(gpu, op, &Shape::new(&[("N", 1001)]), &v);
                }
            }
        })
        .main()
}
