include!("embed_kernels.rs");
