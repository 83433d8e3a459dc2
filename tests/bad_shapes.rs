//! Bad input, fuzzed on the host: every stage of every op is asked to validate shapes across and
//! outside its declared constraints (zero, negative, ragged, at and past every power-of-two edge,
//! past i32 and usize), one key at a time on every default shape and in random combinations. The
//! answer must be `Ok` or a typed error, never a panic (an overflow in a size product included: the
//! tests run with overflow checks). No GPU is needed: validation is what runs before any launch.

use std::panic::{catch_unwind, AssertUnwindSafe};

mod fuzz;

use common::{Op, Shape, Variant};
use fuzz::{every_stage, SMALL_EDGES};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Values that sit on or just past the edges constraints are written against.
const EDGES: [i64; 24] = [
    i64::MIN,
    -1,
    0,
    1,
    2,
    3,
    7,
    8,
    31,
    33,
    63,
    64,
    65,
    127,
    129,
    1000,
    1024,
    4097,
    65535,
    65536,
    (1 << 31) - 1,
    1 << 31,
    1 << 40,
    i64::MAX,
];

/// Outcomes of validation: accepted, refused with a typed error, and the stages that panicked.
#[derive(Default)]
struct Outcomes {
    accepted: usize,
    refused: usize,
    panicked: Vec<String>,
}

impl Outcomes {
    /// Validates `shape` for every variant.
    fn check(&mut self, op: &dyn Op, variants: &[Variant], shape: &Shape) {
        for v in variants {
            match catch_unwind(AssertUnwindSafe(|| op.validate(v, shape))) {
                Ok(Ok(())) => self.accepted += 1,
                Ok(Err(_)) => self.refused += 1,
                Err(_) => self.panicked.push(format!("{} at {shape}", v.id())),
            }
        }
    }

    /// No panic, and the generator reached both sides of the constraints.
    fn assert_sound(&self) {
        assert!(self.panicked.is_empty(), "validation panicked:\n{}", self.panicked.join("\n"));
        assert!(self.accepted > 0 && self.refused > 0, "{} accepted, {} refused", self.accepted, self.refused);
    }
}

#[test]
fn one_key_at_a_time_on_every_default_shape() {
    let mut outcomes = Outcomes::default();
    for (op, variants) in every_stage() {
        for base in op.default_shapes() {
            for key in op.shape_keys() {
                for value in EDGES {
                    let mut s = base.clone();
                    s.set(key, value);
                    outcomes.check(op, &variants, &s);
                }
            }
        }
    }
    outcomes.assert_sound();
}

#[test]
fn random_combinations_of_edges() {
    // The generator the GPU fuzz launches from, once with every edge (validation only, so sizes
    // past memory are fine here) and once with the small edges it launches with.
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut outcomes = Outcomes::default();
    for (op, variants) in every_stage() {
        let base = &op.default_shapes()[0];
        for _ in 0..200 {
            outcomes.check(op, &variants, &fuzz::draw(&mut rng, op, base, &EDGES, 5000));
            outcomes.check(op, &variants, &fuzz::draw(&mut rng, op, base, &SMALL_EDGES, 300));
        }
    }
    outcomes.assert_sound();
}

#[test]
fn shape_and_plan_strings_from_the_command_line() {
    // What `--shape`, `--each` and `--plan` hand to the parsers: typed errors, never a panic.
    let mut rng = StdRng::seed_from_u64(7);
    let alphabet: Vec<char> = "BTNC=,:;-+0123456789 xX_.\u{e9}fastestlinear".chars().collect();
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..5000 {
        let len = rng.random_range(0..24);
        let text: String = (0..len).map(|_| alphabet[rng.random_range(0..alphabet.len())]).collect();
        for result in
            [catch_unwind(|| Shape::parse(&text).map(|_| ())), catch_unwind(|| gpt2::plan::Plan::check_spec(&text))]
        {
            match result {
                Ok(Ok(())) => ok += 1,
                Ok(Err(_)) => refused += 1,
                Err(_) => panic!("parsing {text:?} panicked"),
            }
        }
    }
    for text in ["fastest:linear=0", "cublas-gemv:gemv=off,decode=6", "B=4,T=1024", "N=-1"] {
        assert!(
            catch_unwind(|| Shape::parse(text)).is_ok() && catch_unwind(|| gpt2::plan::Plan::check_spec(text)).is_ok()
        );
    }
    assert!(ok > 0 && refused > 0, "{ok} parsed, {refused} refused");
}

/// `--sweep FOO=1,2` on a family whose stages declare other tunables: one typed error naming each
/// declared tunable once (not once per stage that declares it).
#[test]
fn a_sweep_of_an_unknown_tunable_names_each_known_one_once() {
    let sweep = common::Sweep { tunable: "FOO".into(), values: vec![1, 2] };
    let opts = common::runner::RunOptions { sweeps: vec![sweep], ..Default::default() };
    let e = common::runner::select_variants(&matmul::linear_bf16::LinearBf16, &opts).unwrap_err().to_string();
    let known = e.split("known: ").nth(1).expect("the known names");
    let names: Vec<&str> = known.split(", ").collect();
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(names.len(), unique.len(), "{e}");
    assert!(e.contains("unknown tunable 'FOO'"), "{e}");
}
