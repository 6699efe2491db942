//! te-core: the shared vocabulary of te and its classic batch engine.
//!
//! - [`config`], [`settings`]: Mooncake's defaults and the `MC_*` variables te-core reads.
//! - [`memory`]: registered regions, permissions, pins ([`HostBuffer`], te-owned memory, is te-sys's).
//! - [`segment`], [`metadata`], [`control`]: descriptors, where they come from, the control channel.
//! - [`batch`], [`slicer`], [`retry`], [`router`], [`health`], [`rails`]: the decisions and
//!   bookkeeping of a transfer (which slice, which rail, which rail is paused), no I/O.
//! - [`transport`]: the seam transports implement.
//! - [`mooncake`]: the opt-in that serves Mooncake initiators.
//! - [`engine`]: [`TransferEngine`], the classic API.
//!
//! te-core moves no bytes between processes: transports do. It knows nothing of a transport's
//! wire format, verbs, CUDA or io_uring. Unsafe code lives in te-sys, te-cuda and the
//! transports; here only the contract of `register_memory` (and its batch form): the caller
//! vouches for the memory it registers.
#![deny(unsafe_code)]

pub mod batch;
pub mod clock;
mod completion;
pub mod config;
pub mod control;
pub mod engine;
pub mod error;
#[cfg(test)]
mod fuzz_targets;
pub mod health;
pub mod memory;
pub mod merge;
pub mod metadata;
pub mod mooncake;
pub mod notify;
mod outcome;
pub mod rails;
pub mod retry;
pub mod router;
pub mod segment;
pub mod settings;
pub mod slicer;
pub mod transport;

pub use batch::{
    BATCH_ID_BITS, BatchId, HeldTask, TaskWatcher, TransferState, TransferStatus, next_engine_tag,
};
pub use config::Config;
pub use engine::{
    FileAccess, PeerLiveness, Policy, SubmitOptions, TransferEngine, TransferRequest,
};
pub use error::{Error, Result};
pub use memory::{Location, Permission};
pub use notify::Notification;
pub use segment::SegmentId;
pub use te_sys::HostBuffer;
pub use te_sys::hashing;
pub use transport::{Capabilities, Opcode};
