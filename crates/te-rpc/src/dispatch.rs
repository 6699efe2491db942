//! Asynchronous sends: a bounded queue drained by the client's sending threads, each send
//! made as a synchronous one is. A send finds room in the queue or waits for it (the future
//! stays pending; a callback send is refused only once the client stopped), so a caller that
//! sends faster than the peers take is held back rather than buffered without bound.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

use crate::client::{Owned, Shared, lock};
use crate::error::{Error, Result};

/// Called with a send's outcome, on a sending thread.
pub type Done = Box<dyn FnOnce(Result<()>) + Send>;

/// Sends waiting for a thread, at most.
const QUEUE: usize = 1024;

struct Job {
    target: String,
    what: Owned,
    done: Done,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    waiting_for_room: Vec<Waker>,
    stopped: bool,
}

/// The sending threads and their queue.
pub(crate) struct Dispatch {
    queue: Mutex<Queue>,
    work: Condvar,
    room: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatch").finish_non_exhaustive()
    }
}

impl Dispatch {
    pub(crate) fn start(shared: Arc<Shared>, threads: usize) -> Result<Arc<Self>> {
        let d = Arc::new(Dispatch {
            queue: Mutex::default(),
            work: Condvar::new(),
            room: Condvar::new(),
            threads: Mutex::default(),
        });
        for i in 0..threads {
            let (d2, s2) = (d.clone(), shared.clone());
            let t = std::thread::Builder::new()
                .name(format!("te-rpc-send{i}"))
                .spawn(move || d2.run(&s2))
                .map_err(|e| Error::socket("starting the RPC client's sending threads", e))?;
            lock(&d.threads).push(t);
        }
        Ok(d)
    }

    fn run(&self, shared: &Shared) {
        loop {
            let job = {
                let mut q = lock(&self.queue);
                loop {
                    if let Some(job) = q.jobs.pop_front() {
                        if let Some(w) = q.waiting_for_room.pop() {
                            w.wake();
                        }
                        break job;
                    }
                    if q.stopped {
                        return;
                    }
                    q = self.work.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            self.room.notify_one();
            let result = shared.send(&job.target, job.what.borrow(), shared.timeout());
            (job.done)(result);
        }
    }

    /// Queues a send, waiting for room.
    pub(crate) fn submit(&self, target: String, what: Owned, done: Done) -> Result<()> {
        let mut q = lock(&self.queue);
        while q.jobs.len() >= QUEUE && !q.stopped {
            q = self.room.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        if q.stopped {
            return Err(Error::Stopped);
        }
        q.jobs.push_back(Job { target, what, done });
        drop(q);
        self.work.notify_one();
        Ok(())
    }

    /// Queues a send without blocking: `Err(job)` back when the queue is full.
    fn try_submit(&self, job: Job, waker: &Waker) -> std::result::Result<(), Option<Job>> {
        let mut q = lock(&self.queue);
        if q.stopped {
            return Err(None);
        }
        if q.jobs.len() >= QUEUE {
            q.waiting_for_room.push(waker.clone());
            return Err(Some(job));
        }
        q.jobs.push_back(job);
        drop(q);
        self.work.notify_one();
        Ok(())
    }

    pub(crate) fn future(self: &Arc<Self>, target: String, what: Owned) -> SendFuture {
        SendFuture {
            dispatch: self.clone(),
            pending: Some((target, what)),
            slot: Arc::default(),
        }
    }

    pub(crate) fn stop(&self) {
        let mut q = lock(&self.queue);
        q.stopped = true;
        let jobs: Vec<Job> = q.jobs.drain(..).collect();
        for w in q.waiting_for_room.drain(..) {
            w.wake();
        }
        drop(q);
        self.work.notify_all();
        self.room.notify_all();
        for job in jobs {
            (job.done)(Err(Error::Stopped));
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        let me = std::thread::current().id();
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

#[derive(Default)]
struct Slot {
    result: Option<Result<()>>,
    waker: Option<Waker>,
}

/// An asynchronous send: resolves to the send's outcome. Any executor can await it.
pub struct SendFuture {
    dispatch: Arc<Dispatch>,
    pending: Option<(String, Owned)>,
    slot: Arc<Mutex<Slot>>,
}

impl std::fmt::Debug for SendFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendFuture")
            .field("queued", &self.pending.is_none())
            .finish()
    }
}

impl Future for SendFuture {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if let Some((target, what)) = self.pending.take() {
            let slot = self.slot.clone();
            let done: Done = Box::new(move |r| {
                let mut s = lock(&slot);
                s.result = Some(r);
                if let Some(w) = s.waker.take() {
                    w.wake();
                }
            });
            lock(&self.slot).waker = Some(cx.waker().clone());
            let job = Job { target, what, done };
            match self.dispatch.try_submit(job, cx.waker()) {
                Ok(()) => {}
                Err(Some(job)) => {
                    self.pending = Some((job.target, job.what));
                    return Poll::Pending;
                }
                Err(None) => return Poll::Ready(Err(Error::Stopped)),
            }
        }
        let mut s = lock(&self.slot);
        match s.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
