//! Where a received descriptor provably came from ([`Origin`]). What a descriptor names on this
//! host (a process for cross-memory attach, a shared-memory file, a device range, a GPU handle)
//! is used only when the descriptor's owner is proven: the process that held the other end of
//! the very connection the descriptor was served on (never a name resolved again), or a
//! descriptor signed with the cluster key. Anything else is moved over the network, where the
//! target checks every request itself.

use std::net::TcpStream;

use super::{SegmentDesc, host_id, process_identity};

/// What proves who owns a received descriptor. Never published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Origin {
    /// Nothing: the descriptor's claims about this host are not used.
    #[default]
    Unproven,
    /// Process `pid` of this host, the one the descriptor names (`te_owner`, start time
    /// included), held the other end of the connection that served it.
    Served {
        /// The owner.
        pid: u32,
    },
    /// Signed with the cluster key (every holder of the cluster secret is trusted), naming
    /// process `pid` of this host, or (`None`) a process elsewhere.
    Signed {
        /// The owner, when it runs on this host now.
        pid: Option<u32>,
    },
}

impl Origin {
    /// The owner's pid on this host, when proven.
    pub fn pid(self) -> Option<u32> {
        match self {
            Origin::Served { pid } | Origin::Signed { pid: Some(pid) } => Some(pid),
            _ => None,
        }
    }

    /// The origin of `desc`, served over `stream` (still open): [`Origin::Served`] when the
    /// process `desc` names (pid and start time) runs on this host and holds the other end
    /// of `stream`, else [`Origin::Unproven`].
    pub fn served_over(stream: &TcpStream, desc: &SegmentDesc) -> Origin {
        let Some(pid) = named_process(desc) else {
            return Origin::Unproven;
        };
        if let Err(why) = te_sys::holder::holds_other_end(stream, pid) {
            tracing::debug!(segment = %desc.name, "{why}: its same-host claims are not used");
            return Origin::Unproven;
        }
        // The pid named the same process all along (no exit and reuse during the check).
        match named_process(desc) == Some(pid) {
            true => Origin::Served { pid },
            false => Origin::Unproven,
        }
    }

    /// The origin of `desc`, whose cluster signature was checked, for the engine whose own
    /// segment is `own_name`: the process it names on this host, if it runs now and is not
    /// this one (unless the segment is this engine's own).
    pub fn signed(desc: &SegmentDesc, own_name: &str) -> Origin {
        let pid =
            named_process(desc).filter(|&pid| pid != std::process::id() || desc.name == own_name);
        Origin::Signed { pid }
    }
}

/// The pid of the live process on this host that `desc` names (`te_owner`, start time
/// included, and this host's id), if any.
fn named_process(desc: &SegmentDesc) -> Option<u32> {
    if desc.te_host_id.as_deref() != Some(host_id()) {
        return None;
    }
    let owner = desc.te_owner.as_deref()?;
    let pid: u32 = owner.split(':').next()?.parse().ok()?;
    (process_identity(pid).as_deref() == Some(owner)).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(owner: Option<String>, host: &str) -> SegmentDesc {
        let mut d = SegmentDesc::from_json(
            br#"{"name":"h:1","protocol":"tcp","tcp_data_port":9,"buffers":[]}"#,
        )
        .unwrap();
        d.te_owner = owner;
        d.te_host_id = Some(host.to_string());
        d
    }

    #[test]
    fn the_process_at_the_other_end_is_the_origin_and_no_other() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let _served = listener.accept().unwrap();
        let me = process_identity(std::process::id());
        assert_eq!(
            Origin::served_over(&client, &desc(me.clone(), host_id())),
            Origin::Served {
                pid: std::process::id()
            }
        );
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let other = process_identity(child.id());
        assert_eq!(
            Origin::served_over(&client, &desc(other, host_id())),
            Origin::Unproven,
            "a process that does not hold the connection"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            Origin::served_over(&client, &desc(me.clone(), "another-host")),
            Origin::Unproven
        );
        assert_eq!(
            Origin::served_over(&client, &desc(None, host_id())),
            Origin::Unproven
        );
        let reused = format!("{}:1", std::process::id());
        assert_eq!(
            Origin::served_over(&client, &desc(Some(reused), host_id())),
            Origin::Unproven,
            "another start time: another process"
        );
    }

    #[test]
    fn a_signed_descriptor_names_this_process_only_for_its_own_segment() {
        let me = process_identity(std::process::id());
        let own = desc(me, host_id());
        assert_eq!(Origin::signed(&own, "h:1").pid(), Some(std::process::id()));
        assert_eq!(
            Origin::signed(&own, "other:2"),
            Origin::Signed { pid: None }
        );
        let elsewhere = desc(None, "another-host");
        assert_eq!(Origin::signed(&elsewhere, "x").pid(), None);
        assert_eq!(Origin::Unproven.pid(), None);
    }
}
