//! Notifications: small named messages between segments, and the bounded queue that holds
//! received ones until the application takes them.
//!
//! The wire shape is Mooncake's `{"name": ..., "notify_msg": ...}`. The `name` is whatever the
//! sender wrote; what te vouches for is the [`Sender`]: the address of the connection the
//! notification came on, and whether that connection proved the cluster secret. Sending goes
//! through the control channel (see [`crate::control`]); this module only stores and hands out.
//!
//! What a stranger can make the queue hold is bounded in bytes, not only in count
//! ([`NotifyLimits`]): a notification larger than `max_message` is refused (the control
//! listener refuses its frame before reading it whole), the queue holds at most `max_queued`
//! bytes, and one source (an IPv4 address, or an IPv6 /64) at most a quarter of them.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One notification (Mooncake's `NotifyDesc`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notification {
    /// Sender-chosen name (often the sender's segment name): the sender's word, nothing more.
    pub name: String,
    /// The message.
    pub notify_msg: String,
}

/// Who sent a received notification, as far as te knows it: the connection it came on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sender {
    /// The connection's remote address.
    pub addr: SocketAddr,
    /// The connection proved the cluster secret (`MC_TE_CLUSTER_SECRET`): the sender holds it.
    /// False without a cluster secret, and for a Mooncake peer served under the opt-in.
    pub authenticated: bool,
}

/// A received notification and the connection it came on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// What the sender wrote.
    pub notification: Notification,
    /// Who sent it.
    pub sender: Sender,
}

/// What the queue holds at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotifyLimits {
    /// The largest notification accepted, as sent (its JSON), in bytes
    /// (`MC_TE_NOTIFY_MAX_BYTES`).
    pub max_message: usize,
    /// Bytes queued in all (`MC_TE_NOTIFY_QUEUE_BYTES`); one source may hold a quarter.
    pub max_queued: usize,
    /// Notifications queued in all.
    pub max_count: usize,
}

impl Default for NotifyLimits {
    fn default() -> Self {
        NotifyLimits {
            max_message: crate::settings::TE_NOTIFY_MAX_BYTES.initial(),
            max_queued: crate::settings::TE_NOTIFY_QUEUE_BYTES.initial(),
            max_count: 65536,
        }
    }
}

/// A source may hold this fraction of the queue's bytes (1/4).
const SOURCE_SHARE: usize = 4;
/// What an entry costs beyond its text: its place in the queue.
const ENTRY_COST: usize = 64;

/// Why a notification was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// It is larger than `max_message`.
    TooLarge {
        /// Its size.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The queue holds its bytes or its count.
    Full,
    /// Its source holds its share of the queue.
    SourceFull,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::TooLarge { len, max } => write!(
                f,
                "notification of {len} bytes exceeds MC_TE_NOTIFY_MAX_BYTES ({max})"
            ),
            Refused::Full => f.write_str("notification queue full"),
            Refused::SourceFull => {
                f.write_str("notification queue full for your address (its share is held)")
            }
        }
    }
}

#[derive(Debug, Default)]
struct Queue {
    entries: VecDeque<(Received, usize)>,
    bytes: usize,
    by_source: HashMap<IpAddr, usize>,
}

impl Queue {
    fn pop(&mut self) -> Option<Received> {
        let (r, cost) = self.entries.pop_front()?;
        self.bytes -= cost;
        let key = te_reactor::source_key(r.sender.addr.ip());
        if let Some(held) = self.by_source.get_mut(&key) {
            *held -= cost;
            if *held == 0 {
                self.by_source.remove(&key);
            }
        }
        Some(r)
    }
}

/// Received notifications, oldest first, bounded by [`NotifyLimits`].
#[derive(Debug)]
pub struct NotificationQueue {
    limits: NotifyLimits,
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl NotificationQueue {
    /// An empty queue holding at most what `limits` allow.
    pub fn new(limits: NotifyLimits) -> Self {
        NotificationQueue {
            limits,
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
        }
    }

    /// The bounds it keeps.
    pub fn limits(&self) -> NotifyLimits {
        self.limits
    }

    /// Adds one from `sender`, or says why not (and drops it).
    ///
    /// # Errors
    /// [`Refused`]: too large, the queue full, or the sender's share held.
    pub fn push(&self, notification: Notification, sender: Sender) -> Result<(), Refused> {
        let len = notification.name.len() + notification.notify_msg.len();
        if len > self.limits.max_message {
            return Err(Refused::TooLarge {
                len,
                max: self.limits.max_message,
            });
        }
        let cost = len + ENTRY_COST;
        let key = te_reactor::source_key(sender.addr.ip());
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.entries.len() >= self.limits.max_count || q.bytes + cost > self.limits.max_queued {
            return Err(Refused::Full);
        }
        let held = q.by_source.get(&key).copied().unwrap_or(0);
        if held + cost > self.limits.max_queued / SOURCE_SHARE {
            return Err(Refused::SourceFull);
        }
        q.bytes += cost;
        *q.by_source.entry(key).or_insert(0) += cost;
        q.entries.push_back((
            Received {
                notification,
                sender,
            },
            cost,
        ));
        self.ready.notify_all();
        Ok(())
    }

    /// Takes every queued notification, with its sender.
    pub fn drain(&self) -> Vec<Received> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        std::iter::from_fn(|| q.pop()).collect()
    }

    /// Takes the oldest notification, waiting up to `timeout` for one to arrive.
    pub fn recv(&self, timeout: Duration) -> Option<Received> {
        let end = Instant::now() + timeout;
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(n) = q.pop() {
                return Some(n);
            }
            let now = Instant::now();
            if now >= end {
                return None;
            }
            q = self
                .ready
                .wait_timeout(q, end - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Bytes queued now, as charged against `max_queued`.
    pub fn queued_bytes(&self) -> usize {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(msg: &str) -> Notification {
        Notification {
            name: "a".into(),
            notify_msg: msg.into(),
        }
    }

    fn from(addr: &str) -> Sender {
        Sender {
            addr: addr.parse().unwrap(),
            authenticated: false,
        }
    }

    #[test]
    fn a_fifo_bounded_by_count() {
        let q = NotificationQueue::new(NotifyLimits {
            max_count: 2,
            ..NotifyLimits::default()
        });
        let s = from("10.0.0.1:5");
        assert!(q.push(n("1"), s).is_ok() && q.push(n("2"), s).is_ok());
        assert_eq!(q.push(n("3"), s), Err(Refused::Full));
        let first = q.recv(Duration::ZERO).unwrap();
        assert_eq!((first.notification, first.sender), (n("1"), s));
        assert_eq!(
            q.drain()
                .into_iter()
                .map(|r| r.notification)
                .collect::<Vec<_>>(),
            vec![n("2")]
        );
        assert_eq!(q.recv(Duration::from_millis(5)), None);
        assert_eq!(q.queued_bytes(), 0);
    }

    #[test]
    fn bytes_are_bounded_per_message_in_all_and_per_source() {
        let limits = NotifyLimits {
            max_message: 1000,
            max_queued: 4 * (1000 + ENTRY_COST),
            max_count: 1000,
        };
        let q = NotificationQueue::new(limits);
        let big = "x".repeat(999);
        assert_eq!(
            q.push(n(&"x".repeat(1000)), from("10.0.0.1:1")),
            Err(Refused::TooLarge {
                len: 1001,
                max: 1000
            })
        );
        // One source: a quarter of the bytes, then refused; others still get theirs.
        assert!(q.push(n(&big), from("10.0.0.1:1")).is_ok());
        assert_eq!(
            q.push(n(&big), from("10.0.0.1:2")),
            Err(Refused::SourceFull),
            "another port of the same address is the same source"
        );
        assert_eq!(q.push(n(&big), from("[2001:db8::1]:1")).map(|_| ()), Ok(()));
        assert_eq!(
            q.push(n(&big), from("[2001:db8::ffff]:1")),
            Err(Refused::SourceFull),
            "one IPv6 /64 is one source"
        );
        assert!(q.push(n(&big), from("[::ffff:10.0.0.2]:1")).is_ok());
        assert!(q.push(n(&big), from("10.0.0.3:1")).is_ok());
        assert_eq!(q.push(n("small"), from("10.0.0.4:1")), Err(Refused::Full));
        assert_eq!(q.queued_bytes(), limits.max_queued);
        // Taking gives the bytes back, to the source and to the queue.
        assert_eq!(q.drain().len(), 4);
        assert_eq!(q.queued_bytes(), 0);
        assert!(q.push(n(&big), from("10.0.0.1:1")).is_ok());
    }
}
