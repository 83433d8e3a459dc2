//! matmul on the GPU: every stage of both ops at the GPT-2 shapes (M = 64 with the real N, K; full
//! M = 4096 shapes), at ragged hand-picked shapes, in property tests over M, N, K in 1..512, bad
//! buffers as typed errors that launch nothing, the documented limits, and graph replays. Ignored
//! (not passed) without a GPU; failing with `LADDER_REQUIRE_GPU=1`.

mod support;

use common::cudarc::driver::CudaSlice;
use common::testing::{assert_graph_replay_passes, assert_limits_on_gpu, assert_stages_pass, proptest, Suite};
use common::{Gpu, Op, Shape};
use matmul::epilogue::{self, Epilogue, EpilogueArgs, EpilogueDims, LinearEpilogue};
use matmul::linear::{self, Linear, LinearArgs, LinearDims};
use support::{all_variants, constraint, epi, lin};

fn pass(gpu: &Gpu, op: &dyn Op, shape: &Shape) {
    assert_stages_pass(gpu, op, shape, &all_variants(op));
}

/// A GEMV shape of the proptests' input kind: 0 fp32 inp, 1 bf16 inp, else the LayerNorm folded in
/// (its bias the folded shift, so `bias` is unused).
fn gemv_shape(input: i64, m: i64, n: i64, k: i64, bias: i64, epi: i64) -> Shape {
    use matmul::gemv;
    match input {
        0 => gemv::shape_with_tail(m, n, k, bias, epi),
        1 => gemv::shape_bf16_in(m, n, k, bias, epi),
        _ => gemv::shape_ln(m, n, k, epi),
    }
}

/// linear-fp8 stage 7's e4m3 out is, byte for byte, `quantize-fp8` stage 1's quantization of the
/// same stage's bf16 out (its header's claim: the values rounded to bf16, then quantize-fp8's
/// arithmetic), with and without GELU, at a ragged M, a last scale group of 16 columns and the MLP
/// up's shape at M = 256; codes and scales poisoned before the run.
fn linear_fp8_e4m3_out_is_quantized_bf16_out(gpu: &Gpu) {
    use common::data::uniform;
    use common::lt::Output;
    use matmul::fp8::{groups, quantize_blocks, quantize_rows};
    use matmul::linear_bf16::Tail;
    use matmul::linear_fp8::{prepare, Bias, LinearFp8, LinearFp8Args, LinearFp8Dims, OutBuf};
    use matmul::quantize_fp8::{self, QuantizeDims, QuantizeFp8};
    let stage = LinearFp8.variants().into_iter().find(|v| v.stage == 7).expect("stage 7");
    let rows_stage = QuantizeFp8.variants().into_iter().find(|v| v.stage == 1).expect("quantize-fp8 stage 1");
    let stream = gpu.stream().clone();
    for (i, (m, n, k, tail)) in
        [(129, 272, 144, Tail::Gelu), (300, 400, 1008, Tail::None), (256, 3072, 768, Tail::Gelu)]
            .into_iter()
            .enumerate()
    {
        let seed = 0x5eed + i as u64;
        let (qa, qw) = (
            quantize_rows(&uniform(m * k, -1.0, 1.0, seed), m, k),
            quantize_blocks(&uniform(n * k, -0.1, 0.1, seed ^ 1), n, k),
        );
        let bias = gpu.upload(&uniform(n, -0.5, 0.5, seed ^ 2)).unwrap();
        let (a_codes, a_scales) = (gpu.upload(&qa.codes).unwrap(), gpu.upload(&qa.scales).unwrap());
        let (w_codes, w_scales) = (gpu.upload(&qw.codes).unwrap(), gpu.upload(&qw.scales).unwrap());
        let run = |out_type: Output, out: OutBuf| {
            let d = LinearFp8Dims { m, n, k, bias: true, tail, out: out_type };
            let p = prepare(gpu, &stage, d).unwrap();
            let args = LinearFp8Args {
                out,
                a_codes: &a_codes,
                a_scales: &a_scales,
                w_codes: &w_codes,
                w_scales: &w_scales,
                bias: Some(Bias::F32(&bias)),
                residual: None,
            };
            p.enqueue(&stream, args).unwrap();
        };
        let mut bf16: CudaSlice<u16> = gpu.alloc_poisoned(m * n).unwrap();
        run(Output::Bf16, OutBuf::new(&mut bf16));
        let q = quantize_fp8::prepare(gpu, &rows_stage, QuantizeDims { m, k: n, blocks: false, ln: false }).unwrap();
        let (mut want_codes, mut want_scales) =
            (gpu.alloc_poisoned::<u8>(m * n).unwrap(), gpu.alloc_poisoned::<f32>(m * groups(n)).unwrap());
        q.enqueue(&stream, &mut want_codes, &mut want_scales, &bf16).unwrap();
        let (mut codes, mut scales) =
            (gpu.alloc_poisoned::<u8>(m * n).unwrap(), gpu.alloc_poisoned::<f32>(m * groups(n)).unwrap());
        run(Output::E4m3, OutBuf::e4m3(&mut codes, &mut scales));
        let (got, want) = (gpu.download(&codes).unwrap(), gpu.download(&want_codes).unwrap());
        let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "M={m} N={n} K={k} {tail:?}: {differ} of {} codes differ", got.len());
        let (got, want) = (gpu.download(&scales).unwrap(), gpu.download(&want_scales).unwrap());
        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "M={m} N={n} K={k} {tail:?}: scales differ");
    }
}

/// `ladder timeline` on the persistent stages: at a ragged shape of two or more tiles a block (and,
/// for the cooperative stage, at one of a tile a block), every block stamps each phase of its
/// producer and its two consumers, in the order the kernel runs them, inside the run's own event
/// time, and the instrumented build verifies.
fn timeline_stamps_every_phase_in_order(gpu: &Gpu) {
    use common::timeline::record;
    use matmul::linear_bf16::{shape, LinearBf16};
    let sms = gpu.info().sm_count as usize;
    // Stage 16's consumers take turns, so its second consumer needs a block of two tiles.
    for ((m, n, k), stages) in [((4100, 2000, 136), &[14, 16][..]), ((4096, 768, 64), &[14][..])] {
        let s = shape(m, n, k, 1);
        let mut problem = LinearBf16.problem(gpu, &s, common::data::fresh_seed()).unwrap();
        for v in LinearBf16.variants().into_iter().filter(|v| stages.contains(&v.stage)) {
            let t = record(gpu, &LinearBf16, problem.as_mut(), &v, &s, 5, 2).unwrap();
            let phase = |slot: usize| t.phases.iter().find(|p| p.slot == slot).unwrap();
            assert!(t.blocks >= 1 && t.blocks <= sms, "{}: {} blocks", v.id(), t.blocks);
            // Blocks 0, 1, the producer's two, then each consumer's three.
            assert_eq!(t.phases.len(), 10, "{}: the header's ten slots", v.id());
            for slot in 0..10 {
                assert_eq!(phase(slot).blocks, t.blocks, "{}: slot {slot} ({})", v.id(), phase(slot).name);
            }
            let order = [0, 1, 2, 3];
            for c in 0..2 {
                let chain = [0, 1, 4 + 3 * c, 5 + 3 * c, 6 + 3 * c];
                for pair in chain.windows(2).chain(order.windows(2)) {
                    let (a, b) = (phase(pair[0]), phase(pair[1]));
                    assert!(
                        a.first_us <= b.first_us && a.last_us <= b.last_us,
                        "{}: {} after {}",
                        v.id(),
                        a.name,
                        b.name
                    );
                }
            }
            assert!(t.span_us > 0.0 && t.span_us < t.event.max_ms * 1e3, "{}: span {} us", v.id(), t.span_us);
        }
    }
}

fn bad_buffers(gpu: &Gpu) {
    let (m, n, k) = (8usize, 16usize, 24usize);
    let inp = gpu.upload(&vec![1.0f32; m * k]).unwrap();
    let long_inp = gpu.upload(&vec![1.0f32; m * k + 1]).unwrap();
    let w = gpu.upload(&vec![1.0f32; n * k]).unwrap();
    let bias = gpu.upload(&vec![1.0f32; n]).unwrap();
    let short_bias = gpu.upload(&vec![1.0f32; n - 1]).unwrap();
    let stream = gpu.stream();
    for v in Linear.variants() {
        let p = linear::prepare(gpu, &v, LinearDims { m, n, k, bias: true }).unwrap();
        let mut out = gpu.alloc_poisoned::<f32>(m * n).unwrap();
        let mut call = |x: &CudaSlice<f32>, b: Option<&CudaSlice<f32>>| {
            p.enqueue(stream, LinearArgs { out: &mut out, inp: x, weight: &w, bias: b })
        };
        assert!(constraint(call(&long_inp, Some(&bias))).contains("len(inp)"), "{}", v.id());
        assert!(constraint(call(&inp, Some(&short_bias))).contains("len(bias)"), "{}", v.id());
        assert!(constraint(call(&inp, None)).contains("bias"), "{}", v.id());
        assert!(
            constraint(linear::prepare(gpu, &v, LinearDims { m: 0, n, k, bias: true }).map(|_| ())).contains("M >= 1")
        );
        gpu.synchronize().unwrap();
        // Nothing was launched: out is still all poison.
        assert!(gpu.download(&out).unwrap().iter().all(|x| x.is_nan()), "{} wrote out", v.id());
    }
    let residual = gpu.upload(&vec![1.0f32; m * n]).unwrap();
    for v in LinearEpilogue.variants() {
        for e in [Epilogue::BiasResidual, Epilogue::BiasGelu] {
            let p = epilogue::prepare(gpu, &v, EpilogueDims { m, n, k, epilogue: e }).unwrap();
            let mut out = gpu.alloc_poisoned::<f32>(m * n).unwrap();
            let mut call = |res: Option<&CudaSlice<f32>>| {
                p.enqueue(stream, EpilogueArgs { out: &mut out, inp: &inp, weight: &w, bias: &bias, residual: res })
            };
            match e {
                Epilogue::BiasResidual => {
                    assert!(constraint(call(None)).contains("residual"), "{}", v.id());
                    assert!(constraint(call(Some(&bias))).contains("len(residual)"), "{}", v.id());
                }
                Epilogue::BiasGelu => assert!(constraint(call(Some(&residual))).contains("no residual"), "{}", v.id()),
            }
            gpu.synchronize().unwrap();
            assert!(gpu.download(&out).unwrap().iter().all(|x| x.is_nan()), "{} wrote out", v.id());
        }
    }
    bad_bias_alignment(gpu);
    bad_group(gpu);
}

/// A tile order of no row panels at a time (the kernel would divide by it) is a typed error refused
/// before anything compiles.
fn bad_group(gpu: &Gpu) {
    use matmul::linear_bf16::{self as lb, LinearBf16, LinearBf16Dims, Output, Tail};
    let d = LinearBf16Dims { m: 8, n: 16, k: 64, bias: true, tail: Tail::None, out: Output::F32 };
    let v = LinearBf16.variants().into_iter().find(|v| v.stage == 15).expect("a persistent stage");
    let bad = v.with_config(&[("WS_GROUP_M".to_string(), 0)]).unwrap();
    let refused = constraint(lb::prepare(gpu, &bad, d).map(|_| ()));
    assert!(refused.contains("WS_GROUP_M >= 1"), "{refused}");
}

/// Stage 13 and the later ones copy the bias with 16-byte cp.async: a bias 4 bytes into an allocation is a typed
/// error that launches nothing (a `CudaSlice` of its own allocation is always aligned, so the
/// misaligned one is made from a raw pointer).
fn bad_bias_alignment(gpu: &Gpu) {
    use matmul::linear_bf16::{self as lb, LinearBf16, LinearBf16Args, LinearBf16Dims, Output, Tail};
    let (m, n, k) = (8usize, 16usize, 64usize);
    let v = LinearBf16.variants().into_iter().find(|v| v.name == "staged-store").expect("stage 13");
    let p = lb::prepare(gpu, &v, LinearBf16Dims { m, n, k, bias: true, tail: Tail::None, out: Output::F32 }).unwrap();
    let (x, w) = (gpu.upload(&vec![0x3f80u16; m * k]).unwrap(), gpu.upload(&vec![0x3f80u16; n * k]).unwrap());
    let wide = gpu.upload(&vec![1.0f32; n + 4]).unwrap();
    let stream = gpu.stream();
    // SAFETY: n floats 4 bytes into `wide`'s allocation of n + 4; leaked below, so only `wide`
    // frees the allocation.
    let shifted = unsafe { stream.upgrade_device_ptr::<f32>(common::device_ptr(&wide) + 4, n) };
    let mut out = gpu.alloc_poisoned::<f32>(m * n).unwrap();
    let call = |out: &mut CudaSlice<f32>, b: &CudaSlice<f32>| {
        p.enqueue(stream, LinearBf16Args { out, inp: &x, weight: &w, bias: Some(b), residual: None })
    };
    let refused = call(&mut out, &shifted);
    shifted.leak();
    assert!(constraint(refused).contains("16-byte aligned"));
    gpu.synchronize().unwrap();
    assert!(gpu.download(&out).unwrap().iter().all(|x| x.is_nan()), "a refused call wrote out");
    // The same call on an aligned bias runs: each output is 64 products of 1 x 1, plus 1.
    let bias = gpu.upload(&vec![1.0f32; n]).unwrap();
    call(&mut out, &bias).unwrap_or_else(|e| panic!("aligned bias refused: {e}"));
    gpu.synchronize().unwrap();
    assert!(gpu.download(&out).unwrap().iter().all(|&x| x == 65.0), "aligned bias: wrong out");
    // A call prepared for a bf16 output refuses fp32 buffers, and the reverse, launching nothing.
    let bf16_dims = LinearBf16Dims { out: Output::Bf16, m, n, k, bias: true, tail: Tail::None };
    let p16 = lb::prepare(gpu, &v, bf16_dims).unwrap();
    let mut poisoned = gpu.alloc_poisoned::<f32>(m * n).unwrap();
    let wrong = p16
        .enqueue(stream, LinearBf16Args { out: &mut poisoned, inp: &x, weight: &w, bias: Some(&bias), residual: None });
    assert!(constraint(wrong).contains("out of the type prepared"));
    let bias16 = gpu.upload(&vec![0x3f80u16; n]).unwrap(); // bf16 1.0: a bf16 output's bias is bf16
    let mut out16 = gpu.alloc_poisoned::<u16>(m * n).unwrap();
    let wrong =
        p.enqueue(stream, LinearBf16Args { out: &mut out16, inp: &x, weight: &w, bias: Some(&bias16), residual: None });
    assert!(constraint(wrong).contains("out of the type prepared"));
    gpu.synchronize().unwrap();
    assert!(gpu.download(&poisoned).unwrap().iter().all(|x| x.is_nan()), "a refused call wrote out");
    assert!(gpu.download(&out16).unwrap().iter().all(|&x| x == 0xffff), "a refused call wrote out");
    // The bf16 store of the same call: 65 is exact in bf16.
    p16.enqueue(stream, LinearBf16Args { out: &mut out16, inp: &x, weight: &w, bias: Some(&bias16), residual: None })
        .unwrap();
    gpu.synchronize().unwrap();
    assert!(gpu.download(&out16).unwrap().iter().all(|&x| x == 0x4282), "bf16 out: wrong bits (65.0 is 0x4282)");
}

/// Stages 14 to 16 may start while the kernel before them runs: a GEMM whose residual is the
/// output of the GEMM launched just before it must still read that output whole. The first GEMM
/// (itself a dependent-launch stage, which lets its dependents launch as each block starts its
/// last tile, here the stragglers' last) has two more 128-row panels than twice the SMs, deep in
/// K: two blocks compute a third tile long after the others have left their SMs to the second
/// GEMM, whose K = 8 tiles reach their residual reads within a microsecond. Without `griddepcontrol.wait` the blocks that take
/// the last row panels read the poisoned (NaN) rows the stragglers have not written yet.
fn dependent_launch_waits_for_the_previous_output(gpu: &Gpu) {
    use common::data::uniform;
    use half::bf16;
    use matmul::linear_bf16::{self as lb, LinearBf16, LinearBf16Args, LinearBf16Dims, Output, Tail};
    let sms = gpu.info().sm_count as usize;
    let (m, n, k1, k2) = (256 * (sms + 1), 128usize, 4096usize, 8usize);
    let bits = |len: usize, seed: u64| -> Vec<u16> {
        uniform(len, -1.0, 1.0, seed).into_iter().map(|x| bf16::from_f32(x).to_bits()).collect()
    };
    let (x1, w1) = (bits(m * k1, 1), bits(n * k1, 2));
    let (x2, w2, bias) = (bits(m * k2, 3), bits(n * k2, 4), uniform(n, -1.0, 1.0, 5));
    let (dx1, dw1) = (gpu.upload(&x1).unwrap(), gpu.upload(&w1).unwrap());
    let (dx2, dw2, dbias) = (gpu.upload(&x2).unwrap(), gpu.upload(&w2).unwrap(), gpu.upload(&bias).unwrap());
    let mut tested = 0;
    for v in LinearBf16.variants().into_iter().chain(LinearBf16.leave_one_out()) {
        let dims = |k, bias, tail| LinearBf16Dims { m, n, k, bias, tail, out: Output::F32 };
        let first = lb::prepare(gpu, &v, dims(k1, false, Tail::None)).unwrap();
        if !first.dependent_launch() {
            continue;
        }
        let second = lb::prepare(gpu, &v, dims(k2, true, Tail::Residual)).unwrap();
        assert!(second.dependent_launch(), "{}: both GEMMs launch as dependents", v.id());
        let (mut out1, mut out2) =
            (gpu.alloc_poisoned::<f32>(m * n).unwrap(), gpu.alloc_poisoned::<f32>(m * n).unwrap());
        let stream = gpu.stream();
        first
            .enqueue(stream, LinearBf16Args { out: &mut out1, inp: &dx1, weight: &dw1, bias: None, residual: None })
            .unwrap();
        second
            .enqueue(
                stream,
                LinearBf16Args { out: &mut out2, inp: &dx2, weight: &dw2, bias: Some(&dbias), residual: Some(&out1) },
            )
            .unwrap();
        gpu.synchronize().unwrap();
        let (residual, got) = (gpu.download(&out1).unwrap(), gpu.download(&out2).unwrap());
        assert!(residual.iter().all(|x| x.is_finite()), "{}: the first GEMM left poison", v.id());
        let widen = |b: &[u16]| -> Vec<f32> { b.iter().map(|&x| bf16::from_bits(x).to_f32()).collect() };
        let rows: Vec<usize> = (0..m).collect();
        let mut want = matmul::reference::linear_rows(&widen(&x2), &widen(&w2), Some(&bias), n, k2, &rows);
        want.iter_mut().zip(&residual).for_each(|(w, &r)| *w += r as f64);
        let (mut err, mut norm) = (0.0f64, 0.0f64);
        for (&g, &w) in got.iter().zip(&want) {
            assert!(!g.is_nan(), "{}: read the residual before the GEMM that writes it finished", v.id());
            err += (g as f64 - w).powi(2);
            norm += w * w;
        }
        let rel = (err / norm).sqrt();
        assert!(rel <= 1e-2, "{}: relative L2 error {rel:e}", v.id());
        tested += 1;
    }
    // Stages 14-16 launch as dependents, and the last rung's rows that keep WS_PDL (all but one).
    assert_eq!(tested, 3 + matmul::linear_bf16::SWITCHES.len() - 1, "stages 14-16 and 8 leave-one-out rows");
}

/// Every linear-bf16 module the trials after this one launch, compiled in one batch on every core
/// and loaded: each kernel stage and leave-one-out row at each tile width the host picks (small shapes:
/// 128, 4100 x 580: 192, 4096 x 772: 256; the ping-pong residual entry: 128), with an fp32 and a
/// bf16 output, and the sweep points the trials take (stages 9, 10, 15, 16 at 128 and 192 wide;
/// stage 15 at ring depths 3 and 5 and groups 1 and 3). Compiled here, the later trials find their
/// modules loaded instead of compiling a few at a time.
fn linear_bf16_modules_compile_and_load(gpu: &Gpu) {
    use common::{Generator, Grid, Sweep};
    use matmul::linear_bf16::{bf16_out, shape, shape_with_tail, LinearBf16};
    let op = &LinearBf16;
    let sweep =
        |tunable: &str, values: &[u32]| Grid { axes: vec![Sweep { tunable: tunable.into(), values: values.to_vec() }] };
    let kernels = || op.variants().into_iter().filter(|v| matches!(v.source, common::Source::Kernel(_)));
    let mut rows: Vec<_> = kernels().chain(op.leave_one_out()).collect();
    rows.extend(kernels().flat_map(|v| sweep("WS_BN", &[128, 192]).derive(&v)));
    for (tunable, values) in [("WG_STAGES", [3, 5]), ("WS_GROUP_M", [1, 3])] {
        rows.extend(kernels().filter(|v| v.stage == 15).flat_map(|v| sweep(tunable, &values).derive(&v)));
    }
    let mut shapes = Vec::new();
    for (m, n, k) in [(1, 1, 8), (4100, 580, 72), (4096, 772, 64)] {
        for s in [shape(m, n, k, 1), shape_with_tail(m, n, k, 2)] {
            shapes.extend([s.clone(), bf16_out(s)]);
        }
    }
    common::preload(gpu, op, &shapes, &rows);
    for s in &shapes {
        for v in rows.iter().filter(|v| op.validate(v, s).is_ok()) {
            for c in op.compiled_variants(gpu, v, s) {
                if let Err(e) = gpu.module(op.sources(), &c) {
                    panic!("{} at {s}: {e}", c.id());
                }
            }
        }
    }
}

/// The picking LM head (`gemv::PICKS` on each folding stage): its logits bit for bit the plain
/// folded GEMV's, and each row's pick word the argmax of its own stored logits over the first V
/// columns, the lowest index among equal values. Rows at and past V are made to hold the largest
/// values (a pick that reads them fails), and in the tie cases W's rows 3, 4 and 19 (another
/// block) are one row that dominates every other, so three columns tie exactly at the maximum.
/// GPT-2's LM head at M = 1 and 3, and ragged N, V, K at M = 33 and 64 (several column tiles).
fn gemv_picks_are_the_argmax_of_the_stored_rows(gpu: &Gpu) {
    use common::data::uniform;
    use half::bf16;
    use matmul::gemv::{self, Gemv, GemvArgs, GemvDims, GemvWeight, PickingArgs};
    use matmul::linear_bf16::Tail;
    let folding: Vec<_> = Gemv.variants().into_iter().filter(gemv::folds_layernorm).collect();
    assert!(folding.len() >= 5, "gemv 5-9 fold the LayerNorm");
    for (m, n, v, k, ties) in [
        (1, 50304, 50257, 768, false),
        (3, 50304, 50257, 768, true),
        (33, 300, 289, 136, true),
        (64, 300, 1, 64, false),
    ] {
        let seed = (m * 31 + k) as u64;
        // Every row of x the same in the tie cases, so that one row of W dominates in all of them.
        let mut x = uniform(m * k, -1.0, 1.0, seed);
        if ties {
            let first = x[..k].to_vec();
            x.chunks_mut(k).for_each(|r| r.copy_from_slice(&first));
        }
        let mut w = uniform(n * k, -1.0, 1.0, seed + 1);
        let mut bias = uniform(n, -1.0, 1.0, seed + 2);
        if ties {
            let mean = x[..k].iter().sum::<f32>() / k as f32;
            let top: Vec<f32> = x[..k].iter().map(|&xi| if xi >= mean { 4.0 } else { -4.0 }).collect();
            for r in [3, 4, 19] {
                w[r * k..(r + 1) * k].copy_from_slice(&top);
                bias[r] = 0.5;
            }
        }
        bias[v..].fill(1e4);
        let wb: Vec<u16> = w.iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
        let (dx, dw, db) = (gpu.upload(&x).unwrap(), gpu.upload(&wb).unwrap(), gpu.upload(&bias).unwrap());
        let d = GemvDims { m, n, k, bias: true, tail: Tail::None, input: common::ActType::F32, ln: true };
        for stage in &folding {
            let id = stage.id();
            let plain = gemv::prepare(gpu, stage, d).unwrap();
            let picking = gemv::prepare_picking(gpu, stage, d, v).unwrap();
            let (mut want, mut got) =
                (gpu.alloc_poisoned::<f32>(m * n).unwrap(), gpu.alloc_poisoned::<f32>(m * n).unwrap());
            let mut words = gpu.zeros::<u64>(m * gemv::PICK_WORDS_PER_ROW).unwrap();
            let s = gpu.stream();
            let weight = GemvWeight::Bf16(&dw);
            plain
                .enqueue(
                    s,
                    GemvArgs { out: &mut want, inp: common::Act::F32(&dx), weight, bias: Some(&db), residual: None },
                )
                .unwrap();
            picking
                .enqueue(s, PickingArgs { out: &mut got, picks: &mut words, inp: &dx, weight: &dw, bias: Some(&db) })
                .unwrap();
            gpu.synchronize().unwrap();
            let (want, got, words) =
                (gpu.download(&want).unwrap(), gpu.download(&got).unwrap(), gpu.download(&words).unwrap());
            assert!(
                want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{id}: the logits differ from the plain GEMV's"
            );
            for (row, (logits, slots)) in got.chunks(n).zip(words.chunks(gemv::PICK_WORDS_PER_ROW)).enumerate() {
                // The row's slots, one a line, merged as the reader merges them.
                let word = slots.iter().step_by(16).copied().max().unwrap();
                assert!(
                    slots.iter().enumerate().all(|(i, &w)| i % 16 == 0 || w == 0),
                    "{id}: a word off its slot's line"
                );
                let expect = logits[..v]
                    .iter()
                    .enumerate()
                    .fold((0usize, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
                    .0;
                let index = if word == 0 { 0 } else { (0xFFFF_FFFFu64 - (word & 0xFFFF_FFFF)) as usize };
                assert_eq!(index, expect, "{id}, M = {m}, N = {n}, V = {v}, row {row}");
                if ties {
                    assert_eq!(index, 3, "{id}: the tie goes to the lowest index");
                }
            }
        }
    }
}

fn main() -> std::process::ExitCode {
    Suite::new()
        .gpu("linear_gpt2_shapes_m64", |gpu| {
            for mut s in Linear.default_shapes() {
                s.set("M", 64);
                pass(gpu, &Linear, &s);
            }
        })
        .gpu("linear_full_shape_and_sampled_reference", |gpu| {
            // Full reference (4096·768·768 < 2^32 MACs) and a sampled one (4096·2304·768).
            pass(gpu, &Linear, &lin(4096, 768, 768, 1));
            pass(gpu, &Linear, &lin(4096, 2304, 768, 1));
        })
        .gpu("linear_ragged_shapes", |gpu| {
            for (m, n, k) in [(1, 1, 1), (1, 50257, 3), (17, 33, 15), (129, 127, 130), (31, 2305, 769), (300, 7, 1001)]
            {
                for b in [0, 1] {
                    pass(gpu, &Linear, &lin(m, n, k, b));
                }
            }
        })
        .gpu("epilogue_gpt2_shapes_m64", |gpu| {
            for mut s in LinearEpilogue.default_shapes() {
                s.set("M", 64);
                pass(gpu, &LinearEpilogue, &s);
            }
            pass(gpu, &LinearEpilogue, &epi(4096, 768, 768, 2));
        })
        .gpu("epilogue_ragged_shapes", |gpu| {
            for (m, n, k) in [(1, 1, 1), (17, 33, 15), (130, 515, 47)] {
                for e in [1, 2] {
                    pass(gpu, &LinearEpilogue, &epi(m, n, k, e));
                }
            }
        })
        .gpu("linear_any_shape", |gpu| {
            proptest(16, (1i64..512, 1i64..512, 1i64..512, 0i64..2), |(m, n, k, b)| {
                pass(gpu, &Linear, &lin(m, n, k, b))
            })
        })
        .gpu("epilogue_any_shape", |gpu| {
            proptest(16, (1i64..512, 1i64..512, 1i64..512, 1i64..3), |(m, n, k, e)| {
                pass(gpu, &LinearEpilogue, &epi(m, n, k, e))
            })
        })
        .gpu("gemv_gpt2_shapes_and_ragged", |gpu| {
            use matmul::gemv::Gemv;
            for s in Gemv.default_shapes() {
                assert_stages_pass(gpu, &Gemv, &s, &Gemv.variants());
            }
            // M up to 64 (several passes of 8), N not a multiple of 4 or 16, K a multiple of 8 or not
            // (the 16-byte stages refuse the latter with a typed error), every tail, fp32 or bf16 inp,
            // or the LayerNorm folded in (stages 5 and 6 alone).
            let strategy = (1i64..=64, 1i64..=300, 1i64..=130, 0i64..=1, 0i64..=1, 0i64..=2, 0i64..=2);
            proptest(24, strategy, |(m, n, k8, ragged, bias, epi, input)| {
                let k = 8 * k8 - ragged * 3;
                let s = gemv_shape(input, m, n, k, bias, epi);
                assert_stages_pass(gpu, &Gemv, &s, &Gemv.variants());
            })
        })
        .gpu("gemv_picks_are_the_argmax_of_the_stored_rows", gemv_picks_are_the_argmax_of_the_stored_rows)
        .gpu("quantize_fp8_default_and_ragged", |gpu| {
            // Byte for byte against the CPU quantizer: GPT-2's shapes, then rows and channels that
            // are not multiples of 4, 32 or 128 (a partial last group or block), M = 1 and K = 1.
            use matmul::quantize_fp8::{shape, shape_ln, QuantizeFp8};
            for s in QuantizeFp8.default_shapes() {
                assert_stages_pass(gpu, &QuantizeFp8, &s, &QuantizeFp8.variants());
            }
            for s in [shape(1, 1, 0), shape(1, 1, 1), shape(2, 1, 0), shape(1, 300, 1)] {
                assert_stages_pass(gpu, &QuantizeFp8, &s, &QuantizeFp8.variants());
            }
            proptest(16, (1i64..=400, 1i64..=700, 0i64..=1), |(m, k, blocks)| {
                assert_stages_pass(gpu, &QuantizeFp8, &shape(m, k, blocks), &QuantizeFp8.variants());
            });
            // The LayerNorm taken in (stage 2, ln = 1): ragged rows, K a multiple of 8 with a partial
            // last group, up to the 4096 limit.
            let stage2: Vec<_> = QuantizeFp8.variants().into_iter().filter(|v| v.stage == 2).collect();
            for s in [shape_ln(1, 8), shape_ln(3, 4096), shape_ln(33, 1000)] {
                assert_stages_pass(gpu, &QuantizeFp8, &s, &stage2);
            }
            proptest(16, (1i64..=300, 1i64..=512), |(m, k8)| {
                assert_stages_pass(gpu, &QuantizeFp8, &shape_ln(m, 8 * k8), &stage2);
            })
        })
        .gpu("gemv_fp8_gpt2_shapes_and_ragged", |gpu| {
            // Against the f64 product on the dequantized weights: GPT-2's shapes, then M up to 64,
            // N across 128-row blocks of scales and not a multiple of 4 or 16, K a multiple of 16
            // but not of 64 or 128 (a partial last step and scale group) or of 8 only (refused with
            // a typed error), every tail, fp32 or bf16 inp, or the LayerNorm folded (stage 1 alone).
            use matmul::gemv;
            use matmul::gemv_fp8::GemvFp8;
            let stages = GemvFp8.variants();
            for s in GemvFp8.default_shapes() {
                assert_stages_pass(gpu, &GemvFp8, &s, &stages);
            }
            // (No GELU at a lone output: deep in its negative tail fp32's 1 + tanh is 0 where f64's is
            // not, a relative error of 1 that says nothing about the kernel.)
            // K > 2048: stage 5 splits the row over 4 warps (2080: a part-filled last piece set).
            for (m, n, k) in [(1, 19, 16), (33, 131, 400), (64, 300, 1040), (3, 257, 8), (5, 131, 2080), (2, 9, 4096)] {
                assert_stages_pass(gpu, &GemvFp8, &gemv::shape_with_tail(m, n, k, 1, 2), &stages);
                assert_stages_pass(gpu, &GemvFp8, &gemv::shape_ln(m, n, k, 0), &stages);
            }
            let strategy = (1i64..=64, 1i64..=300, 1i64..=40, 0i64..=1, 0i64..=1, 0i64..=2, 0i64..=2);
            proptest(24, strategy, |(m, n, k16, ragged, bias, epi, input)| {
                let k = 16 * k16 - ragged * 8;
                let s = gemv_shape(input, m, n, k, bias, epi);
                assert_stages_pass(gpu, &GemvFp8, &s, &stages);
            })
        })
        .gpu("linear_fp8_default_and_ragged", |gpu| {
            // Against the f64 product of the dequantized operands: GPT-2's linears and the square
            // shapes at M = 512 (8192^3 at 8192), then M, N, K not multiples of the 128-wide tile or
            // scale group (K % 16 == 0), M = 1 and N = 1.
            use matmul::linear_bf16::{bf16_out, shape_with_tail};
            use matmul::linear_fp8::{e4m3_out, shape, LinearFp8};
            let stages = LinearFp8.variants();
            for mut s in LinearFp8.default_shapes() {
                if s.get("K") != Some(8192) {
                    s.set("M", 512);
                }
                assert_stages_pass(gpu, &LinearFp8, &s, &stages);
            }
            // The last two take stage 8's 128 x 256 tile (wide_fit): a last column tile whose right
            // half lies wholly past N (3076 = 12 x 256 + 4), and one whose right half is partial.
            for (m, n, k, b) in [
                (1, 1, 16, 1),
                (129, 127, 144, 0),
                (300, 7, 1008, 1),
                (257, 129, 48, 1),
                (5, 300, 2064, 0),
                (1030, 3076, 272, 1),
                (520, 6148, 144, 0),
            ] {
                assert_stages_pass(gpu, &LinearFp8, &shape(m, n, k, b), &stages);
            }
            // The tails at ragged M and partial tiles and scale groups: GELU into bf16, the residual
            // in fp32 and bf16.
            for (m, n, k, e, bf16) in [
                (129, 136, 144, 1, true),
                (300, 260, 1008, 2, false),
                (1, 8, 16, 2, true),
                (1030, 3076, 272, 1, true),
                (1030, 3076, 272, 2, false),
            ] {
                let s = shape_with_tail(m, n, k, e);
                assert_stages_pass(gpu, &LinearFp8, &if bf16 { bf16_out(s) } else { s }, &stages);
            }
            // Stage 7's e4m3 out (stage 8's too): GELU at ragged M, no tail with a last scale group of
            // 16 columns (N = 272) and without a bias, one row of one group; GELU at a shape where
            // stage 8 would take its wide tile at the other outs (3088 = 12 x 256 + 16).
            for s in [
                shape_with_tail(129, 144, 144, 1),
                shape(300, 272, 1008, 0),
                shape(1, 16, 16, 1),
                shape_with_tail(1030, 3088, 272, 1),
            ] {
                assert_stages_pass(gpu, &LinearFp8, &e4m3_out(s), &stages);
            }
            // Ragged shapes with every tail and every output (stages 4 on take the tails and bf16,
            // at N % 4 == 0 or N % 8 == 0, stage 7 e4m3 at N % 16 == 0; the other stages refuse
            // them, and prepare must agree).
            proptest(16, (1i64..400, 1i64..400, 1i64..40, 0i64..2, 0i64..3, 0i64..3), |(m, n, k16, b, e, o)| {
                let s = if e > 0 { shape_with_tail(m, n, 16 * k16, e) } else { shape(m, n, 16 * k16, b) };
                let s = match o {
                    1 => bf16_out(s),
                    2 => e4m3_out(s),
                    _ => s,
                };
                assert_stages_pass(gpu, &LinearFp8, &s, &stages)
            })
        })
        .gpu("linear_fp8_e4m3_out_is_quantize_fp8_of_its_bf16_out", linear_fp8_e4m3_out_is_quantized_bf16_out)
        .gpu("linear_bf16_modules_compile_and_load", linear_bf16_modules_compile_and_load)
        .gpu("linear_bf16_default_shapes", |gpu| {
            // Every default shape's N, K, tail and output type (the LM head at 50257 and 50304,
            // 4096^3, 8192^3) at M = 512, and the one-tile-an-SM shapes at N = 768 whole (128 tiles
            // on 132 SMs): every stage and the last rung's leave-one-out rows. `ladder run matmul
            // --leave-one-out` verifies every row at every default shape whole.
            let op = &matmul::linear_bf16::LinearBf16;
            let rows: Vec<_> = op.variants().into_iter().chain(op.leave_one_out()).collect();
            for mut s in op.default_shapes() {
                if s.get("N") != Some(768) || s.get("K") != Some(768) {
                    s.set("M", 512);
                }
                assert_stages_pass(gpu, op, &s, &rows);
            }
        })
        .gpu("linear_bf16_leave_one_out_ragged", |gpu| {
            // The last rung's leave-one-out rows at ragged shapes with every tail: each switch's
            // absence (the cooperative consumers at the wave model's width, the store without
            // staging, the launch without the dependent attribute, the declared group) is a kernel
            // of its own.
            use matmul::linear_bf16::{shape, shape_with_tail, LinearBf16, SWITCHES};
            let rows = LinearBf16.leave_one_out();
            assert_eq!(rows.len(), SWITCHES.len(), "stage 16's nine switches");
            for (m, n, k, e) in [(129, 127, 136, 0), (300, 388, 1000, 1), (257, 300, 64, 2), (4100, 772, 72, 2)] {
                let s = if e == 0 { shape(m, n, k, 1) } else { shape_with_tail(m, n, k, e) };
                assert_stages_pass(gpu, &LinearBf16, &s, &rows);
            }
        })
        .gpu("linear_bf16_any_shape", |gpu| {
            // M, N, K in 1..512, mostly not multiples of 8, 16, 64 or the 128 x 128 x 32 tile; K % 8
            // != 0 takes the unaligned entry.
            use matmul::linear_bf16::{shape, LinearBf16};
            for (m, n, k) in [(1, 1, 1), (129, 127, 130), (300, 7, 1001), (128, 256, 64), (257, 129, 40)] {
                for b in [0, 1] {
                    assert_stages_pass(gpu, &LinearBf16, &shape(m, n, k, b), &LinearBf16.variants());
                }
            }
            proptest(24, (1i64..512, 1i64..512, 1i64..512, 0i64..2), |(m, n, k, b)| {
                assert_stages_pass(gpu, &LinearBf16, &shape(m, n, k, b), &LinearBf16.variants())
            });
            // The fused tails (GELU, residual) at ragged shapes, K a multiple of 8 (the TMA stages).
            use matmul::linear_bf16::shape_with_tail;
            for (m, n, k, e) in [(1, 1, 8, 1), (129, 127, 136, 2), (300, 7, 1000, 1), (257, 300, 64, 2)] {
                assert_stages_pass(gpu, &LinearBf16, &shape_with_tail(m, n, k, e), &LinearBf16.variants());
            }
            proptest(16, (1i64..512, 1i64..512, 1i64..64, 1i64..3), |(m, n, k8, e)| {
                assert_stages_pass(gpu, &LinearBf16, &shape_with_tail(m, n, 8 * k8, e), &LinearBf16.variants())
            })
        })
        .gpu("linear_bf16_tile_widths_any_shape", |gpu| {
            // The persistent stages at the other tile widths their sweep space declares (WS_BN 128
            // and 192: the ragged last column of tiles, the n128/n192 wgmma), with and without tails.
            use common::{Generator, Grid, Sweep};
            use matmul::linear_bf16::{shape, shape_with_tail, LinearBf16};
            let widths = Grid { axes: vec![Sweep { tunable: "WS_BN".into(), values: vec![128, 192] }] };
            let points: Vec<_> = LinearBf16.variants().iter().flat_map(|v| widths.derive(v)).collect();
            assert_eq!(points.len(), 8, "stages 9, 10, 15 and 16, two widths each");
            for (m, n, k) in [(1, 1, 8), (129, 193, 136), (300, 7, 1000), (4096, 768, 768), (257, 385, 64)] {
                assert_stages_pass(gpu, &LinearBf16, &shape(m, n, k, 1), &points);
                assert_stages_pass(gpu, &LinearBf16, &shape_with_tail(m, n, k, 1 + (m % 2)), &points);
            }
            proptest(16, (1i64..512, 1i64..512, 1i64..64, 0i64..3), |(m, n, k8, e)| {
                assert_stages_pass(gpu, &LinearBf16, &shape_with_tail(m, n, 8 * k8, e), &points)
            })
        })
        .gpu("linear_bf16_fitted_stages_any_shape", |gpu| {
            // Every stage from 11 on, 15 at two more ring depths its sweep declares and at tile
            // orders of 1 and 3 row panels, with ragged M, N and K: consumers whose rows all lie past
            // M, the unchecked interior tiles of stage 12 on (staged from 13 on) next to checked edge
            // tiles, in bias-free shapes too (the staged stores then read a zeroed copy), the
            // ping-pong consumers taking turns over blocks of one, two or many tiles with fewer K
            // steps a tile than ring stages (K = 8, 64, 72), shapes where the wave model picks each
            // width (4100 x 580: 192, 4096 x 772: 256, small: 128), and a group that does not
            // divide the tile rows.
            use common::{Generator, Grid, Sweep};
            use matmul::linear_bf16::{shape, shape_with_tail, LinearBf16};
            let mut points: Vec<_> =
                LinearBf16.variants().into_iter().filter(|v| (11..90).contains(&v.stage)).collect();
            let depths = Grid { axes: vec![Sweep { tunable: "WG_STAGES".into(), values: vec![3, 5] }] };
            points.extend(LinearBf16.variants().iter().filter(|v| v.stage == 15).flat_map(|v| depths.derive(v)));
            let groups = Grid { axes: vec![Sweep { tunable: "WS_GROUP_M".into(), values: vec![1, 3] }] };
            points.extend(LinearBf16.variants().iter().filter(|v| v.stage == 15).flat_map(|v| groups.derive(v)));
            for (m, n, k) in [
                (1, 4, 8),
                (129, 196, 136),
                (300, 12, 1000),
                (4100, 580, 72),
                (4096, 772, 64),
                (257, 388, 64),
                (4100, 2308, 72),
            ] {
                assert_stages_pass(gpu, &LinearBf16, &shape(m, n, k, m % 2), &points);
                assert_stages_pass(gpu, &LinearBf16, &shape_with_tail(m, n, k, 1 + (m % 2)), &points);
                assert_stages_pass(gpu, &LinearBf16, &shape_with_tail(m, n, k, 2 - (m % 2)), &points);
            }
            proptest(16, (1i64..512, 1i64..512, 1i64..64, 0i64..3), |(m, n, k8, e)| {
                assert_stages_pass(gpu, &LinearBf16, &shape_with_tail(m, n, 8 * k8, e), &points)
            })
        })
        .gpu("linear_bf16_out_bf16_any_shape", |gpu| {
            // The stages that store bf16 (12 on, the last rung's leave-one-out rows that keep the
            // lean store, the library row) at `out = 16` with every tail at ragged shapes: the staged
            // interior's 8-byte stores next to the edge tiles' pairs and single elements (odd N),
            // a bf16 residual, 4-wide and unaligned rows (N % 4 != 0 leaves the staged path), the
            // wave model's three widths (small shapes: 128, 4100 x 580: 192, 4096 x 772: 256).
            use matmul::linear_bf16::{bf16_out, shape, shape_with_tail, LinearBf16};
            let mut rows: Vec<_> = LinearBf16.variants().into_iter().filter(|v| v.stage >= 12).collect();
            rows.extend(LinearBf16.leave_one_out());
            for (m, n, k) in
                [(1, 1, 8), (129, 196, 136), (300, 7, 1000), (4100, 580, 72), (257, 389, 64), (4096, 772, 64)]
            {
                for e in 0..3 {
                    let s = if e == 0 { shape(m, n, k, m % 2) } else { shape_with_tail(m, n, k, e) };
                    assert_stages_pass(gpu, &LinearBf16, &bf16_out(s), &rows);
                }
            }
            proptest(8, (1i64..512, 1i64..512, 1i64..64, 0i64..3), |(m, n, k8, e)| {
                let s = if e == 0 { shape(m, n, 8 * k8, 1) } else { shape_with_tail(m, n, 8 * k8, e) };
                assert_stages_pass(gpu, &LinearBf16, &bf16_out(s), &rows)
            })
        })
        .gpu("timeline_stamps_every_phase_in_order", timeline_stamps_every_phase_in_order)
        .gpu("bad_buffers_are_typed_errors_and_launch_nothing", bad_buffers)
        .gpu("dependent_launch_waits_for_the_previous_output", dependent_launch_waits_for_the_previous_output)
        .gpu("limits_past_refused_inside_verified", |gpu| assert_limits_on_gpu(gpu, &matmul::Matmul))
        .gpu("graph_replay_every_stage", |gpu| {
            let bf16 = matmul::linear_bf16::shape(129, 132, 136, 1);
            for (op, shape) in [
                (&Linear as &dyn Op, lin(129, 127, 130, 1)),
                (&LinearEpilogue, epi(130, 515, 47, 2)),
                (&matmul::linear_bf16::LinearBf16, bf16),
            ] {
                for v in all_variants(op) {
                    assert_graph_replay_passes(gpu, op, &shape, &v);
                }
            }
        })
        .main()
}
