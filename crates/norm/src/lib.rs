//! The norm family: LayerNorm forward and the attention softmax, each a ladder of stages from the
//! reference report's naive kernels to the bandwidth limit.

use common::declare_family;

pub mod layernorm;
pub mod softmax;

declare_family! {
    pub struct Norm {
        name: "norm",
        description: "LayerNorm forward and row softmax (fp32): naive -> reductions -> single-pass vectorized",
        imports: [],
        ops: [&layernorm::LayerNorm, &softmax::Softmax],
    }
}
