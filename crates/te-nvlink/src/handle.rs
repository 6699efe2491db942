//! The published name of exported GPU memory (`cuda-ipc:<device>:<offset>:<handle hex>`), and
//! the two copy calls te-nvlink makes (its only `unsafe`).

#![allow(unsafe_code)]

use std::fmt;

/// A CUDA IPC handle as published in a buffer's `shm_name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcName {
    /// The owner's device ordinal.
    pub device: u32,
    /// The buffer's offset in the exported allocation.
    pub offset: u64,
    /// `cuIpcGetMemHandle`'s 64 bytes.
    pub handle: [u8; 64],
}

const PREFIX: &str = "cuda-ipc:";

impl fmt::Display for IpcName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}:{}:", self.device, self.offset)?;
        self.handle.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl IpcName {
    /// Parses a published name; `None` for anything else (a shared-memory path, bad hex).
    pub fn parse(s: &str) -> Option<IpcName> {
        let mut parts = s.strip_prefix(PREFIX)?.splitn(3, ':');
        let device = parts.next()?.parse().ok()?;
        let offset = parts.next()?.parse().ok()?;
        let hex = parts.next()?;
        if hex.len() != 128 || !hex.is_ascii() {
            return None;
        }
        let mut handle = [0u8; 64];
        for (i, b) in handle.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(IpcName {
            device,
            offset,
            handle,
        })
    }
}

/// A copy on `device`'s context: queued on the worker's stream and waited for when `on_stream`
/// (large copies), else synchronous.
pub(crate) fn copy(
    cuda: &te_core::cuda::Cuda,
    on_stream: bool,
    (device, dst, src, len): (u32, u64, u64, usize),
) -> te_core::Result<()> {
    // SAFETY: te-nvlink calls this only for a slice whose local range lies in a region the
    // engine pinned for its task and whose remote range lies in a buffer the target published
    // (opened into this process, or this process's own), both valid until the slice reports.
    unsafe {
        match on_stream {
            true => cuda.copy_on_stream(device, dst, src, len),
            false => cuda.copy(device, dst, src, len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_other_names_are_not_handles() {
        let mut handle = [0u8; 64];
        handle[0] = 0xab;
        handle[63] = 7;
        let n = IpcName {
            device: 3,
            offset: 4096,
            handle,
        };
        let s = n.to_string();
        assert!(s.starts_with("cuda-ipc:3:4096:ab00"));
        assert_eq!(IpcName::parse(&s), Some(n));
        for bad in [
            "/dev/shm/te-1234",
            "cuda-ipc:3:4096:zz",
            "cuda-ipc:x:1:00",
            "cuda-ipc:1:2",
            &s[..s.len() - 2],
        ] {
            assert_eq!(IpcName::parse(bad), None, "{bad}");
        }
    }
}
