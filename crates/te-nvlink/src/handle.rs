//! The published name of exported GPU memory, and the two copy calls te-nvlink makes (its only
//! `unsafe`). Two kinds of handle:
//! - `cuda-ipc:<device>:<offset>:<handle hex>` — a legacy CUDA IPC handle of `cuMemAlloc`
//!   memory, opened by processes of the same host;
//! - `cuda-fabric:<device>:<offset>:<size>:<handle hex>` — a fabric handle of a `cuMemCreate`
//!   allocation of `size` bytes, mapped by any process of the NVLink domain (MNNVL).
//!
//! Names come from peers' descriptors: parsing bounds every number and refuses anything else.

#![allow(unsafe_code)]

use std::fmt;

use te_cuda::MAX_FABRIC_MAPPING;

/// Which CUDA handle a name carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleKind {
    /// `cuIpcGetMemHandle`: same host only.
    Ipc,
    /// `cuMemExportToShareableHandle(FABRIC)` of an allocation of `size` bytes: the NVLink
    /// domain, across hosts on multi-node NVLink systems.
    Fabric {
        /// The allocation's size, which the importer maps whole.
        size: u64,
    },
}

/// A GPU memory handle as published in a buffer's `shm_name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuName {
    /// Legacy IPC or fabric.
    pub kind: HandleKind,
    /// The owner's device ordinal.
    pub device: u32,
    /// The buffer's offset in the exported allocation.
    pub offset: u64,
    /// The handle's 64 bytes.
    pub handle: [u8; 64],
}

const IPC: &str = "cuda-ipc:";
const FABRIC: &str = "cuda-fabric:";

impl fmt::Display for GpuName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            HandleKind::Ipc => write!(f, "{IPC}{}:{}:", self.device, self.offset)?,
            HandleKind::Fabric { size } => {
                write!(f, "{FABRIC}{}:{}:{size}:", self.device, self.offset)?
            }
        }
        self.handle.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

fn hex_handle(hex: &str) -> Option<[u8; 64]> {
    if hex.len() != 128 || !hex.is_ascii() {
        return None;
    }
    let mut handle = [0u8; 64];
    for (i, b) in handle.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(handle)
}

impl GpuName {
    /// Parses a published name; `None` for anything else (a shared-memory path, bad hex, a
    /// fabric size of 0 or over [`MAX_FABRIC_MAPPING`], an offset outside the allocation).
    pub fn parse(s: &str) -> Option<GpuName> {
        let (kind, mut parts) = match (s.strip_prefix(IPC), s.strip_prefix(FABRIC)) {
            (Some(rest), _) => (HandleKind::Ipc, rest.splitn(3, ':')),
            (_, Some(rest)) => (HandleKind::Fabric { size: 0 }, rest.splitn(4, ':')),
            _ => return None,
        };
        let device = parts.next()?.parse().ok()?;
        let offset: u64 = parts.next()?.parse().ok()?;
        let kind = match kind {
            HandleKind::Ipc => HandleKind::Ipc,
            HandleKind::Fabric { .. } => {
                let size: u64 = parts.next()?.parse().ok()?;
                if size == 0 || size > MAX_FABRIC_MAPPING || offset >= size {
                    return None;
                }
                HandleKind::Fabric { size }
            }
        };
        let handle = hex_handle(parts.next()?)?;
        Some(GpuName {
            kind,
            device,
            offset,
            handle,
        })
    }

    /// Whether a buffer of `len` bytes at this name's offset lies inside what a peer maps
    /// (always, for IPC handles: the driver maps the whole allocation).
    pub fn holds(&self, len: u64) -> bool {
        match self.kind {
            HandleKind::Ipc => true,
            HandleKind::Fabric { size } => self.offset.checked_add(len).is_some_and(|e| e <= size),
        }
    }
}

/// A copy on `device`'s context, returned from when the bytes are there (the worker's stream,
/// waited for).
pub(crate) fn copy(
    cuda: &te_cuda::Cuda,
    (device, dst, src, len): (u32, u64, u64, usize),
) -> te_core::Result<()> {
    // SAFETY: te-nvlink calls this only for a slice whose local range lies in a region the
    // engine pinned for its task and whose remote range lies in a buffer the target published
    // (opened into this process, or this process's own), both valid until the slice reports.
    Ok(unsafe { cuda.copy(device, dst, src, len) }?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> [u8; 64] {
        let mut handle = [0u8; 64];
        handle[0] = 0xab;
        handle[63] = 7;
        handle
    }

    #[test]
    fn names_round_trip_and_other_names_are_not_handles() {
        let ipc = GpuName {
            kind: HandleKind::Ipc,
            device: 3,
            offset: 4096,
            handle: handle(),
        };
        let s = ipc.to_string();
        assert!(s.starts_with("cuda-ipc:3:4096:ab00"));
        assert_eq!(GpuName::parse(&s), Some(ipc));
        let fabric = GpuName {
            kind: HandleKind::Fabric { size: 2 << 20 },
            ..ipc
        };
        let f = fabric.to_string();
        assert!(f.starts_with("cuda-fabric:3:4096:2097152:ab00"), "{f}");
        assert_eq!(GpuName::parse(&f), Some(fabric));
        for bad in [
            "/dev/shm/te-1234",
            "cuda-ipc:3:4096:zz",
            "cuda-ipc:x:1:00",
            "cuda-ipc:1:2",
            &s[..s.len() - 2],
            &s.replacen("cuda-ipc:3", "cuda-ipc:-3", 1),
            // A fabric name needs its size, inside the bound, and the offset inside it.
            &f.replacen(":2097152:", ":", 1),
            &f.replacen(":2097152:", ":0:", 1),
            &f.replacen(":2097152:", &format!(":{}:", MAX_FABRIC_MAPPING + 1), 1),
            &f.replacen(":4096:2097152:", ":2097152:2097152:", 1),
            &f.replacen(":ab00", ":é00", 1),
        ] {
            assert_eq!(GpuName::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_fabric_name_holds_only_buffers_inside_its_allocation() {
        let n = GpuName {
            kind: HandleKind::Fabric { size: 1 << 20 },
            device: 0,
            offset: 4096,
            handle: handle(),
        };
        assert!(n.holds((1 << 20) - 4096));
        assert!(!n.holds((1 << 20) - 4095));
        assert!(!n.holds(u64::MAX));
        assert!(
            GpuName {
                kind: HandleKind::Ipc,
                ..n
            }
            .holds(u64::MAX)
        );
    }

    /// Fuzz target (`cargo xtask fuzz gpu-name --secs N`): names from peers' descriptors parse
    /// only into handles inside their bounds, round-trip, and never panic the parser.
    #[test]
    fn gpu_name() {
        let ipc = GpuName {
            kind: HandleKind::Ipc,
            device: 1,
            offset: 512,
            handle: handle(),
        }
        .to_string();
        let fabric = GpuName {
            kind: HandleKind::Fabric { size: 1 << 21 },
            device: 0,
            offset: 4096,
            handle: handle(),
        }
        .to_string();
        te_testkit::fuzz::run(
            "gpu-name",
            env!("CARGO_MANIFEST_DIR"),
            &[ipc.as_bytes(), fabric.as_bytes()],
            te_testkit::fuzz::budget(1.0),
            |b: &[u8]| {
                let Some(n) = std::str::from_utf8(b).ok().and_then(GpuName::parse) else {
                    return;
                };
                if let HandleKind::Fabric { size } = n.kind {
                    assert!(size > 0 && size <= MAX_FABRIC_MAPPING && n.offset < size);
                }
                assert_eq!(GpuName::parse(&n.to_string()), Some(n));
            },
        );
    }
}
