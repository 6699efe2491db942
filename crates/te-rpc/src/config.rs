//! How a communicator runs: its threads, timeouts, pool and message limit, and whom it trusts.
//! [`Config::from_lookup`] reads te's variables (the cluster secret and the Mooncake
//! allow-list the transfer listeners use too, and the RPC limit of its own).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use te_reactor::allow::AllowList;
use te_reactor::secret::ClusterKey;

use crate::error::{Error, Result};
use crate::wire::Limits;

use crate::settings::TE_RPC_MAX_MESSAGE;

/// Both sides' settings.
#[derive(Clone)]
pub struct Config {
    /// Server threads (Mooncake's `thread_count`; 0: the machine's cores, at most 8).
    pub threads: usize,
    /// A call's timeout, and how long a server waits for a started call's next bytes.
    pub timeout: Duration,
    /// Connections a client holds to one peer at most (Mooncake's `pool_size`).
    pub pool_size: usize,
    /// The largest payload sent or taken.
    pub max_message: u64,
    /// Connections a server holds.
    pub max_connections: usize,
    /// How long a server keeps a connection that sends nothing, and a client an unused one.
    pub idle_timeout: Duration,
    /// The cluster key: te peers prove it both ways.
    pub key: Option<ClusterKey>,
    /// Under a cluster key, the Mooncake peers admitted (and served by a client).
    pub mooncake_allow: Option<AllowList>,
}

/// A server's settings (the same type: both sides read one configuration).
pub type ServerConfig = Config;

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("threads", &self.threads)
            .field("timeout", &self.timeout)
            .field("pool_size", &self.pool_size)
            .field("max_message", &self.max_message)
            .field("cluster_secret", &self.key.is_some())
            .field("mooncake_allow", &self.mooncake_allow.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            threads: 0,
            timeout: Duration::from_secs(30),
            pool_size: 100,
            max_message: TE_RPC_MAX_MESSAGE.initial(),
            max_connections: 10_240,
            idle_timeout: Duration::from_secs(600),
            key: None,
            mooncake_allow: None,
        }
    }
}

impl Config {
    /// The defaults, with `MC_TE_CLUSTER_SECRET`, `MC_TE_MOONCAKE_ALLOW` and
    /// `MC_TE_RPC_MAX_MESSAGE` read through `get`.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the variable.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut c = Config::default();
        let value = |name: &str| {
            get(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if let Some(secret) = value("MC_TE_CLUSTER_SECRET") {
            let key = ClusterKey::from_secret(&secret)
                .map_err(|reason| Error::invalid("MC_TE_CLUSTER_SECRET", "<redacted>", reason))?;
            c.key = Some(key);
        }
        if let Some(allow) = value("MC_TE_MOONCAKE_ALLOW") {
            let list = AllowList::parse(&allow)
                .map_err(|reason| Error::invalid("MC_TE_MOONCAKE_ALLOW", &allow, reason))?;
            c.mooncake_allow = Some(list);
        }
        let env = te_sys::env::Env::new(&get);
        c.max_message = env.number_or_initial(&TE_RPC_MAX_MESSAGE)?;
        c.check()?;
        Ok(c)
    }

    /// The process's environment, as [`Config::from_lookup`] reads it.
    ///
    /// # Errors
    /// As [`Config::from_lookup`].
    pub fn from_env() -> Result<Self> {
        Config::from_lookup(te_sys::env::process)
    }

    /// Checks the values.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the value.
    pub fn check(&self) -> Result<()> {
        if self.max_message == 0 || self.max_message > u64::from(u32::MAX) {
            return Err(Error::invalid(
                TE_RPC_MAX_MESSAGE.name,
                self.max_message,
                "from 1 byte to 4 GiB - 1 (a frame's length is 32 bits)",
            ));
        }
        if self.timeout.is_zero() {
            return Err(Error::invalid("timeout_seconds", 0, "at least 1 second"));
        }
        if self.threads > 256 {
            return Err(Error::invalid("thread_count", self.threads, "at most 256"));
        }
        if self.pool_size == 0 || self.pool_size > 65_536 {
            return Err(Error::invalid(
                "pool_size",
                self.pool_size,
                "from 1 to 65,536",
            ));
        }
        Ok(())
    }

    /// The server threads to run.
    pub fn server_threads(&self) -> usize {
        if self.threads == 0 {
            std::thread::available_parallelism()
                .map_or(2, std::num::NonZero::get)
                .clamp(1, 8)
        } else {
            self.threads
        }
    }

    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_message: self.max_message,
        }
    }
}

/// The address `target` (`host:port`) names; a host name resolves to its first address.
///
/// # Errors
/// [`Error::Invalid`] when it does not parse or resolve.
pub fn resolve(target: &str) -> Result<SocketAddr> {
    if let Ok(a) = target.parse() {
        return Ok(a);
    }
    if !target.contains(':') {
        return Err(Error::invalid("address", target, "expected host:port"));
    }
    target
        .to_socket_addrs()
        .map_err(|e| Error::invalid("address", target, e.to_string()))?
        .next()
        .ok_or_else(|| Error::invalid("address", target, "resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_are_read_and_bad_values_named() {
        let table = [
            ("MC_TE_RPC_MAX_MESSAGE", "64M"),
            ("MC_TE_MOONCAKE_ALLOW", "127.0.0.0/8"),
        ];
        let c = Config::from_lookup(te_sys::env::table(&table)).unwrap();
        assert_eq!(c.max_message, 64 << 20);
        assert!(c.mooncake_allow.is_some());
        for (name, value) in [
            ("MC_TE_RPC_MAX_MESSAGE", "0"),
            ("MC_TE_RPC_MAX_MESSAGE", "8G"),
            ("MC_TE_RPC_MAX_MESSAGE", "lots"),
            ("MC_TE_MOONCAKE_ALLOW", "10.0.0.0/40"),
            ("MC_TE_CLUSTER_SECRET", "short"),
        ] {
            let t = [(name, value)];
            let e = Config::from_lookup(te_sys::env::table(&t)).unwrap_err();
            assert!(e.to_string().contains(name), "{e}");
        }
    }

    #[test]
    fn addresses_resolve_or_are_named() {
        assert_eq!(resolve("127.0.0.1:80").unwrap().port(), 80);
        assert_eq!(resolve("localhost:81").unwrap().port(), 81);
        assert!(
            resolve("nohost")
                .unwrap_err()
                .to_string()
                .contains("host:port")
        );
    }
}
