//! Segments of peers: opening, fetching and refreshing their descriptors, keyed by the name
//! asked for, with what they name on this host bound to their proven owner ([`Origin`]).

use std::sync::Arc;
use std::time::Duration;

use tracing::debug;

use super::{DESCRIPTOR_MIN_AGE, TransferEngine};
use crate::control::auth::ClusterKey;
use crate::control::{self, frame::FrameType};
use crate::error::{Error, Result};
use crate::memory::Opcode;
use crate::metadata::{FetchedSegment, Metadata};
use crate::segment::{Origin, RemoteSegment, SegmentDesc, SegmentId, host_id};

/// How the name of a local file segment starts ([`TransferEngine::open_file_segment`]).
pub(crate) const FILE_PREFIX: &str = "file:";

/// A peer's segment name as given (a leading `/` dropped), refused when spelled as a local
/// file segment's.
fn peer_name(name: &str) -> Result<&str> {
    let name = name.trim_start_matches('/');
    match name.starts_with(FILE_PREFIX) {
        true => Err(Error::InvalidArgument(format!(
            "segment name {name:?}: names starting with {FILE_PREFIX:?} are local file \
             segments (open_file_segment), never a peer's"
        ))),
        false => Ok(name),
    }
}

/// What a fetched descriptor must pass before it is cached, wherever it was fetched (a
/// segment opened, the keeper's refresh): the cluster signature and seal, the name it was
/// asked for, and the proof of its owner ([`Origin`]).
pub(crate) struct Vetting {
    pub(crate) metadata: Arc<dyn Metadata>,
    pub(crate) key: Option<Arc<ClusterKey>>,
    /// This engine's own segment name.
    pub(crate) own_name: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_payload: usize,
}

impl Vetting {
    /// Fetches segment `name`'s descriptor and vets it.
    ///
    /// # Errors
    /// The fetch's; [`Error::PeerRefused`] for a bad signature or seal; [`Error::MalformedMessage`]
    /// for a descriptor naming another segment.
    pub(crate) fn fetch(&self, name: &str) -> Result<FetchedSegment> {
        let mut fetched = self.metadata.fetch_segment(name)?;
        let key = self.key.as_deref();
        control::auth::verify(key, name, &fetched.desc)?;
        control::auth::unseal(key, name, &mut fetched.desc)?;
        // Keyed by the name asked for: a descriptor naming another segment replaces nothing.
        if fetched.desc.name != name {
            return Err(Error::MalformedMessage(format!(
                "the descriptor fetched for segment {name:?} names segment {:?}",
                fetched.desc.name
            )));
        }
        if fetched.desc.origin == Origin::Unproven {
            fetched.desc.origin = match key {
                Some(_) => Origin::signed(&fetched.desc, &self.own_name),
                None => self.owner_proof(name, &mut fetched),
            };
        }
        Ok(fetched)
    }

    /// The origin of an unsigned descriptor from a shared metadata service (anyone who can
    /// write the service can write it): proven only by its owner serving the same segment over
    /// its own control listener, at the address the service gives for it. When it does, that
    /// descriptor, fresh from the owner, replaces the service's; else nothing on this host is
    /// used (the segment's protocol carries its transfers, checked by the target).
    fn owner_proof(&self, name: &str, fetched: &mut FetchedSegment) -> Origin {
        if !self.metadata.is_shared()
            || fetched.desc.te_host_id.as_deref() != Some(host_id())
            || !on_this_host(&fetched.host, fetched.rpc_port)
        {
            return Origin::Unproven;
        }
        let served = control::exchange(
            &fetched.host,
            fetched.rpc_port,
            FrameType::Metadata,
            b"{}",
            self.connect_timeout,
            self.max_payload,
            None,
        )
        .and_then(|(reply, connection)| {
            let mut desc = SegmentDesc::from_json(&reply)?;
            desc.origin = Origin::served_over(&connection, &desc);
            Ok(desc)
        });
        match served {
            Ok(desc) if desc.name == name && desc.origin != Origin::Unproven => {
                let origin = desc.origin;
                fetched.desc = desc;
                origin
            }
            Ok(desc) => {
                debug!(segment = name, served = %desc.name, "the listener the metadata service names did not prove the segment its own");
                Origin::Unproven
            }
            Err(e) => {
                debug!(segment = name, error = %e, "the segment's owner could not prove its descriptor");
                Origin::Unproven
            }
        }
    }
}

/// Whether `host` names an address of this host (loopback, or one of its interfaces' in this
/// network namespace): only a listener there can prove a descriptor its own, so no round trip
/// is spent on another.
fn on_this_host(host: &str, port: u16) -> bool {
    control::resolve(host, port)
        .is_ok_and(|addrs| addrs.iter().any(|a| te_sys::holder::on_this_host(a.ip())))
}

impl TransferEngine {
    /// Opens segment `name` (P2P: `host:port`), fetching its descriptor unless cached. The
    /// name is a peer's: one spelled as a file segment's (`file:…`) is refused, so a name that
    /// arrives from a peer can never alias a local file.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a file segment's name; [`Error::Metadata`] when the peer
    /// cannot be reached, [`Error::MalformedMessage`] for a bad descriptor, one that names
    /// another segment than `name`.
    pub fn open_segment(&self, name: &str) -> Result<SegmentId> {
        let name = peer_name(name)?;
        if self.config.metacache {
            if let Some(seg) = self.segments.by_name(name).filter(|s| !s.is_stale()) {
                return Ok(seg.id());
            }
        }
        self.fetch_segment(name).map(|s| s.id())
    }

    /// Fetches segment `name`'s descriptor again, cached or not, keeping its id when it was
    /// open (its owner registered or released memory since).
    ///
    /// # Errors
    /// As [`open_segment`](Self::open_segment).
    pub fn refresh_segment(&self, name: &str) -> Result<SegmentId> {
        self.fetch_segment(peer_name(name)?).map(|s| s.id())
    }

    /// Fetches `name`'s descriptor and caches it under `name` (and its existing id if it was
    /// open), dropping transports' connections made from the previous descriptor.
    fn fetch_segment(&self, name: &str) -> Result<Arc<RemoteSegment>> {
        let previous = self.segments.by_name(name);
        let fetched = self.vetting.fetch(name)?;
        if let Some(old) = &previous {
            for t in self.core.transports() {
                t.close_segment(old);
            }
        }
        let seg = self
            .segments
            .insert(fetched.host, fetched.rpc_port, fetched.desc);
        debug!(
            segment = name,
            id = seg.id(),
            buffers = seg.desc().buffers.len(),
            "segment opened"
        );
        Ok(seg)
    }

    /// Fetches a distrusted descriptor again before a transfer. When a shared metadata service
    /// cannot be reached, the cached descriptor is kept (transfers between open segments must
    /// outlive a service restart); a segment the service says is gone is an error.
    pub(super) fn refetch(&self, seg: Arc<RemoteSegment>) -> Result<Arc<RemoteSegment>> {
        if seg.desc().is_file() {
            return Ok(seg);
        }
        match self.fetch_segment(seg.name()) {
            Ok(fresh) => Ok(fresh),
            Err(e @ (Error::Metadata(_) | Error::Socket { .. })) if self.metadata.is_shared() => {
                debug!(segment = seg.name(), error = %e, "metadata service unreachable; keeping the cached descriptor");
                Ok(seg)
            }
            Err(e) => Err(e),
        }
    }

    /// Closes a segment: forgets its descriptor and drops transports' connections to it.
    /// Slices already posted finish on their own.
    ///
    /// # Errors
    /// [`Error::UnknownSegment`].
    pub fn close_segment(&self, id: SegmentId) -> Result<()> {
        let seg = self.segments.remove(id).ok_or(Error::UnknownSegment(id))?;
        for t in self.core.transports() {
            t.close_segment(&seg);
        }
        Ok(())
    }

    /// The names of the segments open now.
    pub fn open_segment_names(&self) -> Vec<String> {
        self.segments
            .all()
            .iter()
            .map(|s| s.name().to_string())
            .collect()
    }

    /// The descriptor of an opened segment.
    ///
    /// # Errors
    /// [`Error::UnknownSegment`].
    pub fn segment(&self, id: SegmentId) -> Result<Arc<RemoteSegment>> {
        // A match, not `ok_or`: the error is built (and dropped) only when it is returned, and
        // this runs once per submit.
        match self.segments.by_id(id) {
            Some(seg) => Ok(seg),
            None => Err(Error::UnknownSegment(id)),
        }
    }

    /// Segment `id`'s descriptor as it should be used for `[offset, offset+len)`: fetched
    /// again when it lists no buffer holding the range (the peer may have registered it since
    /// the descriptor was fetched). After a fetch that found nothing new, the next one waits
    /// until that descriptor is [`DESCRIPTOR_MIN_AGE`] old, so bad requests cannot make every
    /// submit a round trip. Range checks themselves stay with the caller.
    ///
    /// # Errors
    /// [`Error::UnknownSegment`]; the fetch's error.
    pub fn segment_for_range(
        &self,
        id: SegmentId,
        offset: u64,
        len: u64,
        opcode: Opcode,
    ) -> Result<Arc<RemoteSegment>> {
        Ok(self.covering(self.segment(id)?, offset, len, opcode)?.0)
    }

    /// As [`segment_for_range`](Self::segment_for_range), from the descriptor in hand, with
    /// the range's look-up in the descriptor returned (the index of the buffer holding it, or
    /// why none does): one look-up when the descriptor in hand lists the range, as nearly
    /// always.
    ///
    /// # Errors
    /// The fetch's error.
    pub(crate) fn covering(
        &self,
        seg: Arc<RemoteSegment>,
        offset: u64,
        len: u64,
        opcode: Opcode,
    ) -> Result<(Arc<RemoteSegment>, Result<usize>)> {
        match seg.buffer_for(offset, len, opcode) {
            Err(Error::RemoteAddressNotRegistered { .. })
                if seg.refetch_for_unknown_range(DESCRIPTOR_MIN_AGE) =>
            {
                let fresh = self.refetch(Arc::clone(&seg))?;
                if fresh.lists_same_memory(&seg) {
                    fresh.fetched_for_unknown_range();
                }
                let found = fresh.buffer_for(offset, len, opcode);
                Ok((fresh, found))
            }
            found => Ok((seg, found)),
        }
    }
}
