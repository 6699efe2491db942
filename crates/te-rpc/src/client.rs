//! The client: sends messages and tensors to peers by address over a bounded pool of
//! connections per peer, each call bound to the configured timeout. A call returns once the
//! peer's handler has taken the message. Asynchronous sends run the same call on the client's
//! sending threads ([`crate::dispatch`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::config::{Config, resolve};
use crate::dispatch::{Dispatch, Done, SendFuture};
use crate::error::{Error, Result};
use crate::link::{Kind, Link};
use crate::tensor::TensorMeta;
use crate::wire::{self, Function};

/// How long a pooled connection may idle before it is checked for its peer's close.
const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// What to send.
#[derive(Clone, Copy, Debug)]
pub enum Outgoing<'a> {
    /// A message.
    Data(&'a [u8]),
    /// A tensor: its dtype and shape, and exactly its bytes.
    Tensor(&'a TensorMeta, &'a [u8]),
}

impl Outgoing<'_> {
    fn len(&self) -> usize {
        match self {
            Outgoing::Data(b) | Outgoing::Tensor(_, b) => b.len(),
        }
    }
}

/// What to send, owned (for asynchronous sends).
#[derive(Clone, Debug)]
pub enum Owned {
    /// A message.
    Data(Vec<u8>),
    /// A tensor.
    Tensor(TensorMeta, Vec<u8>),
}

impl Owned {
    pub(crate) fn borrow(&self) -> Outgoing<'_> {
        match self {
            Owned::Data(b) => Outgoing::Data(b),
            Owned::Tensor(m, b) => Outgoing::Tensor(m, b),
        }
    }
}

/// The connections to one peer.
#[derive(Debug, Default)]
struct Pool {
    idle: Vec<Link>,
    open: usize,
    kind: Option<Kind>,
}

#[derive(Debug, Default)]
struct Peer {
    pool: Mutex<Pool>,
    room: Condvar,
}

/// The state every handle to one client shares.
#[derive(Debug)]
pub(crate) struct Shared {
    config: Config,
    peers: Mutex<HashMap<SocketAddr, Arc<Peer>>>,
    stopped: AtomicBool,
    /// When idle connections were last pruned.
    pruned: Mutex<Instant>,
}

/// A client. Cloning it shares its pools; the last clone dropped stops it.
#[derive(Clone, Debug)]
pub struct Client {
    handle: Arc<Handle>,
}

/// What every clone holds; its drop stops the sending threads (which hold only `shared` and
/// `dispatch`, so they never keep a client alive).
#[derive(Debug)]
struct Handle {
    shared: Arc<Shared>,
    dispatch: Arc<Dispatch>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Client {
    /// A client with `config`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a value it cannot honour, or the sending threads would not start.
    pub fn new(config: Config) -> Result<Self> {
        config.check()?;
        let shared = Arc::new(Shared {
            config,
            peers: Mutex::default(),
            stopped: AtomicBool::new(false),
            pruned: Mutex::new(Instant::now()),
        });
        let threads = shared.config.pool_size.clamp(1, 8);
        let dispatch = Dispatch::start(shared.clone(), threads)?;
        Ok(Client {
            handle: Arc::new(Handle { shared, dispatch }),
        })
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &Config {
        &self.handle.shared.config
    }

    /// Sends `what` to `target` (`host:port`) and waits until the peer's handler took it.
    ///
    /// # Errors
    /// [`Error::TooLarge`] over the limit (nothing sent), [`Error::TimedOut`] when the peer
    /// did not answer in time, [`Error::Refused`] when it refused the call,
    /// [`Error::Untrusted`] when it did not prove the cluster secret, socket errors.
    pub fn send(&self, target: &str, what: Outgoing<'_>) -> Result<()> {
        self.handle
            .shared
            .send(target, what, self.handle.shared.config.timeout)
    }

    /// As [`Client::send`], within `timeout` instead of the configured one.
    ///
    /// # Errors
    /// As [`Client::send`]; [`Error::Invalid`] for a zero timeout.
    pub fn send_within(&self, target: &str, what: Outgoing<'_>, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::invalid("timeout", "0 s", "a send needs some time"));
        }
        self.handle.shared.send(target, what, timeout)
    }

    /// Sends `what` to `target` on the client's sending threads; the future resolves as
    /// [`Client::send`] returns. Sends wait for room beyond a bounded queue.
    pub fn send_async(&self, target: &str, what: Owned) -> SendFuture {
        self.handle.dispatch.future(target.to_string(), what)
    }

    /// Sends `what` to `target` on the client's sending threads and calls `done` with the
    /// outcome there.
    ///
    /// # Errors
    /// [`Error::Stopped`] (`done` is then not called).
    pub fn send_then(&self, target: &str, what: Owned, done: Done) -> Result<()> {
        self.handle.dispatch.submit(target.to_string(), what, done)
    }

    /// Closes every connection and refuses further sends.
    pub fn stop(&self) {
        self.handle.stop();
    }
}

impl Handle {
    fn stop(&self) {
        self.shared.stopped.store(true, Ordering::Release);
        self.dispatch.stop();
        let peers = std::mem::take(&mut *lock(&self.shared.peers));
        for peer in peers.values() {
            lock(&peer.pool).idle.clear();
            peer.room.notify_all();
        }
    }
}

impl Shared {
    pub(crate) fn send(&self, target: &str, what: Outgoing<'_>, timeout: Duration) -> Result<()> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(Error::Stopped);
        }
        let len = what.len() as u64;
        if len > self.config.max_message {
            return Err(Error::TooLarge {
                len,
                max: self.config.max_message,
            });
        }
        check_tensor(&what)?;
        let addr = resolve(target)?;
        let end = Instant::now() + timeout;
        let peer = self.peer(addr);
        let mut link = self.checkout(&peer, addr, end)?;
        let result = exchange(&mut link, what, &self.config, end);
        let mut pool = lock(&peer.pool);
        match &result {
            Ok(()) if !self.stopped.load(Ordering::Acquire) => pool.idle.push(link),
            _ => pool.open -= 1,
        }
        drop(pool);
        peer.room.notify_one();
        result
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.config.timeout
    }

    fn peer(&self, addr: SocketAddr) -> Arc<Peer> {
        self.prune();
        lock(&self.peers).entry(addr).or_default().clone()
    }

    /// At most once a second: closes connections idle longer than the configured idle time,
    /// and forgets peers left with none, so a client that talks to many peers over time holds
    /// sockets only for those it uses.
    fn prune(&self) {
        let idle = self.config.idle_timeout;
        {
            let mut last = lock(&self.pruned);
            if last.elapsed() < RECHECK_AFTER.min(idle) {
                return;
            }
            *last = Instant::now();
        }
        lock(&self.peers).retain(|_, peer| {
            let mut pool = lock(&peer.pool);
            let before = pool.idle.len();
            pool.idle.retain(|l| l.last_used.elapsed() < idle);
            pool.open -= before - pool.idle.len();
            pool.open > 0 || Arc::strong_count(peer) > 1
        });
    }

    /// An idle connection, a new one while the pool has room, or the first to come back by
    /// the deadline.
    fn checkout(&self, peer: &Peer, addr: SocketAddr, end: Instant) -> Result<Link> {
        let mut pool = lock(&peer.pool);
        loop {
            if let Some(link) = pool.idle.pop() {
                // A connection idle a while may have been closed by the peer meanwhile.
                if link.last_used.elapsed() < RECHECK_AFTER || link.alive() {
                    return Ok(link);
                }
                pool.open -= 1;
                continue;
            }
            if pool.open < self.config.pool_size {
                pool.open += 1;
                let known = pool.kind;
                drop(pool);
                let opened = Link::open(addr, known, &self.config, end);
                let mut pool = lock(&peer.pool);
                return match opened {
                    Ok(link) => {
                        pool.kind = Some(link.kind);
                        Ok(link)
                    }
                    Err(e) => {
                        pool.open -= 1;
                        pool.kind = None;
                        drop(pool);
                        peer.room.notify_one();
                        Err(e)
                    }
                };
            }
            let Some(left) = end.checked_duration_since(Instant::now()) else {
                return Err(Error::TimedOut {
                    peer: addr,
                    what: "waiting for a pooled connection",
                    secs: self.config.timeout.as_secs_f64(),
                });
            };
            pool = peer
                .room
                .wait_timeout(pool, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
            if self.stopped.load(Ordering::Acquire) {
                return Err(Error::Stopped);
            }
        }
    }
}

/// One message or tensor over `link`, in the protocol its peer speaks.
///
/// To a Mooncake peer every non-empty payload goes as the attachment: Mooncake's server hands
/// a later call without one the last attachment its connection carried, so an empty payload
/// goes on a connection that never carried one (a fresh one where this one did).
fn exchange(link: &mut Link, what: Outgoing<'_>, config: &Config, end: Instant) -> Result<()> {
    if link.kind == Kind::Mooncake && what.len() == 0 && link.carried_attachment {
        *link = Link::open(link.peer, Some(Kind::Mooncake), config, end)?;
    }
    match (link.kind, what) {
        (Kind::Te, Outgoing::Data(b)) => link.call(Function::TeData, &[], b, end),
        (Kind::Te, Outgoing::Tensor(meta, b)) => {
            link.call(Function::TeTensor, &meta.encode(), b, end)
        }
        (Kind::Mooncake, Outgoing::Data(b)) => {
            let mut body = Vec::with_capacity(16);
            wire::pack_string(&[], &mut body);
            link.call(Function::MooncakeData, &body, b, end)
        }
        // As Mooncake's engine sends a tensor: its raw bytes, no dtype or shape.
        (Kind::Mooncake, Outgoing::Tensor(_, b)) => {
            link.call(Function::MooncakeTensor, &[], b, end)
        }
    }
    .map(drop)
}

/// Checks that a tensor's bytes are its shape's.
fn check_tensor(what: &Outgoing<'_>) -> Result<()> {
    if let Outgoing::Tensor(meta, b) = what {
        meta.check_len(b.len() as u64)
            .map_err(|reason| Error::invalid("tensor", format!("{} bytes", b.len()), reason))?;
    }
    Ok(())
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
