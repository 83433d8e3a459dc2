//! The norm family: LayerNorm forward and the attention softmax, each a ladder of stages from the
//! reference report's naive kernels to the bandwidth limit.

pub mod layernorm;
pub mod softmax;

common::declare_family! {
    pub struct Norm {
        name: "norm",
        description: "LayerNorm forward and row softmax (fp32): naive -> reductions -> single-pass vectorized",
        imports: [],
        ops: [&layernorm::LayerNorm, &softmax::Softmax],
    }
}
