//! GPT-2's configurations and LayerNorm's epsilon.

use common::{Error, Result};

/// LayerNorm's epsilon in GPT-2.
pub const LN_EPS: f32 = 1e-5;

/// A GPT-2 configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub layers: usize,
    pub heads: usize,
    pub c: usize,
    pub vocab: usize,
    /// The context length (rows of the position embedding).
    pub max_t: usize,
}

impl Config {
    pub const GPT2: Config = Config { layers: 12, heads: 12, c: 768, vocab: 50257, max_t: 1024 };
    pub const MEDIUM: Config = Config { layers: 24, heads: 16, c: 1024, vocab: 50257, max_t: 1024 };
    pub const LARGE: Config = Config { layers: 36, heads: 20, c: 1280, vocab: 50257, max_t: 1024 };
    pub const XL: Config = Config { layers: 48, heads: 25, c: 1600, vocab: 50257, max_t: 1024 };

    /// `gpt2`, `gpt2-medium`, `gpt2-large` or `gpt2-xl`.
    pub fn by_name(name: &str) -> Result<Config> {
        match name {
            "gpt2" => Ok(Config::GPT2),
            "gpt2-medium" => Ok(Config::MEDIUM),
            "gpt2-large" => Ok(Config::LARGE),
            "gpt2-xl" => Ok(Config::XL),
            _ => Err(Error::constraint("model in {gpt2, gpt2-medium, gpt2-large, gpt2-xl}", format!("'{name}'"))),
        }
    }

    pub fn head_size(&self) -> usize {
        self.c / self.heads
    }

    /// The vocabulary padded to a multiple of 64 (50304 for GPT-2): the LM head's N, so every
    /// leading dimension of its GEMM is aligned (cuBLAS then takes its fast tensor-core path). The
    /// padding rows are zeros and never sampled: logits leave the model with V columns.
    pub fn padded_vocab(&self) -> usize {
        self.vocab.next_multiple_of(64)
    }

    /// Every dimension in one word (`L12-H12-C768-V50257-T1024`), for file names and tables.
    pub fn key(&self) -> String {
        format!("L{}-H{}-C{}-V{}-T{}", self.layers, self.heads, self.c, self.vocab, self.max_t)
    }
}
