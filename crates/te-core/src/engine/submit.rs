//! `submit` and what it decides: validation of every request, slicing, the rail of each slice,
//! pinning, and posting to the transports. Returns once posted.

use std::sync::Arc;

use super::{TransferEngine, TransferRequest};
use crate::batch::{BatchId, PendingNotify, SliceToken, TaskShared};
use crate::error::{Error, Result};
use crate::memory::{Location, Region, RegionTable};
use crate::merge::{self, Piece};
use crate::notify::Notification;
use crate::router::{Candidates, TaskRails};
use crate::segment::RemoteSegment;
use crate::slicer;
use crate::transport::{SliceOp, Transport};
use te_sys::small_list::SmallList;

/// How [`TransferEngine::submit_with`] posts its requests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubmitOptions {
    /// The installed transport to post through (its name), instead of the engine's choice.
    /// A name known at compile time (as every transport's is) is kept without a copy.
    pub transport: Option<std::borrow::Cow<'static, str>>,
    /// Tasks not done this long after submit end TIMEOUT (instead of `MC_SLICE_TIMEOUT`).
    pub timeout: Option<std::time::Duration>,
    /// The submitting thread waits for the batch right after submitting it (a synchronous
    /// call): a transport may carry out a small lone slice on that thread, so that `submit`
    /// returns with it done. Never set it for a submit that must return at once.
    pub caller_waits: bool,
    /// Merge requests contiguous in both memories before slicing (see [`crate::merge`]);
    /// `None` follows the engine's `MC_TE_MERGE_REQUESTS`.
    pub merge: Option<bool>,
    /// The tasks are steps of a request the submitter counts itself (te-tent's staging hops):
    /// with metrics on, the engine counts them as transport attempts, not as requests.
    pub attempt_only: bool,
    /// A failed task is held again for its runtime's next attempt instead of ending FAILED
    /// ([`TransferEngine::post_held`]; its batch's watcher is told).
    pub fail_over: bool,
    /// The tasks are posted as the engine's runtime policy planned them (its own posts): the
    /// policy is not asked again.
    pub planned: bool,
    /// Sent to the target of the first request once every task of the batch has completed
    /// (from the engine's thread, not the caller's poll).
    pub notify: Option<Notification>,
}

impl SubmitOptions {
    /// Post through transport `name` (a `&'static str`, as transports name themselves, is not
    /// copied: te-tent names one on every submit).
    pub fn via(mut self, name: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        self.transport = Some(name.into());
        self
    }

    /// Say that the submitting thread waits for the batch at once ([`caller_waits`](Self::caller_waits)).
    pub fn waited(mut self) -> Self {
        self.caller_waits = true;
        self
    }

    /// Say that the tasks are attempts of requests the submitter counts ([`attempt_only`](Self::attempt_only)).
    pub fn as_attempts(mut self) -> Self {
        self.attempt_only = true;
        self
    }

    /// Hold failed tasks again for their next attempt ([`fail_over`](Self::fail_over)).
    pub fn failing_over(mut self, fail_over: bool) -> Self {
        self.fail_over = fail_over;
        self
    }

    /// Send `notification` once every task of the batch has completed ([`notify`](Self::notify)).
    pub fn notifying(mut self, notification: Notification) -> Self {
        self.notify = Some(notification);
        self
    }

    /// Say that these tasks are the policy's own posts ([`planned`](Self::planned)).
    pub fn as_planned(mut self) -> Self {
        self.planned = true;
        self
    }

    /// Merge contiguous requests (or not), whatever the engine's setting.
    pub fn merging(mut self, merge: bool) -> Self {
        self.merge = Some(merge);
        self
    }

    /// End tasks TIMEOUT when not done within `timeout`.
    pub fn within(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

impl TransferEngine {
    /// Where the next task's stripe starts: a shared counter (`MC_PATH_ROUNDROBIN`) or a
    /// well-mixed value of it (random start, Mooncake's default).
    fn next_salt(&self) -> u64 {
        let n = self
            .stripe
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.config.path_roundrobin {
            return n;
        }
        let mut z = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z ^ (z >> 31)
    }

    /// The rails of a task from `region` to buffer `buffer` of `seg`: both sides' candidates
    /// are worked out once (per region, per buffer), and shared.
    fn route_for(
        &self,
        region: &crate::memory::Region,
        seg: &RemoteSegment,
        buffer: usize,
    ) -> TaskRails {
        let local = region.candidates(|| {
            Candidates::for_location(
                Some(&self.local_matrix),
                &region.location().to_string(),
                &self.rail_names,
            )
        });
        TaskRails::between(local, seg.candidates(buffer), || self.next_salt())
    }

    /// Validates and posts `requests` as new tasks of `batch`; returns once posted.
    /// Nothing is posted unless every request is valid.
    ///
    /// # Errors
    /// [`Error::InvalidBatch`], [`Error::TooManyRequests`], [`Error::InvalidArgument`] (zero
    /// length), [`Error::AddressNotRegistered`] (local range), [`Error::UnknownSegment`],
    /// [`Error::RemoteAddressNotRegistered`], [`Error::PermissionDenied`],
    /// [`Error::NotSupportedTransport`].
    pub fn submit(&self, batch: BatchId, requests: &[TransferRequest]) -> Result<()> {
        self.submit_with(batch, requests, &SubmitOptions::default())
    }

    /// As [`submit`](Self::submit), with `options`: a transport to post through instead of the
    /// engine's choice, a timeout for these tasks, the batch's notification (sent to the target
    /// of `requests[0]` once every task of the batch has completed). With a runtime policy
    /// installed, the policy plans them (unless they are its own, [`SubmitOptions::planned`]).
    ///
    /// # Errors
    /// As [`submit`](Self::submit); [`Error::NotSupportedTransport`] when the transport is not
    /// installed or cannot reach a request's buffer (a same-host transport for a buffer it does
    /// not serve, a memory transport for a file); [`Error::InvalidArgument`] for a notification
    /// with no request.
    pub fn submit_with(
        &self,
        batch: BatchId,
        requests: &[TransferRequest],
        options: &SubmitOptions,
    ) -> Result<()> {
        let notify = match (&options.notify, requests.first()) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(Error::InvalidArgument(
                    "a notification needs at least one request".into(),
                ));
            }
            (Some(n), Some(first)) => Some((n, first.target_id)),
        };
        // The policy's own posts do not look it up (a weak reference's upgrade per post).
        if !options.planned
            && let Some(policy) = self.policy()
        {
            return policy.submit(batch, requests, options);
        }
        let notify = match notify {
            Some((n, target)) => Some(PendingNotify {
                target: self.segment(target)?,
                notification: n.clone(),
            }),
            None => None,
        };
        self.submit_inner(batch, requests, Place::Append(notify), options)
    }

    /// The transport `options` names for `buffer` of `seg`, if it can reach it.
    fn forced_transport(
        &self,
        name: &str,
        seg: &RemoteSegment,
        buffer: &crate::segment::BufferDesc,
    ) -> Result<Arc<dyn Transport>> {
        use crate::transport::Capabilities as C;
        let t = self.core.transport_for(name)?;
        let caps = t.capabilities();
        let own = seg.name() == self.name;
        let reaches = match seg.desc().is_file() {
            true => caps.contains(C::DRAM_FILE) || caps.contains(C::GPU_FILE),
            // A device copy reaches memory of this process: the own segment.
            false if own && caps.contains(C::GPU_LOCAL) => true,
            false => {
                caps.contains(C::DRAM_REMOTE_HOST)
                    || caps.contains(C::GPU_REMOTE_HOST)
                    || t.serves(seg, buffer)
            }
        };
        match reaches {
            true => Ok(t),
            false => Err(Error::NotSupportedTransport(format!(
                "{name} cannot reach {:#x} of segment {}",
                buffer.addr,
                seg.name()
            ))),
        }
    }

    pub(super) fn submit_inner(
        &self,
        id: BatchId,
        requests: &[TransferRequest],
        place: Place<'_>,
        options: &SubmitOptions,
    ) -> Result<()> {
        let batch = self.batches.get(id)?;
        // With metrics on, the batch's tasks are counted, all submitted now (one clock read).
        let submitted = self.core.metering().then(|| {
            batch.count_into(&self.core.metrics);
            std::time::Instant::now()
        });
        let deadline = options
            .timeout
            .or(self.config.slice_timeout)
            .map(|t| self.core.clock.now() + t);
        // A transport may ask for its own slice size (memory copies gain nothing from 64 KiB).
        let sizing = |t: &Arc<dyn Transport>, seg: &RemoteSegment| match t.slice_size(seg) {
            Some(size) => (size.max(4096), size.max(4096) / 4),
            None => (self.config.slice_size, self.config.fragment_limit),
        };
        let mut checked: SmallList<Checked> = SmallList::with_capacity(requests.len());
        let mut last_region: Option<Arc<Region>> = None;
        for r in requests {
            if r.length == 0 {
                return Err(Error::InvalidArgument("zero-length transfer".into()));
            }
            if r.source.checked_add(r.length).is_none() {
                return Err(Error::InvalidArgument(format!(
                    "{:#x}+{} overflows",
                    r.source, r.length
                )));
            }
            // Requests of one submit usually share a target: look it up once.
            let seg = match checked.last() {
                Some(last) if last.seg.id() == r.target_id => Arc::clone(&last.seg),
                _ => self.segment(r.target_id)?,
            };
            // A descriptor a failed transfer distrusted is fetched again (the peer restarted).
            let seg = match seg.is_stale() {
                true => self.refetch(seg)?,
                false => seg,
            };
            let (seg, found) = self.covering(seg, r.target_offset, r.length, r.opcode)?;
            let index = found?;
            let buffer = &seg.desc().buffers[index];
            // The transport is the previous request's when both go to one buffer of one
            // descriptor (the choice depends on nothing else): asked once per run of them.
            let transport = match (checked.last(), &options.transport) {
                (Some(last), _)
                    if Arc::ptr_eq(&last.seg, &seg) && last.key.buffer == buffer.addr =>
                {
                    last.transport.clone()
                }
                (_, Some(name)) => self.forced_transport(name, &seg, buffer)?,
                (_, None) => self.core.transport_for_buffer(&seg, index)?,
            };
            // A request in the region of the one before is pinned without a look-up: that
            // request's pin keeps the region registered.
            let pin = match &last_region {
                Some(region) if region.contains(r.source, r.length) => {
                    RegionTable::pin_again(region)
                }
                _ => {
                    let pin = self.regions.pin_local(r.source, r.length)?;
                    last_region = Some(pin.region().clone());
                    pin
                }
            };
            let route = self.route_for(pin.region(), &seg, index);
            let host = !matches!(pin.region().location(), Location::Cuda(_));
            let key = MergeKey {
                segment: Arc::as_ptr(&seg) as usize,
                buffer: buffer.addr,
                region: Arc::as_ptr(pin.region()) as usize,
                transport: Arc::as_ptr(&transport) as *const () as usize,
                opcode: r.opcode as u8,
            };
            // No slice counted yet: its run counts them all below, before it posts any.
            let task = TaskShared::new(r.opcode, r.length, 0, deadline, Some(pin))
                .with_route(route)
                .with_transport(transport.name())
                .waited(options.caller_waits)
                .failing_over(options.fail_over)
                .metered(submitted.map(|at| crate::batch::Meter::new(at, options.attempt_only)));
            checked.push(Checked {
                seg,
                transport,
                task: Arc::new(task),
                key,
                host,
            });
        }
        // Merging needs two requests; one request, or merging off, is a run of one per request
        // (and costs no allocation).
        let merging = requests.len() > 1 && options.merge.unwrap_or(self.config.merge_requests);
        let runs = merging.then(|| {
            let pieces: Vec<Piece<MergeKey>> = requests
                .iter()
                .zip(checked.iter())
                .map(|(r, c)| Piece {
                    key: c.key,
                    source: r.source,
                    target: r.target_offset,
                    len: r.length,
                })
                .collect();
            merge::runs(&pieces, true)
        });
        match place {
            Place::Append(notify) => {
                batch.add_tasks(checked.iter().map(|c| &c.task), notify)?;
            }
            Place::Held(slots) => batch.fill_held(slots, checked.iter().map(|c| &c.task))?,
        }
        // At most one clock read per submit, for the rails' health, and none while every rail
        // is healthy.
        let now = std::cell::OnceCell::new();
        let now = || *now.get_or_init(|| self.core.clock.now());
        let mut posts = Posts {
            stamp: submitted.map(|at| (batch.clone(), at)),
            ..Posts::default()
        };
        // One list of shares, reused by every merged slice of the submit.
        let mut shares = Vec::new();
        // Each slice's token holds the batch: the submit's own handle goes with its last slice
        // (the last of the last run), the others take a reference each.
        let mut runs_left = runs.as_ref().map_or(requests.len(), merge::Runs::len);
        let mut handle = Some(batch);
        let mut slice_run = |run: &[usize]| {
            runs_left -= 1;
            let first = run[0];
            let r = &requests[first];
            let Checked { seg, transport, .. } = &checked[first];
            let (slice_size, fragment_limit) = sizing(transport, seg);
            let lens: Vec<u64> = match run.len() {
                1 => Vec::new(),
                _ => run.iter().map(|&i| requests[i].length).collect(),
            };
            let total = match run.len() {
                1 => r.length,
                _ => lens.iter().sum(),
            };
            // Every slice of the run is counted on its tasks before the first is posted:
            // slices go out in chunks, and one that ends early must not end its task.
            let count = slicer::count(total, slice_size, fragment_limit);
            match run.len() {
                1 => checked[first].task.count_slices(count),
                _ => merge::slices_per_request(&lens, slice_size, count)
                    .zip(run)
                    .for_each(|(n, &i)| checked[i].task.count_slices(n)),
            }
            let mut cover = merge::Cover::new(&lens);
            for (seq, s) in slicer::plan(total, slice_size, fragment_limit).enumerate() {
                // `count` is how many slices the plan makes (their tasks were counted so).
                let batch = match runs_left == 0 && seq as u64 + 1 == count {
                    true => handle.take(),
                    false => handle.clone(),
                }
                .expect("the batch handle is given away only with the submit's last slice");
                let token = match run.len() {
                    1 => SliceToken::new(batch, checked[first].task.clone(), seq as u64),
                    _ => {
                        cover.shares(s.offset, s.len, &mut shares);
                        let riders = shares[1..]
                            .iter()
                            .map(|&(k, n)| (checked[run[k]].task.clone(), n))
                            .collect();
                        let owner = checked[run[shares[0].0]].task.clone();
                        SliceToken::merged(batch, owner, riders, seq as u64)
                    }
                };
                let (local_rail, remote_rail) = token.route().map_or((0, 0), |route| {
                    route.choose(seq as u64, 0, |l, rr| {
                        self.core.usable(l, seg.id(), rr, now)
                    })
                });
                posts.push(
                    transport,
                    requests.len(),
                    SliceOp {
                        opcode: r.opcode,
                        local_addr: r.source + s.offset,
                        remote_addr: r.target_offset + s.offset,
                        len: s.len,
                        local_rail,
                        remote_rail,
                        target: seg.clone(),
                        token,
                        host: match checked[first].host {
                            true => (r.source + s.offset, s.len as usize),
                            false => (0, 0),
                        },
                    },
                );
            }
        };
        match &runs {
            Some(runs) => runs.iter().for_each(&mut slice_run),
            None => (0..requests.len()).for_each(|i| slice_run(std::slice::from_ref(&i))),
        }
        posts.post_all();
        Ok(())
    }
}

/// Where a submit's tasks go in their batch.
pub(super) enum Place<'a> {
    /// After its tasks, with the notification to send once all completed.
    Append(Option<PendingNotify>),
    /// In the places of these held tasks, one per request.
    Held(&'a [usize]),
}

/// Slices handed to a transport at a time: a large batch goes out in chunks as it is sliced,
/// so the transport starts on it before the last slice is made and no submit builds one list
/// of thousands of slices (hundreds of KiB, allocated and freed per batch).
const POST_CHUNK: usize = 256;

/// The slices of one submit not yet posted, by transport: nearly always one transport, kept
/// without a list of its own, and often one slice, kept without a list either.
#[derive(Default)]
struct Posts {
    first: Option<(Arc<dyn Transport>, SmallList<SliceOp>)>,
    more: Vec<(Arc<dyn Transport>, SmallList<SliceOp>)>,
    /// With metrics on, the batch and the submit's moment: the first post stamps when its
    /// slices started going to their transports.
    stamp: Option<(Arc<crate::batch::BatchShared>, std::time::Instant)>,
}

impl Posts {
    /// Adds `op` for `transport` (room for `hint` made for the first list); a list that
    /// reaches [`POST_CHUNK`] slices is posted at once.
    fn push(&mut self, transport: &Arc<dyn Transport>, hint: usize, op: SliceOp) {
        let ops = self.ops_for(transport, hint.min(POST_CHUNK));
        ops.push(op);
        if ops.len() >= POST_CHUNK {
            let full = std::mem::replace(ops, SmallList::with_capacity(POST_CHUNK));
            let stamp = self.stamp.take();
            post(transport, full, stamp);
        }
    }

    /// The slices going to `transport` so far.
    fn ops_for(&mut self, transport: &Arc<dyn Transport>, hint: usize) -> &mut SmallList<SliceOp> {
        let (t, ops) = self
            .first
            .get_or_insert_with(|| (transport.clone(), SmallList::with_capacity(hint)));
        if Arc::ptr_eq(t, transport) {
            return ops;
        }
        let at = match self
            .more
            .iter()
            .position(|(t, _)| Arc::ptr_eq(t, transport))
        {
            Some(i) => i,
            None => {
                self.more.push((transport.clone(), SmallList::Empty));
                self.more.len() - 1
            }
        };
        &mut self.more[at].1
    }

    /// Hands each transport the slices it has not been given yet.
    fn post_all(self) {
        let mut stamp = self.stamp;
        if let Some((transport, ops)) = self.first {
            post(&transport, ops, stamp.take());
        }
        for (transport, ops) in self.more {
            post(&transport, ops, stamp.take());
        }
    }
}

/// Hands `transport` its slices (a lone slice through `post_one`); with `stamp`, the
/// submit's first post, first notes the moment on the batch (with metrics on).
fn post(
    transport: &Arc<dyn Transport>,
    ops: SmallList<SliceOp>,
    stamp: Option<(Arc<crate::batch::BatchShared>, std::time::Instant)>,
) {
    if let Some((batch, submitted)) = stamp {
        batch.stamp_posted(submitted, std::time::Instant::now());
    }
    match ops {
        SmallList::Empty => {}
        SmallList::One(op) => transport.post_one(op),
        SmallList::Many(ops) => transport.post(ops),
    }
}

/// What two requests must share to be merged: one descriptor of one segment, one of its
/// buffers, one local region, one transport and one opcode (so one permission check holds for
/// the merged range on both sides).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct MergeKey {
    segment: usize,
    buffer: u64,
    region: usize,
    transport: usize,
    opcode: u8,
}

/// A request that passed every check, with its task (not yet in the batch) and what posting
/// it needs.
struct Checked {
    seg: Arc<RemoteSegment>,
    transport: Arc<dyn Transport>,
    task: Arc<TaskShared>,
    key: MergeKey,
    /// The local region is host memory.
    host: bool,
}
