//! `cargo bench -p gpt2`: every stage of GPT-2's own kernels at the GPT-2 124M shape.

use common::bench::{bench_op, Sampling};
use common::Op;
use criterion::{criterion_group, criterion_main, Criterion};

fn gpt2(c: &mut Criterion) {
    let op = &gpt2::encoder::Encoder;
    bench_op(c, op, &op.default_shapes(), &op.variants(), |_, _| Sampling::default());
}

criterion_group!(benches, gpt2);
criterion_main!(benches);
