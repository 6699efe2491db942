//! `libtransfer_engine.so`: Mooncake's C API (`transfer_engine_c.h`, 0.3.13) on te. Programs
//! built against Mooncake's library (NIXL's Mooncake backend, Mooncake's Go p2p store, its
//! Rust crate) load this one instead and run on te without recompiling: the same symbols,
//! types, struct layouts, constants and return conventions (NULL from create on failure,
//! negative `ERR_*` from registration, Mooncake's positive `Status` codes from submit, status
//! and free). The header is `include/transfer_engine_c.h`, written for te, with each
//! function's contract on the caller's pointers.
//!
//! Safer than Mooncake's at the boundary: engine handles are looked up, not dereferenced (a
//! destroyed, stale or made-up handle is an error code), batch ids are checked, null
//! pointers, lengths that overflow and strings that are not UTF-8 are refused, and no Rust
//! panic crosses into C (every entry point catches it and returns an error).
//!
//! The semantics are te-facade's ([`te_facade::MooncakeEngine`]); this crate converts C
//! arguments and results only. TENT's C API (`tent_*`, header `include/tent/transfer_engine.h`)
//! is in the same library, over te-tent (`tent`).

#![allow(unsafe_code)] // the C ABI: raw pointers from the caller, each use with a SAFETY note

mod batch_api;
mod engine_api;
mod logging;
mod registry;
mod tent;
pub mod types;
