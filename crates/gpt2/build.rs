include!("../common/embed_kernels.rs");
