//! The persistence files of a store: the snapshot (a JSON object of strings) and the log of
//! changes beside it (`<snapshot>.log`, one JSON line per change), read back at start and
//! written as changes come: a change is written first and made durable by a later
//! [`Log::sync`], which may cover many; a failed write or sync is cut back off the log.
//!
//! Not here: when changes are applied and answered (`store.rs`).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use tracing::warn;

/// The log is compacted once it holds more than this and more than the snapshot.
pub(crate) const MIN_COMPACT: u64 = 1 << 20;

/// One change, as the log holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    Put(String, String),
    Delete(String),
}

impl Change {
    /// The key changed.
    pub(crate) fn key(&self) -> &str {
        match self {
            Change::Put(k, _) | Change::Delete(k) => k,
        }
    }

    fn line(&self) -> Vec<u8> {
        let mut line = match self {
            Change::Put(k, v) => serde_json::to_vec(&("put", k, v)),
            Change::Delete(k) => serde_json::to_vec(&("del", k)),
        }
        .unwrap_or_default();
        line.push(b'\n');
        line
    }

    pub(crate) fn apply(&self, map: &mut BTreeMap<String, String>) {
        match self {
            Change::Put(k, v) => {
                map.insert(k.clone(), v.clone());
            }
            Change::Delete(k) => {
                map.remove(k);
            }
        }
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
        let change = match <[String; 3]>::try_from(fields) {
            Ok([op, k, v]) if op == "put" => Change::Put(k, v),
            Ok(_) => return Err(bad(String::new())),
            Err(fields) => match <[String; 2]>::try_from(fields) {
                Ok([op, k]) if op == "del" => Change::Delete(k),
                _ => return Err(bad(String::new())),
            },
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

/// The persistence files of a store.
pub(crate) struct Log {
    /// The snapshot.
    pub(crate) snapshot: PathBuf,
    /// Its size when last written (or read).
    snapshot_bytes: u64,
    /// The log, open for appending.
    pub(crate) file: File,
    path: PathBuf,
    /// Bytes of whole changes in the log, synced.
    bytes: u64,
    /// Bytes of whole changes in the log, synced or only written.
    written: u64,
    /// Why changes can no longer be logged, after a failed write could not be undone.
    broken: Option<String>,
    /// Makes the next sync fail, as a disk might.
    #[cfg(test)]
    pub(crate) fail_next_sync: bool,
}

impl Log {
    /// Opens the snapshot and log at `snapshot`, reading what they hold into a map.
    pub(crate) fn open(snapshot: PathBuf) -> io::Result<(Log, BTreeMap<String, String>)> {
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
            written: bytes,
            broken: None,
            #[cfg(test)]
            fail_next_sync: false,
        };
        Ok((log, map))
    }

    /// Writes `change` after those written before, not yet synced. On failure the log is cut
    /// back to the changes before it.
    pub(crate) fn write(&mut self, change: &Change) -> io::Result<()> {
        if let Some(why) = &self.broken {
            return Err(io::Error::other(why.clone()));
        }
        let line = change.line();
        if let Err(e) = self.file.write_all(&line) {
            self.cut(self.written, &e);
            return Err(e);
        }
        self.written += line.len() as u64;
        Ok(())
    }

    /// Makes every change written so far durable. On failure they are cut off the log, none of
    /// them durable.
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        let synced = self.file.sync_data();
        #[cfg(test)]
        let synced = match std::mem::take(&mut self.fail_next_sync) {
            true => Err(io::Error::other("injected sync failure")),
            false => synced,
        };
        match synced {
            Ok(()) => {
                self.bytes = self.written;
                Ok(())
            }
            Err(e) => {
                self.cut(self.bytes, &e);
                Err(e)
            }
        }
    }

    /// Cuts the log back to `len` bytes after `failure`; if even that fails, no further change
    /// is logged.
    fn cut(&mut self, len: u64, failure: &io::Error) {
        match self.file.set_len(len).and_then(|()| self.file.sync_data()) {
            Ok(()) => self.written = len,
            Err(undo) => {
                let why = format!(
                    "{}: a failed write ({failure}) could not be undone ({undo}); restart the server",
                    self.path.display()
                );
                warn!("{why}");
                self.broken = Some(why);
            }
        }
    }

    /// Whether the log has outgrown the snapshot.
    pub(crate) fn due(&self) -> bool {
        self.bytes > MIN_COMPACT.max(self.snapshot_bytes)
    }

    /// Writes `map` as the new snapshot and empties the log. Only with every change written
    /// also synced (and in `map`).
    pub(crate) fn compact(&mut self, map: &BTreeMap<String, String>) -> io::Result<()> {
        debug_assert_eq!(self.bytes, self.written, "compacting past unsynced changes");
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
        self.written = 0;
        Ok(())
    }
}
