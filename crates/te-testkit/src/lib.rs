//! te's test kit, a dev-dependency of every crate's tests and of nothing else.
//!
//! - [`InstantTransport`] (te-instant's, re-exported) completes every slice the moment it is
//!   posted, without touching memory.
//! - [`SimTransport`] holds every slice until the test reports it: the seeded, deterministic
//!   simulation (`tests/sim.rs`) drives the real engine through it, choosing order and faults,
//!   on a [`clock::SimClock`] it advances by hand.

pub mod clock;
pub mod forger;
pub mod fuzz;
pub mod mooncake;
pub mod services;

use std::sync::{Arc, OnceLock};

use te_core::Result;
use te_core::transport::{CompletionSink, InstallContext, SliceOp, Transport};

pub use te_instant::InstantTransport;

/// A transport that executes nothing by itself: posted slices wait in a queue until the test
/// (the deterministic simulation) takes them and reports an outcome, in any order it likes.
/// A slice is moved out of the queue to be completed, so no slice can be reported twice.
pub struct SimTransport {
    queue: std::sync::Mutex<Vec<SliceOp>>,
    sink: OnceLock<Arc<dyn CompletionSink>>,
    name: &'static str,
    capabilities: te_core::transport::Capabilities,
    /// Endpoints by peer segment, as a real transport keeps them (`with_endpoints`), and the
    /// peers whose endpoints were evicted since last asked.
    endpoints: std::sync::Mutex<Option<SimEndpoints>>,
}

struct SimEndpoints {
    store: te_workers::EndpointStore<String, ()>,
    evicted: Vec<String>,
}

impl Default for SimTransport {
    fn default() -> Self {
        Self::named("sim", te_core::transport::Capabilities::DRAM_REMOTE_HOST)
    }
}

impl SimTransport {
    /// A transport named `sim` not yet installed.
    pub fn new() -> Self {
        Self::default()
    }

    /// A simulated transport with its own name and capabilities (several can be installed:
    /// te-tent's policy and failover tests choose among them).
    pub fn named(name: &'static str, capabilities: te_core::transport::Capabilities) -> Self {
        SimTransport {
            queue: std::sync::Mutex::new(Vec::new()),
            sink: OnceLock::new(),
            name,
            capabilities,
            endpoints: std::sync::Mutex::new(None),
        }
    }

    /// Keeps an endpoint per peer segment in an `EndpointStore` of `capacity` (SIEVE), as te-tcp
    /// and te-rdma do; a post to a peer without one evicts another when the store is full.
    pub fn with_endpoints(self, capacity: usize) -> Self {
        *self.endpoints.lock().unwrap_or_else(|e| e.into_inner()) = Some(SimEndpoints {
            store: te_workers::EndpointStore::new(capacity, te_core::config::EvictionPolicy::Sieve),
            evicted: Vec::new(),
        });
        self
    }

    /// The peers whose endpoints were evicted since the last call (each eviction once).
    pub fn take_evicted(&self) -> Vec<String> {
        self.endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .map_or_else(Vec::new, |e| std::mem::take(&mut e.evicted))
    }

    /// Endpoints held now.
    pub fn endpoints(&self) -> usize {
        self.endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |e| e.store.len())
    }

    /// Takes every waiting slice `pred` picks.
    pub fn take_where(&self, pred: impl Fn(&SliceOp) -> bool) -> Vec<SliceOp> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let (taken, kept) = std::mem::take(&mut *q).into_iter().partition(|op| pred(op));
        *q = kept;
        taken
    }

    /// Slices waiting.
    pub fn queued(&self) -> usize {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Runs `f` over the waiting slices (to check what is in flight).
    pub fn inspect<R>(&self, f: impl FnOnce(&[SliceOp]) -> R) -> R {
        f(&self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Takes the waiting slice at `pick(len)` (taken modulo the queue length).
    pub fn take(&self, pick: impl FnOnce(usize) -> usize) -> Option<SliceOp> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.is_empty() {
            return None;
        }
        let i = pick(q.len()) % q.len();
        Some(q.swap_remove(i))
    }

    /// Carries out every waiting WRITE from `local` to `remote` (a copy within this process,
    /// at the slices' offsets into each) and reports it done; how many it carried.
    ///
    /// # Panics
    /// When a slice falls outside the buffers (a test helper).
    pub fn carry_writes(&self, local: &te_core::HostBuffer, remote: &te_core::HostBuffer) -> usize {
        let mut carried = 0;
        while let Some(s) = self.take(|_| 0) {
            let from = (s.local_addr - local.addr()) as usize;
            let to = (s.remote_addr - remote.addr()) as usize;
            let bytes = local.to_vec(from, s.len as usize).expect("inside local");
            remote.write_at(to, &bytes).expect("inside remote");
            self.complete(s, Ok(()));
            carried += 1;
        }
        carried
    }

    /// Reports a taken slice to the engine (which may post it again, to this queue).
    pub fn complete(
        &self,
        slice: SliceOp,
        outcome: std::result::Result<(), te_core::transport::SliceError>,
    ) {
        if let Some(sink) = self.sink.get() {
            sink.complete(slice, outcome);
        }
    }
}

impl Transport for SimTransport {
    fn name(&self) -> &'static str {
        self.name
    }

    fn capabilities(&self) -> te_core::transport::Capabilities {
        self.capabilities
    }

    fn install(&self, ctx: InstallContext) -> Result<()> {
        let _ = self.sink.set(ctx.sink);
        Ok(())
    }

    fn post(&self, slices: Vec<SliceOp>) {
        if let Some(e) = self
            .endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            for op in &slices {
                let peer = op.target.name().to_string();
                if e.store.get(&peer).is_none() {
                    let gone = e.store.insert(peer, ());
                    e.evicted.extend(gone.into_iter().map(|(k, ())| k));
                }
            }
        }
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(slices);
    }
}

/// Registers two buffers of `len` bytes with `engine`: a local one (local only) and a remote
/// one (remote read-write) in its own segment, which it opens; for tests that drive an engine
/// against itself.
///
/// # Panics
/// When allocation, registration or the open fails (a test helper).
pub fn own_buffers(
    engine: &te_core::TransferEngine,
    len: usize,
) -> (Arc<te_core::HostBuffer>, Arc<te_core::HostBuffer>, u64) {
    use te_core::memory::Permission;
    let local = Arc::new(te_core::HostBuffer::new(len).expect("local buffer"));
    let remote = Arc::new(te_core::HostBuffer::new(len).expect("remote buffer"));
    engine
        .register_buffer(&local, "*", Permission::LocalOnly)
        .expect("local registration");
    engine
        .register_buffer(&remote, "*", Permission::RemoteReadWrite)
        .expect("remote registration");
    let segment = engine
        .open_segment(engine.segment_name())
        .expect("own segment");
    (local, remote, segment)
}

/// Runs `request` as a one-task batch posted with `options`, waits up to a minute, frees the
/// batch, and returns the end state with the task's error (for test assertions).
///
/// # Panics
/// When the engine refuses the batch, the submit, the wait or the free (a test helper).
pub fn transfer_one(
    engine: &te_core::TransferEngine,
    request: te_core::TransferRequest,
    options: &te_core::SubmitOptions,
) -> (
    te_core::TransferState,
    Option<te_core::transport::SliceError>,
) {
    let b = engine.allocate_batch(1).expect("a batch");
    engine
        .submit_with(b, &[request], options)
        .expect("submitted");
    let s = engine
        .wait(b, std::time::Duration::from_secs(60))
        .expect("waited");
    let error = engine.task_error(b, 0).expect("the task");
    engine.free_batch(b).expect("freed");
    (s.state, error)
}

/// WRITEs and READs 4 KiB from the start of `local` at `target_offset` of segment `target_id`,
/// a descriptor an attack test forged, and asserts that neither completes (a refusal at submit,
/// or a failed task) and that nothing was read into `local`.
///
/// # Panics
/// When either completes, `local` changed, or the engine refuses a batch (a test helper).
pub fn assert_neither_way(
    engine: &te_core::TransferEngine,
    local: &te_core::HostBuffer,
    target_id: te_core::SegmentId,
    target_offset: u64,
) {
    let before = local.to_vec(0, local.len()).expect("the local buffer");
    for opcode in [te_core::Opcode::Write, te_core::Opcode::Read] {
        let b = engine.allocate_batch(1).expect("a batch");
        let r = te_core::TransferRequest {
            opcode,
            source: local.addr(),
            target_id,
            target_offset,
            length: 4096,
        };
        let state = match engine.submit(b, &[r]) {
            Ok(()) => {
                engine
                    .wait(b, std::time::Duration::from_secs(60))
                    .expect("waited")
                    .state
            }
            Err(_) => te_core::TransferState::Failed,
        };
        let _ = engine.free_batch(b);
        assert_ne!(
            state,
            te_core::TransferState::Completed,
            "{opcode:?} through a forged descriptor"
        );
    }
    assert!(
        local.to_vec(0, local.len()).expect("the local buffer") == before,
        "nothing was read through the forged descriptor"
    );
}

/// A victim helper process's end: prints `READY <ready>`, waits for a line on stdin (or its
/// end: the test is gone), and exits 0 when every buffer of `bufs` still holds only `byte`,
/// else 3.
///
/// # Panics
/// When a buffer cannot be read (a test helper).
pub fn victim_until_checked(ready: &str, bufs: &[&te_core::HostBuffer], byte: u8) -> ! {
    use std::io::Write;
    println!("READY {ready}");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    let intact = bufs.iter().all(|b| {
        b.to_vec(0, b.len())
            .expect("the victim's buffer")
            .iter()
            .all(|&x| x == byte)
    });
    std::process::exit(if intact { 0 } else { 3 })
}

/// Deterministic test bytes: `len` bytes from a xorshift stream seeded by `seed`, so two
/// processes (or a writer and a checker) agree on what a transfer must deliver.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Asserts that `got` equals `want`, naming the first byte that differs (instead of printing
/// megabytes of both).
///
/// # Panics
/// When they differ.
pub fn assert_same_bytes(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {at} of {}", want.len());
    }
}

/// Waits, up to 30 s, until the first byte of `buf` is `byte`: a transfer filling it with that
/// byte is under way.
pub fn wait_for_first_byte(buf: &te_core::HostBuffer, byte: u8) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while buf.to_vec(0, 1).expect("a readable buffer")[0] != byte {
        assert!(
            std::time::Instant::now() < deadline,
            "the transfer never started"
        );
        std::thread::yield_now();
    }
}

/// Asserts that nothing writes into the first `len` bytes of `buf` any more (`after` says since
/// when): a snapshot read 1 MiB at a time from the end back, ahead of where writes still under
/// way would go next, equals another taken 300 ms later.
pub fn assert_nothing_lands(buf: &te_core::HostBuffer, len: usize, after: &str) {
    let snapshot = || -> Vec<Vec<u8>> {
        let mib = 1 << 20;
        (0..len.div_ceil(mib))
            .rev()
            .map(|i| {
                let at = i * mib;
                buf.to_vec(at, mib.min(len - at))
                    .expect("a readable buffer")
            })
            .collect()
    };
    let first = snapshot();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        snapshot() == first,
        "bytes landed in the buffer after {after}"
    );
}

/// Arguments that make a test binary run only its ignored test `test`: how multi-process tests
/// start themselves again as a helper process.
pub fn self_test_args(test: &str) -> [&str; 5] {
    [
        "--exact",
        test,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]
}

/// A helper process, killed (and reaped) when the test ends, passed or not.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` with its stdout piped and waits for the line holding `READY <text>` that a
/// helper process prints once it serves; returns the child and `<text>`.
///
/// # Panics
/// When the process cannot start or ends without printing `READY` (a test helper).
pub fn spawn_ready(cmd: &mut std::process::Command) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("helper process starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(std::result::Result::ok)
        .find_map(|l| l.split_once("READY ").map(|(_, r)| r.to_string()))
        .expect("helper process prints READY");
    (child, ready)
}

/// What `ss` (iproute2) prints with `args`.
fn ss(args: &[&str]) -> String {
    let out = std::process::Command::new("ss")
        .args(args)
        .output()
        .expect("ss (iproute2) runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The backlog of the socket listening on `port`, as `ss` (iproute2) shows it: the Send-Q of
/// each listening socket on that port (one, normally).
///
/// # Panics
/// When `ss` cannot run (a test helper).
pub fn listen_backlog(port: u16) -> Vec<String> {
    ss(&["-ltnH", &format!("sport = :{port}")])
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect()
}

/// Waits up to `within` for the peer to close `s` (a read that ends or fails); whether it did.
///
/// # Panics
/// When the socket's read timeout cannot be set (a test helper).
pub fn closed_within(s: &mut std::net::TcpStream, within: std::time::Duration) -> bool {
    use std::io::{ErrorKind, Read};
    let deadline = std::time::Instant::now() + within;
    s.set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 4096];
    while std::time::Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

/// The congestion control of every established TCP connection with an end on `port` (either
/// end: the connections an engine accepted there and those made to it), as `ss -i` shows it.
///
/// # Panics
/// When `ss` cannot run (a test helper).
pub fn connection_congestion(port: u16) -> Vec<String> {
    let filter = format!("( sport = :{port} or dport = :{port} )");
    // Each connection is a line of addresses, then a line of details that starts with the
    // algorithm's name.
    ss(&["-tinH", "state", "established", &filter])
        .lines()
        .filter(|l| l.starts_with(char::is_whitespace))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// A sweep of transfer sizes over one remote buffer, for the two-process tests of same-host
/// transports: size `i` sits at its own odd offset ([`slot`](Self::slot)); READs come from
/// `[0, write_base)` (filled with `pattern(read_seed)` by the owner) into a local offset one
/// byte further, and WRITEs of `pattern(100 + i)` go to `write_base + slot(i)`.
#[derive(Clone, Copy, Debug)]
pub struct SizeSweep<'a> {
    /// The transfer sizes.
    pub sizes: &'a [usize],
    /// Where the written area starts in the remote buffer.
    pub write_base: usize,
    /// Seed of the read area's pattern.
    pub read_seed: u64,
}

impl SizeSweep<'_> {
    /// Offset of size `i`: past the earlier sizes, with a gap, never aligned.
    pub fn slot(&self, i: usize) -> usize {
        self.sizes[..i].iter().map(|s| s + 4093).sum::<usize>() + 3
    }

    /// What the owner puts in the read area.
    pub fn read_area(&self) -> Vec<u8> {
        pattern(self.read_seed, self.write_base)
    }

    /// Initiator side: every READ then every WRITE, one task each; asserts each completes and
    /// each READ brought the right bytes.
    ///
    /// # Panics
    /// On any failure (a test helper).
    pub fn run(
        &self,
        e: &te_core::TransferEngine,
        segment: te_core::SegmentId,
        local: &te_core::HostBuffer,
        remote: u64,
    ) {
        use te_core::{Opcode, TransferRequest, TransferState};
        let one = |r: TransferRequest| {
            let b = e.allocate_batch(1).unwrap();
            e.submit(b, &[r]).unwrap();
            let s = e.wait(b, std::time::Duration::from_secs(60)).unwrap();
            e.free_batch(b).unwrap();
            s.state
        };
        let expected = self.read_area();
        for (i, &len) in self.sizes.iter().enumerate() {
            let at = self.slot(i);
            let r = TransferRequest {
                opcode: Opcode::Read,
                source: local.addr() + at as u64 + 1,
                target_id: segment,
                target_offset: remote + at as u64,
                length: len as u64,
            };
            assert_eq!(one(r), TransferState::Completed, "read {len}");
            assert!(
                local.to_vec(at + 1, len).unwrap() == expected[at..at + len],
                "read {len}: bytes differ"
            );
        }
        for (i, &len) in self.sizes.iter().enumerate() {
            let at = self.slot(i);
            local.write_at(at, &pattern(100 + i as u64, len)).unwrap();
            let w = TransferRequest {
                opcode: Opcode::Write,
                source: local.addr() + at as u64,
                target_id: segment,
                target_offset: remote + (self.write_base + at) as u64,
                length: len as u64,
            };
            assert_eq!(one(w), TransferState::Completed, "write {len}");
        }
    }

    /// Owner side: whether every WRITE of [`run`](Self::run) landed.
    pub fn writes_landed(&self, buf: &te_core::HostBuffer) -> bool {
        self.sizes.iter().enumerate().all(|(i, &len)| {
            buf.to_vec(self.write_base + self.slot(i), len).unwrap() == pattern(100 + i as u64, len)
        })
    }
}
