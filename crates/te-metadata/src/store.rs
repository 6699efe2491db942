//! The keys the server holds, and their persistence.
//!
//! With a file, what persists is a snapshot, the file itself (a JSON object of strings), and a
//! log beside it, `<file>.log`, that takes each change as one line (`["put",key,value]` or
//! `["del",key]`, `log.rs`). A change is written to the log, then synced, then applied and
//! answered, so a restart or a crash loses nothing acknowledged, and a change costs its own
//! size, not the whole store's: a cluster's engines re-publishing their descriptors every few
//! seconds would otherwise rewrite every descriptor each time.
//!
//! Group commit: a change is submitted ([`Store::submit`]: checked and written to the log) and
//! its client waits on a [`Ticket`]; [`Store::settle`] syncs every change written so far with
//! one `fdatasync`, applies them in the order written, then fills their tickets. The server
//! settles once per event-loop turn, so the PUTs of all the connections a turn serves share
//! one sync. Until then a change is neither visible nor answered; a sync that fails cuts every
//! change it covered off the log and fails their tickets, changing nothing. Without a file a
//! change is applied at once.
//!
//! Once the log outgrows the snapshot (and [`log::MIN_COMPACT`]), the store is compacted: the whole
//! map written to a temporary file, synced and renamed over the snapshot (its directory
//! synced), then the log emptied. A crash between the two leaves a log whose changes the new
//! snapshot already holds; replaying them again gives the same keys.
//!
//! At start the snapshot is read and the log replayed. A last line cut short by a crash (its
//! change was never acknowledged) is dropped; any other line that is not a change stops the
//! start, naming the file and line. A PUT of the value already held (or about to be, by a
//! change waiting for its sync), or a DELETE of a key not there, writes nothing.
//!
//! The keys and values held are bounded by a limit (`--max-stored`): a PUT that would take the
//! store past it is refused with [`io::ErrorKind::StorageFull`] and changes nothing, so clients
//! filling the server cannot take its memory (a DELETE, or a PUT that makes a value no larger,
//! is always taken). Each key costs its bytes, its value's and [`ENTRY_COST`]. What a restart
//! reads back is taken whole, even past the limit: it was acknowledged.
//!
//! Not here: HTTP (`conn.rs`, `request.rs`).

mod log;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tracing::warn;

use log::{Change, Log};

/// What a key costs beyond its bytes and its value's, counted against the limit: the map's own
/// bookkeeping (two strings' headers and the tree's share), so that a flood of empty values is
/// bounded too.
pub(crate) const ENTRY_COST: usize = 64;

/// What `key` holding `value` costs against the limit.
fn cost(key: &str, value: &str) -> usize {
    key.len() + value.len() + ENTRY_COST
}

/// The keys, and what they cost together.
#[derive(Default)]
struct Keys {
    map: BTreeMap<String, String>,
    bytes: usize,
}

impl Keys {
    /// Applies `change`, keeping the cost.
    fn apply(&mut self, change: &Change) {
        let key = change.key();
        if let Some(old) = self.map.get(key) {
            self.bytes -= cost(key, old);
        }
        if let Change::Put(k, v) = change {
            self.bytes += cost(k, v);
        }
        change.apply(&mut self.map);
    }
}

/// What a submitted change's client waits on: filled once the change is durable and applied
/// (`Ok`), or known never to be (`Err`, why).
#[derive(Clone, Debug, Default)]
pub(crate) struct Ticket(Arc<OnceLock<Result<(), String>>>);

impl Ticket {
    /// The change's outcome, once settled.
    pub(crate) fn outcome(&self) -> Option<&Result<(), String>> {
        self.0.get()
    }

    fn fill(&self, outcome: Result<(), String>) {
        let _ = self.0.set(outcome);
    }
}

/// What became of a change submitted.
#[derive(Debug)]
pub(crate) enum Submitted {
    /// Applied (or already so): done.
    Done,
    /// A DELETE of a key not there: nothing to do.
    Absent,
    /// Written to the log: applied once settled.
    Waiting(Ticket),
}

/// A change written to the log, waiting for its sync.
struct Queued {
    change: Change,
    ticket: Ticket,
}

/// The writer's side: changes are submitted and settled one at a time under its lock.
struct Writer {
    log: Option<Log>,
    /// Changes written to the log and not yet synced, in the order written.
    queue: Vec<Queued>,
    /// For each key in `queue`, where its last change there is.
    latest: HashMap<String, usize>,
    /// What the keys will cost once `queue` is applied.
    projected: usize,
}

/// The keys and where they persist. Readers take only `keys`' lock, so they never wait on the
/// disk and never see a change that is not yet durable.
pub(crate) struct Store {
    keys: Mutex<Keys>,
    writer: Mutex<Writer>,
    /// Bytes the keys may cost together ([`cost`]).
    limit: usize,
}

impl Store {
    /// A store of at most `limit` bytes of keys ([`cost`]), persisted at `persist` if given,
    /// holding what was persisted there.
    ///
    /// # Errors
    /// The snapshot is not a JSON object of strings, a line of the log (other than a last one
    /// cut short) is not a change, or the files cannot be read, written or synced.
    pub(crate) fn load(persist: Option<PathBuf>, limit: usize) -> io::Result<Store> {
        let (map, log) = match persist {
            Some(p) => {
                let (log, map) = Log::open(p)?;
                (map, Some(log))
            }
            None => (BTreeMap::new(), None),
        };
        let bytes = map.iter().map(|(k, v)| cost(k, v)).sum();
        if bytes > limit {
            warn!(
                bytes,
                limit,
                "the persisted keys cost more than --max-stored: only changes that shrink the store are taken until it is back under"
            );
        }
        Ok(Store {
            keys: Mutex::new(Keys { map, bytes }),
            writer: Mutex::new(Writer {
                log,
                queue: Vec::new(),
                latest: HashMap::new(),
                projected: bytes,
            }),
            limit,
        })
    }

    fn keys(&self) -> MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many keys are held, and what they cost together ([`cost`]).
    pub(crate) fn size(&self) -> (usize, usize) {
        let keys = self.keys();
        (keys.map.len(), keys.bytes)
    }

    /// What the keys cost together ([`cost`]).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.keys().bytes
    }

    /// The value of `key`.
    #[cfg(test)]
    pub(crate) fn get(&self, key: &str) -> Option<String> {
        self.with_value(key, str::to_string)
    }

    /// What `f` makes of the value of `key`, `f` called while the keys are locked (so it can
    /// decide whether to copy the value before anything is copied).
    pub(crate) fn with_value<R>(&self, key: &str, f: impl FnOnce(&str) -> R) -> Option<R> {
        self.keys().map.get(key).map(|v| f(v))
    }

    /// Sets `key` to `value` (`Some`) or removes it (`None`): applied at once without a file,
    /// else written to the log and applied once [settled](Store::settle).
    ///
    /// # Errors
    /// [`io::ErrorKind::StorageFull`] when the store would grow past its limit; the log's write
    /// failing. Nothing changes.
    pub(crate) fn submit(&self, key: &str, value: Option<&str>) -> io::Result<Submitted> {
        let mut w = self.writer();
        let w = &mut *w;
        let mut keys = self.keys();
        let now = match w.latest.get(key) {
            Some(&i) => match &w.queue[i].change {
                Change::Put(_, v) => Some(v.as_str()),
                Change::Delete(_) => None,
            },
            None => keys.map.get(key).map(String::as_str),
        };
        let change = match (now, value) {
            (None, None) => return Ok(Submitted::Absent),
            (Some(old), Some(new)) if old == new => return Ok(Submitted::Done),
            (_, Some(new)) => Change::Put(key.to_string(), new.to_string()),
            (Some(_), None) => Change::Delete(key.to_string()),
        };
        let (was, will) = (
            now.map_or(0, |v| cost(key, v)),
            value.map_or(0, |v| cost(key, v)),
        );
        let after = w.projected - was + will;
        if will > was && after > self.limit {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "the store holds {} of its {} bytes (--max-stored) and this value would take it to {after}",
                    w.projected, self.limit
                ),
            ));
        }
        let Some(log) = w.log.as_mut() else {
            keys.apply(&change);
            w.projected = keys.bytes;
            return Ok(Submitted::Done);
        };
        drop(keys);
        log.write(&change)?;
        w.projected = after;
        w.latest.insert(key.to_string(), w.queue.len());
        let ticket = Ticket::default();
        w.queue.push(Queued {
            change,
            ticket: ticket.clone(),
        });
        Ok(Submitted::Waiting(ticket))
    }

    /// Makes every change submitted so far durable with one sync, applies them in order, and
    /// fills their tickets; if the sync fails, fails them, changing nothing. Every ticket
    /// handed out before the call is filled when it returns. Returns how long the sync took,
    /// when there was one.
    pub(crate) fn settle(&self) -> Option<std::time::Duration> {
        let mut w = self.writer();
        let w = &mut *w;
        if w.queue.is_empty() {
            return None;
        }
        let queue = std::mem::take(&mut w.queue);
        w.latest.clear();
        let log = w.log.as_mut()?;
        let started = std::time::Instant::now();
        let synced = log.sync();
        let took = started.elapsed();
        if let Err(e) = synced {
            warn!(error = %e, changes = queue.len(), "syncing the log failed; its changes were refused");
            w.projected = self.keys().bytes;
            let why = format!("not persisted, not applied: {e}");
            for q in queue {
                q.ticket.fill(Err(why.clone()));
            }
            return Some(took);
        }
        {
            let mut keys = self.keys();
            for q in &queue {
                keys.apply(&q.change);
            }
        }
        for q in queue {
            q.ticket.fill(Ok(()));
        }
        if log.due() {
            // Written from a copy, so readers wait for the copy only, not for the disk.
            let map = self.keys().map.clone();
            if let Err(e) = log.compact(&map) {
                // The changes are in the log, so they stay; it is compacted at a later change.
                warn!(error = %e, snapshot = %log.snapshot.display(), "compacting the store failed");
            }
        }
        Some(took)
    }

    /// Submits a change and settles it: done when it returns.
    #[cfg(test)]
    fn change_now(&self, key: &str, value: Option<&str>) -> io::Result<bool> {
        match self.submit(key, value)? {
            Submitted::Done => Ok(true),
            Submitted::Absent => Ok(false),
            Submitted::Waiting(ticket) => {
                self.settle();
                match ticket.outcome() {
                    Some(Ok(())) => Ok(true),
                    Some(Err(why)) => Err(io::Error::other(why.clone())),
                    None => Err(io::Error::other("a change was left unsettled")),
                }
            }
        }
    }

    /// Sets `key` to `value` and settles it.
    ///
    /// # Errors
    /// As [`Store::submit`], and the sync failing.
    #[cfg(test)]
    pub(crate) fn put(&self, key: &str, value: &str) -> io::Result<()> {
        self.change_now(key, Some(value)).map(drop)
    }

    /// Removes `key` and settles it; whether it was there.
    ///
    /// # Errors
    /// As [`Store::submit`], and the sync failing.
    #[cfg(test)]
    pub(crate) fn delete(&self, key: &str) -> io::Result<bool> {
        self.change_now(key, None)
    }
}

#[cfg(test)]
mod tests;
