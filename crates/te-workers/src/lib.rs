//! [`CopyWorkers`]: worker threads that execute slices for memory-copy transports (te-shm,
//! te-cxl) and report each slice exactly once through the engine's sink.
//!
//! A post of at most [`INLINE_BYTES`] (1 MiB) is copied on the posting thread itself, before
//! `post` returns: a copy that size takes less time than handing it to a worker and waking
//! whoever waits for it (in a VM, waking an idle CPU costs tens of microseconds: one 1 MiB
//! task per batch moved half as fast through a worker, 64 KiB x 16 too). Larger posts are dealt
//! across the workers, so a large transfer copies on several cores and `submit` returns at
//! once. A submit that made one slice hands it over alone ([`CopyWorkers::post_one`]), with no
//! list made for it.
//!
//! A worker that runs out of slices polls for a short while (`SPIN`) before it sleeps, so a
//! slice posted right after another is picked up without a wake-up; a quiet transport costs no
//! CPU. The copy itself is the transport's executor; this module moves no bytes.
//!
//! [`CopyWorkers::shutdown`] fails what is still queued and joins the workers: once it returns
//! no copy of the engine's is under way, so an application may free its buffers. [`Threads`]
//! is how it, and other transports' shutdowns, wait for their threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use te_core::transport::{CompletionSink, SliceError, SliceOp};
use te_core::{Error, Result};

pub mod endpoints;
pub use endpoints::EndpointStore;

/// How long an idle worker polls before it sleeps.
const SPIN: Duration = Duration::from_micros(50);
/// How old an owner-alive check may be: an owner's exit is noticed within this.
const OWNER_CHECK_AGE: Duration = Duration::from_millis(10);
/// The slice size memory-copy transports ask for: large enough that per-slice work is noise
/// next to the copy, small enough that a large task still spreads over the workers.
pub const COPY_SLICE: u64 = 1 << 20;
/// Posts up to this many bytes are copied on the posting thread; larger ones are dealt across
/// the workers.
pub const INLINE_BYTES: u64 = 1 << 20;

/// Executes one slice (the copy); called on a worker thread.
pub type Executor = dyn Fn(&SliceOp) -> std::result::Result<(), SliceError> + Send + Sync;

/// Worker threads, each fed by its own queue.
pub struct CopyWorkers {
    name: &'static str,
    queues: Mutex<Option<Vec<Sender<SliceOp>>>>,
    /// Started and not shut down (what `queues` holding senders says, read without its lock
    /// by posts copied on the posting thread, and by the workers, which fail what is left in
    /// their queues once it is false).
    running: Arc<AtomicBool>,
    /// The workers, joined at shutdown.
    threads: Threads,
    sink: OnceLock<Arc<dyn CompletionSink>>,
    exec: OnceLock<Arc<Executor>>,
}

impl std::fmt::Debug for CopyWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyWorkers")
            .field("name", &self.name)
            .finish()
    }
}

/// The next slice for a worker; `spin` says whether to poll a while before sleeping.
fn next(rx: &Receiver<SliceOp>, spin: bool) -> Option<SliceOp> {
    let end = Instant::now() + if spin { SPIN } else { Duration::ZERO };
    // The clock is read every 32 polls: in a VM a clock read costs more than a poll.
    for polls in 0u32.. {
        match rx.try_recv() {
            Ok(op) => return Some(op),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if polls % 32 != 31 || Instant::now() < end => {
                std::hint::spin_loop()
            }
            Err(TryRecvError::Empty) => break,
        }
    }
    rx.recv().ok()
}

impl CopyWorkers {
    /// Workers for the transport `name` (thread names and errors use it); start them at install.
    pub fn new(name: &'static str) -> Self {
        CopyWorkers {
            name,
            queues: Mutex::new(None),
            running: Arc::new(AtomicBool::new(false)),
            threads: Threads::default(),
            sink: OnceLock::new(),
            exec: OnceLock::new(),
        }
    }

    /// Starts `count` workers running `exec` and reporting to `sink`.
    ///
    /// # Errors
    /// [`Error::Transport`] when already started or a thread cannot be spawned.
    pub fn start(
        &self,
        count: usize,
        sink: Arc<dyn CompletionSink>,
        exec: Arc<Executor>,
    ) -> Result<()> {
        let fail = |reason: String| Error::Transport {
            transport: self.name,
            reason,
        };
        self.sink
            .set(sink.clone())
            .map_err(|_| fail("already installed in an engine".into()))?;
        let _ = self.exec.set(exec.clone());
        let mut queues = Vec::with_capacity(count.max(1));
        for i in 0..count.max(1) {
            let (tx, rx) = mpsc::channel::<SliceOp>();
            let (sink, exec) = (sink.clone(), exec.clone());
            let (running, name) = (self.running.clone(), self.name);
            // Worker 0 polls before sleeping (a large transfer's next post comes soon); the
            // others sleep at once, so at most one thread polls.
            let spin = i == 0;
            let worker = std::thread::Builder::new()
                .name(format!("te-{}-{i}", self.name))
                .spawn(move || {
                    while let Some(op) = next(&rx, spin) {
                        match running.load(Ordering::Acquire) {
                            true => CopyWorkers::run(&exec, &sink, op),
                            false => {
                                let shut = format!("{name} transport is shut down");
                                sink.complete(op, Err(SliceError::Path(shut)));
                            }
                        }
                    }
                })
                .map_err(|e| fail(format!("spawning a worker: {e}")))?;
            self.threads.push(worker);
            queues.push(tx);
        }
        *self.queues.lock().unwrap_or_else(|e| e.into_inner()) = Some(queues);
        self.running.store(true, Ordering::Release);
        Ok(())
    }

    /// Executes or queues slices; after shutdown they are reported as failed. A post of up to
    /// [`INLINE_BYTES`] is copied here, on the posting thread; a larger one is dealt out across
    /// all workers in runs of neighbouring slices.
    pub fn post(&self, slices: Vec<SliceOp>) {
        let total: u64 = slices.iter().map(|s| s.len).sum();
        let slices = match total <= INLINE_BYTES {
            true => match self.copy_here(slices) {
                Some(back) => back,
                None => return,
            },
            false => slices,
        };
        let mut refused = Vec::new();
        {
            let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            let count = slices.len();
            for (i, op) in slices.into_iter().enumerate() {
                let sent = match queues.as_deref() {
                    Some(qs) if !qs.is_empty() => {
                        qs[i * qs.len() / count].send(op).map_err(|e| e.0)
                    }
                    _ => Err(op),
                };
                if let Err(op) = sent {
                    refused.push((
                        op,
                        SliceError::Path(format!("{} transport is shut down", self.name)),
                    ));
                }
            }
        }
        self.refuse(refused);
    }

    /// Executes `slices` on this thread and reports each; hands them back untouched when the
    /// workers are not running (not yet started, or shut down). No lock is held while the
    /// sink runs: the engine may post a retry straight back.
    fn copy_here(&self, slices: Vec<SliceOp>) -> Option<Vec<SliceOp>> {
        let Some((exec, sink)) = self.here() else {
            return Some(slices);
        };
        for op in slices {
            Self::run(exec, sink, op);
        }
        None
    }

    /// The executor and the sink, while the workers run (what a copy on the posting thread
    /// needs).
    fn here(&self) -> Option<(&Arc<Executor>, &Arc<dyn CompletionSink>)> {
        match self.running.load(Ordering::Acquire) {
            true => Some((self.exec.get()?, self.sink.get()?)),
            false => None,
        }
    }

    /// Executes one slice (unless it was canceled) and reports it.
    fn run(exec: &Arc<Executor>, sink: &Arc<dyn CompletionSink>, op: SliceOp) {
        let outcome = match op.is_canceled() {
            true => Err(SliceError::Canceled),
            false => exec(&op),
        };
        match outcome {
            // The copy's stores may still be on their way to the cache: no outcome is passed
            // (see `complete_ok`).
            Ok(()) => sink.complete_ok(op),
            Err(e) => sink.complete(op, Err(e)),
        }
    }

    /// As [`post`](Self::post) for a single slice, without making a list of it when it is
    /// copied here.
    pub fn post_one(&self, op: SliceOp) {
        if op.len <= INLINE_BYTES
            && let Some((exec, sink)) = self.here()
        {
            return Self::run(exec, sink, op);
        }
        self.post(vec![op]);
    }

    /// As [`post_live`](Self::post_live) for a single slice.
    pub fn post_live_one(&self, op: SliceOp) {
        match Self::owner_runs(&op) {
            true => self.post_one(op),
            false => self.refuse(vec![Self::owner_gone(op)]),
        }
    }

    /// Whether the owner of the slice's segment still runs (as far as a check at most
    /// `OWNER_CHECK_AGE` old says); always true for a segment on another host.
    fn owner_runs(op: &SliceOp) -> bool {
        !op.target.same_host() || op.target.owner_alive_within(OWNER_CHECK_AGE) != Some(false)
    }

    fn owner_gone(op: SliceOp) -> (SliceOp, SliceError) {
        let reason = format!("the owner of segment {} has exited", op.target.name());
        (op, SliceError::Path(reason))
    }

    /// Queues slices whose segment owner still runs, and fails the others: for transports that
    /// write straight into a peer's memory (a mapping outlives its owner), so nothing
    /// "completes" into a process that has exited. Each slice is judged from a check at most
    /// 10 ms old, one check serving neighbouring slices of one segment; a post whose owners all
    /// run goes on as it came (no list is made).
    pub fn post_live(&self, slices: Vec<SliceOp>) {
        let mut last: Option<(u64, bool)> = None;
        let mut alive = |op: &SliceOp| {
            let seg = op.target.id();
            match last {
                Some((s, a)) if s == seg => a,
                _ => {
                    let a = Self::owner_runs(op);
                    last = Some((seg, a));
                    a
                }
            }
        };
        if slices.iter().all(&mut alive) {
            return self.post(slices);
        }
        let (live, dead): (Vec<SliceOp>, Vec<SliceOp>) = slices.into_iter().partition(alive);
        self.refuse(dead.into_iter().map(Self::owner_gone).collect());
        self.post(live);
    }

    /// Reports slices that will not be executed, with their errors. Call it with no lock held:
    /// the engine may post a retry straight back.
    pub fn refuse(&self, slices: Vec<(SliceOp, SliceError)>) {
        if let Some(sink) = self.sink.get() {
            for (op, e) in slices {
                sink.complete(op, Err(e));
            }
        }
    }

    /// Takes no more slices, fails the queued ones and returns once the workers are gone: a
    /// copy under way finishes, and after that nothing touches the engine's memory (an
    /// application may free a buffer as soon as its engine is closed). Called from a worker
    /// (a completion that closed the engine), that worker is not waited for.
    pub fn shutdown(&self) {
        self.running.store(false, Ordering::Release);
        self.queues.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.threads.join_all(self.name);
    }
}

/// Threads a transport started, joined when it shuts down: what they hold (queue pairs, the
/// memory they copy into) is let go before the shutdown returns.
#[derive(Debug, Default)]
pub struct Threads(Mutex<Vec<std::thread::JoinHandle<()>>>);

impl Threads {
    /// Keeps `thread` to join at shutdown.
    pub fn push(&self, thread: std::thread::JoinHandle<()>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(thread);
    }

    /// Joins every thread kept, but the calling one (a shutdown from one of them, such as a
    /// completion that closed the engine, cannot wait for itself); one that panicked is
    /// logged, naming `owner`.
    pub fn join_all(&self, owner: &str) {
        let threads = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        let me = std::thread::current().id();
        for t in threads.into_iter().filter(|t| t.thread().id() != me) {
            if t.join().is_err() {
                tracing::warn!(owner, "a thread had panicked");
            }
        }
    }
}
