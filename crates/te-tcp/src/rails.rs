//! The completion sink that keeps the per-rail load counters (te_metrics::rail): every
//! slice is counted in flight when posted and settled when it reports, on the local rail it used.

use std::sync::Arc;

use te_core::transport::{CompletionSink, SliceError, SliceOp};
use te_metrics::rail::RailCounters;

/// Settles the rail counters, then hands the slice to the engine.
pub(crate) struct CountingSink {
    pub(crate) inner: Arc<dyn CompletionSink>,
    pub(crate) rails: Arc<Vec<RailCounters>>,
}

impl CompletionSink for CountingSink {
    fn complete(&self, slice: SliceOp, outcome: Result<(), SliceError>) {
        if let Some(rail) = self.rails.get(usize::from(slice.local_rail)) {
            rail.settled(slice.len, te_core::transport::settled(&outcome));
        }
        self.inner.complete(slice, outcome);
    }
}
