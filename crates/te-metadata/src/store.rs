//! The keys the server holds, and their persistence: with a file, every change is written to a
//! temporary file beside it, synced and renamed over it before the change is answered, so a
//! restart (or a crash) loses nothing that was acknowledged.
//!
//! Not here: HTTP (`conn.rs`, `request.rs`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The keys and where they persist.
pub(crate) struct Store {
    pub(crate) map: Mutex<BTreeMap<String, String>>,
    persist: Option<PathBuf>,
}

impl Store {
    pub(crate) fn load(persist: Option<PathBuf>) -> std::io::Result<Store> {
        let map = match &persist {
            Some(p) if p.exists() => {
                let bytes = std::fs::read(p)?;
                serde_json::from_slice(&bytes).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: not a JSON object of strings: {e}", p.display()),
                    )
                })?
            }
            _ => BTreeMap::new(),
        };
        Ok(Store {
            map: Mutex::new(map),
            persist,
        })
    }

    /// Writes the map next to the file, syncs, and renames it over the file.
    fn save(path: &Path, map: &BTreeMap<String, String>) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        let json = serde_json::to_vec(map).map_err(std::io::Error::other)?;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }

    /// Applies `change` and persists it before returning; a failed save undoes nothing in
    /// memory but is reported, so the client learns the write is not durable.
    pub(crate) fn change<T>(
        &self,
        change: impl FnOnce(&mut BTreeMap<String, String>) -> T,
    ) -> std::io::Result<T> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let out = change(&mut map);
        if let Some(p) = &self.persist {
            Store::save(p, &map)?;
        }
        Ok(out)
    }
}
