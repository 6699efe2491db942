//! The request, memory-option and batch types of te-tent's API (TENT's `Request`,
//! `MemoryOptions`, `BatchID`). Plain data: what they ask for is carried out by the engine.

use std::time::Duration;

use te_core::{Opcode, Permission, SegmentId, TransferRequest};

use crate::policy::{Intent, Priority};

/// One request in TENT's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// READ (target → local) or WRITE (local → target).
    pub opcode: Opcode,
    /// Local address, in registered memory.
    pub source: u64,
    /// The target segment.
    pub target_id: SegmentId,
    /// Address in the target segment (a file offset for a file segment).
    pub target_offset: u64,
    /// Bytes.
    pub length: u64,
    /// Posted before lower priorities when tasks wait.
    pub priority: Priority,
    /// A transport to try first (`tcp`, `rdma`, ...).
    pub transport_hint: Option<String>,
    /// The task ends TIMEOUT when not done this long after submit.
    pub deadline: Option<Duration>,
    /// Why it moves (policies may match it).
    pub intent: Intent,
    /// A policy rule to use by name.
    pub policy_name: Option<String>,
}

impl Request {
    /// A high-priority request with no hint, deadline or intent.
    pub fn new(
        opcode: Opcode,
        source: u64,
        target_id: SegmentId,
        target_offset: u64,
        length: u64,
    ) -> Self {
        Request {
            opcode,
            source,
            target_id,
            target_offset,
            length,
            priority: Priority::High,
            transport_hint: None,
            deadline: None,
            intent: Intent::Unspec,
            policy_name: None,
        }
    }

    /// With `priority`.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Trying transport `name` first.
    pub fn hint(mut self, name: &str) -> Self {
        self.transport_hint = Some(name.to_string());
        self
    }

    /// Ending TIMEOUT after `deadline`.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// With `intent`.
    pub fn intent(mut self, intent: Intent) -> Self {
        self.intent = intent;
        self
    }

    pub(crate) fn core(&self) -> TransferRequest {
        TransferRequest {
            opcode: self.opcode,
            source: self.source,
            target_id: self.target_id,
            target_offset: self.target_offset,
            length: self.length,
        }
    }
}

/// How memory is registered (TENT's `MemoryOptions`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Location: `cpu:N`, `cuda:N`, or `*` (detect).
    pub location: String,
    /// Who may touch it.
    pub permission: Permission,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions {
            location: "*".into(),
            permission: Permission::RemoteReadWrite,
        }
    }
}

/// A batch of this engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TentBatchId(pub u64);
