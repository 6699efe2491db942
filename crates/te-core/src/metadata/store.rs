//! Descriptors kept in a key-value service (the HTTP metadata server, Redis, etcd), laid out as
//! Mooncake lays them out, so te and Mooncake tools read the same keys:
//!
//! - `mooncake/[<MC_METADATA_CLUSTER_ID>/]ram/<segment>`: the segment descriptor (JSON); a
//!   name that holds a `/` is used as the path after the prefix;
//! - `mooncake/[<cluster>/]rpc_meta/<segment>`: `{"ip_or_host_name": …, "rpc_port": …}`, where
//!   the owner's control listener is.
//!
//! [`KvStore`] is what a backend implements (get, put, delete of one key); [`StoreMetadata`]
//! turns it into [`Metadata`]. Values read back are validated like any bytes from the network.

use serde::{Deserialize, Serialize};

use super::{FetchedSegment, Metadata};
use crate::error::{Error, Result};
use crate::segment::SegmentDesc;

pub use te_kv::KvStore;

/// Mooncake's key names, under an optional cluster id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: String,
}

impl KeyLayout {
    /// `mooncake/`, or `mooncake/<cluster_id>/` (`MC_METADATA_CLUSTER_ID`).
    pub fn new(cluster_id: Option<&str>) -> Self {
        let prefix = match cluster_id.map(str::trim).filter(|c| !c.is_empty()) {
            Some(c) => format!("mooncake/{}/", c.trim_end_matches('/')),
            None => "mooncake/".to_string(),
        };
        KeyLayout { prefix }
    }

    /// The descriptor key of segment `name`.
    pub fn segment_key(&self, name: &str) -> String {
        match name.contains('/') {
            true => format!("{}{name}", self.prefix),
            false => format!("{}ram/{name}", self.prefix),
        }
    }

    /// The key of segment `name`'s control-listener address.
    pub fn rpc_key(&self, name: &str) -> String {
        format!("{}rpc_meta/{name}", self.prefix)
    }
}

/// Mooncake's `rpc_meta` value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcMeta {
    /// Host or address of the control listener.
    pub ip_or_host_name: String,
    /// Its port.
    pub rpc_port: u16,
}

/// [`Metadata`] over a [`KvStore`].
pub struct StoreMetadata {
    store: Box<dyn KvStore>,
    layout: KeyLayout,
    max_len: usize,
}

impl std::fmt::Debug for StoreMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreMetadata")
            .field("store", &self.store.describe())
            .field("layout", &self.layout)
            .finish()
    }
}

impl StoreMetadata {
    /// Descriptors in `store` under `layout`; values longer than `max_len` are refused.
    pub fn new(store: Box<dyn KvStore>, layout: KeyLayout, max_len: usize) -> Self {
        StoreMetadata {
            store,
            layout,
            max_len,
        }
    }

    fn read(&self, key: &str, what: &str, name: &str) -> Result<Vec<u8>> {
        let value = self.store.get(key)?.ok_or_else(|| Error::SegmentNotFound {
            segment: name.to_string(),
            service: format!("{} ({what} key {key})", self.store.describe()),
        })?;
        if value.len() > self.max_len {
            return Err(Error::MalformedMessage(format!(
                "{key}: {} bytes exceed the limit of {}",
                value.len(),
                self.max_len
            )));
        }
        Ok(value)
    }
}

impl Metadata for StoreMetadata {
    fn fetch_segment(&self, name: &str) -> Result<FetchedSegment> {
        let key = self.layout.segment_key(name);
        let desc = SegmentDesc::from_json(&self.read(&key, "descriptor", name)?)
            .map_err(|e| Error::MalformedMessage(format!("{key}: {e}")))?;
        let (host, rpc_port) = self.rpc_address(name)?;
        Ok(FetchedSegment {
            host,
            rpc_port,
            desc,
        })
    }

    fn publish_segment(&self, desc: &SegmentDesc) -> Result<()> {
        Ok(self.store.put(
            &self.layout.segment_key(&desc.name),
            desc.to_json().as_bytes(),
        )?)
    }

    fn publish_rpc(&self, name: &str, host: &str, port: u16) -> Result<()> {
        let meta = RpcMeta {
            ip_or_host_name: host.to_string(),
            rpc_port: port,
        };
        let json = serde_json::to_vec(&meta).map_err(|e| Error::Metadata(e.to_string()))?;
        let key = self.layout.rpc_key(name);
        let refused = match self.store.put(&key, &json) {
            Ok(()) => return Ok(()),
            Err(e) => Error::from(e),
        };
        // Mooncake's HTTP metadata server never replaces an `rpc_meta` entry ("Duplicate
        // rpc_meta key not allowed"), so every re-publication is refused: an entry that already
        // names this engine's listener is published all the same.
        match self.store.get(&key) {
            Ok(Some(held)) => match serde_json::from_slice::<RpcMeta>(&held) {
                Ok(held) if held == meta => Ok(()),
                Ok(held) => Err(Error::Metadata(format!(
                    "{key} names {}:{}, not this engine's {host}:{port}, and the service refused \
                     to replace it ({refused}): another engine is named {name:?}, or one that \
                     stopped without removing its entry was; delete the key or choose another \
                     name",
                    held.ip_or_host_name, held.rpc_port
                ))),
                Err(_) => Err(refused),
            },
            _ => Err(refused),
        }
    }

    fn remove_segment(&self, name: &str) -> Result<()> {
        self.store.delete(&self.layout.segment_key(name))?;
        Ok(self.store.delete(&self.layout.rpc_key(name))?)
    }

    fn rpc_address(&self, name: &str) -> Result<(String, u16)> {
        let key = self.layout.rpc_key(name);
        let meta: RpcMeta = serde_json::from_slice(&self.read(&key, "rpc_meta entry", name)?)
            .map_err(|e| Error::MalformedMessage(format!("{key}: {e}")))?;
        if meta.ip_or_host_name.is_empty() || meta.rpc_port == 0 {
            return Err(Error::MalformedMessage(format!(
                "{key}: empty host or port 0"
            )));
        }
        Ok((meta.ip_or_host_name, meta.rpc_port))
    }

    fn is_shared(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_mooncake() {
        let plain = KeyLayout::new(None);
        assert_eq!(plain.segment_key("node01"), "mooncake/ram/node01");
        assert_eq!(plain.segment_key("nvmeof/disk1"), "mooncake/nvmeof/disk1");
        assert_eq!(plain.rpc_key("node01"), "mooncake/rpc_meta/node01");
        let cluster = KeyLayout::new(Some("prod-a/"));
        assert_eq!(cluster.segment_key("n"), "mooncake/prod-a/ram/n");
        assert_eq!(cluster.rpc_key("n"), "mooncake/prod-a/rpc_meta/n");
        assert_eq!(KeyLayout::new(Some("  ")), plain);
    }
}
