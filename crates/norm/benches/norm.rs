//! `cargo bench -p norm`: every stage of LayerNorm and softmax at the GPT-2 and bandwidth shapes.

use common::bench::{bench_op, Sampling};
use common::Op;
use criterion::{criterion_group, criterion_main, Criterion};

fn norm(c: &mut Criterion) {
    for op in [&norm::layernorm::LayerNorm as &dyn Op, &norm::softmax::Softmax] {
        bench_op(c, op, &op.default_shapes(), &op.variants(), |_, _| Sampling::default());
    }
}

criterion_group!(benches, norm);
criterion_main!(benches);
