//! [`TcpSettings`]: what te-tcp's variables (`settings.rs`) say, read when the transport is
//! installed unless given.

use std::time::Duration;

use te_reactor::congestion::Congestion;
use te_sys::env::Env;

use crate::settings::{
    TCP_LANES_PER_PEER, TCP_STATUS_TIMEOUT_SEC, TE_MOONCAKE_THREADS, TE_TCP_CONGESTION,
};

/// te-tcp's settings: from the environment when the transport is installed, unless given with
/// [`TcpTransport::with_settings`](crate::TcpTransport::with_settings).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpSettings {
    /// Connections per peer (`MC_TCP_LANES_PER_PEER`).
    pub lanes_per_peer: usize,
    /// How long a connection may make no progress with requests out before it fails them
    /// (`MC_TCP_STATUS_TIMEOUT_SEC`).
    pub status_timeout: Duration,
    /// The congestion control of data connections (`MC_TE_TCP_CONGESTION`).
    pub congestion: Congestion,
    /// Event-loop threads of the Mooncake listener (`MC_TE_MOONCAKE_THREADS`).
    pub mooncake_threads: usize,
}

impl Default for TcpSettings {
    fn default() -> Self {
        TcpSettings {
            lanes_per_peer: TCP_LANES_PER_PEER.initial(),
            status_timeout: Duration::from_secs(TCP_STATUS_TIMEOUT_SEC.initial()),
            congestion: Congestion::Auto,
            mooncake_threads: TE_MOONCAKE_THREADS.initial(),
        }
    }
}

impl TcpSettings {
    /// The defaults overridden by the process environment.
    ///
    /// # Errors
    /// As [`from_lookup`](Self::from_lookup).
    pub fn from_env() -> te_core::Result<Self> {
        Self::from_lookup(&te_sys::env::process)
    }

    /// The defaults overridden by `lookup`.
    ///
    /// # Errors
    /// [`te_core::Error::InvalidConfig`] naming the first variable whose value is unusable.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> te_core::Result<Self> {
        let env = Env::new(lookup);
        let d = TcpSettings::default();
        Ok(TcpSettings {
            lanes_per_peer: env.number(&TCP_LANES_PER_PEER)?.unwrap_or(d.lanes_per_peer),
            status_timeout: env
                .number(&TCP_STATUS_TIMEOUT_SEC)?
                .map_or(d.status_timeout, Duration::from_secs),
            congestion: match env.text(&TE_TCP_CONGESTION) {
                Some(v) => Congestion::parse(&v)?,
                None => d.congestion,
            },
            mooncake_threads: env
                .number(&TE_MOONCAKE_THREADS)?
                .unwrap_or(d.mooncake_threads),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_from_their_variables_and_refusals_name_them() {
        let pairs = [
            ("MC_TCP_LANES_PER_PEER", "2"),
            ("MC_TCP_STATUS_TIMEOUT_SEC", "7"),
            ("MC_TE_TCP_CONGESTION", "host"),
        ];
        let s = TcpSettings::from_lookup(&te_sys::env::table(&pairs)).unwrap();
        assert_eq!(s.lanes_per_peer, 2);
        assert_eq!(s.status_timeout, Duration::from_secs(7));
        assert_eq!(s.congestion, Congestion::Host);
        assert_eq!(s.mooncake_threads, 2);
        for (name, bad) in [
            ("MC_TCP_LANES_PER_PEER", "0"),
            ("MC_TCP_STATUS_TIMEOUT_SEC", "x"),
            ("MC_TE_TCP_CONGESTION", "bbr; reno"),
            ("MC_TE_MOONCAKE_THREADS", "65"),
        ] {
            let lookup = |k: &str| (k == name).then(|| bad.to_string());
            match TcpSettings::from_lookup(&lookup) {
                Err(te_core::Error::InvalidConfig { name: n, .. }) => assert_eq!(n, name),
                other => panic!("{name}={bad}: {other:?}"),
            }
        }
    }
}
