//! Opened remote segments: a peer's descriptor validated and indexed ([`RemoteSegment`]: the
//! initiator-side bounds and permission check, staleness, the owner-alive check of same-host
//! transports, rail candidates per buffer), and the engine's cache of them by name and id
//! ([`SegmentCache`]). Fetching descriptors is the metadata module's job, not this one's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::{BufferDesc, Origin, SegmentDesc, SegmentId, SegmentSecret, process_identity};
use crate::error::{Error, Result};
use crate::memory::Opcode;
use crate::memory::Permission;

/// In a segment's packed owner check: a check was made.
const OWNER_CHECKED: u64 = 0b10;
/// In a segment's packed owner check: the owner was alive.
const OWNER_ALIVE: u64 = 0b01;

/// A peer's segment, opened and validated.
#[derive(Debug)]
pub struct RemoteSegment {
    id: SegmentId,
    host: String,
    rpc_port: u16,
    desc: SegmentDesc,
    secret: SegmentSecret,
    /// (addr, len, permission, buffer index) sorted by addr.
    spans: Vec<(u64, u64, Permission, usize)>,
    rail_names: Vec<String>,
    /// Set when a transfer suggests the descriptor no longer matches the peer.
    stale: std::sync::atomic::AtomicBool,
    /// The last owner check, packed (read on every post without a lock): the coarse clock's
    /// nanoseconds shifted left by two, then [`OWNER_CHECKED`] and [`OWNER_ALIVE`]; 0 before
    /// the first check.
    owner_seen: std::sync::atomic::AtomicU64,
    /// Rail candidates per buffer (by index in the descriptor), worked out on first use.
    routes: Box<[std::sync::OnceLock<Arc<crate::router::Candidates>>]>,
    /// The transport chosen per buffer (by index), with the epoch of the engine's transport
    /// set it was chosen from ([`chosen`](Self::chosen)).
    chosen: Box<[std::sync::OnceLock<Chosen>]>,
    /// What a transport keeps per buffer (by index) of this descriptor ([`attached`](Self::attached)).
    attached: Box<[std::sync::OnceLock<Attachment>]>,
    /// When this descriptor was built from what the peer published.
    fetched: std::time::Instant,
    /// Whether it was fetched because a request named a range the previous one did not list,
    /// and listed nothing new.
    for_unknown_range: std::sync::atomic::AtomicBool,
}

impl RemoteSegment {
    /// Builds from a validated descriptor reached at `host:rpc_port`.
    pub fn new(id: SegmentId, host: String, rpc_port: u16, desc: SegmentDesc) -> Self {
        let secret = desc
            .te_secret
            .as_deref()
            .and_then(SegmentSecret::from_hex)
            .unwrap_or_default();
        let mut spans: Vec<_> = desc
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let p = b
                    .permission
                    .as_deref()
                    .and_then(Permission::parse)
                    .unwrap_or(Permission::RemoteReadWrite);
                (b.addr, b.length, p, i)
            })
            .collect();
        spans.sort_unstable_by_key(|s| s.0);
        let rail_names = match desc.te_rails.is_empty() {
            true => vec!["default".to_string()],
            false => desc.te_rails.iter().map(|r| r.name.clone()).collect(),
        };
        let (routes, chosen, attached) = (per_buffer(&desc), per_buffer(&desc), per_buffer(&desc));
        RemoteSegment {
            id,
            chosen,
            attached,
            host,
            rpc_port,
            routes,
            desc,
            secret,
            spans,
            rail_names,
            stale: std::sync::atomic::AtomicBool::new(false),
            owner_seen: std::sync::atomic::AtomicU64::new(0),
            fetched: std::time::Instant::now(),
            for_unknown_range: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether a request for a range this descriptor does not list should fetch it again:
    /// yes, unless this descriptor was itself fetched for such a range and found nothing new
    /// less than `min_age` ago (so bad requests cannot make every submit a round trip, while a
    /// peer registering buffer after buffer is followed at once).
    pub fn refetch_for_unknown_range(&self, min_age: std::time::Duration) -> bool {
        !self
            .for_unknown_range
            .load(std::sync::atomic::Ordering::Acquire)
            || self.fetched.elapsed() >= min_age
    }

    /// Whether this descriptor lists the same memory (ranges and permissions) as `other`.
    pub fn lists_same_memory(&self, other: &RemoteSegment) -> bool {
        self.spans == other.spans
    }

    /// Marks this descriptor as fetched for a range its predecessor did not list, finding
    /// nothing new.
    pub fn fetched_for_unknown_range(&self) {
        self.for_unknown_range
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Marks the descriptor as no longer trusted (the peer refused our secret, or stopped
    /// answering): the engine fetches it again before the next transfer to this segment.
    pub fn mark_stale(&self) {
        self.stale.store(true, std::sync::atomic::Ordering::Release);
    }

    /// The pid of the segment's owning process on this host, when proven ([`Origin`]): the
    /// process same-host transports may reach. A descriptor's unproven `te_owner` is no answer.
    pub fn owner_pid(&self) -> Option<u32> {
        self.desc.origin.pid()
    }

    /// What proves who owns the descriptor.
    pub fn origin(&self) -> Origin {
        self.desc.origin
    }

    /// Whether the segment's owning process (on this host) still runs; `None` when the
    /// descriptor does not say who owns it.
    pub fn owner_alive(&self) -> Option<bool> {
        let pid = self.owner_pid()?;
        Some(process_identity(pid).as_deref() == self.desc.te_owner.as_deref())
    }

    /// As [`owner_alive`](Self::owner_alive), answered from a check made within `max_age` when
    /// there is one (reading `/proc` costs microseconds; a transport asks on every post). An
    /// exit stays seen.
    pub fn owner_alive_within(&self, max_age: std::time::Duration) -> Option<bool> {
        use std::sync::atomic::Ordering;
        self.desc.te_owner.as_ref()?;
        // The coarse clock: this runs on every post, and an age off by a tick does not matter.
        let now = te_sys::coarse_monotonic_ns();
        let max_age = u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX);
        let seen = self.owner_seen.load(Ordering::Acquire);
        if seen & OWNER_CHECKED != 0 {
            if seen & OWNER_ALIVE == 0 {
                return Some(false);
            }
            if now.saturating_sub(seen >> 2) <= max_age {
                return Some(true);
            }
        }
        let alive = self.owner_alive()?;
        let packed = (now << 2) | OWNER_CHECKED | (u64::from(alive) * OWNER_ALIVE);
        // A check never overwrites one that found the owner gone (two threads may check at
        // once).
        let kept =
            self.owner_seen
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                    match old & (OWNER_CHECKED | OWNER_ALIVE) == OWNER_CHECKED {
                        true => None,
                        false => Some(packed),
                    }
                });
        Some(alive && kept.is_ok())
    }

    /// Whether the segment's owner is proven to run on this host ([`Origin`]): only then may
    /// same-host transports use what its descriptor names here.
    pub fn same_host(&self) -> bool {
        self.desc.origin.pid().is_some()
    }

    /// Whether [`mark_stale`](Self::mark_stale) was called.
    pub fn is_stale(&self) -> bool {
        self.stale.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The rails the segment serves on, by NIC name (`default` for a single unnamed rail).
    pub fn rail_names(&self) -> &[String] {
        &self.rail_names
    }

    /// The id `open_segment` returned.
    pub fn id(&self) -> SegmentId {
        self.id
    }
    /// The segment name.
    pub fn name(&self) -> &str {
        &self.desc.name
    }
    /// Host the peer is reached at (its control listener's address).
    pub fn host(&self) -> &str {
        &self.host
    }
    /// Port of the peer's control listener.
    pub fn rpc_port(&self) -> u16 {
        self.rpc_port
    }
    /// The descriptor as published.
    pub fn desc(&self) -> &SegmentDesc {
        &self.desc
    }
    /// The secret requests to this segment must carry.
    pub fn secret(&self) -> SegmentSecret {
        self.secret
    }

    /// Checks that `[addr, addr+len)` lies in one published buffer that permits `op`, and
    /// returns that buffer.
    ///
    /// # Errors
    /// [`Error::RemoteAddressNotRegistered`] or [`Error::PermissionDenied`].
    pub fn check_access(&self, addr: u64, len: u64, op: Opcode) -> Result<&BufferDesc> {
        self.buffer_for(addr, len, op)
            .map(|i| &self.desc.buffers[i])
    }

    /// As [`check_access`](Self::check_access): the buffer's index in the descriptor.
    ///
    /// # Errors
    /// [`Error::RemoteAddressNotRegistered`] or [`Error::PermissionDenied`].
    pub fn buffer_for(&self, addr: u64, len: u64, op: Opcode) -> Result<usize> {
        let not_registered = || Error::RemoteAddressNotRegistered {
            segment: self.desc.name.clone(),
            addr,
            len,
        };
        let end = addr.checked_add(len).ok_or_else(not_registered)?;
        let idx = self.spans.partition_point(|s| s.0 <= addr);
        let &(start, length, permission, buffer) = idx
            .checked_sub(1)
            .and_then(|i| self.spans.get(i))
            .ok_or_else(not_registered)?;
        if len == 0 || end > start + length {
            return Err(not_registered());
        }
        if !permission.allows_remote(op) {
            return Err(Error::PermissionDenied {
                segment: self.desc.name.clone(),
                addr,
                operation: op.as_str(),
            });
        }
        Ok(buffer)
    }

    /// The transport chosen for buffer `index` when the engine's transports were at `epoch`,
    /// if one was; else `choose()`'s answer, kept for later asks at the same epoch. The choice
    /// depends only on the descriptor and the transport set, so it is made once per buffer
    /// instead of once per submit. A choice kept from an older epoch is never returned (nor
    /// replaced: a transport installed after a segment is opened costs that segment the full
    /// choice on every submit, which is what every submit cost before). Generic over what is
    /// chosen (the engine's `dyn Transport`), so that segments know nothing of transports.
    pub(crate) fn chosen<T: ?Sized + Send + Sync + 'static>(
        &self,
        index: usize,
        epoch: u64,
        choose: impl FnOnce() -> Result<Arc<T>>,
    ) -> Result<Arc<T>> {
        let slot = &self.chosen[index];
        if let Some(kept) = slot.get()
            && kept.epoch == epoch
            && let Some(t) = kept
                .choice
                .downcast_ref::<Weak<T>>()
                .and_then(Weak::upgrade)
        {
            return Ok(t);
        }
        let t = choose()?;
        let _ = slot.set(Chosen {
            epoch,
            choice: Box::new(Arc::downgrade(&t)),
        });
        Ok(t)
    }

    /// What a transport keeps for buffer `index` of this descriptor (te-shm's mapping of the
    /// peer's file), made by `make` on first use and dropped with the descriptor: a look-up
    /// that takes no lock and no reference count, for a transport that asks on every slice.
    /// `None` when the buffer already holds something of another type (two transports
    /// attaching to one buffer): the caller then does without. An out-of-range `index` is
    /// `None` too.
    ///
    /// # Errors
    /// `make`'s, when it fails; nothing is kept then, and the next call tries again.
    pub fn attached<T, E>(
        &self,
        index: usize,
        make: impl FnOnce() -> std::result::Result<T, E>,
    ) -> std::result::Result<Option<&T>, E>
    where
        T: std::any::Any + Send + Sync,
    {
        let Some(slot) = self.attached.get(index) else {
            return Ok(None);
        };
        if slot.get().is_none() {
            let made: Attachment = Box::new(make()?);
            // Two threads may make one at once: the first kept wins, the other is dropped.
            let _ = slot.set(made);
        }
        Ok(slot.get().and_then(|a| a.downcast_ref::<T>()))
    }

    /// The rail candidates for buffer `index` (its location in the segment's priority matrix,
    /// among the rails it serves), worked out once per descriptor.
    pub(crate) fn candidates(&self, index: usize) -> &Arc<crate::router::Candidates> {
        self.routes[index].get_or_init(|| {
            Arc::new(crate::router::Candidates::for_location(
                self.desc.priority_matrix.as_ref(),
                &self.desc.buffers[index].name,
                &self.rail_names,
            ))
        })
    }
}

/// One empty slot per buffer of `desc`, filled on first use.
fn per_buffer<T>(desc: &SegmentDesc) -> Box<[std::sync::OnceLock<T>]> {
    desc.buffers
        .iter()
        .map(|_| std::sync::OnceLock::new())
        .collect()
}

/// What a transport keeps for one buffer of a descriptor.
type Attachment = Box<dyn std::any::Any + Send + Sync>;

/// A buffer's transport as chosen at one epoch of the engine's transport set. Weak: a
/// transport may hold segments (its connections), and a segment must not keep it alive.
#[derive(Debug)]
struct Chosen {
    epoch: u64,
    /// A `Weak` of what was chosen.
    choice: Attachment,
}

/// Opened segments by name and by id.
#[derive(Debug, Default)]
pub struct SegmentCache {
    inner: Mutex<CacheInner>,
}

#[derive(Debug, Default)]
struct CacheInner {
    next_id: SegmentId,
    by_name: HashMap<String, SegmentId>,
    /// By id: engine-made, so hashed with one multiply.
    by_id: HashMap<SegmentId, Arc<RemoteSegment>, te_sys::hashing::IdHashing>,
}

impl SegmentCache {
    /// The cached segment called `name`.
    pub fn by_name(&self, name: &str) -> Option<Arc<RemoteSegment>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .by_name
            .get(name)
            .and_then(|id| inner.by_id.get(id))
            .cloned()
    }

    /// The segment opened as `id`.
    pub fn by_id(&self, id: SegmentId) -> Option<Arc<RemoteSegment>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_id.get(&id).cloned()
    }

    /// Stores a freshly fetched descriptor, keeping the id if the name was open already.
    pub fn insert(&self, host: String, rpc_port: u16, desc: SegmentDesc) -> Arc<RemoteSegment> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let id = match inner.by_name.get(&desc.name) {
            Some(id) => *id,
            None => {
                inner.next_id += 1;
                inner.next_id
            }
        };
        inner.by_name.insert(desc.name.clone(), id);
        let seg = Arc::new(RemoteSegment::new(id, host, rpc_port, desc));
        inner.by_id.insert(id, seg.clone());
        seg
    }

    /// Every open segment.
    pub fn all(&self) -> Vec<Arc<RemoteSegment>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_id.values().cloned().collect()
    }

    /// Forgets a segment; slices already posted keep their own reference.
    pub fn remove(&self, id: SegmentId) -> Option<Arc<RemoteSegment>> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let seg = inner.by_id.remove(&id)?;
        inner.by_name.remove(seg.name());
        Some(seg)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn owned_by(owner: Option<String>) -> RemoteSegment {
        let mut desc = SegmentDesc::from_json(
            br#"{"name":"h:1","protocol":"tcp","tcp_data_port":9,"buffers":[]}"#,
        )
        .unwrap();
        // As if proven: these tests are about the checks made after.
        desc.origin = match &owner {
            Some(o) => Origin::Served {
                pid: o.split(':').next().unwrap().parse().unwrap(),
            },
            None => Origin::Unproven,
        };
        desc.te_owner = owner;
        RemoteSegment::new(1, "h".into(), 1, desc)
    }

    #[test]
    fn an_owner_check_is_kept_for_its_age_and_an_exit_stays_seen() {
        const HOUR: Duration = Duration::from_secs(3600);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let seg = owned_by(process_identity(child.id()));
        assert_eq!(seg.owner_alive_within(HOUR), Some(true));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(seg.owner_alive(), Some(false));
        // The check made above is young enough: it answers without looking again.
        assert_eq!(seg.owner_alive_within(HOUR), Some(true));
        // Looked at again (once the coarse clock has moved on), the exit is seen, and stays
        // seen however young the check may be.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(seg.owner_alive_within(Duration::ZERO), Some(false));
        assert_eq!(seg.owner_alive_within(HOUR), Some(false));
    }

    #[test]
    fn an_attachment_is_made_once_per_buffer_kept_by_type_and_not_kept_on_failure() {
        let desc = SegmentDesc::from_json(
            br#"{"name":"h:1","protocol":"tcp","tcp_data_port":9,"buffers":[
                {"name":"cpu:0","addr":4096,"length":4096,"lkey":[],"rkey":[]},
                {"name":"cpu:0","addr":16384,"length":4096,"lkey":[],"rkey":[]}]}"#,
        )
        .unwrap();
        let seg = RemoteSegment::new(1, "h".into(), 1, desc);
        let made = std::cell::Cell::new(0);
        let make = |v: u32| {
            made.set(made.get() + 1);
            Ok::<u32, String>(v)
        };
        // A failure keeps nothing: the next call makes it again.
        assert_eq!(
            seg.attached::<u32, _>(0, || Err("no file".to_string())),
            Err("no file".into())
        );
        assert_eq!(seg.attached(0, || make(7)), Ok(Some(&7)));
        assert_eq!(
            seg.attached(0, || make(8)),
            Ok(Some(&7)),
            "kept, not made again"
        );
        assert_eq!(seg.attached(1, || make(9)), Ok(Some(&9)), "one per buffer");
        assert_eq!(made.get(), 2);
        // Another type on a taken buffer: none, and the kept one stays.
        assert_eq!(seg.attached(0, || Ok::<u64, String>(1)), Ok(None));
        assert_eq!(seg.attached(0, || make(10)), Ok(Some(&7)));
        assert_eq!(seg.attached(2, || make(11)), Ok(None), "no buffer 2");
        assert_eq!(made.get(), 2);
    }

    #[test]
    fn a_segment_without_an_owner_has_no_answer() {
        assert_eq!(owned_by(None).owner_alive_within(Duration::ZERO), None);
    }
}
