//! The runtime queue: tasks wait here by priority until fewer than `max_inflight_tasks` are
//! posted; higher priorities leave first, and a task sent back for failover goes to the front
//! of its priority. Pure bookkeeping: posting is the engine's.

use std::collections::VecDeque;

use crate::policy::Priority;

/// Tasks waiting by priority, and how many are posted.
#[derive(Debug)]
pub struct Dispatcher<T> {
    queues: [VecDeque<T>; 3],
    inflight: usize,
    max: usize,
}

impl<T: PartialEq> Dispatcher<T> {
    /// Empty, posting at most `max` at once.
    pub fn new(max: usize) -> Self {
        Dispatcher {
            queues: Default::default(),
            inflight: 0,
            max: max.max(1),
        }
    }

    /// Queues `item` behind others of its priority.
    pub fn push(&mut self, priority: Priority, item: T) {
        self.queues[priority.index()].push_back(item);
    }

    /// Queues `item` ahead of others of its priority (a retry keeps its place).
    pub fn push_front(&mut self, priority: Priority, item: T) {
        self.queues[priority.index()].push_front(item);
    }

    /// The next item to post, counted as posted; `None` when nothing waits or the limit is
    /// reached.
    pub fn take_next(&mut self) -> Option<T> {
        if self.inflight >= self.max {
            return None;
        }
        let item = self.queues.iter_mut().find_map(VecDeque::pop_front)?;
        self.inflight += 1;
        Some(item)
    }

    /// A posted item finished (or was taken back).
    pub fn finished(&mut self) {
        self.ended(1);
    }

    /// `n` posted items finished.
    pub fn ended(&mut self, n: usize) {
        self.inflight = self.inflight.saturating_sub(n);
    }

    /// Removes waiting items `drop` selects; returns them.
    pub fn remove_where(&mut self, drop: impl Fn(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        for q in &mut self.queues {
            let mut kept = VecDeque::with_capacity(q.len());
            for item in q.drain(..) {
                match drop(&item) {
                    true => out.push(item),
                    false => kept.push_back(item),
                }
            }
            *q = kept;
        }
        out
    }

    /// How many more may be posted now.
    pub fn room(&self) -> usize {
        self.max.saturating_sub(self.inflight)
    }

    /// `n` items were posted without waiting (the queue was empty and had room).
    pub fn count_posted(&mut self, n: usize) {
        self.inflight += n;
    }

    /// Items waiting.
    pub fn waiting(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    /// Items posted and not finished.
    pub fn inflight(&self) -> usize {
        self.inflight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn higher_priorities_leave_first_within_the_limit() {
        let mut d = Dispatcher::new(2);
        d.push(Priority::Low, "l1");
        d.push(Priority::Low, "l2");
        d.push(Priority::Medium, "m1");
        d.push(Priority::High, "h1");
        assert_eq!(d.take_next(), Some("h1"));
        assert_eq!(d.take_next(), Some("m1"));
        assert_eq!(d.take_next(), None, "two in flight");
        d.push(Priority::High, "h2");
        d.finished();
        assert_eq!(
            d.take_next(),
            Some("h2"),
            "a later high still goes before earlier lows"
        );
        d.finished();
        d.push_front(Priority::Low, "retry");
        assert_eq!(d.take_next(), Some("retry"));
        assert_eq!(d.remove_where(|i| *i == "l2"), vec!["l2"]);
        assert_eq!((d.waiting(), d.inflight()), (1, 2));
        d.finished();
        d.finished();
        d.finished();
        assert_eq!(d.inflight(), 0, "never below zero");
    }
}
