//! te-tent: Mooncake TENT's runtime over te-core's engine and the same transports. A caller
//! says what to move; the runtime decides how.
//!
//! - [`capability`]: the matrix of (source kind → target kind, scope) moves each transport
//!   declares.
//! - [`policy`]: rules (and the default policy) that order the capable transports per
//!   request, and the staging plan when none can make a move directly.
//! - [`queue`]: the runtime queue, posting higher priorities first under load.
//! - [`config`]: TENT's JSON configuration (`MC_TENT_CONF`) with the legacy `MC_*` variables.
//! - The runtime is installed in te-core's engine as its `Policy`: the engine's allocations,
//!   submits, registrations and frees reach it, whoever calls them (te-facade, the C API).
//! - [`TentEngine`]: batches of te-core held tasks (te-core's batches, ids and status), each
//!   task posted on the transport its plan puts first, failed over to the next capable one
//!   when an attempt fails (te-core holds it again and tells the runtime), deadlines, staging
//!   through host memory, and notifications sent after their data (te-core's).
//!
//! Not here: moving bytes (the transports do), slicing, rails and retries within a transport,
//! or a task's status (te-core's engine does all of it).

#![forbid(unsafe_code)]

mod bell;
pub mod capability;
pub mod config;
mod engine;
mod memo;
mod planner;
pub mod policy;
mod progress;
pub mod queue;
mod request;
pub mod settings;
mod staging;
mod state;

pub use config::{TentConfig, TentFile};
pub use engine::TentEngine;
pub use policy::{Intent, Priority};
pub use request::{MemoryOptions, Request, TentBatchId};

/// te-tent's errors.
#[derive(Debug, thiserror::Error)]
pub enum TentError {
    /// The configuration is wrong (the message names the key or variable).
    #[error("TENT configuration: {0}")]
    Config(String),
    /// The metrics endpoint or log could not start (the address taken, a thread refused).
    #[error("metrics: {0}")]
    Metrics(String),
    /// The classic engine refused (its error).
    #[error(transparent)]
    Engine(#[from] te_core::Error),
    /// No transport (nor staging) can make the move a request asks for.
    #[error("no transport for this request: {0}")]
    NoTransport(String),
    /// A batch id this engine did not hand out, or one already freed.
    #[error("unknown batch {0}")]
    InvalidBatch(u64),
    /// A task index past the batch's tasks.
    #[error("batch {batch} has no task {task}")]
    InvalidTask {
        /// The batch.
        batch: u64,
        /// The task index.
        task: usize,
    },
    /// More requests than the batch holds.
    #[error("batch {batch} holds {capacity} tasks")]
    TooManyRequests {
        /// The batch.
        batch: u64,
        /// Its capacity.
        capacity: usize,
        /// Tasks already submitted plus those asked for.
        requested: usize,
    },
    /// The batch still has tasks that are not finished.
    #[error("batch {0} has tasks in flight")]
    BatchBusy(u64),
    /// A bad argument (the message says which).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// te-tent's result.
pub type Result<T> = std::result::Result<T, TentError>;
