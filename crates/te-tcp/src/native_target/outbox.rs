//! A data connection's outbox: its replies, gathered in request order, and each READ's data
//! (pinned in its region) due right after that READ's own reply. One send call carries as much
//! of both as the socket takes, in order; what it did not take goes in the next.
//!
//! Not here: when to send (the connection's drive decides, and bounds how much may wait with
//! [`Outbox::waiting`], [`Outbox::reads`] and [`Outbox::read_bytes`]), and what a request's
//! reply says.

use std::collections::VecDeque;

use te_core::memory::RegionPin;

use crate::sys::{self, SendPart};
use crate::wire::{Reply, Status};

/// Parts one send call carries at most (the kernel takes up to 1,024).
const MAX_PARTS: usize = 256;

/// A READ answered and not yet sent: its data (pinned) goes out right after byte `after` of
/// the replies (its own reply's end).
struct PendingRead {
    pin: RegionPin,
    addr: u64,
    left: usize,
    after: usize,
}

/// How a send of what waits ended.
pub(super) enum Flush {
    /// Everything is out.
    Done,
    /// The socket is full; the rest waits for it to drain.
    Blocked,
    /// The socket failed.
    Failed,
}

/// What a connection has to send, in order.
#[derive(Default)]
pub(super) struct Outbox {
    /// Replies gathered and not yet sent (from `sent` on).
    replies: Vec<u8>,
    sent: usize,
    /// READs answered in `replies` whose data is still to send, in order.
    reads: VecDeque<PendingRead>,
    /// Bytes of READ data in `reads`.
    read_bytes: usize,
}

impl Outbox {
    /// Queues the reply to request `request_id`.
    pub(super) fn reply(&mut self, request_id: u64, status: Status) {
        self.replies
            .extend_from_slice(&Reply { status, request_id }.encode());
    }

    /// Queues bytes already framed (a refusal in a foreign framing).
    pub(super) fn framed(&mut self, bytes: &[u8]) {
        self.replies.extend_from_slice(bytes);
    }

    /// Queues READ `request_id`'s reply and then its data: `len` bytes at `addr`, which `pin`
    /// holds in a region that permits remote reads (checked by the caller).
    pub(super) fn read(&mut self, request_id: u64, pin: RegionPin, addr: u64, len: usize) {
        self.reply(request_id, Status::Ok);
        self.reads.push_back(PendingRead {
            pin,
            addr,
            left: len,
            after: self.replies.len(),
        });
        self.read_bytes += len;
    }

    /// Reply bytes not yet sent.
    pub(super) fn waiting(&self) -> usize {
        self.replies.len() - self.sent
    }

    /// READs whose data is not wholly sent.
    pub(super) fn reads(&self) -> usize {
        self.reads.len()
    }

    /// Bytes of READ data not yet sent.
    pub(super) fn read_bytes(&self) -> usize {
        self.read_bytes
    }

    /// The replies not yet sent, for a connection that leaves the loop with no READ's data
    /// waiting (a thread of its own sends them first).
    pub(super) fn unsent_replies(&self) -> Vec<u8> {
        debug_assert!(self.reads.is_empty());
        self.replies[self.sent..].to_vec()
    }

    /// Sends what waits, as far as the socket takes it; `moved` is called after each send
    /// that took bytes.
    pub(super) fn flush(&mut self, stream: &mio::net::TcpStream, mut moved: impl FnMut()) -> Flush {
        loop {
            let mut parts = [SendPart::EMPTY; MAX_PARTS + 1];
            let Some(n) = self.next_parts(&mut parts) else {
                return Flush::Failed;
            };
            if n == 0 {
                // Only READs of no bytes, if any, are left: they are due.
                self.advance(0);
                if self.reads.is_empty() {
                    self.replies.clear();
                    self.sent = 0;
                    self.read_bytes = 0;
                    return Flush::Done;
                }
                continue;
            }
            match sys::send_some(stream, &parts[..n]) {
                Ok(n) => {
                    self.advance(n);
                    moved();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Flush::Blocked,
                Err(_) => return Flush::Failed,
            }
        }
    }

    /// Fills `parts` with the next send's, in order: replies up to the next READ's data, that
    /// data, and so on, at most [`MAX_PARTS`] (and one more) of them. How many it filled (none
    /// when only READs of no bytes are left); `None` if a READ's range left its region (it
    /// was checked against it when queued, so never).
    fn next_parts<'a>(&'a self, parts: &mut [SendPart<'a>; MAX_PARTS + 1]) -> Option<usize> {
        let mut n = 0;
        let mut at = self.sent;
        for r in &self.reads {
            if n >= MAX_PARTS {
                // Within the kernel's iovec limit; the rest in the next call.
                return Some(n);
            }
            if r.after > at {
                parts[n] = self.replies[at..r.after].into();
                n += 1;
                at = r.after;
            }
            if r.left > 0 {
                parts[n] = r.pin.range(r.addr, r.left)?.into();
                n += 1;
            }
        }
        if at < self.replies.len() && n <= MAX_PARTS {
            parts[n] = self.replies[at..].into();
            n += 1;
        }
        Some(n)
    }

    /// Accounts `n` bytes sent: replies up to the next READ's data, that data, and so on.
    fn advance(&mut self, mut n: usize) {
        loop {
            // READs wholly out (a READ of no bytes as soon as its reply is).
            while self
                .reads
                .front()
                .is_some_and(|r| self.sent >= r.after && r.left == 0)
            {
                self.reads.pop_front();
            }
            if n == 0 {
                return;
            }
            match self.reads.front_mut() {
                Some(r) if self.sent < r.after => {
                    let k = n.min(r.after - self.sent);
                    self.sent += k;
                    n -= k;
                }
                Some(r) => {
                    let k = n.min(r.left);
                    r.addr += k as u64;
                    r.left -= k;
                    self.read_bytes -= k;
                    n -= k;
                }
                None => {
                    self.sent += n.min(self.replies.len() - self.sent);
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
