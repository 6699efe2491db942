//! The engine's completion sink: what happens when a transport reports a slice.
//!
//! A path failure charges the slice's rail (pausing it after repeated errors) and, within
//! `MC_RETRY_CNT`, re-posts the slice on its next rail; anything else is recorded on the task,
//! which finishes when its last slice reports. A finished batch's notification is handed to the
//! notifier thread. No byte moves here.

use std::sync::mpsc;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use tracing::{debug, warn};

use crate::batch::PendingNotify;
use crate::error::{Error, Result};
use crate::health::RailHealth;
use crate::retry::RetryPolicy;
use crate::transport::{Capabilities, CompletionSink, Rejection, SliceError, SliceOp, Transport};

/// The part of the engine transports report to.
pub(crate) struct Core {
    pub(crate) clock: Arc<dyn crate::clock::Clock>,
    pub(crate) retry: RetryPolicy,
    pub(crate) health: std::sync::Mutex<RailHealth>,
    pub(crate) health_clean: std::sync::atomic::AtomicBool,
    pub(crate) transports: RwLock<Vec<Arc<dyn Transport>>>,
    /// Bumped whenever `transports` changes (under its write lock): a transport choice kept
    /// from an older epoch is not used ([`RemoteSegment::chosen`](crate::segment::RemoteSegment)).
    pub(crate) transports_epoch: std::sync::atomic::AtomicU64,
    pub(crate) notifier: std::sync::Mutex<Option<mpsc::Sender<PendingNotify>>>,
    /// What the engine did, counted while `metrics_on` is set.
    pub(crate) metrics: Arc<te_metrics::counters::Metrics>,
    pub(crate) metrics_on: std::sync::atomic::AtomicBool,
}

impl Core {
    /// Whether tasks submitted now are counted.
    pub(crate) fn metering(&self) -> bool {
        self.metrics_on.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn metered(&self) -> Option<&te_metrics::counters::Metrics> {
        self.metrics_on
            .load(std::sync::atomic::Ordering::Relaxed)
            .then_some(&*self.metrics)
    }

    /// Whether the rail may carry slices now (no lock while every rail is healthy).
    /// Whether the rail may carry a slice; `now` is asked for only when some rail is paused
    /// (with every rail healthy, as almost always, no clock is read).
    pub(crate) fn usable(
        &self,
        local: u16,
        segment: u64,
        remote: u16,
        now: impl FnOnce() -> Instant,
    ) -> bool {
        if self.health_clean.load(std::sync::atomic::Ordering::Acquire) {
            return true;
        }
        let h = self.health.lock().unwrap_or_else(|e| e.into_inner());
        h.usable((local, segment, remote), now())
    }

    /// Charges or clears the slice's rail. A path failure charges its (local, remote) pair; a
    /// local NIC failure charges the local rail towards every remote rail of the segment.
    fn record_rail(&self, slice: &SliceOp, outcome: &std::result::Result<(), SliceError>) {
        use std::sync::atomic::Ordering;
        // A target at its cap says nothing of the path, either way.
        if matches!(outcome, Err(SliceError::Busy(_))) {
            return;
        }
        let failed = matches!(outcome, Err(SliceError::Path(_) | SliceError::LocalPath(_)));
        if !failed && self.health_clean.load(Ordering::Acquire) {
            return;
        }
        let (seg, local) = (slice.target.id(), slice.local_rail);
        let remotes: Vec<u16> = match outcome {
            Err(SliceError::LocalPath(_)) => (0..slice.target.rail_names().len() as u16).collect(),
            _ => vec![slice.remote_rail],
        };
        let mut h = self.health.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.clock.now();
        for remote in remotes {
            let key = (local, seg, remote);
            if !failed {
                h.record_success(key);
            } else if h.record_error(key, now) {
                if let Some(m) = self.metered() {
                    m.rail_paused();
                }
                warn!(
                    local_rail = local,
                    segment = slice.target.name(),
                    remote_rail = remote,
                    "rail paused after repeated errors"
                );
            }
        }
        self.health_clean.store(h.is_clean(), Ordering::Release);
    }

    /// Moves a slice to its next rail before it is posted again.
    fn reroute(&self, slice: &mut SliceOp) {
        if let Some(route) = slice.token.route() {
            let now = std::cell::OnceCell::new();
            let seg = slice.target.id();
            let (l, r) = route.choose(slice.token.seq(), slice.token.attempt(), |l, r| {
                self.usable(l, seg, r, || *now.get_or_init(|| self.clock.now()))
            });
            slice.local_rail = l;
            slice.remote_rail = r;
        }
    }

    /// Changes the installed transports with `change`, and the epoch with them.
    pub(crate) fn change_transports<R>(
        &self,
        change: impl FnOnce(&mut Vec<Arc<dyn Transport>>) -> R,
    ) -> R {
        let mut list = self.transports.write().unwrap_or_else(|e| e.into_inner());
        let out = change(&mut list);
        self.transports_epoch
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        out
    }

    /// A snapshot of the installed transports (the lock is not held while they are called).
    pub(crate) fn transports(&self) -> Vec<Arc<dyn Transport>> {
        self.transports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The transport for buffer `index` of `seg`: one that serves it better (same-host shared
    /// memory), else the one speaking the segment's protocol.
    ///
    /// The choice is kept per buffer of the descriptor (`RemoteSegment::chosen`), for as long
    /// as the installed transports stay as they were.
    pub(crate) fn transport_for_buffer(
        &self,
        seg: &crate::segment::RemoteSegment,
        index: usize,
    ) -> Result<Arc<dyn Transport>> {
        // Read before the list: a choice made from a list newer than this epoch is kept under
        // the older epoch, and so never used.
        let epoch = self
            .transports_epoch
            .load(std::sync::atomic::Ordering::Acquire);
        seg.chosen(index, epoch, || {
            self.choose_transport(seg, &seg.desc().buffers[index])
        })
    }

    /// The choice for one buffer, said once (it is kept): which transport and why.
    fn choose_transport(
        &self,
        seg: &crate::segment::RemoteSegment,
        buffer: &crate::segment::BufferDesc,
    ) -> Result<Arc<dyn Transport>> {
        let (chosen, why) = self.pick_transport(seg, buffer)?;
        tracing::info!(
            segment = seg.name(),
            buffer = format_args!("{:#x}", buffer.addr),
            transport = chosen.name(),
            why,
            "transport chosen"
        );
        Ok(chosen)
    }

    fn pick_transport(
        &self,
        seg: &crate::segment::RemoteSegment,
        buffer: &crate::segment::BufferDesc,
    ) -> Result<(Arc<dyn Transport>, &'static str)> {
        if seg.desc().is_file() {
            return self
                .transports
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .find(|t| t.capabilities().contains(Capabilities::DRAM_FILE))
                .map(|t| (t.clone(), "a file segment"))
                .ok_or_else(|| {
                    Error::NotSupportedTransport(
                        "none installed moves file segments (install te-uring's)".into(),
                    )
                });
        }
        let better = self
            .transports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|t| t.serves(seg, buffer))
            .cloned();
        match better {
            Some(t) => Ok((t, "it serves this buffer directly (same host or device)")),
            None => Ok((
                self.transport_for(&seg.desc().protocol)?,
                "the protocol the segment publishes",
            )),
        }
    }

    pub(crate) fn transport_for(&self, protocol: &str) -> Result<Arc<dyn Transport>> {
        self.transports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|t| t.name() == protocol)
            .cloned()
            .ok_or_else(|| {
                Error::NotSupportedTransport(format!(
                    "no installed transport is named {protocol:?}"
                ))
            })
    }
}

impl CompletionSink for Core {
    fn complete_ok(&self, slice: SliceOp) {
        self.record_rail(&slice, &Ok(()));
        self.recorded(slice.token.record_ok(slice.len));
    }

    fn complete(&self, mut slice: SliceOp, outcome: std::result::Result<(), SliceError>) {
        self.record_rail(&slice, &outcome);
        let outcome = match outcome {
            Err(e) if e.is_retryable() && slice.is_canceled() => Err(SliceError::Canceled),
            Err(e) if self.retry.should_retry(slice.token.attempt(), &e) => {
                let transport = match slice.token.transport() {
                    Some(name) => self.transport_for(name),
                    None => self.transport_for(&slice.target.desc().protocol),
                };
                match transport {
                    Ok(t) => {
                        debug!(error = %e, attempt = slice.token.attempt(), ?slice, "retrying slice");
                        if let Some(m) = self.metered() {
                            let label = te_metrics::counters::TransportLabel::of(t.name());
                            m.slice_retried(label, slice.opcode.operation());
                        }
                        slice.token.next_attempt();
                        self.reroute(&mut slice);
                        t.post_one(slice);
                        return;
                    }
                    // Transports leave the engine only when it shuts down.
                    Err(_) => Err(SliceError::Path(format!(
                        "{e}; not retried: the engine shut down"
                    ))),
                }
            }
            other => other,
        };
        if let Err(e) = &outcome {
            debug!(error = %e, ?slice, "slice failed");
            // A refused secret means the peer restarted; a path that stays broken may mean the
            // same. Either way the descriptor is fetched again before the next transfer.
            // A file segment has no peer to ask again.
            if !slice.target.desc().is_file()
                && matches!(
                    e,
                    SliceError::Path(_) | SliceError::Rejected(Rejection::BadSecret)
                )
            {
                slice.target.mark_stale();
            }
        }
        self.recorded(slice.token.record(slice.len, outcome));
    }
}

impl Core {
    /// Sends the notification a slice's record gave back (the batch it finished had one).
    pub(crate) fn recorded(&self, notify: Option<PendingNotify>) {
        if let Some(notify) = notify
            && let Some(tx) = self
                .notifier
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
        {
            let _ = tx.send(notify);
        }
    }
}
