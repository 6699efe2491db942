//! Test and benchmark helpers (feature `testing`).
//!
//! [`InstantTransport`] completes every slice the moment it is posted, without touching memory:
//! with it, a benchmark measures the engine's own cost per slice (validation, slicing, routing,
//! bookkeeping, completion, waking), the "engine overhead" figure.

use std::sync::{Arc, OnceLock};

use crate::error::Result;
use crate::segment::SegmentDesc;
use crate::transport::{CompletionSink, InstallContext, SliceOp, Transport};

/// A transport named `instant` that reports every slice done as soon as it is posted.
#[derive(Default)]
pub struct InstantTransport {
    sink: OnceLock<Arc<dyn CompletionSink>>,
}

impl InstantTransport {
    /// A transport not yet installed.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Transport for InstantTransport {
    fn name(&self) -> &'static str {
        "instant"
    }

    fn install(&self, ctx: InstallContext) -> Result<()> {
        let _ = self.sink.set(ctx.sink);
        Ok(())
    }

    fn describe(&self, _desc: &mut SegmentDesc) {}

    fn post(&self, slices: Vec<SliceOp>) {
        if let Some(sink) = self.sink.get() {
            for s in slices {
                sink.complete(s, Ok(()));
            }
        }
    }
}
