//! [`InstantTransport`], named `instant`: it completes every slice the moment it is posted,
//! without touching memory. With it, a benchmark measures the engine's own cost per slice
//! (validation, slicing, routing, bookkeeping, completion, waking), the "engine overhead"
//! figure; te-bench, te-facade's and the C API's `instant` feature and the tests use it.

#![forbid(unsafe_code)]

use std::sync::{Arc, OnceLock};

use te_core::Result;
use te_core::transport::{Capabilities, CompletionSink, InstallContext, SliceOp, Transport};

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

    fn capabilities(&self) -> Capabilities {
        Capabilities::DRAM_REMOTE_HOST
    }

    fn install(&self, ctx: InstallContext) -> Result<()> {
        let _ = self.sink.set(ctx.sink);
        Ok(())
    }

    fn post(&self, slices: Vec<SliceOp>) {
        slices.into_iter().for_each(|s| self.post_one(s));
    }

    fn post_one(&self, slice: SliceOp) {
        if let Some(sink) = self.sink.get() {
            sink.complete(slice, Ok(()));
        }
    }
}
