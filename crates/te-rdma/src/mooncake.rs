//! Mooncake engines over RDMA: answering their `HandShakeDesc` in kind, handshaking with
//! Mooncake targets in their dialect, and the priority matrix they read.
//!
//! Mooncake keeps one queue-pair set per (local device, peer NIC path), made by whichever side
//! handshakes first and used for both sides' requests; a new handshake from the same path
//! replaces it. te does the same for Mooncake peers: their sets live in the passive store under
//! [`key`], te's own slices to such a peer use them (always on lane 0, whose completion queues
//! the set reports to), and QPs start at PSN 0 on both sides, as Mooncake's. A handshake
//! without te's segment secret is admitted only under the Mooncake opt-in and its allow-list.
//! A Mooncake initiator named by its handshake listener's `ip:port` (P2PHANDSHAKE) is watched
//! by the sweep like a te initiator, so its sets go when it does ([`crate::liveness`]).

use std::sync::Arc;

use te_core::segment::{RemoteSegment, SegmentDesc};
use te_core::transport::SliceError;
use tracing::{info, warn};

use crate::handshake::{self, Handshake, MAX_QPS_PER_EP};
use crate::liveness::Listener;
use crate::verbs::{Endpoint, QpInfo};
use crate::{Group, State, Watch};

/// Where the QP set shared with a Mooncake peer is kept: by the peer's NIC path and the local
/// device (Mooncake's own key), in the passive store.
pub(crate) fn key(peer_nic_path: &str, nic: usize) -> String {
    format!("mooncake|{peer_nic_path}|{nic}")
}

/// `target`'s NIC path for its device `rdev` (`name@device`, as handshakes of both dialects
/// name it), if the descriptor lists that device.
pub(crate) fn nic_path(target: &RemoteSegment, rdev: usize) -> Option<String> {
    let dev = target.desc().devices.get(rdev)?;
    Some(format!("{}@{}", target.name(), dev.name))
}

/// The priority matrix Mooncake peers read: Mooncake picks a device by the place its name first
/// takes in the matrix and uses that place to index `devices[]` and each buffer's `rkey[]`, so
/// every location (of the engine's matrix and of every buffer) lists every device, in
/// `devices[]` order. NUMA preferences are lost for them; te peers map device names to
/// devices as well as interface names.
pub(crate) fn matrix(desc: &SegmentDesc, devices: &[String]) -> te_topology::PriorityMatrix {
    let locations: std::collections::BTreeSet<String> = desc
        .priority_matrix
        .iter()
        .flat_map(|m| m.0.keys().cloned())
        .chain(desc.buffers.iter().map(|b| b.name.clone()))
        .collect();
    te_topology::PriorityMatrix(
        locations
            .into_iter()
            .map(|l| (l, (devices.to_vec(), Vec::new())))
            .collect(),
    )
}

impl State {
    /// A Mooncake engine's handshake (no credential: the opt-in and its allow-list decide).
    /// As Mooncake does, one QP set serves a (local device, peer NIC path) both ways: a new
    /// handshake from that path replaces it, and te's own slices to that peer use it too.
    pub(crate) fn accept_mooncake(
        &self,
        req: Handshake,
        remote: &[QpInfo],
        peer: Option<std::net::SocketAddr>,
    ) -> Result<Vec<u8>, String> {
        if !peer.is_some_and(|p| self.config.mooncake.admits(p.ip())) {
            warn!(?peer, path = %req.local_nic_path, "RDMA handshake without te's secret refused");
            return Err("te: an RDMA handshake without te's segment secret needs \
                        MC_TE_MOONCAKE_COMPAT=1 on this engine and the peer in MC_TE_MOONCAKE_ALLOW"
                .into());
        }
        let dev = req
            .peer_nic_path
            .rsplit_once('@')
            .map(|(_, d)| d)
            .ok_or("handshake without a device")?;
        let nic = self
            .nics
            .iter()
            .position(|n| n.name == dev)
            .ok_or_else(|| format!("no device {dev} here"))?;
        let group = self.mooncake_group(nic, remote)?;
        let infos: Vec<QpInfo> = group.iter().map(|e| e.info()).collect();
        // Its name, when it is the `ip:port` of its handshake listener (P2PHANDSHAKE), lets the
        // sweep tell when it is gone; a guess until that listener answers.
        let name = req.local_nic_path.rsplit_once('@').map(|(n, _)| n);
        let watch = crate::liveness::control_address(name, peer, crate::is_local_ip)
            .map_or(Watch::Nobody, |a| Watch::At(a, Listener::Mooncake));
        self.keep_passive(key(&req.local_nic_path, nic), group, watch);
        info!(peer = %req.local_nic_path, device = dev, qps = infos.len(), "accepted a Mooncake RDMA endpoint");
        let reply = handshake::mooncake(req.peer_nic_path, req.local_nic_path, &infos);
        serde_json::to_vec(&reply).map_err(|e| e.to_string())
    }

    /// Queue pairs on device `nic` connected to a Mooncake peer's `remote` ones: lane 0, PSN 0
    /// on both sides, as Mooncake's own.
    fn mooncake_group(&self, nic: usize, remote: &[QpInfo]) -> Result<Group, String> {
        let mut group = Vec::with_capacity(remote.len());
        for r in remote {
            let ep = self.nics[nic].endpoint_with(0, Some(0))?;
            ep.connect(r)?;
            group.push(Arc::new(ep));
        }
        Ok(Arc::new(group))
    }

    /// The QP set Mooncake target `target`'s device `rdev` already shares with device `nic`
    /// (made by its handshake or ours), if any. Always on lane 0: one QP set per (device, peer
    /// path).
    pub(crate) fn mooncake_cached(
        &self,
        nic: usize,
        rdev: usize,
        target: &RemoteSegment,
    ) -> Option<Group> {
        let key = key(&nic_path(target, rdev)?, nic);
        self.passive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()
    }

    /// A new QP set to Mooncake target `target`'s device `rdev` from device `nic`, made by a
    /// handshake in Mooncake's dialect.
    pub(crate) fn mooncake_connect(
        &self,
        nic: usize,
        rdev: usize,
        target: &RemoteSegment,
    ) -> Result<Group, SliceError> {
        let remote_dev = &target.desc().devices[rdev].name;
        let peer_path = format!("{}@{remote_dev}", target.name());
        let key = key(&peer_path, nic);
        let count = (self.config.num_qp_per_ep as usize).clamp(1, MAX_QPS_PER_EP);
        let mine = (0..count)
            .map(|_| self.nics[nic].endpoint_with(0, Some(0)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(SliceError::LocalPath)?;
        let infos: Vec<QpInfo> = mine.iter().map(Endpoint::info).collect();
        let local_path = format!("{}@{}", self.local_name, self.nics[nic].name);
        let req = handshake::mooncake(local_path.clone(), peer_path.clone(), &infos);
        // Mooncake knows no cluster secret: its listener takes the handshake as it comes.
        let reply = self.handshake(target, &req, None)?;
        if !reply.reply_msg.is_empty() {
            return Err(SliceError::Path(format!(
                "RDMA handshake refused by {}: {}",
                target.name(),
                reply.reply_msg
            )));
        }
        if reply.local_nic_path != peer_path || reply.peer_nic_path != local_path {
            return Err(SliceError::Path(format!(
                "RDMA handshake reply from {} names other NIC paths",
                target.name()
            )));
        }
        let remote = handshake::mooncake_qps(&reply)
            .ok()
            .filter(|r| r.len() == mine.len())
            .ok_or_else(|| SliceError::Path("RDMA handshake reply: bad queue pairs".into()))?;
        for (ep, r) in mine.iter().zip(&remote) {
            ep.connect(r).map_err(SliceError::LocalPath)?;
        }
        let group: Group = Arc::new(mine.into_iter().map(Arc::new).collect());
        self.keep_passive(key, group.clone(), Watch::Unchanged);
        info!(target = target.name(), local = %self.nics[nic].name, remote = %remote_dev, qps = group.len(), "Mooncake RDMA endpoint connected");
        Ok(group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mooncake_peers_read_every_device_in_descriptor_order_at_every_location() {
        let mut desc: SegmentDesc = serde_json::from_str(
            r#"{"name":"h:1","protocol":"rdma","buffers":[{"name":"cpu:1","addr":4096,"length":4096}],"priority_matrix":{"cpu:0":[["eth1"],["eth0"]]}}"#,
        )
        .unwrap();
        desc.priority_matrix = Some(matrix(&desc, &["rxe0".to_string(), "rxe1".to_string()]));
        let m = desc.priority_matrix.unwrap();
        for location in ["cpu:0", "cpu:1"] {
            let (preferred, other) = m.entry(location).unwrap();
            assert_eq!(preferred, ["rxe0", "rxe1"], "{location}");
            assert!(other.is_empty());
        }
    }
}
