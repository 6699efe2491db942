//! How many connections the engine's servers take and with how many threads: the `MC_TE_*`
//! limits of the control listener, of the transports' data servers and of their initiator
//! loops, and the open-file limit they need.
//!
//! Servers are event driven: a fixed pool of threads serves every connection, so the thread
//! count does not grow with peers; what grows is file descriptors and a little memory per
//! connection. The defaults serve 10,000 connections per server on a machine whose open-file
//! limit allows it. [`raise_open_files`] lifts the process's soft limit to the hard limit (once,
//! at engine start) and says when even that is too low for the configured caps.
//!
//! Not here: what a connection speaks (the control channel, the transports).

use te_sys::env::invalid;

use crate::error::Result;
use tracing::{info, warn};

/// The servers' limits. Build with `ServerLimits::default()` or from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerLimits {
    /// Threads serving every data connection of a transport's server (`MC_TE_SERVER_THREADS`,
    /// 1–256; default: the machine's cores, at most 8).
    pub server_threads: usize,
    /// Data connections a transport's server holds at once; more are refused with a reason
    /// (`MC_TE_MAX_DATA_CONNECTIONS`, 1–1,048,576, default 10,240).
    pub max_data_connections: usize,
    /// Data connections one source (an IPv4 address, an IPv6 /64) may hold
    /// (`MC_TE_MAX_DATA_CONNECTIONS_PER_ADDRESS`, 0–1,048,576, default 1,024; 0: no cap of its
    /// own).
    pub max_data_connections_per_address: usize,
    /// Threads serving the control listener's connections (`MC_TE_CONTROL_THREADS`, 1–64,
    /// default 1).
    pub control_threads: usize,
    /// Control connections held at once (`MC_TE_MAX_CONTROL_CONNECTIONS`, 1–1,048,576,
    /// default 4,096: a control request holds its connection for one exchange).
    pub max_control_connections: usize,
    /// Control connections one source may hold (`MC_TE_MAX_CONTROL_CONNECTIONS_PER_ADDRESS`,
    /// 0–1,048,576, default 64; 0: no cap of its own).
    pub max_control_connections_per_address: usize,
    /// Whether loopback sources are held to the per-source caps (`MC_TE_CAP_LOOPBACK`, default
    /// on: a local stranger is a stranger; off for a host whose processes stand for many
    /// peers, as a benchmark's swarm does).
    pub cap_loopback: bool,
    /// Connections the kernel holds for each listener before they are accepted
    /// (`MC_TE_LISTEN_BACKLOG`, 1–65,535, default 4,096; Linux caps it at
    /// `net.core.somaxconn`). A thousand peers connecting at once overflow a small one: their
    /// SYNs are dropped and retried after one second, then three.
    pub listen_backlog: usize,
    /// Reply bytes a data connection gathers before it sends them (`MC_TE_CONN_REPLY_BYTES`,
    /// 64 B–1 MiB, default 4 KiB): the bound of its outgoing buffer between requests.
    pub conn_reply_bytes: usize,
    /// Threads driving every lane of a transport's initiator side (`MC_TE_CLIENT_THREADS`,
    /// 1–256; default: the machine's cores, at least 4 and at most 8: a lane's sends are
    /// kernel copies, and four lanes per peer move most when four threads can copy at once).
    pub client_threads: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        use crate::settings as S;
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        ServerLimits {
            server_threads: cores.clamp(1, 8),
            max_data_connections: S::TE_MAX_DATA_CONNECTIONS.initial(),
            max_data_connections_per_address: S::TE_MAX_DATA_CONNECTIONS_PER_ADDRESS.initial(),
            control_threads: S::TE_CONTROL_THREADS.initial(),
            max_control_connections: S::TE_MAX_CONTROL_CONNECTIONS.initial(),
            max_control_connections_per_address: S::TE_MAX_CONTROL_CONNECTIONS_PER_ADDRESS
                .initial(),
            cap_loopback: S::TE_CAP_LOOPBACK.on_by_default(),
            listen_backlog: S::TE_LISTEN_BACKLOG.initial(),
            conn_reply_bytes: S::TE_CONN_REPLY_BYTES.initial(),
            client_threads: cores.clamp(4, 8),
        }
    }
}

impl ServerLimits {
    /// Reads the limits through `get` (trimmed, non-empty values).
    ///
    /// # Errors
    /// [`Error::Sys`](crate::Error::Sys) naming the variable whose value is out of range.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let d = ServerLimits::default();
        let read = |s: &te_sys::env::Setting, default: usize| -> Result<usize> {
            match get(s.name) {
                None => Ok(default),
                Some(v) => Ok(s.number(&v)?),
            }
        };
        Ok(ServerLimits {
            server_threads: read(&crate::settings::TE_SERVER_THREADS, d.server_threads)?,
            max_data_connections: read(
                &crate::settings::TE_MAX_DATA_CONNECTIONS,
                d.max_data_connections,
            )?,
            max_data_connections_per_address: read(
                &crate::settings::TE_MAX_DATA_CONNECTIONS_PER_ADDRESS,
                d.max_data_connections_per_address,
            )?,
            control_threads: read(&crate::settings::TE_CONTROL_THREADS, d.control_threads)?,
            max_control_connections: read(
                &crate::settings::TE_MAX_CONTROL_CONNECTIONS,
                d.max_control_connections,
            )?,
            max_control_connections_per_address: read(
                &crate::settings::TE_MAX_CONTROL_CONNECTIONS_PER_ADDRESS,
                d.max_control_connections_per_address,
            )?,
            cap_loopback: match get(crate::settings::TE_CAP_LOOPBACK.name) {
                None => d.cap_loopback,
                Some(v) => te_sys::env::flag(crate::settings::TE_CAP_LOOPBACK.name, &v)?,
            },
            listen_backlog: read(&crate::settings::TE_LISTEN_BACKLOG, d.listen_backlog)?,
            conn_reply_bytes: read(&crate::settings::TE_CONN_REPLY_BYTES, d.conn_reply_bytes)?,
            client_threads: read(&crate::settings::TE_CLIENT_THREADS, d.client_threads)?,
        })
    }

    /// The per-address cap of a transport's data server.
    fn data_per_address(&self) -> crate::AddressCap {
        crate::AddressCap {
            max: self.max_data_connections_per_address,
            loopback: self.cap_loopback,
        }
    }

    /// The per-address cap of the control listener.
    fn control_per_address(&self) -> crate::AddressCap {
        crate::AddressCap {
            max: self.max_control_connections_per_address,
            loopback: self.cap_loopback,
        }
    }

    /// A data listener's settings (te's framing or Mooncake's): the data caps, `threads` loops
    /// dealing connections as `deal`, each connection under `congestion`.
    pub fn data_server(
        &self,
        threads: usize,
        deal: crate::Deal,
        congestion: &crate::congestion::Congestion,
    ) -> crate::ServerSettings {
        crate::ServerSettings {
            threads: threads.max(1),
            max_connections: self.max_data_connections,
            per_address: self.data_per_address(),
            deal,
            backlog: self.listen_backlog,
            congestion: congestion.clone(),
        }
    }

    /// The control listener's settings: the control caps; its frames are small, so nothing is
    /// paced and the host's congestion control stays.
    pub fn control_server(&self) -> crate::ServerSettings {
        crate::ServerSettings {
            threads: self.control_threads,
            max_connections: self.max_control_connections,
            per_address: self.control_per_address(),
            deal: crate::Deal::RoundRobin,
            backlog: self.listen_backlog,
            congestion: crate::congestion::Congestion::Host,
        }
    }

    /// File descriptors the servers may hold at their caps, plus a margin for everything else.
    pub fn open_files_wanted(&self) -> u64 {
        (self.max_data_connections + self.max_control_connections) as u64 + 1024
    }
}

/// The open-file limit after [`raise_open_files`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit before.
    pub before: u64,
    /// The soft limit now.
    pub now: u64,
    /// The hard limit (the most an unprivileged process may raise its soft limit to).
    pub hard: u64,
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit, and says so; warns when the
/// result is below `wanted` (the descriptors the configured caps could use), naming the limit
/// to raise or the settings (`caps`) to lower.
///
/// # Errors
/// [`Error::Sys`](crate::Error::Sys) naming `RLIMIT_NOFILE` when the limit cannot be read (one that
/// cannot be raised is only warned about).
pub fn raise_open_files(wanted: u64, caps: &str) -> Result<OpenFiles> {
    let (before, hard) = te_sys::nofile_limit()
        .map_err(|e| invalid("RLIMIT_NOFILE", "", format!("cannot be read: {e}")))?;
    let mut now = before;
    if before < hard {
        match te_sys::set_nofile_soft(hard) {
            Ok(()) => {
                now = hard;
                info!(
                    before,
                    now, "raised the open-file limit (RLIMIT_NOFILE) to its hard limit"
                );
            }
            Err(e) => warn!(before, hard, error = %e, "cannot raise the open-file limit"),
        }
    }
    if now < wanted {
        warn!(
            open_files = now,
            wanted,
            "the open-file limit is below what the connection caps allow ({caps}): \
             connections past it will be refused by the kernel; raise the hard limit \
             (ulimit -Hn, LimitNOFILE=) or lower the caps"
        );
    }
    Ok(OpenFiles { before, now, hard })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> Result<ServerLimits> {
        let map: HashMap<&str, &str> = pairs.iter().copied().collect();
        ServerLimits::from_lookup(|k| map.get(k).map(|v| v.to_string()))
    }

    #[test]
    fn defaults_serve_ten_thousand_connections() {
        let d = with(&[]).unwrap();
        assert_eq!(d, ServerLimits::default());
        assert!(d.max_data_connections >= 10_000);
        assert!(d.max_control_connections >= 1_024);
        assert!(d.listen_backlog >= 1_024);
        assert!((1..=8).contains(&d.server_threads));
        assert!(d.open_files_wanted() > d.max_data_connections as u64);
    }

    #[test]
    fn values_are_read_and_bounded() {
        let l = with(&[
            ("MC_TE_SERVER_THREADS", "3"),
            ("MC_TE_MAX_DATA_CONNECTIONS", "100"),
            ("MC_TE_CONTROL_THREADS", "2"),
            ("MC_TE_MAX_CONTROL_CONNECTIONS", " 50 "),
            ("MC_TE_CONN_REPLY_BYTES", "65536"),
            ("MC_TE_CLIENT_THREADS", "5"),
            ("MC_TE_LISTEN_BACKLOG", "512"),
        ])
        .unwrap();
        assert_eq!(
            (
                l.server_threads,
                l.max_data_connections,
                l.control_threads,
                l.max_control_connections,
                l.conn_reply_bytes,
                l.client_threads,
                l.listen_backlog,
            ),
            (3, 100, 2, 50, 65536, 5, 512)
        );
        assert!(l.cap_loopback, "loopback is capped unless told otherwise");
        assert!(l.data_per_address().loopback && l.control_per_address().loopback);
        let exempt = with(&[("MC_TE_CAP_LOOPBACK", "0")]).unwrap();
        assert!(!exempt.data_per_address().loopback);
        for (name, bad) in [
            ("MC_TE_SERVER_THREADS", "0"),
            ("MC_TE_SERVER_THREADS", "1000"),
            ("MC_TE_MAX_DATA_CONNECTIONS", "lots"),
            ("MC_TE_CONTROL_THREADS", "65"),
            ("MC_TE_MAX_CONTROL_CONNECTIONS", "0"),
            ("MC_TE_CONN_REPLY_BYTES", "8"),
            ("MC_TE_CLIENT_THREADS", "0"),
            ("MC_TE_LISTEN_BACKLOG", "0"),
            ("MC_TE_LISTEN_BACKLOG", "65536"),
            ("MC_TE_CAP_LOOPBACK", "maybe"),
        ] {
            match with(&[(name, bad)]) {
                Err(crate::Error::Sys(te_sys::Error::InvalidConfig { name: n, value, .. })) => {
                    assert_eq!((n.as_str(), value.as_str()), (name, bad));
                }
                other => panic!("{name}={bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_limit() {
        let files = raise_open_files(0, "no caps").unwrap();
        assert_eq!(files.now, files.hard);
        assert!(files.before <= files.now);
        assert_eq!(te_sys::nofile_limit().unwrap().0, files.hard);
    }
}
