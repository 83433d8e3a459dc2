//! `cargo bench -p matmul`: every stage of the linear layer at the GPT-2 124M shapes (B·T = 4096)
//! and 4096³, cuBLAS rows included; the epilogue variants at the shapes GPT-2 fuses them; then the
//! bf16 tensor-core ladder (`linear-bf16`, cuBLASLt row included) at its default shapes.

use common::bench::{bench_op, Sampling};
use common::Op;
use criterion::{criterion_group, criterion_main, Criterion};
use std::time::Duration;

fn matmul(c: &mut Criterion) {
    for op in [&matmul::linear::Linear as &dyn Op, &matmul::epilogue::LinearEpilogue] {
        // The naive and shared-memory stages take tens to hundreds of ms at these shapes.
        bench_op(c, op, &op.default_shapes(), &op.variants(), |_, v| {
            if op.name() == "linear" && v.stage <= 1 {
                Sampling::slow()
            } else {
                Sampling::default()
            }
        });
    }
    // Every stage at every default shape: one second a point keeps the group to minutes (about
    // eight on the H100 with the 2026-11-23 stage list), and the slowest point (an 8192^3 mma.sync
    // stage, ~7 ms) still gets its 20 samples.
    let bf16 = &matmul::linear_bf16::LinearBf16;
    let quick = Sampling {
        sample_size: 20,
        measurement: Duration::from_secs(1),
        warm_up: Duration::from_millis(200),
        flat: false,
    };
    bench_op(c, bf16, &bf16.default_shapes(), &bf16.variants(), |_, _| quick);
}

criterion_group!(benches, matmul);
criterion_main!(benches);
