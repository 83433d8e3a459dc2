//! `ladder sass`: a stage's machine code without a GPU. NVRTC compiles the stage (through the kernel
//! cache, as a run would), `cuobjdump -sass` disassembles the cubin, and each entry point's
//! instructions are counted by class: the question most rungs ask ("are the tensor-core instructions
//! there, did an array go to local memory, how many barriers does the loop pay") is a count. The main
//! loop is the innermost backward branch whose body holds the most tensor-core instructions (the
//! longest where there are none): the K loop of a GEMM, the tile loop of attention.
//!
//! The disassembler comes with CUDA or from PyPI (`nvidia-cuda-cuobjdump` and the `nvidia-cuda-nvdisasm`
//! it runs, which `.ci/run` installs beside NVRTC): `$CUDA_HOME/bin`, the NVRTC include directory's
//! sibling `bin/`, then `PATH`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Arch, Error, Result, Source, Sources, Toolchain, Variant};

/// One instruction: its address in the function and its text (predicate, opcode, operands).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instruction {
    pub address: u32,
    pub text: String,
}

impl Instruction {
    /// The opcode with its modifiers (`HGMMA.64x128x16.F32.BF16`), the predicate dropped.
    pub fn opcode(&self) -> &str {
        let mut words = self.text.split_whitespace();
        let first = words.next().unwrap_or_default();
        let op = if first.starts_with('@') { words.next().unwrap_or_default() } else { first };
        op.trim_end_matches(';')
    }

    /// The opcode's base (`HGMMA`, `LDG`, `WARPGROUP`).
    pub fn base(&self) -> &str {
        self.opcode().split('.').next().unwrap_or_default()
    }

    /// Where a branch goes: an address (`BRA 0x1c60`, as `cuobjdump -sass` prints a cubin) or a
    /// label (`BRA `(.L_x_3)`, as `nvdisasm` prints one).
    fn branch_target(&self) -> Option<Target<'_>> {
        if !matches!(self.base(), "BRA" | "BRX" | "JMP") {
            return None;
        }
        if let Some(start) = self.text.find("(.L").map(|i| i + 1) {
            let end = start + self.text[start..].find(')')?;
            return Some(Target::Label(&self.text[start..end]));
        }
        let last = self.text.split_whitespace().last()?;
        u32::from_str_radix(last.strip_prefix("0x")?, 16).ok().map(Target::Address)
    }
}

/// A branch's target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target<'a> {
    Address(u32),
    Label(&'a str),
}

/// One function of the cubin: its name, instructions, and where each label points.
#[derive(Clone, Debug, Default)]
pub struct Function {
    pub name: String,
    pub instructions: Vec<Instruction>,
    labels: BTreeMap<String, usize>,
}

/// What the summary counts, in its column order.
pub const CLASSES: [&str; 11] = [
    "HGMMA",
    "HMMA",
    "MUFU",
    "FFMA",
    "global ld",
    "global st",
    "shared ld",
    "shared st",
    "barriers",
    "spills",
    "other",
];

/// The summary class of an opcode base.
pub fn class(base: &str) -> &'static str {
    match base {
        "HGMMA" | "QGMMA" | "IGMMA" => "HGMMA",
        "HMMA" | "IMMA" | "QMMA" => "HMMA",
        "MUFU" => "MUFU",
        "FFMA" | "FFMA2" => "FFMA",
        // Plain loads, cp.async (LDGSTS) and the TMA's bulk copies.
        "LDG" | "LDGSTS" | "UTMALDG" | "UBLKCP" | "UTMAPF" | "CCTL" => "global ld",
        "STG" | "RED" | "REDG" | "ATOM" | "ATOMG" | "UTMASTG" | "UTMAREDG" => "global st",
        "LDS" | "LDSM" => "shared ld",
        "STS" | "STSM" => "shared st",
        "BAR" | "WARPGROUP" | "DEPBAR" | "SYNCS" | "WARPSYNC" | "MEMBAR" | "ERRBAR" => "barriers",
        "LDL" | "STL" => "spills",
        _ => "other",
    }
}

/// Instruction counts by class, and in all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub counts: BTreeMap<&'static str, usize>,
    pub total: usize,
}

impl Summary {
    pub fn of(instructions: &[Instruction]) -> Summary {
        let mut s = Summary::default();
        for i in instructions.iter().filter(|i| i.base() != "NOP") {
            *s.counts.entry(class(i.base())).or_default() += 1;
            s.total += 1;
        }
        s
    }

    pub fn get(&self, class: &str) -> usize {
        self.counts.get(class).copied().unwrap_or(0)
    }
}

impl Function {
    /// The index of a branch target's instruction.
    fn index_of(&self, t: Target) -> Option<usize> {
        match t {
            Target::Label(l) => self.labels.get(l).copied(),
            Target::Address(a) => self.instructions.binary_search_by_key(&a, |i| i.address).ok(),
        }
    }

    /// The main loop's instructions, as a range of indices: of every backward branch's body (from
    /// its target to the branch), the innermost one with the most tensor-core instructions, or the
    /// longest where there are none. `None` for straight-line code.
    pub fn main_loop(&self) -> Option<std::ops::Range<usize>> {
        // A backward branch whose body holds no EXIT: a jump back from out-of-line code placed after
        // the kernel's end (a spin wait's slow path) spans everything and is no loop.
        let loops = self.instructions.iter().enumerate().filter_map(|(at, ins)| {
            let target = self.index_of(ins.branch_target()?)?;
            let body = target..at + 1;
            (target <= at && !self.instructions[body.clone()].iter().any(|i| i.base() == "EXIT")).then_some(body)
        });
        // The most tensor-core instructions, and of loops with as many the innermost (the K loop,
        // not the tile loop around it); without any, the longest.
        let rank = |r: &std::ops::Range<usize>| {
            let s = Summary::of(&self.instructions[r.clone()]);
            let mma = s.get("HGMMA") + s.get("HMMA");
            (mma, if mma > 0 { -(r.len() as i64) } else { r.len() as i64 })
        };
        loops.max_by_key(rank)
    }

    /// The fewest and the most instructions one turn of the loop `body` runs: the shortest and the
    /// longest way from its first instruction through its backward branch, where a predicated
    /// forward branch that lands inside the body may be taken or not and an unpredicated one is
    /// taken (a branch out of the body, a spin wait's slow path, and a backward one inside it, an
    /// inner spin, count as falling through). The class counts hold every copy ptxas made of a
    /// path (a masked and an unmasked row max, say); a turn runs one of them.
    pub fn turn_lengths(&self, body: std::ops::Range<usize>) -> (usize, usize) {
        let n = body.len();
        // rest[k]: the fewest and the most instructions from body instruction k through the back edge.
        let mut rest = vec![(0usize, 0usize); n + 1];
        for k in (0..n).rev() {
            let ins = &self.instructions[body.start + k];
            let cost = usize::from(ins.base() != "NOP");
            let jump = ins
                .branch_target()
                .and_then(|t| self.index_of(t))
                .filter(|&t| t > body.start + k && t < body.end)
                .map(|t| rest[t - body.start]);
            let fall = rest[k + 1];
            let (lo, hi) = match jump {
                Some(j) if ins.text.starts_with('@') => (j.0.min(fall.0), j.1.max(fall.1)),
                Some(j) => j,
                None => fall,
            };
            rest[k] = (cost + lo, cost + hi);
        }
        rest[0]
    }
}

/// Every function of `cuobjdump -sass` output, in its order.
pub fn parse(sass: &str) -> Vec<Function> {
    let mut out: Vec<Function> = Vec::new();
    for line in sass.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("Function : ") {
            out.push(Function { name: name.trim().to_string(), ..Function::default() });
            continue;
        }
        let Some(f) = out.last_mut() else { continue };
        if let Some(label) = t.strip_suffix(':').filter(|l| l.starts_with(".L")) {
            f.labels.insert(label.to_string(), f.instructions.len());
            continue;
        }
        // `/*0120*/  @!P0 BRA `(.L_x_1) ;  /* 0x... */`: an address, then the instruction up to `;`.
        let Some(rest) = t.strip_prefix("/*") else { continue };
        let Some((addr, body)) = rest.split_once("*/") else { continue };
        let Ok(address) = u32::from_str_radix(addr.trim(), 16) else { continue };
        let Some((text, _)) = body.split_once(';') else { continue };
        let text = text.trim();
        if !text.is_empty() {
            f.instructions.push(Instruction { address, text: text.to_string() });
        }
    }
    out
}

/// Where `cuobjdump` is: `$CUDA_HOME/bin`, the toolchain's include directory's sibling `bin/`
/// (the PyPI packages lay out `nvidia/cu13/{include,bin}`), then `PATH`.
pub fn cuobjdump(tc: &Toolchain) -> Result<PathBuf> {
    let beside = |dir: &Path| dir.join("bin").join("cuobjdump");
    let candidates = std::env::var_os("CUDA_HOME")
        .map(|h| beside(Path::new(&h)))
        .into_iter()
        .chain(tc.include_dir.parent().map(beside));
    if let Some(p) = candidates.into_iter().find(|p| p.is_file()) {
        return Ok(p);
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).map(|d| d.join("cuobjdump")).find(|p| p.is_file()));
    on_path.flatten().ok_or_else(|| {
        Error::constraint(
            "cuobjdump in $CUDA_HOME/bin, beside NVRTC's headers or on PATH",
            "none found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, as .ci/run does)",
        )
    })
}

/// A stage's machine code: every entry point, and what ptxas warned while it compiled them.
#[derive(Clone, Debug, Default)]
pub struct Disassembly {
    pub functions: Vec<Function>,
    /// ptxas's findings (`Compiled::ptxas_findings`): a wgmma pipeline it serialized (C7514), a
    /// `setmaxnreg` it ignored (C7508), ...
    pub ptxas_warnings: Vec<String>,
    /// The PTX NVRTC handed ptxas: where a finding names a PTX line, or where the order of blocks
    /// decides what ptxas does (a wgmma's pipeline is judged in layout order).
    pub ptx: String,
}

/// Compiles stage `v` of `sources` for `arch` (or reads it, with ptxas's log, from the cache) and
/// disassembles its cubin: every entry point.
pub fn disassemble(tc: &Toolchain, sources: &Sources, v: &Variant, arch: Arch) -> Result<Disassembly> {
    let Source::Kernel(path) = v.source else {
        return Err(Error::constraint("a kernel stage (a library or host row has no code of ours)", v.id()));
    };
    if v.requires.arch_specific && !arch.arch_specific {
        return Err(Error::constraint(
            format!("{} for a stage with Hopper-only instructions", Arch::SM90A),
            arch.name(),
        ));
    }
    let compiled = tc.compile(&v.id(), sources.find(path)?, &sources.headers()?, &v.compile_defines(), arch)?;
    let file = std::env::temp_dir().join(format!("ladder-sass-{}-{}.cubin", std::process::id(), v.stage));
    std::fs::write(&file, &compiled.image)
        .map_err(|e| Error::constraint("a writable temporary directory", e.to_string()))?;
    // cuobjdump -sass runs nvdisasm, which the PyPI packages put beside it, not on PATH.
    let tool = cuobjdump(tc)?;
    let dir = tool.parent().map(Path::to_path_buf).unwrap_or_default();
    let inherited = std::env::var_os("PATH").unwrap_or_default();
    let paths = std::iter::once(dir).chain(std::env::split_paths(&inherited));
    let path =
        std::env::join_paths(paths).map_err(|e| Error::constraint("a PATH to run cuobjdump with", e.to_string()))?;
    let run = Command::new(tool).env("PATH", path).arg("-sass").arg(&file).output();
    let _ = std::fs::remove_file(&file);
    let out = run.map_err(|e| Error::constraint("cuobjdump to run", e.to_string()))?;
    if !out.status.success() {
        return Err(Error::constraint("cuobjdump -sass to succeed", String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    Ok(Disassembly {
        functions: parse(&String::from_utf8_lossy(&out.stdout)),
        ptxas_warnings: compiled.ptxas_findings(),
        ptx: compiled.ptx,
    })
}

/// One line of the summary table: `entry | total | count per class`.
pub fn summary_row(name: &str, s: &Summary) -> String {
    let counts: Vec<String> = CLASSES.iter().map(|c| s.get(c).to_string()).collect();
    format!("| {name} | {} | {} |", s.total, counts.join(" | "))
}

/// The summary table's head.
pub fn summary_head(first: &str) -> String {
    format!("| {first} | total | {} |\n|{}", CLASSES.join(" | "), "---|".repeat(CLASSES.len() + 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
	code for sm_90a
		Function : toy_kernel
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                       /* 0x00000a00ff017b82 */
                                                                                /* 0x000fe40000000800 */
        /*0010*/                   S2R R0, SR_TID.X ;                           /* 0x0000000000007919 */
.L_x_1:
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;             /* 0x0000000402047981 */
        /*0030*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;         /* 0x0000000604087239 */
        /*0040*/                   MUFU.EX2 R9, R9 ;                            /* 0x0000000009097308 */
        /*0050*/              @!P0 BRA `(.L_x_1) ;                              /* 0xfffffffc00008947 */
        /*0060*/                   STL [R1], R8 ;                               /* 0x0000000801007387 */
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;                /* 0x0000000000007b1d */
        /*0080*/                   STG.E desc[UR4][R2.64], R8 ;                 /* 0x0000000802007986 */
        /*0090*/                   EXIT ;                                       /* 0x000000000000794d */
        /*00a0*/                   NOP;                                         /* 0x0000000000007918 */
		Function : other
        /*0000*/                   EXIT ;                                       /* 0x000000000000794d */
"#;

    #[test]
    fn parses_functions_instructions_and_labels() {
        let f = parse(SAMPLE);
        assert_eq!(f.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["toy_kernel", "other"]);
        let toy = &f[0];
        assert_eq!(toy.instructions.len(), 11);
        assert_eq!(toy.instructions[2].opcode(), "LDG.E.128");
        assert_eq!(toy.instructions[5].opcode(), "BRA", "the predicate is not the opcode");
        assert_eq!(toy.instructions[5].address, 0x50);
        assert_eq!(toy.instructions[5].branch_target(), Some(Target::Label(".L_x_1")));
        let at = |text: &str| Instruction { address: 0x100, text: text.into() };
        assert_eq!(at("@!P0 BRA 0x1c60").branch_target(), Some(Target::Address(0x1c60)));
        assert_eq!(at("@P0 BRA !P1, 0xdf40").branch_target(), Some(Target::Address(0xdf40)));
        assert_eq!(at("FFMA R1, R2, R3, R4").branch_target(), None);
    }

    #[test]
    fn a_branch_to_an_earlier_address_is_a_loop() {
        let cubin_style = SAMPLE.replace("`(.L_x_1)", "0x20").replace(".L_x_1:", "");
        let toy = &parse(&cubin_style)[0];
        assert_eq!(toy.main_loop(), Some(2..6));
    }

    #[test]
    fn counts_by_class_and_finds_the_loop() {
        let toy = &parse(SAMPLE)[0];
        let s = Summary::of(&toy.instructions);
        assert_eq!(s.total, 10, "NOP padding is not counted");
        for (class, n) in [("HMMA", 1), ("MUFU", 1), ("global ld", 1), ("global st", 1), ("spills", 1), ("barriers", 1)]
        {
            assert_eq!(s.get(class), n, "{class}");
        }
        assert_eq!(s.get("other"), 4, "LDC, S2R, BRA, EXIT");
        let body = toy.main_loop().expect("a backward branch");
        assert_eq!(body, 2..6, "from the label to the branch");
        assert_eq!(parse(SAMPLE)[1].main_loop(), None, "straight-line code has none");
    }

    #[test]
    fn a_turn_runs_one_copy_of_a_path_compiled_twice() {
        // A loop whose body holds two copies of a path: the predicated branch skips the masked one
        // (3 instructions), the unpredicated one jumps over the unmasked one (2), and a spin wait's
        // slow path lies outside the body.
        let listing = "\t\tFunction : twice\n\
            /*0000*/ S2R R0, SR_TID.X ;\n\
            /*0010*/ HMMA.16816.F32.BF16 R8, R4, R6, R8 ;\n\
            /*0020*/ @P0 BRA 0x70 ;\n\
            /*0030*/ ISETP.GE.AND P1, PT, R0, R2, PT ;\n\
            /*0040*/ FSEL R8, R8, -INF , !P1 ;\n\
            /*0050*/ FMNMX R9, R8, R9, !PT ;\n\
            /*0060*/ BRA 0x90 ;\n\
            /*0070*/ FMNMX R9, R8, R9, !PT ;\n\
            /*0080*/ NOP ;\n\
            /*0090*/ @!P2 BRA 0xc0 ;\n\
            /*00a0*/ MUFU.EX2 R9, R9 ;\n\
            /*00b0*/ @!P3 BRA 0x10 ;\n\
            /*00c0*/ BRA 0xa0 ;\n\
            /*00d0*/ EXIT ;\n";
        let f = &parse(listing)[0];
        let body = f.main_loop().expect("the backward branch at 0xb0");
        assert_eq!(body, 1..12);
        assert_eq!(Summary::of(&f.instructions[body.clone()]).total, 10, "both copies counted");
        // Shortest: HMMA, the branch, the unmasked FMNMX (the NOP is padding), the spin's branch,
        // MUFU, the back edge. Longest: the masked copy (ISETP, FSEL, FMNMX, BRA) instead of the
        // unmasked FMNMX.
        assert_eq!(f.turn_lengths(body), (6, 9));
    }

    #[test]
    fn the_summary_table_has_a_column_per_class() {
        let head = summary_head("entry");
        let row = summary_row("toy", &Summary::of(&parse(SAMPLE)[0].instructions));
        let cells = |l: &str| l.matches('|').count();
        assert_eq!(cells(head.lines().next().unwrap()), cells(&row));
        assert!(row.starts_with("| toy | 10 | 0 | 1 |"), "{row}");
    }
}
