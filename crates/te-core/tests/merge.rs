//! Request merging through the real engine: what reaches the transport, and that every
//! request's task still reports its own state, bytes and failure. `SimTransport` holds the
//! slices so the test decides each outcome.

use std::sync::Arc;
use std::time::Duration;

use te_core::transport::SliceError;
use te_core::{
    Config, HostBuffer, Opcode, SubmitOptions, TransferEngine, TransferRequest, TransferState,
};
use te_testkit::SimTransport;

const BLOCK: u64 = 4096;

struct Fixture {
    engine: TransferEngine,
    transport: Arc<SimTransport>,
    local: Arc<HostBuffer>,
    remote: Arc<HostBuffer>,
    segment: u64,
}

/// An engine on loopback with `vars` as its environment (merging as `MC_TE_MERGE_REQUESTS`
/// is `merge`, unless it is `None`).
fn engine(merge: Option<&str>, vars: &[(&str, &str)]) -> TransferEngine {
    let mut config = Config::from_lookup(|name| match name {
        "MC_TE_MERGE_REQUESTS" => merge.map(str::to_string),
        _ => vars
            .iter()
            .find(|(var, _)| *var == name)
            .map(|(_, value)| value.to_string()),
    })
    .unwrap();
    config.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    TransferEngine::init(config, "P2PHANDSHAKE", "127.0.0.1").unwrap()
}

fn fixture(merge: Option<&str>) -> Fixture {
    let engine = engine(merge, &[]);
    let transport = Arc::new(SimTransport::new());
    engine.install_transport(transport.clone()).unwrap();
    let (local, remote, segment) = te_testkit::own_buffers(&engine, 1 << 20);
    Fixture {
        engine,
        transport,
        local,
        remote,
        segment,
    }
}

impl Fixture {
    /// `n` WRITEs of `BLOCK` bytes; block `i` at local `i * stride`, remote `i * stride`.
    fn blocks(&self, n: u64, stride: u64) -> Vec<TransferRequest> {
        self.blocks_of(n, BLOCK, stride)
    }

    /// `n` WRITEs of `len` bytes, `stride` apart in both buffers.
    fn blocks_of(&self, n: u64, len: u64, stride: u64) -> Vec<TransferRequest> {
        (0..n)
            .map(|i| TransferRequest {
                opcode: Opcode::Write,
                source: self.local.addr() + i * stride,
                target_id: self.segment,
                target_offset: self.remote.addr() + i * stride,
                length: len,
            })
            .collect()
    }

    /// Completes every queued slice: copies its bytes and reports `outcome(slice's local offset)`.
    fn drain(&self, outcome: impl Fn(u64) -> Result<(), SliceError>) -> usize {
        let mut n = 0;
        while let Some(s) = self.transport.take(|_| 0) {
            let off = s.local_addr - self.local.addr();
            let result = outcome(off);
            if result.is_ok() {
                // The slice lends its whole local range (a merged one spans its requests).
                let range = s.local_range().expect("host memory");
                assert_eq!((range.addr(), range.len() as u64), (s.local_addr, s.len));
                let mut bytes = vec![0u8; range.len()];
                range.get(&mut bytes);
                let at = (s.remote_addr - self.remote.addr()) as usize;
                self.remote.write_at(at, &bytes).unwrap();
            }
            self.transport.complete(s, result);
            n += 1;
        }
        n
    }
}

#[test]
fn contiguous_blocks_travel_as_few_slices_and_finish_one_by_one() {
    let f = fixture(None);
    let pattern = te_testkit::pattern(7, 128 * BLOCK as usize);
    f.local.write_at(0, &pattern).unwrap();
    let b = f.engine.allocate_batch(128).unwrap();
    f.engine.submit(b, &f.blocks(128, BLOCK)).unwrap();
    // 512 KiB in 64 KiB slices.
    assert_eq!(f.transport.queued(), 8);
    assert!(
        f.transport
            .inspect(|q| q.iter().all(|s| s.token.tasks() == 16))
    );
    // Nothing done yet: every task is waiting, none reports bytes.
    let st = f.engine.task_status(b, 127).unwrap();
    assert_eq!(
        (st.state, st.transferred_bytes),
        (TransferState::Waiting, 0)
    );
    assert_eq!(f.drain(|_| Ok(())), 8);
    let st = f.engine.wait(b, Duration::from_secs(5)).unwrap();
    assert_eq!(st.state, TransferState::Completed);
    assert_eq!(st.transferred_bytes, 128 * BLOCK);
    for i in 0..128 {
        let t = f.engine.task_status(b, i).unwrap();
        assert_eq!(
            (t.state, t.transferred_bytes),
            (TransferState::Completed, BLOCK)
        );
    }
    assert_eq!(f.remote.to_vec(0, pattern.len()).unwrap(), pattern);
    f.engine.free_batch(b).unwrap();
}

#[test]
fn a_failed_merged_slice_fails_only_the_requests_it_carried() {
    let f = fixture(None);
    // Five blocks of 40 KiB (200 KiB) go as slices of 64, 64 and 72 KiB (a remainder within
    // the fragment limit is not split off). The middle slice carries the last 16 KiB of block
    // 1, all of block 2 and the first 8 KiB of block 3; it fails for good.
    let len = 40 << 10;
    let requests = f.blocks_of(5, len, len);
    let b = f.engine.allocate_batch(5).unwrap();
    f.engine.submit(b, &requests).unwrap();
    assert_eq!(f.transport.queued(), 3);
    let bad = |off: u64| match off {
        0x10000 => Err(SliceError::Unsupported("refused by the test".into())),
        _ => Ok(()),
    };
    assert_eq!(f.drain(bad), 3, "a permanent failure is not retried");
    let st = f.engine.wait(b, Duration::from_secs(5)).unwrap();
    assert_eq!(st.state, TransferState::Failed);
    let states: Vec<_> = (0..5)
        .map(|i| f.engine.task_status(b, i).unwrap())
        .collect();
    let ended: Vec<_> = states.iter().map(|s| s.state).collect();
    use TransferState::{Completed, Failed};
    assert_eq!(ended, [Completed, Failed, Failed, Failed, Completed]);
    let bytes: Vec<_> = states.iter().map(|s| s.transferred_bytes).collect();
    assert_eq!(bytes, [len, 24 << 10, 0, 32 << 10, len]);
    for i in 1..4 {
        assert!(f.engine.task_error(b, i).unwrap().is_some(), "task {i}");
    }
    assert!(f.engine.task_error(b, 0).unwrap().is_none());
    f.engine.free_batch(b).unwrap();
}

#[test]
fn merging_can_be_switched_off_and_gaps_are_never_bridged() {
    let off = fixture(Some("0"));
    let b = off.engine.allocate_batch(16).unwrap();
    off.engine.submit(b, &off.blocks(16, BLOCK)).unwrap();
    assert_eq!(off.transport.queued(), 16, "MC_TE_MERGE_REQUESTS=0");
    off.drain(|_| Ok(()));
    off.engine.wait(b, Duration::from_secs(5)).unwrap();
    off.engine.free_batch(b).unwrap();

    let on = fixture(None);
    let b = on.engine.allocate_batch(16).unwrap();
    // One submit merges; the next, forced off, does not.
    on.engine
        .submit_with(
            b,
            &on.blocks(4, BLOCK),
            &SubmitOptions::default().merging(false),
        )
        .unwrap();
    assert_eq!(on.transport.queued(), 4);
    on.drain(|_| Ok(()));
    // Blocks with a gap between them (a stride of two blocks) stay apart.
    let b2 = on.engine.allocate_batch(16).unwrap();
    on.engine.submit(b2, &on.blocks(16, 2 * BLOCK)).unwrap();
    assert_eq!(on.transport.queued(), 16);
    on.drain(|_| Ok(()));
    for id in [b, b2] {
        assert_eq!(
            on.engine.wait(id, Duration::from_secs(5)).unwrap().state,
            TransferState::Completed
        );
        on.engine.free_batch(id).unwrap();
    }
}

#[test]
fn a_canceled_request_does_not_cancel_the_slice_its_neighbours_need() {
    let f = fixture(None);
    let b = f.engine.allocate_batch(2).unwrap();
    f.engine.submit(b, &f.blocks(2, BLOCK)).unwrap();
    assert_eq!(f.transport.queued(), 1);
    f.engine.cancel_task(b, 0).unwrap();
    assert!(
        f.transport.inspect(|q| !q[0].is_canceled()),
        "task 1 still wants it"
    );
    f.engine.cancel_task(b, 1).unwrap();
    assert!(f.transport.inspect(|q| q[0].is_canceled()));
    f.drain(|_| Err(SliceError::Canceled));
    f.engine.wait(b, Duration::from_secs(5)).unwrap();
    for i in 0..2 {
        assert_eq!(
            f.engine.task_status(b, i).unwrap().state,
            TransferState::Canceled
        );
    }
    f.engine.free_batch(b).unwrap();
}

/// A batch of more slices than submit hands a transport at once, on a transport that ends
/// every slice inside `post` (as a memory copy does): the first slices end while later ones
/// are still being made, and no task may end before its last slice. Tasks straddle the point
/// where one handed-out list ends and the next begins, merged (120 requests of 10,000 bytes in
/// 4 KiB slices: 293 slices) and alone (one request of 300 slices).
#[test]
fn slices_ending_while_the_batch_is_still_sliced_end_no_task_early() {
    for (merge, n, len) in [(None, 120, 10_000), (Some("0"), 1, 300 * 4096)] {
        let engine = engine(
            merge,
            &[("MC_SLICE_SIZE", "4096"), ("MC_FRAGMENT_RATIO", "4")],
        );
        let counted = Arc::new(CountingInstant::default());
        engine.install_transport(counted.clone()).unwrap();
        let (local, remote, segment) = te_testkit::own_buffers(&engine, 2 << 20);
        let requests: Vec<TransferRequest> = (0..n)
            .map(|i| TransferRequest {
                opcode: Opcode::Write,
                source: local.addr() + i * len,
                target_id: segment,
                target_offset: remote.addr() + i * len,
                length: len,
            })
            .collect();
        let b = engine.allocate_batch(n as usize).unwrap();
        engine.submit(b, &requests).unwrap();
        let (posts, slices) = counted.seen();
        assert!(
            slices > 256 && posts > 1,
            "{slices} slices in {posts} posts"
        );
        let st = engine.wait(b, Duration::from_secs(5)).unwrap();
        assert_eq!(
            (st.state, st.transferred_bytes),
            (TransferState::Completed, n * len)
        );
        for i in 0..n as usize {
            let t = engine.task_status(b, i).unwrap();
            assert_eq!(
                (t.state, t.transferred_bytes),
                (TransferState::Completed, len),
                "task {i}"
            );
        }
        engine.free_batch(b).unwrap();
    }
}

/// te-core's instant transport, counting the lists it is handed and the slices in them.
#[derive(Default)]
struct CountingInstant {
    inner: te_testkit::InstantTransport,
    posts: std::sync::atomic::AtomicUsize,
    slices: std::sync::atomic::AtomicUsize,
}

impl CountingInstant {
    fn seen(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.posts.load(Relaxed), self.slices.load(Relaxed))
    }
}

impl te_core::transport::Transport for CountingInstant {
    fn name(&self) -> &'static str {
        "instant"
    }

    fn capabilities(&self) -> te_core::transport::Capabilities {
        self.inner.capabilities()
    }

    fn install(&self, ctx: te_core::transport::InstallContext) -> te_core::Result<()> {
        self.inner.install(ctx)
    }

    fn post(&self, slices: Vec<te_core::transport::SliceOp>) {
        use std::sync::atomic::Ordering::Relaxed;
        self.posts.fetch_add(1, Relaxed);
        self.slices.fetch_add(slices.len(), Relaxed);
        self.inner.post(slices);
    }
}

/// Requests in the local region of the request before them are pinned without a look-up:
/// each task still holds its own pin, so neither region can be unregistered until the last of
/// its tasks ends, and both can once every task has.
#[test]
fn each_task_pins_its_local_region_until_it_ends() {
    let f = fixture(Some("0"));
    let other = Arc::new(HostBuffer::new(1 << 16).unwrap());
    f.engine
        .register_buffer(&other, "cpu:0", te_core::Permission::RemoteReadWrite)
        .unwrap();
    let write = |source: u64, at: u64| TransferRequest {
        opcode: Opcode::Write,
        source,
        target_id: f.segment,
        target_offset: f.remote.addr() + at,
        length: BLOCK,
    };
    // Two in the first region (the second pinned again, not looked up), one in the other,
    // one in the first again (looked up).
    let requests = [
        write(f.local.addr(), 0),
        write(f.local.addr() + 2 * BLOCK, 2 * BLOCK),
        write(other.addr(), 4 * BLOCK),
        write(f.local.addr() + 6 * BLOCK, 6 * BLOCK),
    ];
    let b = f.engine.allocate_batch(4).unwrap();
    f.engine.submit(b, &requests).unwrap();
    let pins = |addr: u64| f.engine.pin_local(addr, 1).unwrap().region().pins() - 1;
    assert_eq!((pins(f.local.addr()), pins(other.addr())), (3, 1));
    for addr in [f.local.addr(), other.addr()] {
        assert!(matches!(
            f.engine.unregister_memory(addr),
            Err(te_core::Error::RegionBusy { .. })
        ));
    }
    // Ended without moving bytes: only the pins matter here.
    let mut ended = 0;
    while let Some(s) = f.transport.take(|_| 0) {
        f.transport.complete(s, Ok(()));
        ended += 1;
    }
    assert_eq!(ended, 4);
    let st = f.engine.wait(b, Duration::from_secs(5)).unwrap();
    assert_eq!(
        (st.state, st.transferred_bytes),
        (TransferState::Completed, 4 * BLOCK)
    );
    assert_eq!((pins(f.local.addr()), pins(other.addr())), (0, 0));
    f.engine.free_batch(b).unwrap();
    f.engine.unregister_memory(other.addr()).unwrap();
}
