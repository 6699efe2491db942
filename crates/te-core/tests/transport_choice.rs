//! The engine's transport choice per buffer of a descriptor, kept between submits: a transport
//! installed after a segment was opened is chosen for the buffers it serves from the next
//! submit on, and after shutdown no kept choice posts to a transport that is gone.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use te_core::segment::{BufferDesc, RemoteSegment};
use te_core::transport::{Capabilities, CompletionSink, InstallContext, SliceOp, Transport};
use te_core::{
    Config, Error, Opcode, SubmitOptions, TransferEngine, TransferRequest, TransferState,
};
use te_testkit::InstantTransport;

/// A transport that claims every buffer (as te-shm claims same-host shared memory), counts
/// the slices posted to it and reports them done.
#[derive(Default)]
struct Claimer {
    sink: OnceLock<Arc<dyn CompletionSink>>,
    posted: AtomicUsize,
}

impl Transport for Claimer {
    fn name(&self) -> &'static str {
        "claimer"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::DRAM_SAME_HOST
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        let _ = self.sink.set(ctx.sink);
        Ok(())
    }

    fn serves(&self, _target: &RemoteSegment, _buffer: &BufferDesc) -> bool {
        true
    }

    fn post(&self, slices: Vec<SliceOp>) {
        slices.into_iter().for_each(|s| self.post_one(s));
    }

    fn post_one(&self, slice: SliceOp) {
        self.posted.fetch_add(1, Ordering::SeqCst);
        if let Some(sink) = self.sink.get() {
            sink.complete_ok(slice);
        }
    }
}

fn write_one(engine: &TransferEngine, request: TransferRequest) -> te_core::Result<TransferState> {
    let b = engine.allocate_batch(1)?;
    let submitted = engine.submit(b, &[request]);
    let state = match submitted {
        Ok(()) => Ok(engine.wait(b, std::time::Duration::from_secs(10))?.state),
        Err(e) => Err(e),
    };
    engine.free_batch(b)?;
    state
}

#[test]
fn a_transport_installed_later_is_chosen_from_the_next_submit_and_none_after_shutdown() {
    let mut config = Config::from_lookup(|_| None).unwrap();
    config.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    let engine = TransferEngine::init(config, "P2PHANDSHAKE", "127.0.0.1").unwrap();
    engine
        .install_transport(Arc::new(InstantTransport::new()))
        .unwrap();
    let (local, remote, segment) = te_testkit::own_buffers(&engine, 1 << 20);
    let request = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: segment,
        target_offset: remote.addr(),
        length: 4096,
    };
    // Chosen (and kept) before the claimer exists: the segment's protocol, `instant`.
    for _ in 0..3 {
        assert_eq!(
            write_one(&engine, request).unwrap(),
            TransferState::Completed
        );
    }
    let claimer = Arc::new(Claimer::default());
    engine.install_transport(claimer.clone()).unwrap();
    for n in 1..=3 {
        assert_eq!(
            write_one(&engine, request).unwrap(),
            TransferState::Completed
        );
        assert_eq!(
            claimer.posted.load(Ordering::SeqCst),
            n,
            "submit {n} after the install"
        );
    }
    // Forcing a transport still goes past the choice.
    let b = engine.allocate_batch(1).unwrap();
    engine
        .submit_with(b, &[request], &SubmitOptions::default().via("instant"))
        .unwrap();
    assert_eq!(
        engine
            .wait(b, std::time::Duration::from_secs(10))
            .unwrap()
            .state,
        TransferState::Completed
    );
    engine.free_batch(b).unwrap();
    assert_eq!(claimer.posted.load(Ordering::SeqCst), 3);
    engine.shutdown();
    match write_one(&engine, request) {
        Err(Error::NotSupportedTransport(_)) => {}
        other => panic!("a submit after shutdown must find no transport, got {other:?}"),
    }
    assert_eq!(
        claimer.posted.load(Ordering::SeqCst),
        3,
        "nothing posted after shutdown"
    );
}
