//! The variables te-rdma reads: Mooncake's verbs settings and te's peer sweep.
//! `docs/configuration.md` is generated from these (`cargo xtask config`).

use te_sys::env::Setting;

pub(crate) const GID_INDEX: Setting = Setting {
    name: "MC_GID_INDEX",
    default: "1, probe",
    range: "0–255",
    doc: "RDMA port, and GID index (default: probe, RoCEv2 over IPv4 first)",
};
pub(crate) const IB_PORT: Setting = Setting {
    name: "MC_IB_PORT",
    default: "1, probe",
    range: "1–255",
    doc: "RDMA port, and GID index (default: probe, RoCEv2 over IPv4 first)",
};
pub(crate) const IB_SL: Setting = Setting {
    name: "MC_IB_SL",
    default: "256, 0, 0, port's",
    range: "0–15",
    doc: "work requests in flight per QP, service level, traffic class, path MTU (never above the port's)",
};
pub(crate) const IB_TC: Setting = Setting {
    name: "MC_IB_TC",
    default: "256, 0, 0, port's",
    range: "0–255",
    doc: "work requests in flight per QP, service level, traffic class, path MTU (never above the port's)",
};
pub(crate) const IB_TIMEOUT: Setting = Setting {
    name: "MC_IB_TIMEOUT",
    default: "14",
    range: "1–31",
    doc: "local ACK timeout exponent of RC QPs (Soft-RoCE wants 18+)",
};
pub(crate) const MAX_MR_SIZE: Setting = Setting {
    name: "MC_MAX_MR_SIZE",
    default: "1, 1 TiB",
    range: "4096 bytes and up",
    doc: "RDMA completion queues per device (at least one per worker), largest memory region in bytes",
};
pub(crate) const MAX_WR: Setting = Setting {
    name: "MC_MAX_WR",
    default: "256, 0, 0, port's",
    range: "1–65536",
    doc: "work requests in flight per QP, service level, traffic class, path MTU (never above the port's)",
};
pub(crate) const MTU: Setting = Setting {
    name: "MC_MTU",
    default: "256, 0, 0, port's",
    range: "256–4096",
    doc: "work requests in flight per QP, service level, traffic class, path MTU (never above the port's)",
};
pub(crate) const NUM_CQ_PER_CTX: Setting = Setting {
    name: "MC_NUM_CQ_PER_CTX",
    default: "1, 1 TiB",
    range: "1–256",
    doc: "RDMA completion queues per device (at least one per worker), largest memory region in bytes",
};
pub(crate) const TE_RDMA_PEER_SWEEP_SECS: Setting = Setting {
    name: "MC_TE_RDMA_PEER_SWEEP_SECS",
    default: "30",
    range: "1–86400",
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
