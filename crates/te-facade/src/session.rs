//! Peers by segment name: the cache of opened segments (Mooncake's per-adaptor handle map), and
//! what a local name means peer to peer.

use std::collections::HashMap;
use std::sync::Mutex;

use te_core::{SegmentId, TransferEngine};

use crate::error::Result;

/// How the name of a file segment starts (`file:<canonical path>`).
pub(crate) const FILE_PREFIX: &str = "file:";

/// Segments opened by name. te-core caches descriptors too; this is the facade's policy on
/// top: the first use of a name opens it (the handshake), and a failed transfer forgets it so
/// that the next call fetches the peer's descriptor again (the peer may have restarted).
#[derive(Default)]
pub(crate) struct Sessions {
    open: Mutex<HashMap<String, SegmentId>>,
}

impl Sessions {
    /// The segment named `target`, opened now if it was not.
    pub(crate) fn open(&self, engine: &TransferEngine, target: &str) -> Result<SegmentId> {
        if let Some(id) = self.lock().get(target) {
            return Ok(*id);
        }
        // The handshake runs without the lock, so one slow peer holds up nobody else.
        let id = engine.open_segment(target)?;
        self.lock().insert(target.to_string(), id);
        Ok(id)
    }

    /// The peer named `target`, opened now if it was not: never a local file segment, whatever
    /// the name (a peer's name may come from anyone; te-core refuses such a name too, and this
    /// keeps it from matching a file the application opened).
    pub(crate) fn open_peer(&self, engine: &TransferEngine, target: &str) -> Result<SegmentId> {
        if target.trim_start_matches('/').starts_with(FILE_PREFIX) {
            return Err(te_core::Error::InvalidArgument(format!(
                "peer {target:?}: names starting with {FILE_PREFIX:?} are local file segments \
                 (open_file), never a peer's"
            ))
            .into());
        }
        self.open(engine, target)
    }

    /// Keeps `target` as segment `id` (a file segment, which no peer describes).
    pub(crate) fn insert(&self, target: &str, id: SegmentId) {
        self.lock().insert(target.to_string(), id);
    }

    /// Forgets `target` and closes its segment; the next use opens it afresh. A file segment
    /// stays: it has no peer that could have restarted.
    pub(crate) fn forget(&self, engine: &TransferEngine, target: &str) {
        if target.starts_with(FILE_PREFIX) {
            return;
        }
        if let Some(id) = self.lock().remove(target) {
            let _ = engine.close_segment(id);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SegmentId>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The host part of `local_hostname` for a P2P engine: Mooncake ignores any port there and
/// picks one (`"127.0.0.1:12345"` serves on a random port).
///
/// # Errors
/// An empty or malformed name.
pub(crate) fn p2p_host(local_hostname: &str) -> Result<String> {
    let name = local_hostname.trim();
    if name.is_empty() {
        return Err(te_core::Error::InvalidArgument("empty local_hostname".into()).into());
    }
    Ok(te_core::control::parse_segment_name(name, 0)?.0)
}

#[cfg(test)]
mod tests {
    use super::p2p_host;

    #[test]
    fn p2p_names_lose_their_port() {
        assert_eq!(p2p_host("127.0.0.1:12345").unwrap(), "127.0.0.1");
        assert_eq!(p2p_host("127.0.0.1").unwrap(), "127.0.0.1");
        assert_eq!(p2p_host("[::1]:80").unwrap(), "[::1]");
        assert_eq!(p2p_host("::1").unwrap(), "[::1]");
        assert_eq!(p2p_host(" localhost ").unwrap(), "localhost");
        assert_eq!(p2p_host("").unwrap_err().code(), -1);
        assert_eq!(p2p_host("host:notaport").unwrap_err().code(), -1);
    }
}
