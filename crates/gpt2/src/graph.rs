//! The decode step's CUDA graph: captured once for what its kernels bake in (a cache's buffers, how
//! the step ends), replayed while that holds, and its kernels counted for the model table.

use std::sync::Arc;

use common::cudarc::driver::{sys, CudaGraph, CudaStream};
use common::{DriverContext, Result};

/// A graph and the key it was captured for.
pub struct Captured<K> {
    key: K,
    graph: CudaGraph,
}

/// Launches `slot`'s graph, first capturing `enqueue` on `s` into it when the slot is empty or holds
/// another key's graph (which is dropped before the capture).
pub fn replay<K: PartialEq + Copy>(
    slot: &mut Option<Captured<K>>,
    key: K,
    s: &Arc<CudaStream>,
    enqueue: impl FnOnce(&Arc<CudaStream>) -> Result<()>,
) -> Result<()> {
    if slot.as_ref().map(|c| c.key) != Some(key) {
        *slot = None;
        *slot = Some(Captured { key, graph: common::timing::capture(s, enqueue)? });
    }
    slot.as_ref().expect("captured above").graph.launch().ctx("launch the decode graph")
}

impl<K> Captured<K> {
    /// Kernel nodes in the graph: every launch of one step.
    pub fn kernels(&self) -> Result<usize> {
        let g = &self.graph;
        let mut n = 0usize;
        // SAFETY: a null node array asks only for the count, which the driver writes into `n`.
        unsafe { sys::cuGraphGetNodes(g.cu_graph(), std::ptr::null_mut(), &mut n) }
            .result()
            .ctx("count graph nodes")?;
        let mut nodes = vec![std::ptr::null_mut(); n];
        // SAFETY: `nodes` holds `n` entries, the count the driver gave for this graph.
        unsafe { sys::cuGraphGetNodes(g.cu_graph(), nodes.as_mut_ptr(), &mut n) }.result().ctx("list graph nodes")?;
        let mut kernels = 0;
        for node in nodes {
            let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: `node` belongs to the live graph listed above.
            unsafe { sys::cuGraphNodeGetType(node, &mut ty) }.result().ctx("graph node type")?;
            kernels += usize::from(ty == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL);
        }
        Ok(kernels)
    }
}
