//! `CopyWorkers` through the real engine: where a memory-copy transport's slices run (a small
//! post on the submitting thread, before `submit` returns; a large one on a worker), that each
//! is reported once, and that a post after shutdown fails its task instead of vanishing. The
//! executor records the thread and the bytes it was asked for; it moves nothing.

use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use te_core::transport::{Capabilities, InstallContext, SliceOp, Transport};
use te_core::{
    Config, HostBuffer, Opcode, SubmitOptions, TransferEngine, TransferRequest, TransferState,
};
use te_workers::CopyWorkers;

/// A memory-copy transport whose executor notes what it ran and where.
struct Copier {
    workers: CopyWorkers,
    slice_size: u64,
    ran: Arc<Mutex<Vec<(ThreadId, u64)>>>,
}

impl Transport for Copier {
    fn name(&self) -> &'static str {
        "copier"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::DRAM_REMOTE_HOST
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        let ran = self.ran.clone();
        self.workers.start(
            2,
            ctx.sink,
            Arc::new(move |op: &SliceOp| {
                ran.lock()
                    .unwrap()
                    .push((std::thread::current().id(), op.len));
                Ok(())
            }),
        )
    }

    fn slice_size(&self, _target: &te_core::segment::RemoteSegment) -> Option<u64> {
        Some(self.slice_size)
    }

    fn post(&self, slices: Vec<SliceOp>) {
        self.workers.post(slices);
    }

    fn post_one(&self, slice: SliceOp) {
        self.workers.post_one(slice);
    }

    fn shutdown(&self) {
        self.workers.shutdown();
    }
}

struct Fixture {
    engine: TransferEngine,
    copier: Arc<Copier>,
    local: Arc<HostBuffer>,
    remote: Arc<HostBuffer>,
    segment: u64,
}

fn fixture(slice_size: u64) -> Fixture {
    let mut config = Config::from_lookup(|_| None).unwrap();
    config.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    let engine = TransferEngine::init(config, "P2PHANDSHAKE", "127.0.0.1").unwrap();
    let copier = Arc::new(Copier {
        workers: CopyWorkers::new("copier"),
        slice_size,
        ran: Arc::new(Mutex::new(Vec::new())),
    });
    engine.install_transport(copier.clone()).unwrap();
    let (local, remote, segment) = te_testkit::own_buffers(&engine, 4 << 20);
    Fixture {
        engine,
        copier,
        local,
        remote,
        segment,
    }
}

impl Fixture {
    fn write(&self, length: u64) -> TransferRequest {
        TransferRequest {
            opcode: Opcode::Write,
            source: self.local.addr(),
            target_id: self.segment,
            target_offset: self.remote.addr(),
            length,
        }
    }

    fn ran(&self) -> Vec<(ThreadId, u64)> {
        self.copier.ran.lock().unwrap().clone()
    }
}

fn via_copier() -> SubmitOptions {
    SubmitOptions::default().via("copier")
}

#[test]
fn a_lone_small_slice_is_copied_on_the_submitting_thread_before_submit_returns() {
    let f = fixture(1 << 20);
    let b = f.engine.allocate_batch(1).unwrap();
    f.engine
        .submit_with(b, &[f.write(64 << 10)], &via_copier())
        .unwrap();
    // No wait: the slice ran inside submit.
    let status = f.engine.batch_status(b).unwrap();
    assert_eq!(status.state, TransferState::Completed);
    assert_eq!(status.transferred_bytes, 64 << 10);
    assert_eq!(f.ran(), vec![(std::thread::current().id(), 64 << 10)]);
    f.engine.free_batch(b).unwrap();
}

#[test]
fn a_lone_slice_over_the_inline_limit_goes_to_a_worker() {
    let big = te_workers::INLINE_BYTES * 2;
    let f = fixture(big);
    let (state, error) = te_testkit::transfer_one(&f.engine, f.write(big), &via_copier());
    assert_eq!((state, error), (TransferState::Completed, None));
    let ran = f.ran();
    assert_eq!(ran.len(), 1, "one slice, reported once: {ran:?}");
    assert_eq!(ran[0].1, big);
    assert_ne!(ran[0].0, std::thread::current().id(), "a worker copied it");
}

#[test]
fn a_lone_slice_posted_after_shutdown_fails_its_task() {
    let f = fixture(1 << 20);
    f.copier.shutdown();
    let b = f.engine.allocate_batch(1).unwrap();
    f.engine
        .submit_with(b, &[f.write(4096)], &via_copier())
        .unwrap();
    let status = f.engine.wait(b, Duration::from_secs(60)).unwrap();
    assert_eq!(status.state, TransferState::Failed);
    let error = f.engine.task_error(b, 0).unwrap().expect("a reason");
    assert!(error.to_string().contains("shut down"), "{error}");
    assert!(f.ran().is_empty(), "nothing was copied");
    f.engine.free_batch(b).unwrap();
}
