//! `cargo bench -p gpt2`: every stage of GPT-2's own kernels (encoder, GELU, residual add) at the
//! GPT-2 124M shapes. The composed model is benched at the workspace root (`benches/ladder.rs`).

use common::bench::{bench_op, Sampling};
use common::Family;
use criterion::{criterion_group, criterion_main, Criterion};

fn gpt2(c: &mut Criterion) {
    for op in gpt2::Gpt2.ops() {
        bench_op(c, op, &op.default_shapes(), &op.variants(), |_, _| Sampling::default());
    }
}

criterion_group!(benches, gpt2);
criterion_main!(benches);
