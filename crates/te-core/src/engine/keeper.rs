//! The metadata keeper, for engines whose descriptors live in a shared service (HTTP metadata
//! server, Redis): a thread that, every `MC_METADATA_REFRESH_SECS`,
//!
//! - publishes the local descriptor and `rpc_meta` entry again, so a service that restarted
//!   empty, or was unreachable when something changed, gets them back (logged once when it
//!   fails, and when it recovers);
//! - reads the descriptors of open segments again: a re-published one replaces the cached copy
//!   (its transports' connections are dropped), a removed one is marked stale so the next
//!   transfer fetches it and fails clearly; an unreachable service changes nothing, so
//!   transfers between open segments carry on.
//!
//! P2P engines have no keeper: their descriptors live with their owners.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::completion::Core;
use crate::control::ControlState;
use crate::error::{Error, Result};
use crate::metadata::Metadata;
use crate::segment::{SegmentCache, SegmentDesc};

/// What the keeper works with.
pub(crate) struct KeeperCtx {
    pub(crate) metadata: Arc<dyn Metadata>,
    pub(crate) name: String,
    pub(crate) rpc: (String, u16),
    pub(crate) control_state: Arc<ControlState>,
    pub(crate) segments: Arc<SegmentCache>,
    pub(crate) core: Arc<Core>,
    /// Set when a publication failed and is owed.
    pub(crate) owed: Arc<AtomicBool>,
    /// Opens sealed segment secrets.
    pub(crate) cluster_key: Option<Arc<crate::control::auth::ClusterKey>>,
}

/// The running keeper; dropping it stops the thread.
pub(crate) struct Keeper {
    stop: Mutex<Option<mpsc::Sender<()>>>,
}

impl Keeper {
    pub(crate) fn start(ctx: KeeperCtx, period: Duration) -> Result<Keeper> {
        let (tx, rx) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("te-metadata-keeper".into())
            .spawn(move || {
                loop {
                    match rx.recv_timeout(period) {
                        Err(RecvTimeoutError::Timeout) => {
                            republish(&ctx);
                            refresh(&ctx);
                        }
                        _ => return,
                    }
                }
            })
            .map_err(|e| Error::socket("spawning the metadata keeper", e))?;
        Ok(Keeper {
            stop: Mutex::new(Some(tx)),
        })
    }

    pub(crate) fn stop(&self) {
        self.stop.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// Publishes the local descriptor and rpc entry.
pub(crate) fn publish_all(ctx: &KeeperCtx) -> Result<()> {
    let json = ctx
        .control_state
        .local_desc
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let desc = SegmentDesc::from_json(json.as_bytes())?;
    ctx.metadata.publish_segment(&desc)?;
    ctx.metadata.publish_rpc(&ctx.name, &ctx.rpc.0, ctx.rpc.1)
}

fn republish(ctx: &KeeperCtx) {
    match publish_all(ctx) {
        Ok(()) => {
            if ctx.owed.swap(false, Ordering::AcqRel) {
                info!(segment = %ctx.name, "descriptor re-published to the metadata service");
            }
        }
        Err(e) => {
            if !ctx.owed.swap(true, Ordering::AcqRel) {
                warn!(segment = %ctx.name, error = %e, "publishing to the metadata service failed; will retry");
            }
        }
    }
}

/// `desc` without its publication time, for comparing two publications.
fn timeless(desc: &SegmentDesc) -> SegmentDesc {
    SegmentDesc {
        timestamp: None,
        ..desc.clone()
    }
}

fn refresh(ctx: &KeeperCtx) {
    for seg in ctx.segments.all() {
        if seg.desc().is_file() {
            continue;
        }
        let fetched = ctx.metadata.fetch_segment(seg.name()).and_then(|mut f| {
            crate::control::auth::unseal(ctx.cluster_key.as_deref(), seg.name(), &mut f.desc)?;
            Ok(f)
        });
        match fetched {
            Ok(fetched) => {
                let changed = timeless(&fetched.desc) != timeless(seg.desc())
                    || fetched.host != seg.host()
                    || fetched.rpc_port != seg.rpc_port();
                if changed {
                    let name = seg.name().to_string();
                    ctx.segments
                        .insert(fetched.host, fetched.rpc_port, fetched.desc);
                    for t in ctx.core.transports() {
                        t.close_segment(&seg);
                    }
                    info!(segment = %name, "re-published descriptor picked up");
                }
            }
            Err(Error::SegmentNotFound { .. }) => {
                if !seg.is_stale() {
                    info!(
                        segment = seg.name(),
                        "descriptor removed from the metadata service"
                    );
                    seg.mark_stale();
                }
            }
            Err(e) => debug!(segment = seg.name(), error = %e, "refresh skipped"),
        }
    }
}
