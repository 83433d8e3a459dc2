//! Run-time compilation with NVRTC. Sources and the shared headers travel inside the binary; the
//! CUDA headers (`cuda_fp16.h`, `mma.h`, ...) come from a CUDA install or pip's `nvidia/cu13`.
//! Compiled modules are cached on disk, keyed by everything that changes the output.

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::nvrtc::sys;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::module::KernelSource;
use crate::variant::Define;

/// What ptxas allocated for one entry point of a module (`--ptxas-options=-v`): the resource
/// report to read before timing a stage, available without a GPU. Dynamic shared memory is not in
/// it: the host sizes it at launch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EntryResources {
    pub entry: String,
    /// Registers per thread as compiled (a `setmaxnreg` kernel's warpgroups change theirs at run time).
    pub registers: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    /// Per-thread stack: spills, and arrays indexed at run time.
    pub stack_bytes: u32,
    pub static_shared_bytes: u32,
    /// Named barriers the entry may use (`bar.sync id`): 16 is the SM's limit.
    pub barriers: u32,
}

impl EntryResources {
    /// Every entry point in a ptxas log, in the log's order. A function that is not an entry (a
    /// `noinline` device function) has properties but no `Used N registers` line of its own here
    /// and is skipped.
    pub fn parse(log: &str) -> Vec<EntryResources> {
        let number_before = |line: &str, what: &str| -> Option<u32> {
            let at = line.find(what)?;
            line[..at].split(|c: char| !c.is_ascii_digit()).rev().find(|w| !w.is_empty())?.parse().ok()
        };
        let mut entries: Vec<EntryResources> = Vec::new();
        let mut current: Option<EntryResources> = None;
        // The function the next `bytes stack frame` line describes (an entry, or a device function).
        let mut properties_of = String::new();
        for line in log.lines() {
            if let Some(rest) = line.split("Compiling entry function '").nth(1) {
                entries.extend(current.take());
                let name = rest.split('\'').next().unwrap_or_default();
                current = Some(EntryResources { entry: name.to_string(), ..Default::default() });
            } else if let Some(name) = line.split("Function properties for ").nth(1) {
                properties_of = name.trim().to_string();
            } else if let Some(e) = current.as_mut() {
                if line.contains("bytes stack frame") {
                    if properties_of != e.entry {
                        continue;
                    }
                    e.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                    e.spill_store_bytes = number_before(line, "bytes spill stores").unwrap_or(0);
                    e.spill_load_bytes = number_before(line, "bytes spill loads").unwrap_or(0);
                } else if line.contains("Used ") && line.contains(" registers") {
                    e.registers = number_before(line, " registers").unwrap_or(0);
                    e.barriers = number_before(line, " barriers").unwrap_or(0);
                    e.static_shared_bytes = number_before(line, " bytes smem").unwrap_or(0);
                }
            }
        }
        entries.extend(current);
        entries
    }

    /// The entry points of `log`, ptxas's report of a compile of `variant` for `arch` by NVRTC
    /// `version` with `options`; a typed error naming the NVRTC version and options when it reports
    /// none (an empty log: a compile served from NVRTC's own cache, or an NVRTC that does not pass
    /// the report on).
    pub fn from_log(
        log: &str,
        variant: &str,
        arch: Arch,
        version: (i32, i32),
        options: &[String],
    ) -> Result<Vec<EntryResources>> {
        let entries = EntryResources::parse(log);
        if entries.is_empty() {
            return Err(Error::NoPtxasReport {
                variant: variant.to_string(),
                arch: arch.name(),
                nvrtc: format!("{}.{}", version.0, version.1),
                options: options.join(" "),
                log: if log.trim().is_empty() { "(empty)".to_string() } else { log.to_string() },
            });
        }
        Ok(entries)
    }
}

/// The options that make NVRTC `version` pass ptxas's resource report into the program log, on
/// every compile: `--ptxas-options=-v`, and from NVRTC 12.9 on also `--no-cache`. Those versions
/// keep a cache of compiled programs (where a CUDA driver is installed: on a CPU-only machine, as
/// in CI, nothing is cached) and serve a repeated compile of the same source and options from it
/// without running ptxas, so with an empty log; this crate's own cache keeps the log instead. Older
/// versions do not know `--no-cache` (an invalid option there).
pub fn ptxas_report_options(version: (i32, i32)) -> Vec<String> {
    let mut options = vec!["--ptxas-options=-v".to_string()];
    if version >= (12, 9) {
        options.push("--no-cache".to_string());
    }
    options
}

/// A compilation target: `sm_XY`, or `sm_XYa` with the architecture-specific features (wgmma,
/// setmaxnreg) that only run on exactly that chip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
    pub arch_specific: bool,
}

impl Arch {
    pub const SM80: Arch = Arch { major: 8, minor: 0, arch_specific: false };
    pub const SM90: Arch = Arch { major: 9, minor: 0, arch_specific: false };
    pub const SM90A: Arch = Arch { major: 9, minor: 0, arch_specific: true };

    pub fn name(&self) -> String {
        format!("sm_{}{}{}", self.major, self.minor, if self.arch_specific { "a" } else { "" })
    }

    /// `sm_XY` or `sm_XYa` (one digit each): the form [`Arch::name`] writes.
    pub fn parse(name: &str) -> Result<Arch> {
        let bad = || Error::constraint("an architecture sm_XY or sm_XYa (sm_80, sm_90, sm_90a)", format!("'{name}'"));
        let rest = name.strip_prefix("sm_").ok_or_else(bad)?;
        let (digits, arch_specific) = rest.strip_suffix('a').map_or((rest, false), |d| (d, true));
        let mut d = digits.chars().map(|c| c.to_digit(10));
        match (d.next(), d.next(), d.next()) {
            (Some(Some(major)), Some(Some(minor)), None) => Ok(Arch { major, minor, arch_specific }),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// NVRTC (already loaded) and the directory holding the CUDA headers.
#[derive(Debug)]
pub struct Toolchain {
    pub include_dir: PathBuf,
    pub version: (i32, i32),
    cache_dir: Option<PathBuf>,
}

/// What one compilation produced. `image` is a CUBIN for the exact architecture (no driver JIT);
/// `ptx` is kept beside it for reading, and `log` is NVRTC's, with ptxas's resource report and
/// warnings (the cache keeps all three).
#[derive(Debug)]
pub struct Compiled {
    pub image: Vec<u8>,
    pub ptx: String,
    pub log: String,
    /// Read back from this crate's cache (log and PTX included), not compiled.
    pub from_cache: bool,
}

impl Compiled {
    /// The ptxas warnings in the log.
    /// ptxas serializes wgmma it cannot prove safe to overlap (C7510) and ignores a setmaxnreg it
    /// cannot honour (C7508), each only with a warning.
    pub fn ptxas_warnings(&self) -> Vec<String> {
        self.log.lines().filter(|l| l.contains("ptxas") && l.contains("arning")).map(String::from).collect()
    }

    /// The warnings, and the wgmma notes ptxas prints as `info` (C75xx: a pipeline serialized, C7512
    /// / C7514 / C7520; a `warpgroup.arrive` injected, C7519), trimmed: what bears on speed.
    pub fn ptxas_findings(&self) -> Vec<String> {
        let wgmma_note = |l: &str| l.contains("(C75");
        let lines = self.log.lines().filter(|l| l.contains("ptxas") && (l.contains("arning") || wgmma_note(l)));
        lines.map(|l| l.trim().to_string()).collect()
    }
}

fn python_site_dirs() -> Vec<PathBuf> {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print('\\n'.join(p for p in sys.path if p))"])
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).lines().map(PathBuf::from).collect(),
        _ => Vec::new(),
    }
}

/// Places to look for `include/cuda_fp16.h`, in order: `$LADDER_CUDA_HOME`, `$CUDA_HOME`,
/// `$CUDA_PATH`, `/usr/local/cuda`, then pip's `nvidia/cu13` and `nvidia/cuda_runtime` (the
/// packages `nvidia-cuda-runtime` + `nvidia-cuda-crt`) in python3's `sys.path`.
pub(crate) fn cuda_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for var in ["LADDER_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"] {
        if let Ok(v) = std::env::var(var) {
            if !v.is_empty() {
                roots.push(PathBuf::from(v));
            }
        }
    }
    roots.push(PathBuf::from("/usr/local/cuda"));
    for site in python_site_dirs() {
        roots.push(site.join("nvidia/cu13"));
        roots.push(site.join("nvidia/cuda_runtime"));
    }
    roots
}

/// Loads libnvrtc from a CUDA root's `lib`/`lib64` by absolute path, so the later load by soname
/// (inside cudarc) finds it already resident even when the folder is not on `LD_LIBRARY_PATH`.
fn preload_nvrtc(roots: &[PathBuf]) {
    for root in roots {
        for lib in ["lib64", "lib"] {
            for name in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
                let path = root.join(lib).join(name);
                if path.exists() {
                    // SAFETY: loading NVIDIA's NVRTC library runs only its initialisers.
                    if let Ok(lib) = unsafe { libloading::Library::new(&path) } {
                        std::mem::forget(lib); // stays loaded for the process
                        return;
                    }
                }
            }
        }
    }
}

impl Toolchain {
    /// Finds the CUDA headers and loads NVRTC; the error says where it looked.
    pub fn locate() -> Result<Toolchain> {
        let roots = cuda_roots();
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            preload_nvrtc(&roots);
        }
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoNvrtc(format!(
                "libnvrtc.so could not be loaded from LD_LIBRARY_PATH or from lib/ and lib64/ under {}",
                roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
            )));
        }
        let include_dir =
            roots.iter().map(|r| r.join("include")).find(|inc| inc.join("cuda_fp16.h").exists()).ok_or_else(|| {
                Error::NoCudaHeaders(
                    roots.iter().map(|r| r.join("include").display().to_string()).collect::<Vec<_>>().join(", "),
                )
            })?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| Error::NoNvrtc(format!("nvrtcVersion failed: {e:?}")))?;
        Ok(Toolchain { include_dir, version: (major, minor), cache_dir: cache_dir() })
    }

    /// Compiles `source` for `arch` with `defines`; the shared headers are available by name.
    /// `variant` names the variant in errors.
    pub fn compile(
        &self,
        variant: &str,
        source: &KernelSource,
        headers: &[KernelSource],
        defines: &[Define],
        arch: Arch,
    ) -> Result<Compiled> {
        self.compile_with(variant, source, headers, &self.options(defines, arch), arch)
    }

    /// [`Toolchain::compile`] with its options already built: read from the cache, or compiled and
    /// written to it.
    fn compile_with(
        &self,
        variant: &str,
        source: &KernelSource,
        headers: &[KernelSource],
        options: &[String],
        arch: Arch,
    ) -> Result<Compiled> {
        let key = self.cache_key(source, headers, options);
        if let Some(hit) = self.cache_read(&key) {
            return Ok(hit);
        }
        let compiled = self.compile_uncached(variant, source, headers, options, arch)?;
        self.cache_write(&key, &compiled);
        Ok(compiled)
    }

    /// `source` compiled as [`Toolchain::compile`] compiles it (the same cache entry): what ptxas
    /// allocated for each entry point, read from the log. Needs no GPU. A log without a report is
    /// [`Error::NoPtxasReport`].
    pub fn resources(
        &self,
        variant: &str,
        source: &KernelSource,
        headers: &[KernelSource],
        defines: &[Define],
        arch: Arch,
    ) -> Result<Vec<EntryResources>> {
        let options = self.options(defines, arch);
        let compiled = self.compile_with(variant, source, headers, &options, arch)?;
        EntryResources::from_log(&compiled.log, variant, arch, self.version, &options)
    }

    /// This toolchain without its cache: every compile runs NVRTC and ptxas (what a test of NVRTC's
    /// own caching needs).
    pub fn uncached(&self) -> Toolchain {
        Toolchain { include_dir: self.include_dir.clone(), version: self.version, cache_dir: None }
    }

    fn options(&self, defines: &[Define], arch: Arch) -> Vec<String> {
        let mut options = vec![
            format!("--gpu-architecture={}", arch.name()),
            "--std=c++17".to_string(),
            "--generate-line-info".to_string(),
            "-DNDEBUG".to_string(),
            format!("-I{}", self.include_dir.display()),
        ];
        options.extend(ptxas_report_options(self.version));
        let mut sorted: Vec<&Define> = defines.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        for d in sorted {
            options.push(format!("-D{}={}", d.name, d.value));
        }
        options
    }

    fn cache_key(&self, source: &KernelSource, headers: &[KernelSource], options: &[String]) -> String {
        let mut h = Sha256::new();
        h.update(source.path.as_bytes());
        h.update([0]);
        h.update(source.text.as_bytes());
        for header in headers {
            h.update([0]);
            h.update(header.path.as_bytes());
            h.update([0]);
            h.update(header.text.as_bytes());
        }
        for o in options {
            h.update([1]);
            h.update(o.as_bytes());
        }
        h.update(format!("nvrtc {}.{}", self.version.0, self.version.1).as_bytes());
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// An entry is whole once its cubin is there: the log and the PTX are written before it.
    fn cache_read(&self, key: &str) -> Option<Compiled> {
        let dir = self.cache_dir.as_ref()?;
        let image = std::fs::read(dir.join(format!("{key}.cubin"))).ok()?;
        let log = std::fs::read_to_string(dir.join(format!("{key}.log"))).ok()?;
        let ptx = std::fs::read_to_string(dir.join(format!("{key}.ptx"))).ok()?;
        Some(Compiled { image, ptx, log, from_cache: true })
    }

    fn cache_write(&self, key: &str, compiled: &Compiled) {
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let Some(dir) = self.cache_dir.as_ref() else { return };
        // Write then rename, to a name no other process or thread writes, so a concurrent reader
        // never sees half a file. A failed write only costs a recompilation next time.
        let write = |ext: &str, bytes: &[u8]| {
            let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = dir.join(format!("{key}.{ext}.{}-{n}.tmp", std::process::id()));
            if std::fs::write(&tmp, bytes).is_ok() {
                let _ = std::fs::rename(&tmp, dir.join(format!("{key}.{ext}")));
            }
        };
        if std::fs::create_dir_all(dir).is_ok() {
            write("log", compiled.log.as_bytes());
            write("ptx", compiled.ptx.as_bytes());
            write("cubin", &compiled.image);
        }
    }

    fn compile_uncached(
        &self,
        variant: &str,
        source: &KernelSource,
        headers: &[KernelSource],
        options: &[String],
        arch: Arch,
    ) -> Result<Compiled> {
        let fail = |log: String| Error::Compile { variant: variant.to_string(), arch: arch.name(), log };
        let c = |s: &str| CString::new(s).map_err(|_| fail(format!("interior NUL in '{s}'")));
        let src = c(source.text)?;
        let name = c(source.path)?;
        let header_texts: Vec<CString> = headers.iter().map(|h| c(h.text)).collect::<Result<_>>()?;
        let header_names: Vec<CString> = headers.iter().map(|h| c(h.path)).collect::<Result<_>>()?;
        let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|s| s.as_ptr()).collect();
        let name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();
        let opts: Vec<CString> = options.iter().map(|o| c(o)).collect::<Result<_>>()?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();

        let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: all pointers stay alive for the calls below; `prog` is destroyed before return.
        unsafe {
            sys::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                headers.len() as i32,
                text_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
            )
            .result()
            .map_err(|e| fail(format!("nvrtcCreateProgram: {e:?}")))?;
            let status = sys::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
            let log = program_log(prog);
            let result = if status != sys::nvrtcResult::NVRTC_SUCCESS {
                Err(fail(format!("{status:?}\n{log}\noptions: {}", options.join(" "))))
            } else {
                get_outputs(prog).map(|(image, ptx)| Compiled { image, ptx, log, from_cache: false }).map_err(fail)
            };
            let _ = sys::nvrtcDestroyProgram(&mut prog);
            result
        }
    }
}

unsafe fn program_log(prog: sys::nvrtcProgram) -> String {
    let mut size = 0usize;
    if sys::nvrtcGetProgramLogSize(prog, &mut size) != sys::nvrtcResult::NVRTC_SUCCESS {
        return String::new();
    }
    let mut buf = vec![0u8; size.max(1)];
    if sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char) != sys::nvrtcResult::NVRTC_SUCCESS {
        return String::new();
    }
    String::from_utf8_lossy(&buf).trim_end_matches('\0').trim().to_string()
}

unsafe fn get_outputs(prog: sys::nvrtcProgram) -> std::result::Result<(Vec<u8>, String), String> {
    let mut size = 0usize;
    sys::nvrtcGetCUBINSize(prog, &mut size).result().map_err(|e| format!("nvrtcGetCUBINSize: {e:?}"))?;
    let mut image = vec![0u8; size];
    sys::nvrtcGetCUBIN(prog, image.as_mut_ptr() as *mut c_char)
        .result()
        .map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))?;
    sys::nvrtcGetPTXSize(prog, &mut size).result().map_err(|e| format!("nvrtcGetPTXSize: {e:?}"))?;
    let mut ptx = vec![0u8; size];
    sys::nvrtcGetPTX(prog, ptx.as_mut_ptr() as *mut c_char).result().map_err(|e| format!("nvrtcGetPTX: {e:?}"))?;
    Ok((image, String::from_utf8_lossy(&ptx).trim_end_matches('\0').to_string()))
}

/// `$LADDER_CACHE_DIR`, else `$XDG_CACHE_HOME/kernel-ladder`, else `~/.cache/kernel-ladder`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("LADDER_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| Path::new(&h).join(".cache")))
        .ok()?;
    Some(base.join("kernel-ladder"))
}

/// `compile` run over `jobs` on every core, the results in the jobs' order. Each core takes the next
/// job as it frees (`par_bridge`), the later stages of a ladder (`stage`) first: a plain parallel
/// iterator hands each core a run of neighbouring jobs, and a run that holds two of the longest
/// compiles sets the time of all of them. Later stages first approximates longest first, which
/// would need each compile's time before it ran: a ladder's later stages carry more code, and its
/// longest compiles are among them.
pub fn compile_on_every_core<J: Send, R: Send>(
    jobs: Vec<J>,
    stage: impl Fn(&J) -> u32,
    compile: impl Fn(J) -> R + Sync + Send,
) -> Vec<R> {
    use rayon::prelude::*;
    let mut order: Vec<(usize, J)> = jobs.into_iter().enumerate().collect();
    order.sort_by_key(|(_, job)| std::cmp::Reverse(stage(job)));
    let mut done: Vec<(usize, R)> = order.into_iter().par_bridge().map(|(i, job)| (i, compile(job))).collect();
    done.sort_unstable_by_key(|&(i, _)| i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// NVRTC for tests that need no GPU; shared by the process.
pub fn toolchain() -> Result<Arc<Toolchain>> {
    static TC: std::sync::OnceLock<std::result::Result<Arc<Toolchain>, String>> = std::sync::OnceLock::new();
    TC.get_or_init(|| Toolchain::locate().map(Arc::new).map_err(|e| e.to_string())).clone().map_err(Error::Toolchain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_findings_keep_warnings_and_wgmma_notes() {
        let log = "ptxas info    : Used 168 registers\n\
                   ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized\n\
                   ptxas warning : (C7508) setmaxnreg ignored\n\
                   nvrtc: compiled";
        let c = Compiled { image: Vec::new(), ptx: String::new(), log: log.to_string(), from_cache: false };
        let f = c.ptxas_findings();
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(f[0].contains("C7514") && f[1].contains("C7508"));
        assert_eq!(c.ptxas_warnings().len(), 1, "the C75xx note is info, not a warning");
    }

    #[test]
    fn ptxas_report_is_read_per_entry() {
        // ptxas's layout (CUDA 13): a device function's properties, then two entries, one spilling.
        let log = "ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperv
ptxas         .     24 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Compiling entry function 'lean_residual' for 'sm_90a'
ptxas info    : Function properties for lean_residual
ptxas         .     624 bytes stack frame, 624 bytes spill stores, 456 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers, 1024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 265.069 ms
ptxas info    : Compiling entry function 'lean' for 'sm_90a'
ptxas info    : Function properties for lean
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 90 registers, 400 bytes cmem[0]
";
        let e = EntryResources::parse(log);
        assert_eq!(e.len(), 2, "{e:?}");
        assert_eq!(
            e[0],
            EntryResources {
                entry: "lean_residual".into(),
                registers: 168,
                spill_store_bytes: 624,
                spill_load_bytes: 456,
                stack_bytes: 624,
                static_shared_bytes: 1024,
                barriers: 16,
            }
        );
        assert_eq!(e[1], EntryResources { entry: "lean".into(), registers: 90, ..Default::default() });
        assert!(EntryResources::parse("nvrtc: no ptxas lines").is_empty());
        let options = ptxas_report_options((12, 9));
        match EntryResources::from_log("", "attention/kv-append/00-naive", Arch::SM90A, (12, 9), &options) {
            Err(e @ Error::NoPtxasReport { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains("NVRTC 12.9") && text.contains("--no-cache") && text.contains("(empty)"),
                    "{text}"
                );
            }
            other => panic!("an empty log should be NoPtxasReport, got {other:?}"),
        }
        assert_eq!(EntryResources::from_log(log, "x", Arch::SM90A, (13, 0), &options).unwrap(), e);
    }

    #[test]
    fn no_cache_only_where_nvrtc_caches() {
        // NVRTC 12.9 added its compile cache (and --no-cache); older versions reject the option.
        assert_eq!(ptxas_report_options((12, 8)), ["--ptxas-options=-v"]);
        assert_eq!(ptxas_report_options((11, 8)), ["--ptxas-options=-v"]);
        for v in [(12, 9), (13, 0), (13, 1)] {
            assert_eq!(ptxas_report_options(v), ["--ptxas-options=-v", "--no-cache"], "{v:?}");
        }
    }

    #[test]
    fn architectures_parse_as_they_are_named() {
        for arch in [Arch::SM80, Arch::SM90, Arch::SM90A] {
            assert_eq!(Arch::parse(&arch.name()).unwrap(), arch);
        }
        for bad in ["90a", "sm_9", "sm_900", "sm_9x", "sm_90b", ""] {
            let e = Arch::parse(bad).unwrap_err().to_string();
            assert!(e.contains("sm_XY or sm_XYa"), "{bad}: {e}");
        }
    }
}
