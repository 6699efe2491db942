//! [`CopyWorkers`]: worker threads that execute slices for memory-copy transports (te-shm,
//! te-cxl), so copies never run on the submitting thread, and report each slice exactly once
//! through the engine's sink.
//!
//! A worker that runs out of slices polls for a short while (`SPIN`) before it sleeps, so a
//! slice posted right after another is picked up without a wake-up; a quiet transport costs no
//! CPU. The copy itself is the transport's executor; this module moves no bytes.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::transport::{CompletionSink, SliceError, SliceOp};

/// How long an idle worker polls before it sleeps.
const SPIN: Duration = Duration::from_micros(50);

/// Executes one slice (the copy); called on a worker thread.
pub type Executor = dyn Fn(&SliceOp) -> std::result::Result<(), SliceError> + Send + Sync;

/// Worker threads fed by a queue.
pub struct CopyWorkers {
    name: &'static str,
    queue: Mutex<Option<Sender<SliceOp>>>,
    sink: OnceLock<Arc<dyn CompletionSink>>,
}

impl std::fmt::Debug for CopyWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyWorkers")
            .field("name", &self.name)
            .finish()
    }
}

fn next(rx: &Mutex<Receiver<SliceOp>>) -> Option<SliceOp> {
    let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
    let start = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(op) => return Some(op),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if start.elapsed() < SPIN => std::hint::spin_loop(),
            Err(TryRecvError::Empty) => break,
        }
    }
    loop {
        match rx.recv_timeout(Duration::from_secs(3600)) {
            Ok(op) => return Some(op),
            Err(RecvTimeoutError::Disconnected) => return None,
            Err(RecvTimeoutError::Timeout) => continue,
        }
    }
}

impl CopyWorkers {
    /// Workers for the transport `name` (thread names and errors use it); start them at install.
    pub fn new(name: &'static str) -> Self {
        CopyWorkers {
            name,
            queue: Mutex::new(None),
            sink: OnceLock::new(),
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
        let (tx, rx) = mpsc::channel::<SliceOp>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..count.max(1) {
            let (rx, sink, exec) = (rx.clone(), sink.clone(), exec.clone());
            std::thread::Builder::new()
                .name(format!("te-{}-{i}", self.name))
                .spawn(move || {
                    while let Some(op) = next(&rx) {
                        let outcome = match op.is_canceled() {
                            true => Err(SliceError::Canceled),
                            false => exec(&op),
                        };
                        sink.complete(op, outcome);
                    }
                })
                .map_err(|e| fail(format!("spawning a worker: {e}")))?;
        }
        *self.queue.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        Ok(())
    }

    /// Queues slices; after shutdown they are reported as failed.
    pub fn post(&self, slices: Vec<SliceOp>) {
        let mut refused = Vec::new();
        {
            let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            for op in slices {
                let sent = match queue.as_ref() {
                    Some(tx) => tx.send(op).map_err(|e| e.0),
                    None => Err(op),
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

    /// Queues slices whose segment owner still runs, and fails the others: for transports that
    /// write straight into a peer's memory (a mapping outlives its owner), so nothing
    /// "completes" into a process that has exited. Checked once per segment per call.
    pub fn post_live(&self, slices: Vec<SliceOp>) {
        let mut alive: Vec<(u64, bool)> = Vec::new();
        let (mut live, mut refused) = (Vec::with_capacity(slices.len()), Vec::new());
        for op in slices {
            let seg = op.target.id();
            let owner_alive = match alive.iter().find(|(s, _)| *s == seg) {
                Some((_, a)) => *a,
                None => {
                    let a = !op.target.same_host() || op.target.owner_alive() != Some(false);
                    alive.push((seg, a));
                    a
                }
            };
            match owner_alive {
                true => live.push(op),
                false => {
                    let reason = format!("the owner of segment {} has exited", op.target.name());
                    refused.push((op, SliceError::Path(reason)));
                }
            }
        }
        self.refuse(refused);
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

    /// Takes no more slices; queued ones are still executed and reported.
    pub fn shutdown(&self) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}
