//! te's RPC communicator: messages and tensors between processes, by address, beside the
//! one-sided transfers. The counterpart of Mooncake's `RpcInterface`, on its wire.
//!
//! - [`Server`] (`server.rs`): te's reactor serves the socket; each call's bytes go straight
//!   into owned buffers and on to a [`Handler`] on the loop's thread; the reply follows the
//!   handler, so senders are held back rather than buffered.
//! - [`Client`] (`client.rs`, `link.rs`, `dispatch.rs`): a bounded pool of connections per
//!   peer; synchronous sends, futures any executor can await, callback sends; every call bound
//!   to its timeout.
//! - The wire (`wire.rs`): coro_rpc's frames as Mooncake's wheel speaks them, its data and
//!   tensor calls, and te's own calls: a greeting that tells te from Mooncake and proves the
//!   cluster secret (`handshake.rs`), messages exactly as sent, tensors with their dtype and
//!   shape (`tensor.rs`).
//! - Policy apart from I/O (`service.rs`): what a header is admitted to cost, who is trusted,
//!   what each call answers.
//!
//! Invariants: no buffer is sized by a peer's announced length beyond what arrived
//! (`filling.rs`) or beyond the message limit; under a cluster secret te peers prove it before
//! any message is taken, and Mooncake peers are served only from the allow-list.

mod bytes;
mod client;
mod config;
mod dispatch;
mod error;
mod filling;
#[cfg(test)]
mod fuzz_targets;
pub mod handshake;
mod link;
mod message;
mod server;
mod service;
pub mod settings;
pub mod tensor;
pub mod wire;

pub use bytes::{Buffer, Bytes};
pub use client::{Client, Outgoing, Owned};
pub use config::{Config, ServerConfig, resolve};
pub use dispatch::{Done, SendFuture};
pub use error::{Error, Result};
pub use link::Kind;
pub use message::{GIVEN_MIN, Handler, Origin, Payload, Received, Tensor};
pub use server::Server;
pub use te_reactor::allow::AllowList;
pub use te_reactor::secret::ClusterKey;
pub use tensor::{Dtype, TensorMeta};
