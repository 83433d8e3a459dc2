//! Where the time goes: the decode step op by op (eager with events, or a replayed graph with event
//! nodes) and the whole-sequence pass timed with CUDA events.

use common::cudarc::driver::CudaStream;
use common::data::uniform;
use common::timing::{Timing, TimingConfig};
use common::{require, DriverContext, Gpu, Result};

use super::decode_engine::{enqueue_decode, StepEnd};
use super::sequence::Logits;
use super::Model;
use crate::cache::KvCache;
use crate::encoder::TokenIds;

/// One graph-replayed decode step, op by op ([`Model::decode_step_timeline`]).
#[derive(Clone, Debug)]
pub struct StepTimeline {
    /// `(op, start, end)` in ms from the step's start, in launch order (an op recurs once a layer).
    pub ops: Vec<(&'static str, f64, f64)>,
    /// The same step captured without the event nodes: its median device time in ms.
    pub plain_ms: f64,
}

impl Model {
    /// One eager decode step with an event after every op, enqueued behind a closed
    /// [`Gate`](common::timing::Gate) so the gaps of the host's launches are not counted: each op's
    /// device time in enqueue order, `(name, ms)` (ops of one name recur once per layer). The
    /// logits stay on the device.
    pub fn decode_step_profiled(
        &mut self,
        gpu: &Gpu,
        cache: &mut KvCache,
        tokens: &[i32],
    ) -> Result<Vec<(&'static str, f64)>> {
        self.begin_step(gpu, cache, tokens)?;
        let (_, op) = self.decode.as_mut().expect("prepared by begin_step");
        let s = gpu.stream().clone();
        let timed = Some(common::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let event = || gpu.context().new_event(timed).ctx("event");
        let gate = common::timing::Gate::close(gpu)?;
        let start = event()?;
        start.record(&s).ctx("record")?;
        let mut marks = Vec::new();
        enqueue_decode(&s, &self.weights, op, cache, StepEnd::Logits, &mut |name| {
            let e = event()?;
            e.record(&s).ctx("record")?;
            marks.push((name, e));
            Ok(())
        })?;
        gate.open()?;
        gpu.synchronize()?;
        let mut out = Vec::with_capacity(marks.len());
        let mut prev = &start;
        for (name, e) in &marks {
            out.push((*name, prev.elapsed_ms(e).ctx("elapsed")? as f64));
            prev = e;
        }
        cache.lens.iter_mut().for_each(|l| *l += 1);
        Ok(out)
    }

    /// The greedy decode step as a CUDA graph with an event node after every op, replayed `replays`
    /// times: where the replayed step's device time goes, op by op in launch order. Returns each op's
    /// `(name, start, end)` in ms from the step's start (medians over the replays) and the median
    /// device time of the same step captured without the event nodes (what they cost is the
    /// difference). Every replay writes the same cache cells; the lengths advance once at the end.
    pub fn decode_step_timeline(
        &mut self,
        gpu: &Gpu,
        cache: &mut KvCache,
        tokens: &[i32],
        replays: usize,
    ) -> Result<StepTimeline> {
        use common::cudarc::driver::sys::{CUevent_flags, CUevent_record_flags};
        require(replays >= 1, "replays >= 1", || format!("replays = {replays}"))?;
        self.begin_step(gpu, cache, tokens)?;
        let (_, op) = self.decode.as_mut().expect("prepared by begin_step");
        let s = gpu.stream().clone();
        let event = || gpu.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).ctx("event");
        // An external record inside a capture becomes an event node of the graph, recorded at each replay.
        let record = |e: &common::cudarc::driver::CudaEvent, st: &CudaStream| {
            let flags = CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32;
            // SAFETY: the event and the stream are live for the call.
            unsafe { common::cudarc::driver::sys::cuEventRecordWithFlags(e.cu_event(), st.cu_stream(), flags) }
                .result()
                .ctx("record an event node")
        };
        let start = event()?;
        let mut marks = Vec::new();
        let w = &self.weights;
        let marked = common::timing::capture(&s, |st| {
            record(&start, st)?;
            enqueue_decode(st, w, op, cache, StepEnd::Greedy, &mut |name| {
                let e = event()?;
                record(&e, st)?;
                marks.push((name, e));
                Ok(())
            })
        })?;
        let plain =
            common::timing::capture(&s, |st| enqueue_decode(st, w, op, cache, StepEnd::Greedy, &mut |_| Ok(())))?;
        let (before, after) = (event()?, event()?);
        let mut offsets = vec![Vec::with_capacity(replays); marks.len()];
        let mut plain_ms = Vec::with_capacity(replays);
        for _ in 0..replays {
            marked.launch().ctx("replay the marked step")?;
            before.record(&s).ctx("record")?;
            plain.launch().ctx("replay the step")?;
            after.record(&s).ctx("record")?;
            s.synchronize().ctx("the replays")?;
            for ((_, e), o) in marks.iter().zip(&mut offsets) {
                o.push(start.elapsed_ms(e).ctx("elapsed")? as f64);
            }
            plain_ms.push(before.elapsed_ms(&after).ctx("elapsed")? as f64);
        }
        let median = |v: &mut Vec<f64>| Timing::from_samples(v).median_ms;
        let mut ops = Vec::with_capacity(marks.len());
        let mut prev = 0.0;
        for ((name, _), o) in marks.iter().zip(&mut offsets) {
            let end = median(o);
            ops.push((*name, prev, end));
            prev = end;
        }
        cache.lens.iter_mut().for_each(|l| *l += 1);
        Ok(StepTimeline { ops, plain_ms: median(&mut plain_ms) })
    }

    /// A cache of `b` sequences that claim `len` positions each, for timing decode steps at that
    /// length without a prefill. Its keys and values are zeros: no stage's time depends on them.
    pub fn timing_cache(&self, gpu: &Gpu, b: usize, len: usize) -> Result<KvCache> {
        require(len >= 1 && len < self.cfg.max_t, &format!("1 <= len < context {}", self.cfg.max_t), || {
            format!("len = {len}")
        })?;
        let mut cache = self.new_cache(gpu, b)?;
        cache.lens.iter_mut().for_each(|l| *l = len);
        Ok(cache)
    }

    /// Times the whole-sequence forward pass of `b` rows of `t` random tokens ending in `logits`
    /// (CUDA events).
    pub fn time_forward(
        &mut self,
        gpu: &Gpu,
        b: usize,
        t: usize,
        logits: Logits,
        cfg: &TimingConfig,
    ) -> Result<Timing> {
        self.prepare(gpu, b, t)?;
        let tokens: Vec<i32> = uniform(b * t, 0.0, (self.cfg.vocab - 1) as f32, 7).iter().map(|&x| x as i32).collect();
        let ids = TokenIds::upload(gpu, &tokens, self.cfg.vocab)?;
        common::timing::time(gpu, 1, cfg, |s, _| self.enqueue_forward(s, b, t, &ids, None, logits))
    }
}
