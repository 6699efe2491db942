//! The keys the server holds, and their persistence.
//!
//! With a file, what persists is a snapshot, the file itself (a JSON object of strings), and a
//! log beside it, `<file>.log`, that takes each change as one line (`["put",key,value]` or
//! `["del",key]`). A change is appended to the log and synced before it is applied and
//! answered, so a restart or a crash loses nothing acknowledged, and a change costs its own
//! size, not the whole store's: a cluster's engines re-publishing their descriptors every few
//! seconds would otherwise rewrite every descriptor each time. Once the log outgrows the
//! snapshot (and [`MIN_COMPACT`]), the store is compacted: the whole map written to a
//! temporary file, synced and renamed over the snapshot (its directory synced), then the log
//! emptied. A crash between the two leaves a log whose changes the new snapshot already holds;
//! replaying them again gives the same keys.
//!
//! At start the snapshot is read and the log replayed. A last line cut short by a crash (its
//! change was never acknowledged) is dropped; any other line that is not a change stops the
//! start, naming the file and line. A PUT of the value already held, or a DELETE of a key not
//! there, writes nothing.
//!
//! The keys and values held are bounded by a limit (`--max-stored`): a PUT that would take the
//! store past it is refused with [`io::ErrorKind::StorageFull`] and changes nothing, so clients
//! filling the server cannot take its memory (a DELETE, or a PUT that makes a value no larger,
//! is always taken). Each key costs its bytes, its value's and [`ENTRY_COST`]. What a restart
//! reads back is taken whole, even past the limit: it was acknowledged.
//!
//! Not here: HTTP (`conn.rs`, `request.rs`).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tracing::warn;

/// The log is compacted once it holds more than this and more than the snapshot.
const MIN_COMPACT: u64 = 1 << 20;

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

/// The keys and where they persist. Changes are made one at a time under `log`'s lock, each
/// logged and synced before it is applied to `map`; readers take only `map`'s lock, so they
/// never wait on the disk and never see a change that is not yet durable.
pub(crate) struct Store {
    keys: Mutex<Keys>,
    log: Mutex<Option<Log>>,
    /// Bytes the keys may cost together ([`cost`]).
    limit: usize,
}

/// The persistence files of a store.
struct Log {
    /// The snapshot.
    snapshot: PathBuf,
    /// Its size when last written (or read).
    snapshot_bytes: u64,
    /// The log, open for appending.
    file: File,
    path: PathBuf,
    /// Bytes of whole changes in the log.
    bytes: u64,
    /// Why changes can no longer be logged, after a failed write could not be undone.
    broken: Option<String>,
}

/// One change, as the log holds it.
enum Change<'a> {
    Put(&'a str, &'a str),
    Delete(&'a str),
}

impl Change<'_> {
    fn line(&self) -> Vec<u8> {
        let mut line = match self {
            Change::Put(k, v) => serde_json::to_vec(&("put", k, v)),
            Change::Delete(k) => serde_json::to_vec(&("del", k)),
        }
        .unwrap_or_default();
        line.push(b'\n');
        line
    }

    fn apply(&self, map: &mut BTreeMap<String, String>) {
        match *self {
            Change::Put(k, v) => {
                map.insert(k.to_string(), v.to_string());
            }
            Change::Delete(k) => {
                map.remove(k);
            }
        }
    }

    /// Applies the change to `keys`, keeping their cost.
    fn apply_counted(&self, keys: &mut Keys) {
        let key = match *self {
            Change::Put(k, _) | Change::Delete(k) => k,
        };
        if let Some(old) = keys.map.get(key) {
            keys.bytes -= cost(key, old);
        }
        if let Change::Put(k, v) = *self {
            keys.bytes += cost(k, v);
        }
        self.apply(&mut keys.map);
    }
}

/// The log beside `snapshot`: its file name with `.log` added.
pub(crate) fn log_path(snapshot: &Path) -> PathBuf {
    let mut name = snapshot.as_os_str().to_owned();
    name.push(".log");
    PathBuf::from(name)
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Applies the whole lines of `bytes` (a log) to `map`; the length of those lines. A last line
/// without its line end is left out.
fn replay(path: &Path, bytes: &[u8], map: &mut BTreeMap<String, String>) -> io::Result<u64> {
    let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    for (n, line) in bytes[..whole].split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let bad = |why: String| {
            invalid(format!(
                "{}: line {}: not a change record{why}",
                path.display(),
                n + 1
            ))
        };
        let fields: Vec<String> =
            serde_json::from_slice(line).map_err(|e| bad(format!(": {e}")))?;
        let change = match fields.as_slice() {
            [op, k, v] if op == "put" => Change::Put(k, v),
            [op, k] if op == "del" => Change::Delete(k),
            _ => return Err(bad(String::new())),
        };
        change.apply(map);
    }
    Ok(whole as u64)
}

/// Syncs the directory holding `path`, so a file created or renamed in it stays.
fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

impl Log {
    /// Opens the snapshot and log at `snapshot`, reading what they hold into a map.
    fn open(snapshot: PathBuf) -> io::Result<(Log, BTreeMap<String, String>)> {
        let (mut map, snapshot_bytes) = match std::fs::read(&snapshot) {
            Ok(bytes) => {
                let map = serde_json::from_slice(&bytes).map_err(|e| {
                    invalid(format!(
                        "{}: not a JSON object of strings: {e}",
                        snapshot.display()
                    ))
                })?;
                (map, bytes.len() as u64)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => (BTreeMap::new(), 0),
            Err(e) => return Err(e),
        };
        let path = log_path(&snapshot);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => replay(&path, &bytes, &mut map)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        // A torn last line goes, so the next change starts a line of its own.
        file.set_len(bytes)?;
        file.sync_all()?;
        sync_dir(&path)?;
        let log = Log {
            snapshot,
            snapshot_bytes,
            file,
            path,
            bytes,
            broken: None,
        };
        Ok((log, map))
    }

    /// Appends `change` and syncs it. On failure the log is cut back to its last whole change;
    /// if even that fails, no further change is logged.
    fn append(&mut self, change: &Change) -> io::Result<()> {
        if let Some(why) = &self.broken {
            return Err(io::Error::other(why.clone()));
        }
        let line = change.line();
        let written = self
            .file
            .write_all(&line)
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            if let Err(undo) = self
                .file
                .set_len(self.bytes)
                .and_then(|()| self.file.sync_data())
            {
                let why = format!(
                    "{}: a failed write ({e}) could not be undone ({undo}); restart the server",
                    self.path.display()
                );
                warn!("{why}");
                self.broken = Some(why);
            }
            return Err(e);
        }
        self.bytes += line.len() as u64;
        Ok(())
    }

    fn due(&self) -> bool {
        self.bytes > MIN_COMPACT.max(self.snapshot_bytes)
    }

    /// Writes `map` as the new snapshot and empties the log.
    fn compact(&mut self, map: &BTreeMap<String, String>) -> io::Result<()> {
        let tmp = self.snapshot.with_extension("tmp");
        let json = serde_json::to_vec(map).map_err(io::Error::other)?;
        let mut f = File::create(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.snapshot)?;
        sync_dir(&self.snapshot)?;
        self.snapshot_bytes = json.len() as u64;
        self.file.set_len(0)?;
        self.file.sync_all()?;
        self.bytes = 0;
        Ok(())
    }
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
            log: Mutex::new(log),
            limit,
        })
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the keys cost together ([`cost`]).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.keys().bytes
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Option<Log>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The value of `key`.
    pub(crate) fn get(&self, key: &str) -> Option<String> {
        self.keys().map.get(key).cloned()
    }

    /// Sets `key` to `value`, logged and synced first when persisted; nothing changes if that
    /// fails.
    ///
    /// # Errors
    /// [`io::ErrorKind::StorageFull`] when the store would grow past its limit; the log's
    /// write or sync failing.
    pub(crate) fn put(&self, key: &str, value: &str) -> io::Result<()> {
        let mut log = self.writer();
        {
            let keys = self.keys();
            let old = keys.map.get(key);
            if old.is_some_and(|v| v == value) {
                return Ok(());
            }
            let (was, will) = (old.map_or(0, |v| cost(key, v)), cost(key, value));
            let after = keys.bytes - was + will;
            if will > was && after > self.limit {
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!(
                        "the store holds {} of its {} bytes (--max-stored) and this value would take it to {after}",
                        keys.bytes, self.limit
                    ),
                ));
            }
        }
        self.change(&mut log, Change::Put(key, value))
    }

    /// Removes `key`, logged and synced first when persisted; whether it was there.
    pub(crate) fn delete(&self, key: &str) -> io::Result<bool> {
        let mut log = self.writer();
        if !self.keys().map.contains_key(key) {
            return Ok(false);
        }
        self.change(&mut log, Change::Delete(key))?;
        Ok(true)
    }

    /// Logs `change` (if persisted), then applies it; `log` is the writer's lock, held.
    fn change(&self, log: &mut Option<Log>, change: Change) -> io::Result<()> {
        if let Some(log) = log.as_mut() {
            log.append(&change)?;
        }
        change.apply_counted(&mut self.keys());
        if let Some(log) = log.as_mut()
            && log.due()
        {
            // Written from a copy, so readers wait for the copy only, not for the disk.
            let map = self.keys().map.clone();
            if let Err(e) = log.compact(&map) {
                // The change is in the log, so it stays; the log is compacted at a later change.
                warn!(error = %e, snapshot = %log.snapshot.display(), "compacting the store failed");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
