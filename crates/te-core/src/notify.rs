//! Notifications: small named messages between segments, and the bounded queue that holds
//! received ones until the application takes them.
//!
//! The wire shape is Mooncake's `{"name": ..., "notify_msg": ...}`. Sending goes through the
//! control channel (see [`crate::control`]); this module only stores and hands out.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One notification (Mooncake's `NotifyDesc`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notification {
    /// Sender-chosen name (often the sender's segment name).
    pub name: String,
    /// The message.
    pub notify_msg: String,
}

/// Received notifications, oldest first, at most `max` of them.
#[derive(Debug)]
pub struct NotificationQueue {
    max: usize,
    queue: Mutex<VecDeque<Notification>>,
    ready: Condvar,
}

impl NotificationQueue {
    /// An empty queue holding at most `max` notifications.
    pub fn new(max: usize) -> Self {
        NotificationQueue {
            max,
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
        }
    }

    /// Adds one; returns false (and drops it) when the queue is full.
    pub fn push(&self, n: Notification) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= self.max {
            return false;
        }
        q.push_back(n);
        self.ready.notify_all();
        true
    }

    /// Takes every queued notification.
    pub fn drain(&self) -> Vec<Notification> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.drain(..).collect()
    }

    /// Takes the oldest notification, waiting up to `timeout` for one to arrive.
    pub fn recv(&self, timeout: Duration) -> Option<Notification> {
        let end = Instant::now() + timeout;
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(n) = q.pop_front() {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(i: usize) -> Notification {
        Notification {
            name: "a".into(),
            notify_msg: i.to_string(),
        }
    }

    #[test]
    fn bounded_fifo() {
        let q = NotificationQueue::new(2);
        assert!(q.push(n(1)) && q.push(n(2)));
        assert!(!q.push(n(3)), "full");
        assert_eq!(q.recv(Duration::ZERO), Some(n(1)));
        assert_eq!(q.drain(), vec![n(2)]);
        assert_eq!(q.recv(Duration::from_millis(5)), None);
    }
}
