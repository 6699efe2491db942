//! Which TCP congestion control te's data connections use: the policy
//! (`MC_TE_TCP_CONGESTION`) and its choice for one connection. Setting it on a socket is
//! [`te_sys::set_tcp_congestion`]'s; the transports apply the choice to the connections
//! they make and accept. Connections that carry no bulk data (control, metadata) keep the
//! host's default.
//!
//! Why: between two addresses of one host there is no network to share, yet a host whose
//! default is BBR (without the `fq` queueing discipline) paces every connection with a timer
//! per burst, and on a VM each timer costs an exit (`docs/tuning.md`). So by default
//! ([`Congestion::Auto`])
//! te's same-host connections use [`SAME_HOST`] (reno: built into every Linux kernel and
//! allowed to unprivileged processes), and every other connection keeps the host's choice,
//! which its operator made for the network.
//!
//! Not here: the other ends of connections te does not own (a Mooncake target sends with its
//! host's default).

use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use te_sys::env::invalid;

use crate::error::{Error, Result};

/// The algorithm same-host connections use under [`Congestion::Auto`].
pub const SAME_HOST: &str = "reno";

/// Longest algorithm name the kernel takes (`TCP_CA_NAME_MAX` less its terminating NUL).
const NAME_MAX: usize = 15;

/// The congestion-control policy of te's data connections.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Congestion {
    /// Same-host connections (to a loopback address, or between one address and itself) use
    /// [`SAME_HOST`]; the others keep the host's default (`auto`, the default).
    #[default]
    Auto,
    /// Every connection keeps the host's default (`net.ipv4.tcp_congestion_control`) (`host`).
    Host,
    /// Every data connection uses this algorithm (a name such as `cubic`, `bbr` or `reno`; it
    /// must be available, and allowed when the process is unprivileged).
    Named(String),
}

impl Congestion {
    /// Reads a value of `MC_TE_TCP_CONGESTION`: `auto`, `host`, or an algorithm's name.
    ///
    /// # Errors
    /// [`Error::Sys`] naming the variable when the value is none of these.
    pub fn parse(value: &str) -> Result<Self> {
        let v = value.trim();
        let refuse = |reason: &str| Error::from(invalid("MC_TE_TCP_CONGESTION", value, reason));
        match v.to_ascii_lowercase().as_str() {
            "auto" => Ok(Congestion::Auto),
            "host" => Ok(Congestion::Host),
            _ if v.is_empty() || v.len() > NAME_MAX => Err(refuse(
                "must be auto, host or an algorithm's name of 1 to 15 characters",
            )),
            _ if !v
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
            {
                Err(refuse(
                    "an algorithm's name has only letters, digits, '_' and '-'",
                ))
            }
            _ => Ok(Congestion::Named(v.to_string())),
        }
    }

    /// The algorithm a connection to `peer` gets, or `None` to keep the host's. `local` gives
    /// the connection's local address (`None`: unknown); it is asked only when the answer
    /// depends on it (`auto` with a peer that is not a loopback address), so callers pass a
    /// lookup, not its result.
    pub fn choose(&self, peer: IpAddr, local: impl FnOnce() -> Option<IpAddr>) -> Option<&str> {
        match self {
            Congestion::Auto => stays_on_host(peer, local).then_some(SAME_HOST),
            Congestion::Host => None,
            Congestion::Named(name) => Some(name),
        }
    }

    /// Sets the chosen algorithm on `sock`, a connection to `peer` whose local address `local`
    /// gives (see [`choose`](Self::choose)). A kernel that refuses (the algorithm is not
    /// available, or not allowed to this process) leaves the host's default; the first refusal
    /// is logged, later ones are not.
    pub fn apply(&self, sock: &impl AsRawFd, peer: IpAddr, local: impl FnOnce() -> Option<IpAddr>) {
        static WARNED: AtomicBool = AtomicBool::new(false);
        let Some(name) = self.choose(peer, local) else {
            return;
        };
        if let Err(e) = te_sys::set_tcp_congestion(sock, name) {
            if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    algorithm = name,
                    error = %e,
                    "MC_TE_TCP_CONGESTION: the kernel refused the algorithm; connections keep \
                     the host's default (see net.ipv4.tcp_available_congestion_control and \
                     tcp_allowed_congestion_control)"
                );
            }
        }
    }
}

/// Whether a connection between `local` and `peer` stays on this host: the peer is a loopback
/// address, or the same address as the local end (Linux routes that over loopback too).
pub fn same_host(local: IpAddr, peer: IpAddr) -> bool {
    let peer = peer.to_canonical();
    peer.is_loopback() || peer == local.to_canonical()
}

/// As [`same_host`], with the local address asked for (`local`, `None`: unknown) only when the
/// answer depends on it: a loopback peer stays on this host whatever the local end; with the
/// local end unknown, no other peer is taken to.
pub fn stays_on_host(peer: IpAddr, local: impl FnOnce() -> Option<IpAddr>) -> bool {
    peer.to_canonical().is_loopback() || local().is_some_and(|local| same_host(local, peer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// `policy`'s choice for a connection from `local` to `peer`.
    fn choice<'a>(policy: &'a Congestion, local: &str, peer: &str) -> Option<&'a str> {
        policy.choose(ip(peer), || Some(ip(local)))
    }

    #[test]
    fn values_are_read_and_bad_ones_refused() {
        assert_eq!(Congestion::parse("auto").unwrap(), Congestion::Auto);
        assert_eq!(Congestion::parse(" HOST ").unwrap(), Congestion::Host);
        assert_eq!(
            Congestion::parse("cubic").unwrap(),
            Congestion::Named("cubic".into())
        );
        for bad in [
            "",
            "  ",
            "a_name_far_too_long",
            "bbr;rm",
            "cu bic",
            "reno\0",
        ] {
            let e = Congestion::parse(bad).unwrap_err();
            assert!(
                e.to_string().contains("MC_TE_TCP_CONGESTION"),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn auto_picks_reno_only_for_connections_that_stay_on_the_host() {
        let auto = Congestion::Auto;
        assert_eq!(choice(&auto, "127.0.0.1", "127.0.0.1"), Some("reno"));
        assert_eq!(choice(&auto, "127.0.0.1", "127.0.0.2"), Some("reno"));
        assert_eq!(choice(&auto, "::1", "::1"), Some("reno"));
        assert_eq!(
            choice(&auto, "::ffff:127.0.0.1", "::ffff:127.0.0.1"),
            Some("reno")
        );
        assert_eq!(choice(&auto, "10.0.0.5", "10.0.0.5"), Some("reno"));
        assert_eq!(choice(&auto, "10.0.0.5", "10.0.0.6"), None);
        assert_eq!(choice(&auto, "198.18.0.1", "198.18.0.2"), None);
        assert_eq!(choice(&Congestion::Host, "::1", "::1"), None);
        let named = Congestion::Named("cubic".into());
        assert_eq!(choice(&named, "10.0.0.5", "10.0.0.6"), Some("cubic"));
        // An unknown local address: only a loopback peer is known to stay on the host.
        assert_eq!(auto.choose(ip("10.0.0.5"), || None), None);
        // The local address is looked up only when the answer depends on it.
        let never = || -> Option<IpAddr> { panic!("the local address was looked up") };
        assert_eq!(auto.choose(ip("127.0.0.1"), never), Some("reno"));
        assert_eq!(Congestion::Host.choose(ip("10.0.0.6"), never), None);
        assert_eq!(named.choose(ip("10.0.0.6"), never), Some("cubic"));
    }

    #[test]
    fn a_connection_on_loopback_gets_reno_and_an_unknown_algorithm_leaves_the_default() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (served, _) = listener.accept().unwrap();
        let before = te_sys::tcp_congestion(&served).unwrap();
        // Start the client on another algorithm than reno where the host has one, so the
        // check below sees a change (a host defaulting to reno would see none otherwise).
        let available =
            std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
                .unwrap_or_default();
        if let Some(other) = available.split_whitespace().find(|a| *a != SAME_HOST) {
            let _ = te_sys::set_tcp_congestion(&client, other);
        }
        let (local, peer) = (
            client.local_addr().unwrap().ip(),
            client.peer_addr().unwrap().ip(),
        );
        Congestion::Auto.apply(&client, peer, || Some(local));
        assert_eq!(te_sys::tcp_congestion(&client).unwrap(), "reno");
        Congestion::Named("no_such_cc".into()).apply(&served, peer, || Some(local));
        assert_eq!(te_sys::tcp_congestion(&served).unwrap(), before);
        Congestion::Host.apply(&served, peer, || Some(local));
        assert_eq!(te_sys::tcp_congestion(&served).unwrap(), before);
    }
}
