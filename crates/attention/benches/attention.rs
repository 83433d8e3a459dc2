//! `cargo bench -p attention`: every prefill, prefill-bf16 and decode stage at each default shape (a
//! criterion group per shape). The slow stages get criterion's flat sampling with 10 samples instead
//! of being dropped: the unfused prefill stages (0–2) at T = 1024, tens to hundreds of milliseconds a
//! run, prefill-bf16's mma.sync stages (0–1) at HS = 128 (milliseconds), the naive decode stage
//! (milliseconds at the long-context shapes), and every decode-offload stage (each run moves up to
//! half a gigabyte over the host link).

use attention::decode::Decode;
use attention::offload::DecodeOffload;
use attention::prefill::Prefill;
use attention::prefill_bf16::PrefillBf16;
use common::bench::{bench_op, Sampling};
use common::Op;
use criterion::{criterion_group, criterion_main, Criterion};

fn prefill(c: &mut Criterion) {
    let op = &Prefill;
    bench_op(c, op, &op.default_shapes(), &op.variants(), |shape, v| {
        if v.stage <= 2 && shape.get("T").unwrap_or(0) >= 1024 {
            Sampling::slow()
        } else {
            Sampling::default()
        }
    });
}

fn prefill_bf16(c: &mut Criterion) {
    let op = &PrefillBf16;
    bench_op(c, op, &op.default_shapes(), &op.variants(), |shape, v| {
        if v.stage <= 1 && shape.get("HS") == Some(128) {
            Sampling::slow()
        } else {
            Sampling::default()
        }
    });
}

fn decode(c: &mut Criterion) {
    let op = &Decode;
    bench_op(c, op, &op.default_shapes(), &op.variants(), |_, v| {
        if v.stage == 0 {
            Sampling::slow()
        } else {
            Sampling::default()
        }
    });
}

fn decode_offload(c: &mut Criterion) {
    let op = &DecodeOffload;
    bench_op(c, op, &op.default_shapes(), &op.variants(), |_, _| Sampling::slow());
}

criterion_group!(benches, prefill, prefill_bf16, decode, decode_offload);
criterion_main!(benches);
