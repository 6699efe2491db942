//! Helpers shared by te-rdma's device tests (run in the Soft-RoCE guest).

/// Packets device `device` has sent (its hardware counter): proof that bytes crossed the verbs
/// device, not some other path.
pub fn sent_packets(device: &str) -> u64 {
    std::fs::read_to_string(format!(
        "/sys/class/infiniband/{device}/ports/1/hw_counters/sent_pkts"
    ))
    .ok()
    .and_then(|s| s.trim().parse().ok())
    .unwrap_or(0)
}
