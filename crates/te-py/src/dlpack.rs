//! DLPack (`__dlpack__`) tensors as byte ranges: the data address, length and device of a
//! tensor from the capsule its producer (torch, cupy, jax, numpy) hands out. Only contiguous
//! (row-major, or strides absent) tensors of whole bytes are accepted: a registered region is
//! one range of memory.
//!
//! Not here: keeping the tensor alive (the Python `MemoryRegion` holds the capsule and the
//! object while registered; the capsule's own destructor returns it to its producer).

#![allow(unsafe_code)] // reads the producer's DLTensor through the capsule's pointer

use std::ffi::c_void;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`, the first member of the capsule's `DLManagedTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// DLPack's device types te knows what to do with.
const CPU: i32 = 1;
const CUDA: i32 = 2;
const CUDA_HOST: i32 = 3;
const CUDA_MANAGED: i32 = 13;
/// More dimensions than any producer makes: a sign of a corrupt capsule.
const MAX_DIMS: i32 = 64;

/// The `(address, length, location)` of the tensor in `capsule` (a `dltensor` capsule from
/// `__dlpack__()`): location `*` (host memory, its NUMA node found by te) for host memory (pinned host memory included), `cuda:N` for
/// a GPU's memory.
#[pyfunction]
pub(crate) fn dlpack_range(capsule: &Bound<'_, PyAny>) -> PyResult<(u64, u64, String)> {
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err("__dlpack__() did not return a capsule"))?;
    let ptr = capsule.pointer_checked(Some(c"dltensor")).map_err(|_| {
        PyValueError::new_err(
            "not an unused 'dltensor' capsule (already consumed, or a versioned one)",
        )
    })?;
    // SAFETY: a live `dltensor` capsule points at a DLManagedTensor, whose first member is the
    // DLTensor; the capsule (and so the tensor) outlives this call, which only reads it.
    let t = unsafe { &*(ptr.as_ptr() as *const DlTensor) };
    if !(0..=MAX_DIMS).contains(&t.ndim) {
        return Err(PyValueError::new_err(format!(
            "DLPack tensor with {} dimensions",
            t.ndim
        )));
    }
    let ndim = t.ndim as usize;
    let bits = u64::from(t.dtype.bits) * u64::from(t.dtype.lanes);
    if bits == 0 || bits % 8 != 0 {
        return Err(PyValueError::new_err(format!(
            "DLPack element of {} bits x {} lanes is not a whole number of bytes",
            t.dtype.bits, t.dtype.lanes
        )));
    }
    let shape: &[i64] = match ndim {
        0 => &[],
        _ if t.shape.is_null() => {
            return Err(PyValueError::new_err("DLPack tensor without a shape"));
        }
        // SAFETY: DLPack's contract: `shape` holds `ndim` entries for the capsule's lifetime.
        _ => unsafe { std::slice::from_raw_parts(t.shape, ndim) },
    };
    let strides: Option<&[i64]> = match t.strides.is_null() || ndim == 0 {
        true => None,
        // SAFETY: as `shape`: `strides`, when present, holds `ndim` entries.
        false => Some(unsafe { std::slice::from_raw_parts(t.strides, ndim) }),
    };
    let mut elems: u64 = 1;
    for &d in shape {
        let d = u64::try_from(d).map_err(|_| {
            PyValueError::new_err(format!("DLPack shape {shape:?} has a negative extent"))
        })?;
        elems = elems
            .checked_mul(d)
            .ok_or_else(|| PyValueError::new_err("DLPack tensor larger than memory"))?;
    }
    if let Some(strides) = strides {
        // Row-major and compact: each stride (in elements) is the product of the extents
        // after it; extents of 1 may carry any stride.
        let mut expect: i64 = 1;
        for (&d, &s) in shape.iter().zip(strides).rev() {
            if d != 1 && s != expect {
                return Err(PyValueError::new_err(format!(
                    "DLPack tensor is not contiguous (shape {shape:?}, strides {strides:?}): register a contiguous copy"
                )));
            }
            expect = expect.saturating_mul(d);
        }
    }
    let len = elems
        .checked_mul(bits / 8)
        .ok_or_else(|| PyValueError::new_err("DLPack tensor larger than memory"))?;
    let addr = (t.data as u64)
        .checked_add(t.byte_offset)
        .ok_or_else(|| PyValueError::new_err("DLPack data address overflows"))?;
    let location = match t.device.device_type {
        CPU | CUDA_HOST => "*".to_string(),
        CUDA | CUDA_MANAGED => format!("cuda:{}", t.device.device_id),
        other => {
            return Err(PyValueError::new_err(format!(
                "DLPack device type {other} (not CPU or CUDA): te cannot register it"
            )));
        }
    };
    Ok((addr, len, location))
}
