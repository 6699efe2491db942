//! Registered memory: the local region table, its locations and permissions, and pins.
//!
//! A [`Region`] is a registered range `[addr, addr+len)` with a [`Location`] and a [`Permission`].
//! The [`RegionTable`] refuses zero-length, overflowing and overlapping ranges, answers
//! "which region holds this range", and counts in-flight users through [`RegionPin`]s so that a
//! region cannot be unregistered while a slice still reads or writes it.
//! It does not touch the memory itself; [`HostBuffer`](te_sys::HostBuffer) owns memory.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Where a region's memory lives, in Mooncake's spelling (`cpu:0`, `cuda:1`, `*`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Location {
    /// Host memory on a NUMA node.
    Cpu(u32),
    /// Memory of a CUDA device.
    Cuda(u32),
    /// Detect at registration (host memory: the NUMA node of the first page).
    Any,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Cpu(n) => write!(f, "cpu:{n}"),
            Location::Cuda(n) => write!(f, "cuda:{n}"),
            Location::Any => f.write_str("*"),
        }
    }
}

impl FromStr for Location {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::InvalidArgument(format!("location {s:?}: expected cpu:N, cuda:N or *"));
        if s == "*" {
            return Ok(Location::Any);
        }
        let (kind, index) = s.split_once(':').ok_or_else(bad)?;
        let index: u32 = index.parse().map_err(|_| bad())?;
        match kind {
            "cpu" => Ok(Location::Cpu(index)),
            "cuda" => Ok(Location::Cuda(index)),
            _ => Err(bad()),
        }
    }
}

/// Direction of a transfer, seen from the initiator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Opcode {
    /// Remote → local.
    Read,
    /// Local → remote.
    Write,
}

impl Opcode {
    /// The metrics' `operation` label.
    pub fn operation(self) -> te_metrics::counters::Operation {
        match self {
            Opcode::Read => te_metrics::counters::Operation::Read,
            Opcode::Write => te_metrics::counters::Operation::Write,
        }
    }

    /// "read" or "write".
    pub fn as_str(self) -> &'static str {
        match self {
            Opcode::Read => "read",
            Opcode::Write => "write",
        }
    }
}

/// What a remote peer may do with a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Permission {
    /// Only this process uses it (a local source or destination); never published.
    LocalOnly,
    /// Peers may READ from it.
    RemoteRead,
    /// Peers may READ from and WRITE into it.
    RemoteReadWrite,
}

impl Permission {
    /// Whether a remote peer may perform `op` on a region with this permission.
    pub fn allows_remote(self, op: Opcode) -> bool {
        match (self, op) {
            (Permission::LocalOnly, _) => false,
            (Permission::RemoteRead, Opcode::Read) => true,
            (Permission::RemoteRead, Opcode::Write) => false,
            (Permission::RemoteReadWrite, _) => true,
        }
    }

    /// The spelling used in segment descriptors.
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::LocalOnly => "local_only",
            Permission::RemoteRead => "remote_read",
            Permission::RemoteReadWrite => "remote_read_write",
        }
    }

    /// Parses the descriptor spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "local_only" => Some(Permission::LocalOnly),
            "remote_read" => Some(Permission::RemoteRead),
            "remote_read_write" => Some(Permission::RemoteReadWrite),
            _ => None,
        }
    }
}

/// One registered range.
pub struct Region {
    addr: u64,
    len: u64,
    location: Location,
    permission: Permission,
    pins: AtomicU64,
    /// Of `pins`, those held by peers' requests being served (a target's pins).
    remote_pins: AtomicU64,
    /// Being unregistered: peers' requests are refused while those being served drain.
    closing: AtomicBool,
    /// Where an unregistering thread waits for the peers' pins to drain.
    drain_lock: Mutex<()>,
    drained: Condvar,
    _owner: Option<Arc<dyn Any + Send + Sync>>,
    /// This engine's rail candidates for the region's location, worked out on first use.
    route: std::sync::OnceLock<Arc<crate::router::Candidates>>,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("location", &self.location)
            .field("permission", &self.permission)
            .finish()
    }
}

impl Region {
    /// Describes a range; `owner` (if any) is kept alive while the region is registered.
    pub fn new(
        addr: u64,
        len: u64,
        location: Location,
        permission: Permission,
        owner: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Self {
        Region {
            addr,
            len,
            location,
            permission,
            pins: AtomicU64::new(0),
            remote_pins: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            drain_lock: Mutex::new(()),
            drained: Condvar::new(),
            _owner: owner,
            route: std::sync::OnceLock::new(),
        }
    }

    /// The rail candidates for this region's location: `compute` on first use, then kept (a
    /// region belongs to one engine, whose rails and matrix do not change).
    pub(crate) fn candidates(
        &self,
        compute: impl FnOnce() -> crate::router::Candidates,
    ) -> &Arc<crate::router::Candidates> {
        self.route.get_or_init(|| Arc::new(compute()))
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Always false: zero-length regions are refused at registration.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Where the memory lives.
    pub fn location(&self) -> &Location {
        &self.location
    }
    /// What peers may do.
    pub fn permission(&self) -> Permission {
        self.permission
    }
    /// Transfers currently holding the region.
    pub fn pins(&self) -> u64 {
        self.pins.load(Ordering::Acquire)
    }
    fn end(&self) -> u64 {
        self.addr + self.len
    }

    /// Waits until no peer's request holds the region, or `until` (the caller set `closing`).
    fn drain(&self, until: Instant) {
        let mut guard = self.drain_lock.lock().unwrap_or_else(|e| e.into_inner());
        while self.remote_pins.load(Ordering::SeqCst) > 0 {
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                return;
            };
            guard =
                (self.drained.wait_timeout(guard, left)).map_or_else(|e| e.into_inner().0, |g| g.0);
        }
    }
    /// Whether `[addr, addr+len)` lies inside this region (`len` > 0, no overflow).
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        match addr.checked_add(len) {
            Some(end) => len > 0 && addr >= self.addr && end <= self.end(),
            None => false,
        }
    }
}

/// Holds a region registered while a transfer uses it; dropping it releases the hold.
#[derive(Debug)]
pub struct RegionPin {
    region: Arc<Region>,
    /// Held for a peer's request ([`RegionTable::pin_remote`]).
    remote: bool,
}

impl RegionPin {
    /// The pinned region.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// `[addr, addr+len)` of the pinned region, for the kernel or a copy to move bytes
    /// through: `None` unless the range (not empty) lies inside the region and the region is
    /// host memory.
    pub fn range(&self, addr: u64, len: usize) -> Option<te_sys::PinnedRange<'_>> {
        let region = &self.region;
        if !region.contains(addr, len as u64) || matches!(region.location, Location::Cuda(_)) {
            return None;
        }
        // SAFETY: the range lies inside a registered host region, valid memory while it is
        // registered (the registration contract); this pin keeps it registered while the
        // range borrows it.
        #[allow(unsafe_code)]
        Some(unsafe { te_sys::PinnedRange::new(addr, len) })
    }
}

impl Drop for RegionPin {
    fn drop(&mut self) {
        let region = &self.region;
        // All pins first, then peers': read in the other order, pins less peers' pins never
        // counts a peer's pin as a transfer of this engine.
        let before = region.pins.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before != 0, "a region's pin released twice");
        if self.remote {
            // With a full fence on both sides, either this sees `closing` and wakes the
            // unregistering thread, or that thread sees the count this leaves.
            let left = region.remote_pins.fetch_sub(1, Ordering::SeqCst) - 1;
            if left == 0 && region.closing.load(Ordering::SeqCst) {
                drop(region.drain_lock.lock().unwrap_or_else(|e| e.into_inner()));
                region.drained.notify_all();
            }
        }
    }
}

/// Why a remote access was refused by [`RegionTable::pin_remote`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessDenied {
    /// Zero length or `addr + len` overflows.
    BadRange,
    /// The range is not inside one registered region.
    OutOfBounds,
    /// The region is local-only, or read-only for a WRITE.
    Permission,
}

/// How long unregistering waits for peers' requests that hold a region to be served.
pub const REMOTE_DRAIN: Duration = Duration::from_secs(1);

/// The local registered regions, keyed by start address.
#[derive(Debug, Default)]
pub struct RegionTable {
    regions: RwLock<BTreeMap<u64, Arc<Region>>>,
}

impl RegionTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn check_new(map: &BTreeMap<u64, Arc<Region>>, region: &Region) -> Result<()> {
        if region.len == 0 {
            return Err(Error::InvalidArgument(format!(
                "zero-length region at {:#x}",
                region.addr
            )));
        }
        if region.addr == 0 {
            return Err(Error::InvalidArgument("null address".into()));
        }
        let end = region.addr.checked_add(region.len).ok_or_else(|| {
            Error::InvalidArgument(format!("{:#x}+{} overflows", region.addr, region.len))
        })?;
        // The region starting at or before `end - 1` with the highest start is the only candidate.
        if let Some((_, other)) = map.range(..end).next_back() {
            if other.end() > region.addr {
                return Err(Error::AddressOverlapped {
                    addr: region.addr,
                    len: region.len,
                    existing: other.addr,
                    existing_len: other.len,
                });
            }
        }
        Ok(())
    }

    /// Adds every region or none: a refused one leaves the table unchanged.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero length, a null address or overflow;
    /// [`Error::AddressOverlapped`] when a range overlaps a registered one or another in `regions`.
    pub fn insert_all(&self, regions: Vec<Region>) -> Result<Vec<Arc<Region>>> {
        let mut map = self.regions.write().unwrap_or_else(|e| e.into_inner());
        let mut added = Vec::with_capacity(regions.len());
        for region in regions {
            if let Err(e) = Self::check_new(&map, &region) {
                for r in &added {
                    let r: &Arc<Region> = r;
                    map.remove(&r.addr);
                }
                return Err(e);
            }
            let region = Arc::new(region);
            map.insert(region.addr, region.clone());
            added.push(region);
        }
        Ok(added)
    }

    /// Removes the regions starting at each of `addrs`, all or none.
    ///
    /// A region that only peers' requests hold (a target serving a READ sends its last bytes
    /// and lets go a moment after the initiator may have seen them) is waited for, up to
    /// [`REMOTE_DRAIN`], refusing peers' new requests meanwhile; a transfer of this engine
    /// holding one is refused at once.
    ///
    /// # Errors
    /// [`Error::AddressNotRegistered`] if an address starts no region;
    /// [`Error::RegionBusy`] while a transfer of this engine holds one of them, or a peer's
    /// request still does after [`REMOTE_DRAIN`].
    pub fn remove_all(&self, addrs: &[u64]) -> Result<Vec<Arc<Region>>> {
        let until = Instant::now() + REMOTE_DRAIN;
        loop {
            let mut map = self.regions.write().unwrap_or_else(|e| e.into_inner());
            let mut draining = Vec::new();
            for addr in addrs {
                let region = map.get(addr).ok_or(Error::AddressNotRegistered {
                    addr: *addr,
                    len: 0,
                })?;
                // Peers' pins first (see `RegionPin`'s drop); none is added under this lock.
                let remote = region.remote_pins.load(Ordering::SeqCst);
                let pins = region.pins.load(Ordering::SeqCst);
                if pins > remote || (remote > 0 && Instant::now() >= until) {
                    for a in addrs {
                        if let Some(r) = map.get(a) {
                            r.closing.store(false, Ordering::SeqCst);
                        }
                    }
                    return Err(Error::RegionBusy { addr: *addr, pins });
                }
                if remote > 0 {
                    region.closing.store(true, Ordering::SeqCst);
                    draining.push(region.clone());
                }
            }
            if draining.is_empty() {
                return Ok(addrs.iter().filter_map(|a| map.remove(a)).collect());
            }
            drop(map);
            // Drained or not, the next round decides (under the lock again); peers' requests
            // stay refused until then.
            for region in &draining {
                region.drain(until);
            }
        }
    }

    fn find(map: &BTreeMap<u64, Arc<Region>>, addr: u64, len: u64) -> Option<&Arc<Region>> {
        map.range(..=addr)
            .next_back()
            .map(|(_, r)| r)
            .filter(|r| r.contains(addr, len))
    }

    fn pin_of(region: &Arc<Region>) -> RegionPin {
        region.pins.fetch_add(1, Ordering::AcqRel);
        RegionPin {
            region: region.clone(),
            remote: false,
        }
    }

    /// Pins `region` once more without looking it up: only for a region that a pin the caller
    /// holds keeps registered (submit's next request in the region of the one before).
    pub(crate) fn pin_again(region: &Arc<Region>) -> RegionPin {
        Self::pin_of(region)
    }

    /// Pins the region holding `[addr, addr+len)` for a local transfer.
    ///
    /// # Errors
    /// [`Error::AddressNotRegistered`] when no single region holds the range.
    pub fn pin_local(&self, addr: u64, len: u64) -> Result<RegionPin> {
        let map = self.regions.read().unwrap_or_else(|e| e.into_inner());
        // A match, not `ok_or`: the error is built (and dropped) only when it is returned, and
        // this runs once per request.
        match Self::find(&map, addr, len) {
            Some(region) => Ok(Self::pin_of(region)),
            None => Err(Error::AddressNotRegistered { addr, len }),
        }
    }

    /// Pins the region holding `[addr, addr+len)` for a remote peer's `op`, checking the permission.
    ///
    /// # Errors
    /// The [`AccessDenied`] reason; nothing is pinned then.
    pub fn pin_remote(
        &self,
        addr: u64,
        len: u64,
        op: Opcode,
    ) -> std::result::Result<RegionPin, AccessDenied> {
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(AccessDenied::BadRange);
        }
        let map = self.regions.read().unwrap_or_else(|e| e.into_inner());
        let region = Self::find(&map, addr, len).ok_or(AccessDenied::OutOfBounds)?;
        if !region.permission.allows_remote(op) {
            return Err(AccessDenied::Permission);
        }
        // Counted under the table's lock: an unregistering thread that set `closing` under
        // its write lock sees this count, or this sees `closing`.
        if region.closing.load(Ordering::SeqCst) {
            return Err(AccessDenied::OutOfBounds);
        }
        region.remote_pins.fetch_add(1, Ordering::SeqCst);
        let mut pin = Self::pin_of(region);
        pin.remote = true;
        Ok(pin)
    }

    /// Every registered region, in address order.
    pub fn snapshot(&self) -> Vec<Arc<Region>> {
        let map = self.regions.read().unwrap_or_else(|e| e.into_inner());
        map.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(addr: u64, len: u64, permission: Permission) -> Region {
        Region::new(addr, len, Location::Cpu(0), permission, None)
    }

    #[test]
    fn a_pin_lends_ranges_of_its_own_host_region_only() {
        let mut host = vec![0u8; 64];
        let base = host.as_mut_ptr() as u64;
        let table = RegionTable::new();
        let owner: Arc<dyn Any + Send + Sync> = Arc::new(());
        let regions = vec![
            Region::new(
                base,
                64,
                Location::Cpu(0),
                Permission::RemoteReadWrite,
                Some(owner),
            ),
            Region::new(
                0x7000_0000,
                64,
                Location::Cuda(0),
                Permission::RemoteReadWrite,
                None,
            ),
        ];
        table.insert_all(regions).unwrap();
        let pin = table.pin_remote(base + 8, 8, Opcode::Write).unwrap();
        let range = pin.range(base + 8, 8).expect("inside the region");
        range.put(b"12345678");
        assert_eq!(&host[8..16], b"12345678");
        // Anywhere in the pinned region, nowhere past it, never empty.
        assert!(pin.range(base, 64).is_some());
        assert!(pin.range(base + 60, 8).is_none());
        assert!(pin.range(base - 1, 2).is_none());
        assert!(pin.range(base, 0).is_none());
        // GPU memory is not the host's to address.
        let gpu = table.pin_remote(0x7000_0000, 8, Opcode::Read).unwrap();
        assert!(gpu.range(0x7000_0000, 8).is_none());
    }

    #[test]
    fn locations_round_trip() {
        for s in ["cpu:0", "cpu:3", "cuda:1", "*"] {
            assert_eq!(s.parse::<Location>().unwrap().to_string(), s);
        }
        for bad in ["", "cpu", "gpu:0", "cpu:x", "cpu:-1"] {
            assert!(bad.parse::<Location>().is_err(), "{bad}");
        }
    }

    #[test]
    fn overlap_zero_length_and_overflow_are_refused() {
        let t = RegionTable::new();
        t.insert_all(vec![region(0x1000, 0x1000, Permission::RemoteRead)])
            .unwrap();
        for (addr, len) in [
            (0x1800, 0x100),
            (0x0800, 0x1000),
            (0x1fff, 1),
            (0x0, 0x10000),
        ] {
            let err = t
                .insert_all(vec![region(addr.max(1), len, Permission::RemoteRead)])
                .unwrap_err();
            assert!(
                matches!(err, Error::AddressOverlapped { .. }),
                "{addr:#x}+{len}: {err}"
            );
        }
        assert!(matches!(
            t.insert_all(vec![region(0x9000, 0, Permission::RemoteRead)]),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            t.insert_all(vec![region(u64::MAX - 4, 16, Permission::RemoteRead)]),
            Err(Error::InvalidArgument(_))
        ));
        // Adjacent ranges are fine.
        t.insert_all(vec![
            region(0x2000, 0x1000, Permission::RemoteRead),
            region(0x0800, 0x0800, Permission::RemoteRead),
        ])
        .unwrap();
        assert_eq!(t.snapshot().len(), 3);
    }

    #[test]
    fn a_refused_batch_leaves_the_table_unchanged() {
        let t = RegionTable::new();
        let err = t
            .insert_all(vec![
                region(0x1000, 0x1000, Permission::RemoteRead),
                region(0x1800, 0x1000, Permission::RemoteRead),
            ])
            .unwrap_err();
        assert!(matches!(err, Error::AddressOverlapped { .. }));
        assert!(t.snapshot().is_empty());
    }

    #[test]
    fn pins_block_unregister_until_dropped() {
        let t = RegionTable::new();
        t.insert_all(vec![region(0x1000, 0x1000, Permission::RemoteReadWrite)])
            .unwrap();
        let pin = t.pin_local(0x1100, 0x100).unwrap();
        assert!(matches!(
            t.remove_all(&[0x1000]),
            Err(Error::RegionBusy { pins: 1, .. })
        ));
        drop(pin);
        assert_eq!(t.remove_all(&[0x1000]).unwrap().len(), 1);
        assert!(matches!(
            t.remove_all(&[0x1000]),
            Err(Error::AddressNotRegistered { .. })
        ));
    }

    #[test]
    fn unregistering_waits_for_peers_requests_and_refuses_new_ones_meanwhile() {
        let t = RegionTable::new();
        t.insert_all(vec![region(0x1000, 0x1000, Permission::RemoteReadWrite)])
            .unwrap();
        // A peer's READ being served: unregistering waits for it, and refuses the next one.
        let serving = t.pin_remote(0x1000, 16, Opcode::Read).unwrap();
        std::thread::scope(|s| {
            let remover = s.spawn(|| t.remove_all(&[0x1000]));
            while !t.snapshot()[0].closing.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            assert_eq!(
                t.pin_remote(0x1000, 16, Opcode::Read).unwrap_err(),
                AccessDenied::OutOfBounds
            );
            assert!(!remover.is_finished(), "waits for the request being served");
            drop(serving);
            let removed = remover.join().unwrap().unwrap();
            assert_eq!(removed.len(), 1);
        });
        assert!(t.snapshot().is_empty());
        // A peer that keeps its request past the drain: busy, and the region serves again.
        t.insert_all(vec![region(0x1000, 0x1000, Permission::RemoteReadWrite)])
            .unwrap();
        let stuck = t.pin_remote(0x1000, 16, Opcode::Write).unwrap();
        let started = std::time::Instant::now();
        assert!(matches!(
            t.remove_all(&[0x1000]),
            Err(Error::RegionBusy { pins: 1, .. })
        ));
        assert!(started.elapsed() >= REMOTE_DRAIN);
        assert!(t.pin_remote(0x1000, 16, Opcode::Read).is_ok());
        drop(stuck);
        // A transfer of this engine holding it: refused at once, not waited for.
        let own = t.pin_local(0x1000, 16).unwrap();
        let _peer = t.pin_remote(0x1000, 16, Opcode::Read).unwrap();
        let started = std::time::Instant::now();
        assert!(matches!(
            t.remove_all(&[0x1000]),
            Err(Error::RegionBusy { pins: 2, .. })
        ));
        assert!(started.elapsed() < REMOTE_DRAIN);
        drop(own);
    }

    #[test]
    fn remote_access_checks_bounds_and_permission() {
        let t = RegionTable::new();
        t.insert_all(vec![
            region(0x1000, 0x1000, Permission::RemoteRead),
            region(0x2000, 0x1000, Permission::RemoteReadWrite),
            region(0x4000, 0x1000, Permission::LocalOnly),
        ])
        .unwrap();
        use AccessDenied::{BadRange, OutOfBounds};
        const DENIED: AccessDenied = AccessDenied::Permission;
        let cases: &[(u64, u64, Opcode, Option<AccessDenied>)] = &[
            (0x1000, 0x1000, Opcode::Read, None),
            (0x1000, 0x1000, Opcode::Write, Some(DENIED)),
            (0x2000, 0x1000, Opcode::Write, None),
            (0x1800, 0x1000, Opcode::Read, Some(OutOfBounds)), // spans two regions
            (0x2fff, 2, Opcode::Read, Some(OutOfBounds)),
            (0x3000, 1, Opcode::Read, Some(OutOfBounds)),
            (0x4000, 1, Opcode::Read, Some(DENIED)),
            (0x1000, 0, Opcode::Read, Some(BadRange)),
            (u64::MAX, 2, Opcode::Read, Some(BadRange)),
        ];
        for &(addr, len, op, want) in cases {
            let got = t.pin_remote(addr, len, op).err();
            assert_eq!(got, want, "{addr:#x}+{len} {op:?}");
        }
        assert!(t.snapshot().iter().all(|r| r.pins() == 0));
        assert!(
            t.pin_local(0x4000, 0x10).is_ok(),
            "local-only is usable locally"
        );
    }
}
