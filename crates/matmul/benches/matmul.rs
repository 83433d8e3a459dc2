//! `cargo bench -p matmul`: every stage of the linear layer at the GPT-2 124M shapes (B·T = 4096)
//! and 4096³, cuBLAS rows included; then the epilogue variants at the shapes GPT-2 fuses them.

use common::bench::{bench_op, Sampling};
use common::Op;
use criterion::{criterion_group, criterion_main, Criterion};

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
}

criterion_group!(benches, matmul);
criterion_main!(benches);
