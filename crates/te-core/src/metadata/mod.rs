//! Where segment descriptors come from: the [`Metadata`] trait, the P2P handshake (segment name
//! = `host:port` of the peer's control listener), and key-value services in Mooncake's layout
//! ([`store`]) through te-kv's clients: the HTTP metadata server ([`http`]), Redis ([`redis`])
//! and, with the `etcd` feature, etcd (`etcd`).
//!
//! Mooncake's connection strings are parsed by [`MetadataKind::parse`] and opened by [`open`].

#[cfg(feature = "etcd")]
pub use te_kv::etcd;
pub use te_kv::{http, redis};
pub mod store;

use std::time::Duration;

use crate::control::{self, frame::FrameType};
use crate::error::{Error, Result};
use crate::segment::SegmentDesc;

/// A fetched descriptor and where its owner's control listener is.
#[derive(Clone, Debug)]
pub struct FetchedSegment {
    /// Host of the owner's control listener.
    pub host: String,
    /// Port of the owner's control listener.
    pub rpc_port: u16,
    /// The validated descriptor.
    pub desc: SegmentDesc,
}

/// A source of segment descriptors.
pub trait Metadata: Send + Sync {
    /// Fetches and validates the descriptor of segment `name`.
    ///
    /// # Errors
    /// [`Error::Metadata`] / [`Error::Socket`] when unreachable, [`Error::MalformedMessage`] for
    /// a bad descriptor.
    fn fetch_segment(&self, name: &str) -> Result<FetchedSegment>;

    /// Publishes the local descriptor (P2P: nothing to do, the control listener serves it).
    ///
    /// # Errors
    /// The store refused it.
    fn publish_segment(&self, desc: &SegmentDesc) -> Result<()>;

    /// Publishes where segment `name`'s control listener is (stores only).
    ///
    /// # Errors
    /// The store refused it.
    fn publish_rpc(&self, _name: &str, _host: &str, _port: u16) -> Result<()> {
        Ok(())
    }

    /// Whether descriptors live in a shared service (which the engine keeps published) rather
    /// than with their owner.
    fn is_shared(&self) -> bool {
        false
    }

    /// Withdraws the local descriptor.
    ///
    /// # Errors
    /// The store refused it.
    fn remove_segment(&self, name: &str) -> Result<()>;

    /// Host and port of segment `name`'s control listener.
    ///
    /// # Errors
    /// The name cannot be resolved to a listener.
    fn rpc_address(&self, name: &str) -> Result<(String, u16)>;
}

/// The metadata backends named by Mooncake's connection strings.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetadataKind {
    /// `P2PHANDSHAKE`.
    P2p,
    /// `http://…` or `https://…` (the full URL).
    Http(String),
    /// `etcd://h1:2379,h2:2379` or a bare `host:port`.
    Etcd(String),
    /// `redis://host:port`.
    Redis(String),
}

impl MetadataKind {
    /// Parses a Mooncake metadata connection string.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty string or an unknown scheme.
    pub fn parse(conn: &str) -> Result<Self> {
        let conn = conn.trim();
        if conn.eq_ignore_ascii_case("P2PHANDSHAKE") {
            return Ok(MetadataKind::P2p);
        }
        match conn.split_once("://") {
            Some(("http" | "https", _)) => Ok(MetadataKind::Http(conn.to_string())),
            Some(("etcd", rest)) => Ok(MetadataKind::Etcd(rest.to_string())),
            Some(("redis", _)) => Ok(MetadataKind::Redis(conn.to_string())),
            Some((scheme, _)) => Err(Error::InvalidArgument(format!(
                "unknown metadata scheme {scheme:?} in {conn:?}"
            ))),
            None if conn.is_empty() => Err(Error::InvalidArgument(
                "empty metadata connection string".into(),
            )),
            None => Ok(MetadataKind::Etcd(conn.to_string())),
        }
    }
}

/// Opens the backend `conn` names (see [`MetadataKind::parse`]), with `config`'s limits, key
/// namespace and Redis credentials.
///
/// # Errors
/// [`Error::InvalidArgument`] for a bad connection string; [`Error::Metadata`] for etcd in a
/// build without the `etcd` feature, or a backend that cannot be set up.
pub fn open(conn: &str, config: &crate::Config) -> Result<std::sync::Arc<dyn Metadata>> {
    use std::sync::Arc;
    let timeout = config.handshake_connect_timeout;
    let max_len = config.handshake_max_length;
    let layout = store::KeyLayout::new(config.metadata_cluster_id.as_deref());
    let store: Box<dyn store::KvStore> = match MetadataKind::parse(conn)? {
        MetadataKind::P2p => {
            let key = config
                .cluster_secret
                .as_ref()
                .map(|s| control::auth::cluster_key(s.expose()))
                .transpose()?;
            let port = config.handshake_port;
            return Ok(Arc::new(P2pMetadata::new(timeout, max_len, key, port)));
        }
        MetadataKind::Http(url) => Box::new(
            http::HttpStore::new(&url, timeout, max_len)?.with_token(
                config
                    .metadata_token
                    .as_ref()
                    .map(|t| t.expose().to_string()),
            ),
        ),
        MetadataKind::Redis(url) => {
            let mut target = redis::RedisTarget::parse(&url)?;
            if let Some(user) = &config.redis_username {
                target.username = Some(user.clone());
            }
            if let Some(password) = &config.redis_password {
                target.password = Some(password.expose().to_string());
            }
            if let Some(db) = config.redis_db_index {
                target.db = db;
            }
            Box::new(redis::RedisStore::new(target, timeout, max_len))
        }
        #[cfg(feature = "etcd")]
        MetadataKind::Etcd(endpoints) => {
            Box::new(etcd::EtcdStore::new(&endpoints, timeout, max_len)?)
        }
        #[cfg(not(feature = "etcd"))]
        MetadataKind::Etcd(endpoints) => {
            return Err(Error::Metadata(format!(
                "etcd ({endpoints}) needs te-core's `etcd` feature (te-bench: --features etcd); this build speaks P2PHANDSHAKE, http:// and redis://"
            )));
        }
    };
    Ok(Arc::new(store::StoreMetadata::new(store, layout, max_len)))
}

/// The P2P handshake backend: descriptors come straight from the peer's control listener.
#[derive(Debug)]
pub struct P2pMetadata {
    connect_timeout: Duration,
    max_payload: usize,
    key: Option<control::auth::ClusterKey>,
    default_port: u16,
}

impl P2pMetadata {
    /// A backend using these limits for its control requests, authenticating with `key` when
    /// the cluster has a secret; a peer named without a port is at `default_port`
    /// (`MC_HANDSHAKE_PORT`).
    pub fn new(
        connect_timeout: Duration,
        max_payload: usize,
        key: Option<control::auth::ClusterKey>,
        default_port: u16,
    ) -> Self {
        P2pMetadata {
            connect_timeout,
            max_payload,
            key,
            default_port,
        }
    }
}

impl Metadata for P2pMetadata {
    fn fetch_segment(&self, name: &str) -> Result<FetchedSegment> {
        let (host, rpc_port) = self.rpc_address(name)?;
        let (reply, connection) = control::exchange(
            &host,
            rpc_port,
            FrameType::Metadata,
            b"{}",
            self.connect_timeout,
            self.max_payload,
            self.key.as_ref(),
        )
        .map_err(|e| match e {
            refused @ Error::PeerRefused { .. } => refused,
            e => Error::Metadata(format!("fetching segment {name}: {e}")),
        })?;
        // A Mooncake engine answers `null` while it has no descriptor (nothing registered yet).
        if reply.trim_ascii() == b"null" {
            return Err(Error::SegmentNotFound {
                segment: name.to_string(),
                service: format!("its owner at {host}:{rpc_port} (no memory registered yet?)"),
            });
        }
        let mut desc = SegmentDesc::from_json(&reply)?;
        // The segment is known by the name it was opened with.
        desc.name = name.to_string();
        desc.origin = crate::segment::Origin::served_over(&connection, &desc);
        drop(connection);
        Ok(FetchedSegment {
            host,
            rpc_port,
            desc,
        })
    }

    fn publish_segment(&self, _desc: &SegmentDesc) -> Result<()> {
        Ok(())
    }

    fn remove_segment(&self, _name: &str) -> Result<()> {
        Ok(())
    }

    fn rpc_address(&self, name: &str) -> Result<(String, u16)> {
        control::parse_segment_name(name.trim_start_matches('/'), self.default_port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings() {
        assert_eq!(
            MetadataKind::parse("P2PHANDSHAKE").unwrap(),
            MetadataKind::P2p
        );
        assert!(matches!(
            MetadataKind::parse("http://h:8080/metadata").unwrap(),
            MetadataKind::Http(_)
        ));
        assert!(matches!(
            MetadataKind::parse("redis://h:6379").unwrap(),
            MetadataKind::Redis(_)
        ));
        assert_eq!(
            MetadataKind::parse("etcd://a:1,b:2").unwrap(),
            MetadataKind::Etcd("a:1,b:2".into())
        );
        assert_eq!(
            MetadataKind::parse("h:2379").unwrap(),
            MetadataKind::Etcd("h:2379".into())
        );
        assert!(MetadataKind::parse("ftp://x").is_err());
        assert!(MetadataKind::parse("").is_err());
    }
}
