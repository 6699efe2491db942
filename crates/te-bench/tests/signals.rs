//! Clean exit on SIGINT and SIGTERM, by killing real te-bench processes: a shared-memory
//! target removes its file and exits 0; a target publishing to a metadata server deletes its
//! descriptor; an initiator stopped mid-run cleans up and exits 128 + the signal; the usage
//! conventions (`--help`, `--version`, an unknown flag) hold.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use te_core::metadata::http::HttpStore;
use te_core::metadata::store::KvStore;
use te_testkit::services::{exit_within, free_port, signal};

fn te_bench() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_te-bench"));
    cmd.env("MC_LOG_LEVEL", "WARNING");
    cmd
}

/// Starts `cmd` and waits for a stdout line containing `marker`.
fn start(cmd: &mut Command, marker: &str) -> Child {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("te-bench starts");
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let found = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains(marker));
    assert!(found, "te-bench never printed {marker:?}");
    // Keep reading (and dropping) the rest so the child never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    child
}

/// Waits up to 20 s for `child` to exit (te-bench's own grace period is 10 s).
fn exit_of(child: &mut Child) -> ExitStatus {
    exit_within(child, Duration::from_secs(20))
}

/// The shared-memory files process `pid` has mapped.
fn shm_files(pid: u32) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut files: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with("/dev/shm/te-"))
        .map(str::to_string)
        .collect();
    files.dedup();
    files
}

#[test]
fn a_shared_memory_target_removes_its_file_on_sigterm_and_sigint() {
    for sig in ["TERM", "INT"] {
        let mut target = start(
            te_bench().args([
                "--mode=target",
                "--protocol=shm",
                "--buffer_size=16777216",
                &format!("--local_server_name=127.0.0.1:{}", free_port()),
            ]),
            "segment name",
        );
        let files = shm_files(target.id());
        assert!(!files.is_empty(), "the shm target maps its buffer's file");
        signal(&target, sig);
        let status = exit_of(&mut target);
        assert!(status.success(), "SIG{sig}: {status}");
        for f in files {
            assert!(
                !std::path::Path::new(&f).exists(),
                "SIG{sig}: {f} left behind"
            );
        }
    }
}

#[test]
fn a_target_deletes_its_descriptor_from_the_metadata_server_on_sigterm() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = te_metadata::Server::start(listener, te_metadata::Options::default()).unwrap();
    let url = format!("http://{}/metadata", server.addr());
    let name = format!("127.0.0.1:{}", free_port());
    let mut target = start(
        te_bench().args([
            "--mode=target",
            "--protocol=tcp",
            "--buffer_size=1048576",
            &format!("--metadata_server={url}"),
            &format!("--local_server_name={name}"),
        ]),
        "segment name",
    );
    let kv = HttpStore::new(&url, Duration::from_secs(2), 1 << 20).unwrap();
    let key = format!("mooncake/ram/{name}");
    assert!(kv.get(&key).unwrap().is_some(), "{key} published");
    signal(&target, "TERM");
    assert!(exit_of(&mut target).success());
    assert_eq!(kv.get(&key).unwrap(), None, "{key} deleted at exit");
}

#[test]
fn an_initiator_stopped_mid_run_cleans_up_and_exits_with_the_signal() {
    // One process, target and initiator, over shared memory: the target's file is its own.
    let mut run = te_bench()
        .args([
            "--loopback",
            "--protocol=shm",
            "--operation=write",
            "--block_size=65536",
            "--batch_size=16",
            "--threads=1",
            "--duration=600",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = run.id();
    let end = Instant::now() + Duration::from_secs(20);
    let files = loop {
        let f = shm_files(pid);
        if !f.is_empty() {
            break f;
        }
        assert!(Instant::now() < end, "the run never mapped its buffer");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Let it be mid-run.
    std::thread::sleep(Duration::from_millis(500));
    signal(&run, "INT");
    let status = exit_of(&mut run);
    assert_eq!(status.code(), Some(130), "128 + SIGINT: {status}");
    for f in files {
        assert!(!std::path::Path::new(&f).exists(), "{f} left behind");
    }
}

#[test]
fn help_version_and_unknown_flags_follow_the_conventions() {
    let help = te_bench().arg("--help").output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).starts_with("usage: te-bench"));
    let version = te_bench().arg("--version").output().unwrap();
    assert_eq!(version.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("te-bench {}", env!("CARGO_PKG_VERSION"))
    );
    let bad = te_bench().arg("--no_such_flag=1").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("unknown flag --no_such_flag") && err.contains("usage: te-bench"),
        "{err}"
    );
}
