//! te-tcp: the TCP transport.
//!
//! - Target side (`server`): a data listener on the engine's bind address; every request is
//!   checked (segment secret, bounds of one registered region, permission) before any byte of
//!   memory is touched, and a WRITE is acknowledged only once its bytes are in memory.
//! - Initiator side (`lane`): per peer, `MC_TCP_LANES_PER_PEER` persistent connections; slices
//!   go to the least-loaded lane and are pipelined; bytes move between the socket and registered
//!   memory with no copy of te's own.
//!
//! The wire format is te's own ([`wire`]), not Mooncake's: it carries the segment secret.
//! Not done here: several interfaces as rails, failover across rails (te-core's router).
//!
//! Unsafe code is confined to `sys` (the raw socket calls) and the two places that hand it
//! registered addresses (`lane`, `server`), each call with a `SAFETY:` comment.
#![deny(unsafe_code)]

mod error;
mod lane;
mod server;
mod sys;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use te_core::net::ServiceListener;
use te_core::segment::{RemoteSegment, SegmentDesc};
use te_core::transport::{CompletionSink, InstallContext, SliceError, SliceOp, Transport};
use tracing::info;

pub use error::Error;
use lane::{Lane, LaneSettings, PeerKey};
use server::TargetState;

/// Data connections a target serves at once.
const MAX_DATA_CONNECTIONS: usize = 4096;

struct Installed {
    sink: Arc<dyn CompletionSink>,
    settings: Arc<LaneSettings>,
    lanes_per_peer: usize,
    listener: ServiceListener,
}

/// The TCP transport. Create it, then hand it to `TransferEngine::install_transport`.
#[derive(Default)]
pub struct TcpTransport {
    installed: RwLock<Option<Installed>>,
    peers: Mutex<HashMap<PeerKey, Arc<Vec<Lane>>>>,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("port", &self.data_port())
            .finish()
    }
}

impl TcpTransport {
    /// A transport not yet installed.
    pub fn new() -> Self {
        Self::default()
    }

    /// The data listener's port, once installed.
    pub fn data_port(&self) -> Option<u16> {
        self.installed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|i| i.listener.local_addr().port())
    }

    fn lanes_for(&self, key: &PeerKey) -> Result<Arc<Vec<Lane>>, String> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lanes) = peers.get(key) {
            return Ok(lanes.clone());
        }
        let installed = self.installed.read().unwrap_or_else(|e| e.into_inner());
        let inst = installed.as_ref().ok_or("tcp transport is not installed")?;
        let lanes = (0..inst.lanes_per_peer)
            .map(|i| Lane::spawn(key.clone(), i, inst.settings.clone(), inst.sink.clone()))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| format!("starting lanes: {e}"))?;
        let lanes = Arc::new(lanes);
        peers.insert(key.clone(), lanes.clone());
        Ok(lanes)
    }

    fn fail(&self, op: SliceOp, reason: String) {
        let sink = self
            .installed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|i| i.sink.clone());
        if let Some(sink) = sink {
            sink.complete(op, Err(SliceError::Path(reason)));
        }
    }
}

fn peer_key(segment: &RemoteSegment) -> Result<PeerKey, String> {
    let port = segment
        .desc()
        .tcp_data_port
        .ok_or_else(|| format!("segment {} publishes no tcp_data_port", segment.name()))?;
    Ok(PeerKey {
        host: segment.host().to_string(),
        port,
    })
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        let err = |reason: String| te_core::Error::Transport {
            transport: "tcp",
            reason,
        };
        let listener = std::net::TcpListener::bind((ctx.bind_ip, 0))
            .map_err(|e| err(format!("binding the data listener on {}: {e}", ctx.bind_ip)))?;
        let state = Arc::new(TargetState {
            regions: ctx.regions.clone(),
            secret: ctx.secret,
            stall_timeout: ctx.config.tcp_status_timeout,
        });
        let handler: te_core::net::ConnectionHandler =
            Arc::new(move |stream| server::serve(&state, stream));
        let listener =
            ServiceListener::spawn(listener, "te-tcp-data", MAX_DATA_CONNECTIONS, handler)
                .map_err(|e| err(format!("starting the data listener: {e}")))?;
        info!(addr = %listener.local_addr(), segment = %ctx.local_name, "tcp transport installed");
        *self.installed.write().unwrap_or_else(|e| e.into_inner()) = Some(Installed {
            sink: ctx.sink,
            settings: Arc::new(LaneSettings {
                connect_timeout: ctx.config.handshake_connect_timeout,
                status_timeout: ctx.config.tcp_status_timeout,
            }),
            lanes_per_peer: ctx.config.tcp_lanes_per_peer,
            listener,
        });
        Ok(())
    }

    fn describe(&self, desc: &mut SegmentDesc) {
        desc.tcp_data_port = self.data_port();
    }

    fn post(&self, slices: Vec<SliceOp>) {
        let mut current: Option<(PeerKey, Arc<Vec<Lane>>)> = None;
        for op in slices {
            let key = match peer_key(&op.target) {
                Ok(k) => k,
                Err(reason) => {
                    self.fail(op, reason);
                    continue;
                }
            };
            if current.as_ref().is_none_or(|(k, _)| *k != key) {
                match self.lanes_for(&key) {
                    Ok(lanes) => current = Some((key, lanes)),
                    Err(reason) => {
                        self.fail(op, reason);
                        continue;
                    }
                }
            }
            let Some((_, lanes)) = current.as_ref() else {
                continue;
            };
            let lane = lanes
                .iter()
                .min_by_key(|l| l.queued_bytes())
                .unwrap_or(&lanes[0]);
            if let Err(op) = lane.push(op) {
                self.fail(op, "lane closed".into());
            }
        }
    }

    fn close_segment(&self, segment: &RemoteSegment) {
        if let Ok(key) = peer_key(segment) {
            if let Some(lanes) = self
                .peers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key)
            {
                lanes.iter().for_each(Lane::close);
            }
        }
    }

    fn shutdown(&self) {
        let peers = std::mem::take(&mut *self.peers.lock().unwrap_or_else(|e| e.into_inner()));
        for lanes in peers.values() {
            lanes.iter().for_each(Lane::close);
        }
        if let Some(mut inst) = self
            .installed
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            inst.listener.shutdown();
        }
    }
}
