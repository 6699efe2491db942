//! Mooncake's Transfer Engine semantics over te, written once for every binding: te's Python
//! package (`te.mooncake`) and its C library both call [`MooncakeEngine`], so neither
//! re-implements session names, the per-name segment cache, synchronous and asynchronous
//! helpers or the numbers Mooncake returns.
//!
//! What it keeps from Mooncake: an engine object that exists before `initialize`; peers named
//! `host:rpc_port`; a P2P engine ignoring the port it was given; registration codes (-7 for an
//! overlap, -3 for an unknown address); all-or-nothing synchronous transfers; async batch ids
//! with 0 meaning failure. What it does better: calls before `initialize` answer an error
//! instead of dereferencing null; batch ids are checked (a made-up, stale or foreign id is an
//! error, never a use-after-free); synchronous calls park instead of spinning; the byte helpers
//! only touch registered memory.
//!
//! Every call runs on te's classic engine or on te's TENT runtime ([`RuntimeKind`]: Mooncake's
//! `MC_USE_TENT`, or te's `backend="tent"`); protocol names and transport hints are Mooncake's
//! ([`Protocol`]), and one te cannot serve is an error naming it.
//!
//! Not here: argument conversion and each binding's return-code convention.

mod batches;
mod communicator;
mod engine;
mod error;
mod handles;
mod install;
mod managed;
mod owned;
mod runtime;
mod session;
pub mod settings;

pub use batches::{LOCAL_SEGMENT, NicLoad, SegmentRequest};
pub use communicator::{MOONCAKE_DEFAULT_SERVER, MooncakeRpc};
pub use engine::{
    BatchProgress, Lists, Live, MooncakeEngine, TransferOptions, UNREGISTER_GRACE, local_topology,
};
pub use error::{ERR_INVALID_ARGUMENT, ErrorKind, FacadeError, KINDS, KindRow, Result};
pub use runtime::RuntimeKind;
pub use te_catalog::Protocol;
pub use te_core::{Notification, Opcode, Permission};
/// The RPC communicator's types, as the bindings see them.
pub use te_rpc as rpc;
/// TENT's runtime as the bindings see it (te-capi's `tent_*` functions): bindings reach te-tent
/// only through the facade.
#[cfg(feature = "tent")]
pub use te_tent as tent;
