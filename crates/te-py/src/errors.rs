//! te's Python exceptions for the native calls of `te.Engine`: each [`FacadeError`] becomes an
//! instance of one class of `te.errors` (defined in Python, so that they can also derive from
//! the built-in exception a Python caller expects: `ValueError`, `TimeoutError`, ...), carrying
//! Mooncake's `ERR_*` number as `.code`.
//!
//! Not here: `te.mooncake`'s return codes, which never raise (lib.rs).

use pyo3::prelude::*;
use te_facade::FacadeError;

/// `e` as an instance of its kind's `te.errors` class (te-facade's table).
pub(crate) fn to_py(e: FacadeError) -> PyErr {
    Python::attach(|py| {
        let made = py
            .import("te.errors")
            .and_then(|m| m.getattr(e.kind().python_class()))
            .and_then(|class| class.call1((e.to_string(), e.code())));
        match made {
            Ok(instance) => PyErr::from_value(instance),
            Err(import_failed) => import_failed,
        }
    })
}

/// Converts a facade result, raising te's exception.
pub(crate) fn raise<T>(r: te_facade::Result<T>) -> PyResult<T> {
    r.map_err(to_py)
}
