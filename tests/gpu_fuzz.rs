//! Bad input, fuzzed on the GPU: the generator of `bad_shapes.rs` (one draw per key: an edge, a
//! random size, or the default) drives the public path of every stage of every op: validate, draw
//! inputs and the CPU reference, prepare, launch into poisoned outputs, verify. Every outcome must
//! be a typed refusal or a verified output: a panic, a launch failure at a shape the stage accepted,
//! or a wrong answer fails the test. Shapes are kept small (every key at most `MAX`), so a few
//! hundred launches take seconds; the host fuzz covers the sizes past memory and past 2^31.

mod fuzz;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;

use common::testing::Suite;
use common::{Gpu, Op, Shape, Variant};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Shapes drawn per op.
const SHAPES_PER_OP: usize = 24;
/// The largest size a key is drawn at (edges aside).
const MAX: i64 = 300;
/// The test fails unless the shapes reached at least this many verified launches in all.
const MIN_LAUNCHES: usize = 200;

#[derive(Default)]
struct Tally {
    refused: usize,
    verified: usize,
    failures: Vec<String>,
}

impl Tally {
    /// One shape, every stage: validate, then (once per shape) the problem, then prepare and verify.
    fn shape(&mut self, gpu: &Gpu, op: &dyn Op, variants: &[Variant], shape: &Shape, seed: u64) {
        // The stages' modules at this shape compiled at once, on every core.
        common::preload(gpu, op, std::slice::from_ref(shape), variants);
        let mut problem = None;
        for v in variants {
            let id = format!("{} at {shape} (seed {seed})", v.id());
            let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<bool, String> {
                if op.validate(v, shape).is_err() || gpu.supports(v).is_err() {
                    return Ok(false);
                }
                if problem.is_none() {
                    match op.problem(gpu, shape, seed) {
                        Ok(p) => problem = Some(p),
                        Err(e) if e.is_not_applicable() => return Ok(false),
                        Err(e) => return Err(format!("inputs: {e}")),
                    }
                }
                let p = problem.as_deref_mut().expect("made above");
                match p.prepare(gpu, v) {
                    Err(e) if e.is_not_applicable() => return Ok(false),
                    Err(e) => return Err(format!("prepare of an accepted shape: {e}")),
                    Ok(_) => {}
                }
                match common::runner::verify_once(gpu, p) {
                    Ok(ver) if ver.passed() => Ok(true),
                    Ok(ver) => Err(format!("wrong answer: {}", ver.summary())),
                    Err(e) => Err(format!("launch: {e}")),
                }
            }));
            match outcome {
                Ok(Ok(true)) => self.verified += 1,
                Ok(Ok(false)) => self.refused += 1,
                Ok(Err(why)) => self.failures.push(format!("{id}: {}", why.lines().next().unwrap_or_default())),
                Err(_) => self.failures.push(format!("{id}: panicked")),
            }
        }
    }
}

fn fuzz_every_op(gpu: &Gpu) {
    let seed = common::data::fresh_seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tally = Tally::default();
    for (op, variants) in fuzz::every_stage() {
        let base = &op.default_shapes()[0];
        for _ in 0..SHAPES_PER_OP {
            let shape = fuzz::draw(&mut rng, op, base, &fuzz::SMALL_EDGES, MAX);
            tally.shape(gpu, op, &variants, &shape, seed);
        }
    }
    println!("generator seed {seed}: {} verified launches, {} refusals", tally.verified, tally.refused);
    assert!(tally.failures.is_empty(), "{} failure(s):\n{}", tally.failures.len(), tally.failures.join("\n"));
    assert!(tally.verified >= MIN_LAUNCHES, "only {} verified launches (want {MIN_LAUNCHES})", tally.verified);
    assert!(tally.refused > 0, "no shape was refused: the generator stayed inside every constraint");
}

fn main() -> ExitCode {
    Suite::new().gpu("bad_input_fuzz_launches_or_refuses_every_op", fuzz_every_op).main()
}
