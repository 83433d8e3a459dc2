//! Kernel sources: each family's embedded `.cu`/`.cuh` files ([`Sources`]). Compiling and loading
//! them (lazily per family, path, defines and arch, once per process) is [`crate::Gpu::module`].

use crate::error::{Error, Result};

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
