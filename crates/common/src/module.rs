//! Kernel sources and modules: each family's embedded `.cu`/`.cuh` files ([`Sources`]), compiled
//! lazily per (family, path, defines, arch) and loaded once per process.

use std::sync::Arc;

use cudarc::driver::CudaModule;
use cudarc::nvrtc::Ptx;
use rayon::prelude::*;

use crate::error::{DriverContext, Error, Result};
use crate::gpu::Gpu;
use crate::nvrtc::{Arch, Compiled, Toolchain};
use crate::variant::{Define, Source, Variant};

/// A `.cu` or `.cuh` file embedded in a crate at build time; `path` is relative to its `kernels/`.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    pub path: &'static str,
    pub text: &'static str,
}

impl KernelSource {
    pub fn is_header(&self) -> bool {
        self.path.ends_with(".cuh")
    }
}

/// A family's kernel files, and the families whose device headers its kernels may include (a
/// family exposes its `.cuh` files to another by being listed in that one's `imports`).
#[derive(Debug)]
pub struct Sources {
    pub family: &'static str,
    pub files: &'static [KernelSource],
    pub imports: &'static [&'static Sources],
}

impl Sources {
    /// The source of `path` among this family's files.
    pub fn find(&self, path: &str) -> Result<&'static KernelSource> {
        self.files
            .iter()
            .find(|s| s.path == path)
            .ok_or_else(|| Error::MissingSource(format!("{}: {path}", self.family)))
    }

    /// The headers NVRTC sees for this family's kernels: common's shared ones, the family's own
    /// `.cuh` files and those of the families it imports. Two headers of one name are an error.
    pub fn headers(&self) -> Result<Vec<KernelSource>> {
        let own = crate::common_sources().iter().chain(self.files);
        let imported = self.imports.iter().flat_map(|s| s.files.iter());
        let mut out: Vec<KernelSource> = Vec::new();
        for h in own.chain(imported).filter(|s| s.is_header()) {
            if out.iter().any(|o| o.path == h.path && o.text != h.text) {
                return Err(Error::MissingSource(format!(
                    "{}: header {} is defined by two families; rename one",
                    self.family, h.path
                )));
            }
            if !out.iter().any(|o| o.path == h.path) {
                out.push(*h);
            }
        }
        Ok(out)
    }
}

/// One module as [`Gpu::module`] compiles it: its key in the process-wide cache and NVRTC's inputs.
struct ModuleJob {
    key: String,
    variant: String,
    source: &'static KernelSource,
    headers: Vec<KernelSource>,
    defines: Vec<Define>,
    arch: Arch,
}

impl ModuleJob {
    fn compile(&self, tc: &Toolchain) -> Result<Compiled> {
        tc.compile(&self.variant, self.source, &self.headers, &self.defines, self.arch)
    }
}

impl Gpu {
    /// The compiled module of `variant` (its `.cu`, switches and tunables, for this device's exact
    /// architecture), compiling it or reading the disk cache on first use. The process-wide cache is
    /// keyed by family, path, defines and architecture, so two families' `op/NN_x.cu` never collide.
    pub fn module(&self, sources: &Sources, variant: &Variant) -> Result<Arc<CudaModule>> {
        let job = self.module_job(sources, variant)?;
        if let Some(m) = self.module_cache().lock().unwrap().get(&job.key) {
            return Ok(m.clone());
        }
        let compiled = job.compile(&*self.toolchain()?)?;
        self.load_compiled(job.key, compiled)
    }

    /// Compiles the modules of `variants` that are not loaded yet, all at once on every core (NVRTC
    /// compiles programs in parallel), and loads them: [`Gpu::module`]'s first-use work for a whole
    /// stage list ahead of time, so that a run does not compile one stage at a time. What cannot be
    /// loaded here is left to [`Gpu::module`], which reports it in the stage's own row: a library
    /// row or a stage this device does not support (no module), a compile error, no NVRTC. Returns
    /// how many modules were loaded.
    pub fn load_modules(&self, sources: &Sources, variants: &[Variant]) -> usize {
        let Ok(tc) = self.toolchain() else { return 0 };
        let mut jobs: Vec<ModuleJob> = Vec::new();
        {
            let loaded = self.module_cache().lock().unwrap();
            for job in variants.iter().filter_map(|v| self.module_job(sources, v).ok()) {
                if !loaded.contains_key(&job.key) && !jobs.iter().any(|j| j.key == job.key) {
                    jobs.push(job);
                }
            }
        }
        let images: Vec<(String, Compiled)> =
            jobs.into_par_iter().filter_map(|job| Some((job.key.clone(), job.compile(&tc).ok()?))).collect();
        images.into_iter().map(|(key, image)| self.load_compiled(key, image)).filter(Result::is_ok).count()
    }

    fn module_job(&self, sources: &Sources, variant: &Variant) -> Result<ModuleJob> {
        let Source::Kernel(path) = variant.source else {
            return Err(Error::MissingSource(format!("{} is a library call or host work, not a kernel", variant.id())));
        };
        self.supports(variant)?;
        let arch = self.arch(variant.requires.arch_specific);
        let defines = variant.compile_defines();
        Ok(ModuleJob {
            key: format!("{}/{path}|{defines:?}|{arch}", sources.family),
            variant: variant.id(),
            source: sources.find(path)?,
            headers: sources.headers()?,
            defines,
            arch,
        })
    }

    fn load_compiled(&self, key: String, compiled: Compiled) -> Result<Arc<CudaModule>> {
        let module = self.context().load_module(Ptx::from_binary(compiled.image)).ctx("load the compiled module")?;
        self.module_cache().lock().unwrap().insert(key, module.clone());
        Ok(module)
    }

    /// The modules of `sources`' file `path` loaded so far that were compiled with switch `switch` on
    /// (a prepared stage may have set defines per shape, so its module is found by file and switch:
    /// the timeline reads its stamps from whichever of these a run launched).
    pub fn loaded_with(&self, sources: &Sources, path: &str, switch: &'static str) -> Vec<Arc<CudaModule>> {
        let prefix = format!("{}/{path}|", sources.family);
        let on = format!("{:?}", crate::variant::Define::on(switch));
        let cache = self.module_cache().lock().unwrap();
        cache.iter().filter(|(k, _)| k.starts_with(&prefix) && k.contains(&on)).map(|(_, m)| m.clone()).collect()
    }

    /// Copies `data` into the `__constant__` (or `__device__`) symbol `symbol` of `variant`'s module,
    /// after checking it fits; ordered on `stream`.
    pub fn write_symbol<T: cudarc::driver::DeviceRepr>(
        &self,
        sources: &Sources,
        variant: &Variant,
        symbol: &str,
        data: &[T],
    ) -> Result<()> {
        let module = self.module(sources, variant)?;
        let stream = self.stream();
        let mut global = module.get_global(symbol, stream).ctx("find the module symbol")?;
        let bytes = std::mem::size_of_val(data);
        if bytes > global.len() {
            return Err(Error::constraint(
                format!("data fits the {}-byte symbol {symbol}", global.len()),
                format!("{bytes} bytes"),
            ));
        }
        // SAFETY: T is plain data; the view covers `bytes` bytes of the symbol.
        let src = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, bytes) };
        let mut dst = global.slice_mut(0..bytes);
        stream.memcpy_htod(src, &mut dst).ctx("copy to the module symbol")
    }

    /// Fails unless this device can run `variant`.
    pub fn supports(&self, variant: &Variant) -> Result<()> {
        let cc = self.info().compute_capability;
        let need = variant.requires.min_cc;
        let exact = variant.requires.arch_specific;
        if cc < need || (exact && cc != need) {
            return Err(Error::Unsupported {
                variant: variant.id(),
                needed: format!("{}{}.{}", if exact { "exactly " } else { "" }, need.0, need.1),
                found: format!("{}.{}", cc.0, cc.1),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static A_FILES: [KernelSource; 2] =
        [KernelSource { path: "a.cuh", text: "// a" }, KernelSource { path: "op/00_x.cu", text: "" }];
    static A: Sources = Sources { family: "a", files: &A_FILES, imports: &[] };
    static B_FILES: [KernelSource; 1] = [KernelSource { path: "b.cuh", text: "// b" }];
    static B: Sources = Sources { family: "b", files: &B_FILES, imports: &[&A] };
    static CLASH_FILES: [KernelSource; 1] = [KernelSource { path: "a.cuh", text: "// other" }];
    static CLASH: Sources = Sources { family: "c", files: &CLASH_FILES, imports: &[&A] };

    #[test]
    fn imports_expose_headers() {
        let names: Vec<&str> = B.headers().unwrap().iter().map(|h| h.path).collect();
        assert!(names.contains(&"a.cuh") && names.contains(&"b.cuh") && names.contains(&"ladder.cuh"), "{names:?}");
        assert!(!names.contains(&"op/00_x.cu"));
        assert!(CLASH.headers().is_err());
        assert!(A.find("op/00_x.cu").is_ok() && B.find("op/00_x.cu").is_err());
    }
}
