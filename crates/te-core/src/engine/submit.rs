//! `submit` and what it decides: validation of every request, slicing, the rail of each slice,
//! pinning, and posting to the transports. Returns once posted.

use std::sync::Arc;

use super::{TransferEngine, TransferRequest};
use crate::batch::{BatchId, PendingNotify, SliceToken, TaskShared};
use crate::error::{Error, Result};
use crate::notify::Notification;
use crate::router::{Candidates, TaskRoute};
use crate::segment::RemoteSegment;
use crate::slicer;
use crate::transport::{SliceOp, Transport};

/// How [`TransferEngine::submit_with`] posts its requests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubmitOptions {
    /// The installed transport to post through (its name), instead of the engine's choice.
    pub transport: Option<String>,
    /// Tasks not done this long after submit end TIMEOUT (instead of `MC_SLICE_TIMEOUT`).
    pub timeout: Option<std::time::Duration>,
    /// The submitting thread waits for the batch right after submitting it (a synchronous
    /// call): a transport may carry out a small lone slice on that thread, so that `submit`
    /// returns with it done. Never set it for a submit that must return at once.
    pub caller_waits: bool,
}

impl SubmitOptions {
    /// Post through transport `name`.
    pub fn via(mut self, name: &str) -> Self {
        self.transport = Some(name.to_string());
        self
    }

    /// Say that the submitting thread waits for the batch at once ([`caller_waits`](Self::caller_waits)).
    pub fn waited(mut self) -> Self {
        self.caller_waits = true;
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

    fn route_for(
        &self,
        local_location: &str,
        seg: &RemoteSegment,
        remote_location: &str,
    ) -> TaskRoute {
        TaskRoute {
            local: Candidates::for_location(
                Some(&self.local_matrix),
                local_location,
                &self.rail_names,
            ),
            remote: Candidates::for_location(
                seg.desc().priority_matrix.as_ref(),
                remote_location,
                seg.rail_names(),
            ),
            salt: self.next_salt(),
        }
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
        self.submit_inner(batch, requests, None, &SubmitOptions::default())
    }

    /// As [`submit`](Self::submit), with `options`: a transport to post through instead of the
    /// engine's choice (the runtime's policy, te-tent, decides), and a timeout for these tasks.
    ///
    /// # Errors
    /// As [`submit`](Self::submit); [`Error::NotSupportedTransport`] when the transport is not
    /// installed or cannot reach a request's buffer (a same-host transport for a buffer it does
    /// not serve, a memory transport for a file).
    pub fn submit_with(
        &self,
        batch: BatchId,
        requests: &[TransferRequest],
        options: &SubmitOptions,
    ) -> Result<()> {
        self.submit_inner(batch, requests, None, options)
    }

    /// As [`submit`](Self::submit); when every task of the batch has completed, the engine sends
    /// `notification` to the target of `requests[0]` (from its own thread, not the caller's poll).
    ///
    /// # Errors
    /// As [`submit`](Self::submit), and [`Error::InvalidArgument`] for an empty request list.
    pub fn submit_with_notify(
        &self,
        batch: BatchId,
        requests: &[TransferRequest],
        notification: Notification,
    ) -> Result<()> {
        let first = requests.first().ok_or_else(|| {
            Error::InvalidArgument("submit_with_notify needs at least one request".into())
        })?;
        let target = self.segment(first.target_id)?;
        self.submit_inner(
            batch,
            requests,
            Some(PendingNotify {
                target,
                notification,
            }),
            &SubmitOptions::default(),
        )
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

    fn submit_inner(
        &self,
        id: BatchId,
        requests: &[TransferRequest],
        notify: Option<PendingNotify>,
        options: &SubmitOptions,
    ) -> Result<()> {
        let batch = self.batches.get(id)?;
        let deadline = options
            .timeout
            .or(self.config.slice_timeout)
            .map(|t| self.core.clock.now() + t);
        // A transport may ask for its own slice size (memory copies gain nothing from 64 KiB).
        let sizing = |t: &Arc<dyn Transport>, seg: &RemoteSegment| match t.slice_size(seg) {
            Some(size) => (size.max(4096), size.max(4096) / 4),
            None => (self.config.slice_size, self.config.fragment_limit),
        };
        let mut tasks = Vec::with_capacity(requests.len());
        let mut routes: Vec<(Arc<RemoteSegment>, Arc<dyn Transport>)> =
            Vec::with_capacity(requests.len());
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
            let seg = match routes.last() {
                Some((last, _)) if last.id() == r.target_id => Arc::clone(last),
                _ => self.segment(r.target_id)?,
            };
            // A descriptor a failed transfer distrusted is fetched again (the peer restarted).
            let seg = match seg.is_stale() {
                true => self.refetch(seg)?,
                false => seg,
            };
            let seg = self.covering(seg, r.target_offset, r.length, r.opcode)?;
            let buffer = seg.check_access(r.target_offset, r.length, r.opcode)?;
            let transport = match &options.transport {
                Some(name) => self.forced_transport(name, &seg, buffer)?,
                None => self.core.transport_for_buffer(&seg, buffer)?,
            };
            let pin = self.regions.pin_local(r.source, r.length)?;
            let route = self.route_for(&pin.region().location().to_string(), &seg, &buffer.name);
            let (slice_size, fragment_limit) = sizing(&transport, &seg);
            let slices = slicer::count(r.length, slice_size, fragment_limit);
            tasks.push(
                TaskShared::new(r.opcode, r.length, slices, deadline, pin)
                    .with_route(route)
                    .with_transport(transport.clone())
                    .waited(options.caller_waits),
            );
            routes.push((seg, transport));
        }
        let added = batch.add_tasks(tasks, notify)?;
        let mut posts: Vec<(Arc<dyn Transport>, Vec<SliceOp>)> = Vec::new();
        for ((r, task), (seg, transport)) in requests.iter().zip(added).zip(routes) {
            let (slice_size, fragment_limit) = sizing(&transport, &seg);
            let idx = match posts.iter().position(|(t, _)| Arc::ptr_eq(t, &transport)) {
                Some(i) => i,
                None => {
                    posts.push((transport, Vec::new()));
                    posts.len() - 1
                }
            };
            let ops = &mut posts[idx].1;
            let now = self.core.clock.now();
            for (seq, s) in slicer::plan(r.length, slice_size, fragment_limit).enumerate() {
                let token = SliceToken::new(batch.clone(), task.clone(), seq as u64);
                let (local_rail, remote_rail) = token.route().map_or((0, 0), |route| {
                    route.choose(seq as u64, 0, |l, rr| {
                        self.core.usable(l, seg.id(), rr, now)
                    })
                });
                ops.push(SliceOp {
                    opcode: r.opcode,
                    local_addr: r.source + s.offset,
                    remote_addr: r.target_offset + s.offset,
                    len: s.len,
                    local_rail,
                    remote_rail,
                    target: seg.clone(),
                    token,
                });
            }
        }
        for (transport, ops) in posts {
            transport.post(ops);
        }
        Ok(())
    }
}
