//! The KV cache: bf16 keys and values of every layer, contiguous or paged, and each sequence's
//! length.

use attention::decode::{KvCache as CacheRef, PagedCache};
use attention::kv_append::KvTarget;
use common::cudarc::driver::CudaSlice;

/// The KV cache of `b` sequences over the model's context (bf16), in the layout the plan's decode
/// stage reads, and each sequence's length.
pub struct KvCache {
    pub(crate) layers: Vec<LayerCache>,
    pub(crate) lens: Vec<usize>,
    /// Distinguishes caches (a captured decode graph has one cache's buffers baked in).
    pub(crate) id: u64,
}

/// One layer's keys and values: contiguous `[b, context, C]` each, or a paged cache of
/// [`PAGED_BLOCK`]-token blocks.
pub(crate) enum LayerCache {
    Contiguous { k: CudaSlice<u16>, v: CudaSlice<u16> },
    Paged(PagedCache),
}

/// Tokens per block of a paged cache.
pub const PAGED_BLOCK: usize = 16;

impl LayerCache {
    /// Where kv-append writes.
    pub(crate) fn target(&mut self) -> KvTarget<'_> {
        match self {
            LayerCache::Contiguous { k, v } => KvTarget::Contiguous { k, v },
            LayerCache::Paged(p) => KvTarget::Paged(p),
        }
    }

    /// What decode attention reads.
    pub(crate) fn read(&self) -> CacheRef<'_> {
        match self {
            LayerCache::Contiguous { k, v } => CacheRef::Contiguous { k, v },
            LayerCache::Paged(p) => CacheRef::Paged(p),
        }
    }
}

impl KvCache {
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// Whether the cache is paged (the plan's decode stage reads the paged layout).
    pub fn is_paged(&self) -> bool {
        matches!(self.layers.first(), Some(LayerCache::Paged(_)))
    }
}
