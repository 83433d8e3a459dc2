//! The quant-int4 family: decode-phase GQA attention over an INT4 KV cache (row-wise or
//! group-wise scales), after "An efficient decoding Grouped-Query Attention with low-precision KV
//! cache": the formats and their quantizer, the BF16 and INT4 split-K baselines and the report's
//! ten optimizations as switches of one kernel.

pub mod decode;
pub mod format;
pub mod quantize;

common::declare_family! {
    pub struct QuantInt4 {
        name: "quant-int4",
        description: "INT4 KV-cache decode GQA: quantizer, BF16/INT4 split-K baselines, the ten-optimization ladder",
        // The split kernel writes attention's split layout and uses its combine.
        imports: [&attention::SOURCES],
        ops: [&decode::Decode, &quantize::Quantize],
    }
}
