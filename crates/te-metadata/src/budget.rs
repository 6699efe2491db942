//! The server-wide bound on values in transit: bytes of request bodies being gathered and of
//! replies carrying values that wait to be sent, summed over every connection. Each connection
//! is bounded by itself (a body at most the largest value, one reply at a time), but ten
//! thousand connections each holding a 16 MiB value would hold 160 GiB; the budget turns the
//! ones past it away with a 503 that names `--max-buffered`, instead of letting the server
//! run out of memory.
//!
//! A [`Hold`] is one connection's share: it grows before bytes are buffered and gives them back
//! when it is released or dropped (a connection closed mid-body frees its share).
//!
//! Not here: what is refused and how it is answered (`request.rs`, `conn.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The bytes every connection may buffer together.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: usize,
    used: AtomicUsize,
}

/// Why a hold could not grow: the budget is spent.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Spent {
    /// Bytes asked for.
    pub(crate) wanted: usize,
    /// The budget.
    pub(crate) limit: usize,
}

impl std::fmt::Display for Spent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "te-metadata is busy: values being received and sent already take most of its \
             {} bytes (--max-buffered), and {} more do not fit; try again shortly",
            self.limit, self.wanted
        )
    }
}

impl Budget {
    /// A budget of `limit` bytes.
    pub(crate) fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes held now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` if they fit.
    fn take(&self, bytes: usize) -> Result<(), Spent> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&u| u <= self.limit)
            })
            .map(|_| ())
            .map_err(|_| Spent {
                wanted: bytes,
                limit: self.limit,
            })
    }

    fn give(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// One connection's share of a [`Budget`].
#[derive(Debug)]
pub(crate) struct Hold {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Hold {
    /// An empty share of `budget`.
    pub(crate) fn new(budget: &Arc<Budget>) -> Hold {
        Hold {
            budget: Arc::clone(budget),
            bytes: 0,
        }
    }

    /// Adds `bytes` to the share if the budget has them; nothing changes if not.
    pub(crate) fn grow(&mut self, bytes: usize) -> Result<(), Spent> {
        self.budget.take(bytes)?;
        self.bytes += bytes;
        Ok(())
    }

    /// Gives the whole share back.
    pub(crate) fn release(&mut self) {
        self.budget.give(std::mem::take(&mut self.bytes));
    }

    /// Bytes held.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl crate::request::Room for Hold {
    fn make(&mut self, bytes: usize) -> Result<(), String> {
        self.grow(bytes).map_err(|spent| spent.to_string())
    }

    fn fits(&self, bytes: usize) -> Result<(), String> {
        let used = self.budget.used.load(Ordering::Acquire);
        match used
            .checked_add(bytes)
            .is_some_and(|u| u <= self.budget.limit)
        {
            true => Ok(()),
            false => Err(Spent {
                wanted: bytes,
                limit: self.budget.limit,
            }
            .to_string()),
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_grow_within_the_budget_and_give_back_on_release_and_drop() {
        let budget = Budget::new(100);
        let mut a = Hold::new(&budget);
        let mut b = Hold::new(&budget);
        a.grow(60).unwrap();
        assert_eq!(
            b.grow(41),
            Err(Spent {
                wanted: 41,
                limit: 100
            })
        );
        // A refused growth takes nothing.
        assert_eq!((b.bytes(), budget.used()), (0, 60));
        b.grow(40).unwrap();
        assert_eq!(budget.used(), 100);
        assert!(a.grow(1).is_err());
        a.release();
        assert_eq!((a.bytes(), budget.used()), (0, 40));
        a.grow(30).unwrap();
        drop(b);
        assert_eq!(budget.used(), 30);
        drop(a);
        assert_eq!(budget.used(), 0);
        // Asking for more than could ever fit, or an overflowing amount, is refused.
        let mut c = Hold::new(&budget);
        assert!(c.grow(101).is_err());
        c.grow(1).unwrap();
        assert!(c.grow(usize::MAX).is_err());
        assert_eq!(budget.used(), 1);
    }

    #[test]
    fn the_refusal_names_the_flag() {
        let text = Spent {
            wanted: 5,
            limit: 10,
        }
        .to_string();
        assert!(
            text.contains("--max-buffered") && text.contains("10 bytes"),
            "{text}"
        );
    }
}
