//! How often an idle engine's threads wake: the context switches of this process's threads
//! over a quiet spell, for te-core's classic engine and for TENT's runtime, each with the same
//! transports (tcp, shm, uring) and nothing to do.
//!
//! `cargo run --release -p te-tent --example idle_wakeups -- [seconds, default 10]`

use std::collections::HashMap;
use std::time::Duration;

use te_core::{Config, TransferEngine};
use te_tent::{TentConfig, TentEngine};

/// Context switches (voluntary and not) of each thread of this process but the calling one,
/// by thread id, with the thread's name.
fn switches() -> HashMap<String, (String, u64)> {
    let me = std::fs::read_to_string("/proc/thread-self/stat")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_default();
    let mut out = HashMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        let tid = task.file_name().to_string_lossy().into_owned();
        if tid == me {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let n: u64 = status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        out.insert(tid, (name.trim().to_string(), n));
    }
    out
}

/// The wake-ups of the threads other than this one over `spell`, after a second to settle:
/// all of them, and those of threads whose name starts with `own`.
fn idle_wakeups(spell: Duration, own: &str) -> (u64, u64) {
    std::thread::sleep(Duration::from_secs(1));
    let before = switches();
    std::thread::sleep(spell);
    let (mut all, mut theirs) = (0, 0);
    for (tid, (name, n)) in switches() {
        let woke = n - before.get(&tid).map_or(0, |b| b.1);
        all += woke;
        if name.starts_with(own) {
            theirs += woke;
        }
    }
    (all, theirs)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 10,
    };
    let spell = Duration::from_secs(seconds);
    let mut config = Config::default();
    config.tcp_bind_address = Some("127.0.0.1".parse()?);
    let classic = {
        let e = TransferEngine::init(config, "P2PHANDSHAKE", "127.0.0.1")?;
        // The transports TENT installs by default, made the same way.
        let options = te_catalog::Options {
            config: e.config(),
            lookup: &te_sys::env::process,
            devices: None,
            shm_dir: None,
        };
        for entry in ["tcp", "shm", "file"] {
            e.install_transport(te_catalog::make(entry, &options)?.transport)?;
        }
        idle_wakeups(spell, "te-").0
    };
    let (tent, runtime) = {
        let mut config = TentConfig::from_env()?;
        config.local_segment_name = "127.0.0.1".into();
        config.metadata_conn = "P2PHANDSHAKE".into();
        config.core.tcp_bind_address = Some("127.0.0.1".parse()?);
        let _e = TentEngine::new(config)?;
        idle_wakeups(spell, "te-tent")
    };
    // `runtime`: the wake-ups of TENT's own threads (the rest are the engine's and transports'
    // threads, the same as the classic engine's).
    println!(
        r#"{{"seconds": {seconds}, "classic": {classic}, "tent": {tent}, "runtime": {runtime}}}"#
    );
    Ok(())
}
