//! quant-int4 on the GPU: the quantizer matches the CPU bytes, every decode stage (and every
//! leave-one-out variant) passes at small default-like, edge and ragged shapes, bad buffers are
//! typed errors that launch nothing, the documented limits, and graph replays. Ignored (not passed)
//! without a GPU; failing with `LADDER_REQUIRE_GPU=1`.

use common::testing::{assert_graph_replay_passes, assert_limits_on_gpu, assert_stages_pass, proptest, Suite};
use common::{Error, Gpu, Op, Variant};
use half::bf16;
use proptest::prelude::*;
use quant_int4::decode::{self, Decode, Dims};
use quant_int4::format::{KvFormat, Layout};
use quant_int4::quantize::{qshape, Quantize};

const ROW: KvFormat = KvFormat::Int4 { groups: 1 };
const GROUP: KvFormat = KvFormat::Int4 { groups: 4 };

fn all_decode_variants() -> Vec<Variant> {
    Decode.variants().into_iter().chain(Decode.leave_one_out()).collect()
}

fn is_constraint(r: common::Result<()>, needle: &str) {
    match r {
        Err(Error::Constraint { constraint, got }) => {
            assert!(constraint.contains(needle), "constraint '{constraint}' (got {got}) should mention '{needle}'")
        }
        other => panic!("expected a constraint error mentioning '{needle}', got {other:?}"),
    }
}

fn bad_buffers(gpu: &Gpu) {
    let dm = Dims { b: 2, tmax: 16, hq: 8, hkv: 1, d: 128 };
    let stage = &Decode.variants()[1];
    let q = gpu
        .upload(&common::data::uniform(2 * 8 * 128, -1.0, 1.0, 9).into_iter().map(bf16::from_f32).collect::<Vec<_>>())
        .unwrap();
    let mut out = gpu.alloc_poisoned::<bf16>(2 * 8 * 128).unwrap();
    let good = gpu.alloc_poisoned::<u8>(32 * 68).unwrap();
    let short = gpu.alloc_poisoned::<u8>(32 * 68 - 4).unwrap();
    let lens = decode::SeqLens::new(gpu, &[16, 3], 16).unwrap();
    assert!(decode::SeqLens::new(gpu, &[17, 3], 16).is_err());
    // 0 asks for the stage's own count: a whole wave of its blocks, here capped by Tmax / 128.
    assert_eq!(decode::prepare(gpu, stage, dm, 0).unwrap().splits(), 1);
    is_constraint(decode::prepare(gpu, stage, dm, 257).map(|_| ()), "splits <= 256");
    let p = decode::prepare(gpu, stage, dm, 4).unwrap();
    let cache = |d| decode::Cache::Int4 { data: d, groups: 1, layout: Layout::Rows };
    let s = gpu.stream();
    let run = |k, v, out: &mut _| p.enqueue(s, decode::DecodeArgs { out, q: &q, k, v, seq_lens: &lens });
    is_constraint(run(cache(&short), cache(&good), &mut out), "K cache bytes");
    is_constraint(run(cache(&good), cache(&short), &mut out), "V cache bytes");
    let group = decode::Cache::Int4 { data: &good, groups: 4, layout: Layout::Rows };
    is_constraint(run(group, cache(&good), &mut out), "K cache format");
    // The fragment stage takes only the fragment layout (here the same length: Tmax = 16 is one chunk).
    let frag_stage = Decode.variants().into_iter().find(|v| v.name == "int4-row-fragments").unwrap();
    let pf = decode::prepare(gpu, &frag_stage, dm, 4).unwrap();
    let frag = |d| decode::Cache::Int4 { data: d, groups: 1, layout: Layout::Fragments };
    let run_f = |k, v, out: &mut _| pf.enqueue(s, decode::DecodeArgs { out, q: &q, k, v, seq_lens: &lens });
    is_constraint(run_f(cache(&good), frag(&good), &mut out), "K cache layout == Fragments");
    is_constraint(run_f(frag(&good), frag(&short), &mut out), "V cache bytes");
    gpu.synchronize().unwrap();
    assert!(gpu.download(&out).unwrap().iter().all(|x| x.is_nan()), "nothing was launched");
}

fn main() -> std::process::ExitCode {
    Suite::new()
        .gpu("gpu_quantizer_matches_cpu_bytes", |gpu| {
            // Ragged chunk tails (4099 = 16 * 256 + 3 tokens), several KV heads, one row.
            for (rows, d, g, hkv) in [
                (4099, 128, 1, 1),
                (4099, 128, 4, 1),
                (1001, 64, 1, 7),
                (1001, 64, 4, 1),
                (999, 128, 4, 3),
                (1, 128, 4, 1),
            ] {
                assert_stages_pass(gpu, &Quantize, &qshape(rows, d, g, hkv), &Quantize.variants());
            }
        })
        .gpu("gpu_decode_default_like_shapes", |gpu| {
            let all = all_decode_variants();
            for fmt in [KvFormat::Bf16, ROW, GROUP] {
                // The default head layout (HQ = 8, HKV = 1, D = 128) at small B, ragged lengths.
                for (b, tmax, seq, splits) in [(2, 2048, 2048, 0), (3, 2100, 1999, 7), (4, 1500, 1000, 33)] {
                    let s = decode::shape(b, tmax, seq, true, 8, 1, 128, fmt, splits);
                    assert_stages_pass(gpu, &Decode, &s, &all);
                }
                // One long split (many passes) and D = 64 (GPT-2) with several KV heads.
                assert_stages_pass(gpu, &Decode, &decode::shape(2, 1800, 1800, false, 8, 1, 128, fmt, 1), &all);
                assert_stages_pass(gpu, &Decode, &decode::shape(3, 700, 650, true, 12, 12, 64, fmt, 3), &all);
            }
        })
        .gpu("gpu_decode_edge_cases", |gpu| {
            let v = Decode.variants();
            for fmt in [KvFormat::Bf16, ROW, GROUP] {
                // One token per sequence; more splits than tokens (empty splits); a lone query head.
                assert_stages_pass(gpu, &Decode, &decode::shape(3, 1, 1, false, 8, 1, 128, fmt, 0), &v);
                assert_stages_pass(gpu, &Decode, &decode::shape(2, 40, 20, true, 4, 2, 64, fmt, 40), &v);
                assert_stages_pass(gpu, &Decode, &decode::shape(2, 300, 257, true, 1, 1, 128, fmt, 2), &v);
            }
        })
        .gpu("gpu_enqueue_rejects_bad_buffers", bad_buffers)
        .gpu("gpu_decode_ragged_shapes", |gpu| {
            let strategy = (
                1usize..=8,
                1usize..=2048,
                0usize..64,
                prop::sample::select(vec![1usize, 2, 4, 8]),
                prop::sample::select(vec![1usize, 2, 4]),
                prop::sample::select(vec![64usize, 128]),
                prop::sample::select(vec![KvFormat::Bf16, ROW, GROUP]),
                0usize..=48,
            );
            proptest(16, strategy, |(b, seq, extra, ratio, hkv, d, fmt, splits)| {
                let s = decode::shape(b, seq + extra, seq, true, ratio * hkv, hkv, d, fmt, splits);
                assert_stages_pass(gpu, &Decode, &s, &Decode.variants());
            })
        })
        .gpu("limits_past_refused_inside_verified", |gpu| assert_limits_on_gpu(gpu, &quant_int4::QuantInt4))
        .gpu("graph_replay_every_stage", |gpu| {
            for fmt in [ROW, GROUP] {
                let shape = decode::shape(3, 700, 650, true, 8, 2, 64, fmt, 3);
                for v in Decode.variants().iter().filter(|v| Decode.validate(v, &shape).is_ok()) {
                    assert_graph_replay_passes(gpu, &Decode, &shape, v);
                }
            }
            let q = qshape(1001, 128, 4, 1);
            for v in Quantize.variants() {
                assert_graph_replay_passes(gpu, &Quantize, &q, &v);
            }
        })
        .main()
}
