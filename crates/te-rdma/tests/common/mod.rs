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

/// Queue pairs open on `device` (all processes), as the kernel's `rdma resource` shows them.
pub fn queue_pairs(device: &str) -> usize {
    let out = std::process::Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .expect("rdma (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(&format!(" {device}: ")))
        .unwrap_or_else(|| panic!("no {device} in {text}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "qp").expect("a qp count");
    words[at + 1].parse().expect("a number")
}

/// Whether `f` holds within 20 s.
pub fn eventually(f: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    f()
}
