//! The variables te-rdma reads: Mooncake's verbs settings and te's peer sweep.
//! `docs/configuration.md` is generated from these (`cargo xtask config`).

use te_sys::env::{Setting, Unset, Value};

pub(crate) const GID_INDEX: Setting = Setting {
    name: "MC_GID_INDEX",
    value: Value::Number {
        unset: Unset::Means("the rail's: its interface and address, routable, RoCE v2"),
        min: 0,
        max: 255,
    },
    doc: "GID index of the RDMA port",
};
pub(crate) const IB_PORT: Setting = Setting {
    name: "MC_IB_PORT",
    value: Value::Number {
        unset: Unset::Is(1),
        min: 1,
        max: 255,
    },
    doc: "RDMA port of each device",
};
pub(crate) const IB_SL: Setting = Setting {
    name: "MC_IB_SL",
    value: Value::Number {
        unset: Unset::Is(0),
        min: 0,
        max: 15,
    },
    doc: "service level of RC QPs",
};
pub(crate) const IB_TC: Setting = Setting {
    name: "MC_IB_TC",
    value: Value::Number {
        unset: Unset::Is(0),
        min: 0,
        max: 255,
    },
    doc: "traffic class of RC QPs",
};
pub(crate) const IB_TIMEOUT: Setting = Setting {
    name: "MC_IB_TIMEOUT",
    value: Value::Number {
        unset: Unset::Is(14),
        min: 1,
        max: 31,
    },
    doc: "local ACK timeout exponent of RC QPs (Soft-RoCE wants 18+)",
};
pub(crate) const MAX_MR_SIZE: Setting = Setting {
    name: "MC_MAX_MR_SIZE",
    value: Value::Bytes {
        unset: Unset::Is(1 << 40),
        min: 4096,
        max: 1 << 56,
    },
    doc: "largest memory region; a larger registration is cut into regions of this size",
};
pub(crate) const MAX_WR: Setting = Setting {
    name: "MC_MAX_WR",
    value: Value::Number {
        unset: Unset::Is(256),
        min: 1,
        max: 65536,
    },
    doc: "work requests in flight per QP",
};
pub(crate) const MTU: Setting = Setting {
    name: "MC_MTU",
    value: Value::Number {
        unset: Unset::Means("the port's active MTU"),
        min: 256,
        max: 4096,
    },
    doc: "path MTU (never above the port's)",
};
pub(crate) const NUM_CQ_PER_CTX: Setting = Setting {
    name: "MC_NUM_CQ_PER_CTX",
    value: Value::Number {
        unset: Unset::Is(1),
        min: 1,
        max: 256,
    },
    doc: "RDMA completion queues per device (at least one per worker)",
};
pub(crate) const TE_RDMA_PEER_SWEEP_SECS: Setting = Setting {
    name: "MC_TE_RDMA_PEER_SWEEP_SECS",
    value: Value::Number {
        unset: Unset::Is(30),
        min: 1,
        max: 86400,
    },
    doc: "how often an RDMA target dials the initiators it keeps queue pairs for (te's, and Mooncake's started with `P2PHANDSHAKE`), to free those of initiators that are gone (1–86,400)",
};

/// Every variable this crate reads, in the order the reference lists them.
pub const SETTINGS: &[Setting] = &[
    GID_INDEX,
    IB_PORT,
    IB_SL,
    IB_TC,
    IB_TIMEOUT,
    MAX_MR_SIZE,
    MAX_WR,
    MTU,
    NUM_CQ_PER_CTX,
    TE_RDMA_PEER_SWEEP_SECS,
];
