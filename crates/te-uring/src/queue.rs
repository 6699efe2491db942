//! The queue between `post` (any thread) and a transport's workers: slices wait here until a
//! worker takes them as coalesced groups. Closing it refuses new slices and hands the queued
//! ones back (the closer reports them), so each is reported exactly once.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

use te_core::transport::SliceOp;

use crate::plan::{Group, take_group};

#[derive(Default)]
struct State {
    ops: VecDeque<SliceOp>,
    closed: bool,
    /// Bumped by [`SliceQueue::poke`].
    pokes: u64,
}

/// Slices waiting for a worker.
#[derive(Default)]
pub struct SliceQueue {
    state: Mutex<State>,
    ready: Condvar,
}

/// What a worker got from the queue.
pub enum Taken {
    /// A group to execute.
    Group(Group<SliceOp>),
    /// Nothing queued right now (a non-blocking take), or a poke woke the waiter.
    Empty,
    /// Closed and drained: the worker may exit.
    Closed,
}

impl SliceQueue {
    /// Queues slices; hands them back if the queue is closed.
    pub fn push(&self, slices: Vec<SliceOp>) -> Result<(), Vec<SliceOp>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.closed {
            return Err(slices);
        }
        state.ops.extend(slices);
        drop(state);
        self.ready.notify_all();
        Ok(())
    }

    /// Takes the next group of at most `max_io` bytes; waits for one when `wait`, until a poke
    /// newer than `seen` (which is then updated).
    pub fn take(&self, max_io: u64, wait: bool, seen: &mut u64) -> Taken {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(group) = take_group(&mut state.ops, max_io) {
                return Taken::Group(group);
            }
            if state.closed {
                return Taken::Closed;
            }
            if !wait || state.pokes != *seen {
                *seen = state.pokes;
                return Taken::Empty;
            }
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Wakes waiting workers with [`Taken::Empty`] so they look at their state again.
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    pub fn poke(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).pokes += 1;
        self.ready.notify_all();
    }

    /// Refuses new slices, wakes every waiting worker, and hands back the slices no worker
    /// took.
    pub fn close(&self) -> Vec<SliceOp> {
        let left = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.closed = true;
            std::mem::take(&mut state.ops)
        };
        self.ready.notify_all();
        left.into()
    }
}
