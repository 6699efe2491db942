//! Fabric handles (TENT's MNNVL): device memory made through CUDA's virtual memory API
//! (`cuMemCreate`) with the fabric handle type, exported as 64 bytes that any process of the
//! NVLink domain imports and maps — on this host, or on another host of a multi-node NVLink
//! system (with IMEX running). Legacy IPC handles (`cuIpcGetMemHandle`, in `mod.rs`) cover
//! `cuMemAlloc` memory on one host only and cannot export this memory.
//!
//! What it offers: whether a device supports fabric handles, fabric allocations
//! ([`DeviceBuffer::new_fabric`]), the export of the allocation holding an address, and the
//! import (map) and unmapping of a peer's export. Not here: where handles are published or which
//! peers may use them (te-nvlink).

use cudarc::driver::sys;

use super::{Cuda, DeviceBuffer, gpu, use_device};
use crate::error::{Error, Result};

/// The largest fabric allocation te maps for a peer: bounds what a descriptor from the wire
/// can make this process reserve.
pub const MAX_FABRIC_MAPPING: u64 = 1 << 40;

/// What a peer needs to map the allocation holding an exported address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FabricExport {
    /// `cuMemExportToShareableHandle`'s 64 bytes.
    pub handle: [u8; 64],
    /// The address's offset in the allocation.
    pub offset: u64,
    /// The allocation's size (the mapping a peer makes).
    pub size: u64,
}

fn allocation_prop(device: u32) -> sys::CUmemAllocationProp {
    // SAFETY: the property struct is plain data; all-zero is its documented default.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC;
    prop.location = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device as i32,
    };
    prop.allocFlags.gpuDirectRDMACapable = 1;
    prop
}

fn access_to(id: i32) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

/// Grants read-write access to `[ptr, ptr+size)`: to `device` alone, or (`None`) to every
/// device of this process that can reach it — all at once, else one by one, failing only when
/// none can.
fn grant_access(devices: i32, device: Option<u32>, ptr: u64, size: usize) -> Result<()> {
    let set = |descs: &[sys::CUmemAccessDesc]| {
        // SAFETY: `[ptr, ptr+size)` is a range this module mapped; `descs` lives across the call.
        gpu("access to a mapping", unsafe {
            sys::cuMemSetAccess(ptr, size, descs.as_ptr(), descs.len())
        })
    };
    if let Some(d) = device {
        return set(&[access_to(d as i32)]);
    }
    let all: Vec<_> = (0..devices).map(access_to).collect();
    let Err(e) = set(&all) else {
        return Ok(());
    };
    match all
        .iter()
        .filter(|d| set(std::slice::from_ref(d)).is_ok())
        .count()
    {
        0 => Err(e),
        _ => Ok(()),
    }
}

/// Maps `handle` (size `size`) at a fresh reservation, accessible from `device` (or every
/// device that can reach it); releases the handle either way (the mapping keeps the memory).
fn map_handle(
    cuda: &Cuda,
    handle: u64,
    (size, align): (usize, usize),
    device: Option<u32>,
) -> Result<u64> {
    let mut ptr = 0u64;
    // SAFETY: a valid out-pointer; no fixed address is asked for.
    let reserved = gpu("address reservation", unsafe {
        sys::cuMemAddressReserve(&mut ptr, size, align, 0, 0)
    });
    let mapped = reserved.and_then(|()| {
        // SAFETY: `ptr` is a reservation of `size`; `handle` a live allocation handle.
        gpu("mapping", unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) })
    });
    // SAFETY: the handle is ours to release once; a mapping holds its own reference.
    let _ = unsafe { sys::cuMemRelease(handle) };
    let granted = mapped.and_then(|()| grant_access(cuda.devices, device, ptr, size));
    if let Err(e) = granted {
        if ptr != 0 {
            unmap(ptr, size);
        }
        return Err(e);
    }
    Ok(ptr)
}

/// Unmaps and frees a reservation made by [`map_handle`] (errors leave nothing to undo).
pub(super) fn unmap(ptr: u64, size: usize) {
    // SAFETY: `[ptr, ptr+size)` was reserved (and perhaps mapped) here; each call happens once.
    unsafe {
        let _ = sys::cuMemUnmap(ptr, size);
        let _ = sys::cuMemAddressFree(ptr, size);
    }
}

impl Cuda {
    /// Whether device `device` can export fabric handles (`HANDLE_TYPE_FABRIC_SUPPORTED`).
    pub fn fabric_supported(&self, device: u32) -> bool {
        let mut dev = 0;
        let mut supported = 0;
        // SAFETY: valid out-pointers; the driver checks the ordinal.
        let ok = unsafe { sys::cuDeviceGet(&mut dev, device as i32) }
            .result()
            .and_then(|()| {
                // SAFETY: as above.
                unsafe {
                    sys::cuDeviceGetAttribute(
                        &mut supported,
                        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
                        dev,
                    )
                }
                .result()
            });
        ok.is_ok() && supported != 0
    }

    /// The fabric export of the allocation holding `addr`: `Ok(None)` when `addr` is not memory
    /// of the virtual memory API (`cuMemAlloc` memory, which legacy IPC handles cover).
    ///
    /// # Errors
    /// The allocation was made without the fabric handle type (it cannot be shared at all), or
    /// the driver refused the export (no fabric manager or IMEX channel).
    pub fn fabric_export(&self, addr: u64) -> Result<Option<FabricExport>> {
        let Some(device) = self.device_of(addr) else {
            return Err(Error::InvalidArgument(format!(
                "{addr:#x} is not GPU memory"
            )));
        };
        use_device(device as i32)?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: a valid out-pointer; the driver looks `addr` up and fails for other memory.
        let retained = unsafe { sys::cuMemRetainAllocationHandle(&mut handle, addr as *mut _) };
        if retained.result().is_err() {
            return Ok(None);
        }
        let exported = self.export_retained(handle, addr);
        // SAFETY: the reference taken by cuMemRetainAllocationHandle, dropped once.
        let _ = unsafe { sys::cuMemRelease(handle) };
        exported.map(Some)
    }

    fn export_retained(&self, handle: u64, addr: u64) -> Result<FabricExport> {
        // SAFETY: the struct is plain data, filled by the driver.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out-pointer and a retained handle.
        gpu("allocation properties", unsafe {
            sys::cuMemGetAllocationPropertiesFromHandle(&mut prop, handle)
        })?;
        let fabric = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC;
        if prop.requestedHandleTypes.0 & fabric.0 == 0 {
            return Err(Error::InvalidArgument(format!(
                "{addr:#x} was allocated with cuMemCreate without the fabric handle type: it \
                 can be shared neither by fabric nor by legacy IPC handles (allocate it with \
                 CU_MEM_HANDLE_TYPE_FABRIC, e.g. te_cuda::DeviceBuffer::new_fabric)"
            )));
        }
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: valid out-pointers; `addr` is mapped device memory.
        gpu("address range", unsafe {
            sys::cuMemGetAddressRange_v2(&mut base, &mut size, addr)
        })?;
        // SAFETY: the handle struct is plain data, filled by the driver.
        let mut out: sys::CUmemFabricHandle = unsafe { std::mem::zeroed() };
        gpu(
            "fabric handle export (needs a fabric-capable system: NVSwitch with IMEX)",
            // SAFETY: a valid out-pointer of the fabric handle's size, and a retained handle.
            unsafe {
                sys::cuMemExportToShareableHandle(
                    (&mut out as *mut sys::CUmemFabricHandle).cast(),
                    handle,
                    fabric,
                    0,
                )
            },
        )?;
        Ok(FabricExport {
            handle: out.data,
            offset: addr - base,
            size: size as u64,
        })
    }

    /// Imports a peer's fabric handle and maps its `size` bytes here, accessible from every
    /// device that can reach it: the mapping's address. Undo with [`fabric_close`](Self::fabric_close).
    ///
    /// # Errors
    /// `size` is zero or over [`MAX_FABRIC_MAPPING`], or the driver refused (not in the
    /// peer's NVLink domain, no IMEX channel, a forged handle).
    pub fn fabric_import(&self, handle: &[u8; 64], size: u64) -> Result<u64> {
        if size == 0 || size > MAX_FABRIC_MAPPING {
            return Err(Error::InvalidArgument(format!(
                "a fabric mapping of {size} bytes (1 to {MAX_FABRIC_MAPPING})"
            )));
        }
        use_device(0)?;
        let mut h = sys::CUmemFabricHandle { data: *handle };
        let mut imported: sys::CUmemGenericAllocationHandle = 0;
        gpu(
            "importing a fabric handle",
            // SAFETY: a valid out-pointer, and a fabric handle of the documented size.
            unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut imported,
                    (&mut h as *mut sys::CUmemFabricHandle).cast(),
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
                )
            },
        )?;
        map_handle(self, imported, (size as usize, 0), None)
    }

    /// Unmaps what [`fabric_import`](Self::fabric_import) mapped.
    pub fn fabric_close(&self, ptr: u64, size: u64) {
        unmap(ptr, size as usize);
    }
}

impl DeviceBuffer {
    /// `len` bytes on device `device` that can be shared by fabric handle (rounded up to the
    /// allocation granularity; [`len`](Self::len) is the rounded size).
    ///
    /// # Errors
    /// No driver, a device without fabric handles (the message says so), or the allocation
    /// failed.
    pub fn new_fabric(device: u32, len: usize) -> Result<Self> {
        let cuda = super::driver()?;
        if !cuda.fabric_supported(device) {
            return Err(Error::Gpu(format!(
                "GPU {device} does not support fabric handles (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED is 0)"
            )));
        }
        use_device(device as i32)?;
        let prop = allocation_prop(device);
        let mut granularity = 0usize;
        // SAFETY: valid pointers to an out-value and a filled property struct.
        gpu("allocation granularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        })?;
        let size = len.max(1).next_multiple_of(granularity.max(1));
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: as above.
        gpu("fabric allocation", unsafe {
            sys::cuMemCreate(&mut handle, size, &prop, 0)
        })?;
        let ptr = map_handle(cuda, handle, (size, granularity), Some(device))?;
        Ok(DeviceBuffer::mapped(ptr, size, device))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_paths_refuse_what_they_cannot_do() {
        match super::super::driver() {
            // A GPU machine: a bound from the wire is checked before the driver is asked.
            Ok(cuda) => {
                let err = cuda.fabric_import(&[0; 64], MAX_FABRIC_MAPPING + 1);
                assert!(err.unwrap_err().to_string().contains("fabric mapping"));
                if !cuda.fabric_supported(0) {
                    let err = DeviceBuffer::new_fabric(0, 4096).unwrap_err().to_string();
                    assert!(err.contains("fabric"), "{err}");
                }
            }
            Err(_) => {
                let err = DeviceBuffer::new_fabric(0, 4096).unwrap_err().to_string();
                assert!(err.contains("GPU:"), "{err}");
            }
        }
    }
}
