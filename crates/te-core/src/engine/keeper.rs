//! The metadata keeper, for engines whose descriptors live in a shared service (HTTP metadata
//! server, Redis): a thread that, every `MC_METADATA_REFRESH_SECS`,
//!
//! - publishes the local descriptor and `rpc_meta` entry again, so a service that restarted
//!   empty, or was unreachable when something changed, gets them back (logged once when it
//!   fails, and when it recovers);
//! - reads the descriptors of open segments again, at most `MC_TE_METADATA_REFRESH_BATCH` of
//!   them each time, in turn by name ([`Rotation`]), so an engine with a thousand peers puts
//!   no more load on the service than one with a batch of them (Mooncake's own polling, off by
//!   default, reads every one each time): a re-published one replaces the cached copy (its
//!   transports' connections are dropped), a removed one is marked stale so the next transfer
//!   fetches it and fails clearly; an unreachable service changes nothing, so transfers between
//!   open segments carry on. A peer that restarted is also caught without the keeper: a
//!   transfer it refuses or cannot be reached for marks its descriptor stale, to be fetched
//!   again before the next one.
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
    /// What a re-read descriptor must pass, as one being opened does.
    pub(crate) vetting: Arc<super::segments::Vetting>,
    /// Descriptors re-read per refresh, at most.
    pub(crate) refresh_batch: usize,
}

/// Which open segments a refresh re-reads: up to a batch of them, by name, starting after the
/// last one the previous refresh read and wrapping around, so every segment has its turn
/// however segments come and go between refreshes.
#[derive(Debug, Default)]
pub(crate) struct Rotation {
    /// The name read last.
    last: Option<String>,
}

impl Rotation {
    /// Up to `batch` of `items` (named by `name`), the next in turn.
    pub(crate) fn pick<T>(
        &mut self,
        mut items: Vec<T>,
        batch: usize,
        name: impl Fn(&T) -> &str,
    ) -> Vec<T> {
        if items.is_empty() || batch == 0 {
            return Vec::new();
        }
        items.sort_by(|a, b| name(a).cmp(name(b)));
        let start = match &self.last {
            Some(last) => items.partition_point(|i| name(i) <= last.as_str()),
            None => 0,
        };
        let len = items.len();
        items.rotate_left(start % len);
        items.truncate(batch.min(len));
        self.last = items.last().map(|i| name(i).to_string());
        items
    }
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
                let mut rotation = Rotation::default();
                loop {
                    match rx.recv_timeout(period) {
                        Err(RecvTimeoutError::Timeout) => {
                            republish(&ctx);
                            refresh(&ctx, &mut rotation);
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

/// `desc` without its publication time (and what changes with it), for comparing two
/// publications.
fn timeless(desc: &SegmentDesc) -> SegmentDesc {
    SegmentDesc {
        timestamp: None,
        te_signature: None,
        received: None,
        ..desc.clone()
    }
}

fn refresh(ctx: &KeeperCtx, rotation: &mut Rotation) {
    let open: Vec<_> = ctx
        .segments
        .all()
        .into_iter()
        .filter(|seg| !seg.desc().is_file())
        .collect();
    for seg in rotation.pick(open, ctx.refresh_batch, |seg| seg.name()) {
        let fetched = ctx.vetting.fetch(seg.name());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn refreshes_take_segments_in_turn_a_batch_at_a_time() {
        let mut r = Rotation::default();
        let all = names(&["e", "a", "d", "b", "c"]);
        let pick = |r: &mut Rotation, items: &[String], batch| {
            r.pick(items.to_vec(), batch, |s| s.as_str())
        };
        assert_eq!(pick(&mut r, &all, 2), names(&["a", "b"]));
        assert_eq!(pick(&mut r, &all, 2), names(&["c", "d"]));
        // Wraps around.
        assert_eq!(pick(&mut r, &all, 2), names(&["e", "a"]));
        // A batch larger than the segments takes each once.
        assert_eq!(pick(&mut r, &all, 9), names(&["b", "c", "d", "e", "a"]));
        assert_eq!(pick(&mut r, &[], 3), Vec::<String>::new());
    }

    #[test]
    fn segments_coming_and_going_do_not_lose_anyone_its_turn() {
        let mut r = Rotation::default();
        let pick =
            |r: &mut Rotation, items: &[&str], batch| r.pick(names(items), batch, |s| s.as_str());
        assert_eq!(pick(&mut r, &["a", "b", "c", "d"], 2), names(&["a", "b"]));
        // "b", the last read, is gone, and "bb" came: the turn goes on after "b".
        assert_eq!(pick(&mut r, &["a", "bb", "c", "d"], 2), names(&["bb", "c"]));
        assert_eq!(pick(&mut r, &["a", "bb", "c", "d"], 2), names(&["d", "a"]));
        // Over many refreshes each segment is read equally often.
        let all = ["p", "q", "r", "s", "t", "u", "v"];
        let mut count = std::collections::HashMap::new();
        for _ in 0..21 {
            for s in pick(&mut r, &all, 3) {
                *count.entry(s).or_insert(0) += 1;
            }
        }
        assert!(count.values().all(|&n| n == 9), "{count:?}");
    }
}
