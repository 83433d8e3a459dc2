// Shared body of every kernel crate's build.rs (each one is `include!("../common/embed_kernels.rs");`).
// It embeds every `.cu`/`.cuh` file under the crate's `kernels/` folder into `$OUT_DIR/kernels.rs` as
// `pub const KERNEL_SOURCES: &[common::KernelSource]`, so the binary carries its sources and NVRTC
// compiles them at run time. Paths are relative to `kernels/` with `/` separators, sorted.
fn main() {
    use std::fmt::Write as _;
    let manifest = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.join("kernels");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        println!("cargo:rerun-if-changed={}", dir.display());
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if matches!(path.extension().and_then(|e| e.to_str()), Some("cu" | "cuh")) {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut out = String::from("pub const KERNEL_SOURCES: &[common::KernelSource] = &[\n");
    for path in &files {
        let rel = path.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
        writeln!(
            out,
            "    common::KernelSource {{ path: {rel:?}, text: include_str!({:?}) }},",
            path.display().to_string()
        )
        .unwrap();
    }
    out.push_str("];\n");
    let dest = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("kernels.rs");
    std::fs::write(dest, out).unwrap();
}
