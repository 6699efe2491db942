//! Registration: local memory the engine's transports may move (host buffers te owns, raw
//! ranges, te-owned device memory), where each lies (`*` resolved to a NUMA node or GPU), and
//! the republication of the segment's descriptor after each change. Not here: the region table
//! itself (`memory`) or what transports do when a region comes and goes.

use std::sync::Arc;

use super::TransferEngine;
use crate::error::{Error, Result};
use crate::memory::{Location, Permission, Region};
use te_sys::HostBuffer;

impl TransferEngine {
    fn resolve_location(&self, addr: u64, location: &str) -> Result<Location> {
        match location.parse::<Location>()? {
            Location::Any => {
                // Device memory resolves to its GPU (pointer attributes), when CUDA is here.
                #[cfg(feature = "cuda")]
                if let Some(device) = te_cuda::driver().ok().and_then(|c| c.device_of(addr)) {
                    return self.resolve_location(addr, &format!("cuda:{device}"));
                }
                Ok(Location::Cpu(te_sys::numa_node_of(addr).unwrap_or(0)))
            }
            Location::Cuda(n) => {
                use crate::transport::Capabilities as C;
                let gpu = [
                    C::GPU_LOCAL,
                    C::GPU_REMOTE_HOST,
                    C::GPU_SAME_HOST,
                    C::GPU_FILE,
                ];
                let served = self
                    .core
                    .transports()
                    .iter()
                    .any(|t| gpu.iter().any(|&c| t.capabilities().contains(c)));
                match served {
                    true => Ok(Location::Cuda(n)),
                    false => Err(no_gpu_path(location)),
                }
            }
            cpu => Ok(cpu),
        }
    }

    fn register_regions(&self, regions: Vec<Region>) -> Result<()> {
        let added = self.regions.insert_all(regions)?;
        let transports = self.core.transports();
        for (ti, t) in transports.iter().enumerate() {
            for (i, r) in added.iter().enumerate() {
                if let Err(e) = t.register(r) {
                    // Roll back: this transport's earlier regions, every earlier transport, the table.
                    added[..i].iter().for_each(|done| t.unregister(done));
                    for earlier in &transports[..ti] {
                        added.iter().for_each(|done| earlier.unregister(done));
                    }
                    let addrs: Vec<u64> = added.iter().map(|r| r.addr()).collect();
                    let _ = self.regions.remove_all(&addrs);
                    return Err(e);
                }
            }
        }
        self.publish()?;
        match self.policy().map(|p| p.registered(&added)) {
            Some(Err(e)) => {
                let addrs: Vec<u64> = added.iter().map(|r| r.addr()).collect();
                let _ = self.unregister_memory_batch(&addrs);
                Err(e)
            }
            _ => Ok(()),
        }
    }

    /// Registers memory `owner` keeps allocated; the region holds `owner` until unregistered.
    fn register_owned(
        &self,
        (addr, len): (u64, usize),
        location: &str,
        permission: Permission,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<()> {
        let location = self.resolve_location(addr, location)?;
        self.register_regions(vec![Region::new(
            addr,
            len as u64,
            location,
            permission,
            Some(owner),
        )])
    }

    /// Registers a te-owned buffer; the engine keeps it alive until it is unregistered.
    ///
    /// # Errors
    /// As [`register_memory`](Self::register_memory).
    pub fn register_buffer(
        &self,
        buffer: &Arc<HostBuffer>,
        location: &str,
        permission: Permission,
    ) -> Result<()> {
        let owner = buffer.clone();
        self.register_owned((buffer.addr(), buffer.len()), location, permission, owner)
    }

    /// Registers te-owned device memory (feature `cuda`); the engine keeps it alive until it
    /// is unregistered. `location` `*` resolves to the buffer's GPU.
    ///
    /// # Errors
    /// As [`register_memory`](Self::register_memory).
    #[cfg(feature = "cuda")]
    pub fn register_device_buffer(
        &self,
        buffer: &Arc<te_cuda::DeviceBuffer>,
        location: &str,
        permission: Permission,
    ) -> Result<()> {
        let owner = buffer.clone();
        self.register_owned((buffer.addr(), buffer.len()), location, permission, owner)
    }

    /// Registers `[addr, addr+len)` (Mooncake's `registerLocalMemory`).
    ///
    /// # Safety
    /// The range must be memory of this process that stays allocated, readable and writable
    /// until `unregister_memory` succeeds for it: peers and transports read and write it from
    /// other threads meanwhile.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (zero length, null, overflow, bad location),
    /// [`Error::AddressOverlapped`], or a transport's refusal.
    #[allow(unsafe_code)]
    pub unsafe fn register_memory(
        &self,
        addr: *mut u8,
        len: usize,
        location: &str,
        permission: Permission,
    ) -> Result<()> {
        let addr = addr as u64;
        let location = self.resolve_location(addr, location)?;
        self.register_regions(vec![Region::new(
            addr, len as u64, location, permission, None,
        )])
    }

    /// Registers several ranges at once, all or none, with one republication.
    ///
    /// # Safety
    /// As [`register_memory`](Self::register_memory), for every range.
    ///
    /// # Errors
    /// As [`register_memory`](Self::register_memory).
    #[allow(unsafe_code)]
    pub unsafe fn register_memory_batch(
        &self,
        ranges: &[(*mut u8, usize)],
        location: &str,
        permission: Permission,
    ) -> Result<()> {
        let regions = ranges
            .iter()
            .map(|&(addr, len)| {
                let addr = addr as u64;
                Ok(Region::new(
                    addr,
                    len as u64,
                    self.resolve_location(addr, location)?,
                    permission,
                    None,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        self.register_regions(regions)
    }

    /// Pins the local region holding `[addr, addr+len)`: while the pin lives the region stays
    /// registered (unregistering it answers [`Error::RegionBusy`]), so the range stays
    /// allocated. For bindings that copy into or out of registered memory on a caller's behalf.
    ///
    /// # Errors
    /// [`Error::AddressNotRegistered`] when no single region holds the range.
    pub fn pin_local(&self, addr: u64, len: u64) -> Result<crate::memory::RegionPin> {
        self.regions.pin_local(addr, len)
    }

    /// Unregisters the region starting at `addr`.
    ///
    /// # Errors
    /// [`Error::AddressNotRegistered`], or [`Error::RegionBusy`] while slices of this engine use
    /// it (peers' requests being served are waited for, up to [`crate::memory::REMOTE_DRAIN`]).
    pub fn unregister_memory(&self, addr: u64) -> Result<()> {
        self.unregister_memory_batch(&[addr])
    }

    /// Unregisters several regions, all or none.
    ///
    /// # Errors
    /// As [`unregister_memory`](Self::unregister_memory).
    pub fn unregister_memory_batch(&self, addrs: &[u64]) -> Result<()> {
        let removed = self.regions.remove_all(addrs)?;
        for t in self.core.transports() {
            for r in &removed {
                t.unregister(r);
            }
        }
        let published = self.publish();
        if let Some(policy) = self.policy() {
            policy.unregistered(&removed);
        }
        published
    }
}

/// Why GPU memory at `location` cannot be registered when no transport handles it: no CUDA
/// driver or device here (the usual case on a machine without a GPU), else no transport for it.
fn no_gpu_path(location: &str) -> Error {
    #[cfg(feature = "cuda")]
    if let Err(e) = te_cuda::driver() {
        let why = match e {
            te_cuda::Error::Gpu(why) => why,
            other => other.to_string(),
        };
        return Error::Gpu(format!("location {location}: {why}"));
    }
    Error::InvalidArgument(format!(
        "location {location}: no installed transport handles GPU memory"
    ))
}
