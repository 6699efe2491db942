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

/// The numbers of the queue pairs open on `device` (all processes), as the kernel's `rdma
/// resource` lists them. Soft-RoCE hands out QP numbers in turn, so the queue pairs a step makes
/// are the numbers that were not there before it, whatever other processes' queue pairs do
/// meanwhile (a count would mix them in).
pub fn queue_pairs(device: &str) -> std::collections::BTreeSet<u32> {
    resources("qp", "lqpn", device)
}

/// The numbers of the memory regions registered on `device` (all processes), likewise.
#[allow(
    dead_code,
    reason = "each test binary compiles this module; one uses it"
)]
pub fn memory_regions(device: &str) -> std::collections::BTreeSet<u32> {
    resources("mr", "mrn", device)
}

/// The `id` numbers of the `kind` resources on `device` (its lines name it as `link DEV/PORT`
/// or `dev DEV`).
fn resources(kind: &str, id: &str, device: &str) -> std::collections::BTreeSet<u32> {
    let out = std::process::Command::new("rdma")
        .args(["resource", "show", kind])
        .output()
        .expect("rdma (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let port = format!("{device}/");
    text.lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let after = |name: &str| {
                let at = words.iter().position(|w| *w == name)?;
                words.get(at + 1).copied()
            };
            let on =
                after("link").is_some_and(|l| l.starts_with(&port)) || after("dev") == Some(device);
            match on {
                true => after(id)?.parse().ok(),
                false => None,
            }
        })
        .collect()
}

/// The resources in `now` that are not in `then`.
pub fn made_since(
    then: &std::collections::BTreeSet<u32>,
    now: &std::collections::BTreeSet<u32>,
) -> std::collections::BTreeSet<u32> {
    now.difference(then).copied().collect()
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
