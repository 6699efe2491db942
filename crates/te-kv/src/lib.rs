//! te-kv: clients of the key-value services Mooncake deployments keep segment descriptors in,
//! behind one trait ([`KvStore`]): Mooncake's HTTP metadata server ([`http`]), Redis
//! ([`redis`], RESP over TCP) and, with the `etcd` feature, etcd (`etcd`). Blocking calls,
//! each with a time limit; replies are bounded before they are read. What the keys hold
//! (segment descriptors, their layout) is te-core's.

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod http;
pub mod redis;

use std::io;

/// What a call to a key-value service can meet.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// An argument the client cannot use (a URL it does not speak).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The service could not be reached, or refused.
    #[error("metadata: {0}")]
    Metadata(String),
    /// The service's answer was not what its protocol allows.
    #[error("malformed message: {0}")]
    MalformedMessage(String),
    /// A socket operation failed.
    #[error("{context}: {source}")]
    Socket {
        /// What the client was doing.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Result alias of this crate.
pub type Result<T, E = KvError> = std::result::Result<T, E>;

impl From<te_reactor::Error> for KvError {
    fn from(e: te_reactor::Error) -> Self {
        match e {
            te_reactor::Error::Malformed(what) => KvError::MalformedMessage(what),
            te_reactor::Error::Socket { context, source } => KvError::Socket { context, source },
            other => KvError::MalformedMessage(other.to_string()),
        }
    }
}

impl KvError {
    pub(crate) fn socket(context: impl Into<String>, source: io::Error) -> Self {
        KvError::Socket {
            context: context.into(),
            source,
        }
    }

    /// This error, said as the wait it was when it is a socket read or write that ran out of
    /// `timeout` ([`te_reactor::waited`]). Any other error is returned as it is.
    pub(crate) fn timed_out_within(self, timeout: std::time::Duration) -> Self {
        match self {
            KvError::Socket { context, source } => {
                let (context, source) = te_reactor::waited(context, source, timeout);
                KvError::Socket { context, source }
            }
            other => other,
        }
    }
}

/// A key-value service holding descriptors.
pub trait KvStore: Send + Sync {
    /// The value of `key`, or `None` when absent.
    ///
    /// # Errors
    /// [`KvError::Metadata`] when the service cannot be reached or answers wrongly.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;

    /// Sets `key` to `value`.
    ///
    /// # Errors
    /// As [`get`](Self::get).
    fn put(&self, key: &str, value: &[u8]) -> Result<()>;

    /// Removes `key` (absent is fine).
    ///
    /// # Errors
    /// As [`get`](Self::get).
    fn delete(&self, key: &str) -> Result<()>;

    /// The service, for messages (`redis://host:port`).
    fn describe(&self) -> String;
}
