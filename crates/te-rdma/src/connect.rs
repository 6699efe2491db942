//! Setting up an initiator's endpoints: the queue pairs from a local device's lane to a
//! remote device of a target, made on first use by the lane's worker and connected through
//! the control channel's `Connection` frame (te's handshake here, Mooncake's in
//! `mooncake.rs`).
//!
//! A set-up that fails pauses what it blames and is remembered ([`crate::refusals`]): the
//! slices behind it on the same attempt fail with its error at once instead of each making
//! queue pairs and dialling a peer that is gone.
//!
//! Not here: posting work requests and reading completions (`worker.rs`), or answering a
//! peer's handshake ([`State::accept`](crate::State)).

use std::sync::Arc;
use std::time::Instant;

use te_core::control;
use te_core::control::frame::FrameType;
use te_core::segment::RemoteSegment;
use te_core::transport::{Rejection, SliceError};
use tracing::{debug, info};

use crate::handshake::{Handshake, MAX_QPS_PER_EP, hex, request_proof};
use crate::verbs::{Endpoint, QpInfo};
use crate::{Group, State, mooncake};

impl State {
    /// The endpoint from device `nic`'s lane `lane` to remote device `rdev` of `target`,
    /// connecting on first use; `attempt` is the attempt of the slice that needs it.
    pub(crate) fn endpoint(
        &self,
        nic: usize,
        rdev: usize,
        lane: usize,
        target: &Arc<RemoteSegment>,
        attempt: u32,
    ) -> Result<Group, SliceError> {
        let mooncake = target.desc().is_mooncake();
        let cached = match mooncake {
            true => self.mooncake_cached(nic, rdev, target),
            false => self
                .endpoints
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&(target.id(), nic, rdev, lane))
                .cloned(),
        };
        if let Some(group) = cached {
            return Ok(group);
        }
        let key = (target.id(), nic, rdev);
        let now = Instant::now();
        if let Some(e) = self
            .refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .refused(key, target, attempt, now)
        {
            return Err(e);
        }
        let made = match mooncake {
            true => self.mooncake_connect(nic, rdev, target),
            false => self.connect(nic, rdev, lane, target),
        };
        match &made {
            Ok(_) => self
                .refusals
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear(key),
            Err(e) => {
                match e {
                    // The handshake failed: the remote device (or its owner) is suspect.
                    SliceError::Path(_) => self.pause_remote(target.id(), rdev),
                    // This device could not make or connect a QP (a port down, no route).
                    SliceError::LocalPath(_) => self.pause_local(nic),
                    _ => {}
                }
                self.refusals
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .record(key, target, attempt, e.clone(), now);
            }
        }
        made
    }

    /// Makes te's endpoint from device `nic`'s lane `lane` to remote device `rdev` of
    /// `target`: its queue pairs, the handshake (with its proof of the segment secret), the
    /// connect.
    fn connect(
        &self,
        nic: usize,
        rdev: usize,
        lane: usize,
        target: &RemoteSegment,
    ) -> Result<Group, SliceError> {
        if target.desc().te_wire_version < Some(2) {
            return Err(SliceError::Unsupported(format!(
                "segment {} speaks te's wire version {} (the segment secret in every handshake), \
                 which this te no longer sends: upgrade its engine",
                target.name(),
                target.desc().te_wire_version.unwrap_or(0)
            )));
        }
        let key = (target.id(), nic, rdev, lane);
        let remote_dev = &target.desc().devices[rdev].name;
        let count = (self.config.num_qp_per_ep as usize).clamp(1, MAX_QPS_PER_EP);
        let group = (0..count)
            .map(|_| self.nics[nic].endpoint_on(lane))
            .collect::<Result<Vec<_>, _>>()
            .map_err(SliceError::LocalPath)?;
        let infos: Vec<QpInfo> = group.iter().map(Endpoint::info).collect();
        let mut req = Handshake {
            local_nic_path: format!("{}@{}", self.local_name, self.nics[nic].name),
            peer_nic_path: format!("{}@{remote_dev}", target.name()),
            qp_num: infos.iter().map(|q| q.qp_num).collect(),
            reply_msg: String::new(),
            te_qps: infos,
            te_lane: lane as u32,
            te_control: Some(self.control_addr.to_string()),
            ..Handshake::default()
        };
        req.te_proof = Some(hex(&request_proof(&target.secret(), &req)));
        let reply = self.handshake(target, &req, self.control.cluster_key.as_deref())?;
        let remote = match (reply.reply_msg.is_empty(), reply.te_qps) {
            (true, qps) if qps.len() == group.len() => qps,
            _ if reply.reply_msg.contains("secret") => {
                return Err(SliceError::Rejected(Rejection::BadSecret));
            }
            _ => {
                return Err(SliceError::Path(format!(
                    "RDMA handshake refused: {}",
                    reply.reply_msg
                )));
            }
        };
        for (ep, r) in group.iter().zip(&remote) {
            // Connecting is local work (the route from this device, the QP's transitions): a
            // failure here blames this device.
            ep.connect(r).map_err(SliceError::LocalPath)?;
        }
        let group: Group = Arc::new(group.into_iter().map(Arc::new).collect());
        let evicted = self
            .endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, group.clone());
        // Slices in flight on an evicted endpoint keep its queue pairs until they complete.
        if !evicted.is_empty() {
            debug!(evicted = evicted.len(), "RDMA endpoints evicted");
        }
        info!(target = target.name(), local = %self.nics[nic].name, remote = %remote_dev, qps = group.len(), "RDMA endpoint connected");
        Ok(group)
    }

    /// Sends handshake `req` to `target`'s control listener (authenticated with `key` when
    /// given) and decodes the reply; connection and decoding failures are path errors.
    pub(crate) fn handshake(
        &self,
        target: &RemoteSegment,
        req: &Handshake,
        key: Option<&control::auth::ClusterKey>,
    ) -> Result<Handshake, SliceError> {
        let payload = serde_json::to_vec(req).map_err(|e| SliceError::Path(e.to_string()))?;
        let reply = control::request(
            target.host(),
            target.rpc_port(),
            FrameType::Connection,
            &payload,
            self.config.handshake_connect_timeout,
            self.config.handshake_max_length,
            key,
        )
        .map_err(|e| SliceError::Path(format!("RDMA handshake with {}: {e}", target.name())))?;
        serde_json::from_slice(&reply)
            .map_err(|e| SliceError::Path(format!("RDMA handshake reply: {e}")))
    }

    /// Drops the endpoint from device `nic`'s lane `lane` to `target`'s device `rdev` (its QPs
    /// are in error, or were refused): the next slice reconnects.
    pub(crate) fn forget(&self, target: &RemoteSegment, nic: usize, rdev: usize, lane: usize) {
        if target.desc().is_mooncake() {
            if let Some(path) = mooncake::nic_path(target, rdev) {
                let key = mooncake::key(&path, nic);
                self.passive
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&key);
            }
            return;
        }
        self.endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(target.id(), nic, rdev, lane));
    }
}
