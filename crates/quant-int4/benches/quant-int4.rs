//! `cargo bench -p quant-int4`: the cumulative decode ladder at B = 32, 64, 128, 256, 512 (Tmax =
//! seq = 8192, HQ = 8, HKV = 1, D = 128, heuristic splits), one criterion group per (B, format):
//! the fmt=1 groups run the bf16 baseline and the row-wise ladder, the fmt=4 groups the bf16
//! baseline and the group-wise ladder (stages of the other format are skipped with a note).

use common::bench::{bench_op, Sampling};
use common::Op;
use criterion::{criterion_group, criterion_main, Criterion};
use quant_int4::decode::{shape, Decode};
use quant_int4::format::KvFormat;

fn decode(c: &mut Criterion) {
    let mut shapes = Vec::new();
    for b in [32, 64, 128, 256, 512] {
        for fmt in [KvFormat::Int4 { groups: 1 }, KvFormat::Int4 { groups: 4 }] {
            shapes.push(shape(b, 8192, 8192, false, 8, 1, 128, fmt, 0));
        }
    }
    bench_op(c, &Decode, &shapes, &Decode.variants(), |_, _| Sampling::default());
}

criterion_group!(benches, decode);
criterion_main!(benches);
