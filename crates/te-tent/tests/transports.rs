//! te-tent over real transports: failover from a broken shared-memory path to TCP between two
//! processes, notifications that arrive after the data they announce, and staging GPU-located
//! memory through host memory (the device hop is a copy transport standing in for a GPU copy
//! engine, which this machine does not have; the network hop is real TCP).

#![allow(unsafe_code)] // a test transport copies registered memory as a real one does

use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use te_core::transport::{Capabilities, CompletionSink, InstallContext, SliceOp, Transport};
use te_core::{HostBuffer, Notification, Opcode, Permission, TransferState};
use te_tent::{MemoryOptions, Request, TentConfig, TentEngine, TentFile};
use te_testkit::{pattern, self_test_args, spawn_ready};

const LEN: usize = 4 << 20;

fn tent(conf: &str) -> TentEngine {
    let file = TentFile::parse_source(conf).unwrap();
    let config = TentConfig::from_file(file, |name| {
        (name == "MC_TCP_BIND_ADDRESS").then(|| "127.0.0.1".to_string())
    })
    .unwrap();
    TentEngine::new(config).unwrap()
}

fn private() -> MemoryOptions {
    MemoryOptions {
        permission: Permission::LocalOnly,
        ..MemoryOptions::default()
    }
}

#[test]
#[ignore = "helper: started by a_broken_shared_memory_path_fails_over_to_tcp as the target"]
fn tent_target() {
    if std::env::var("TE_TENT_TARGET").is_err() {
        return;
    }
    let t = tent("{}");
    // Shared memory from te-shm, so a peer on this host prefers it.
    let buf = t.allocate_memory(LEN, &MemoryOptions::default()).unwrap();
    buf.write_at(0, &vec![0; LEN]).unwrap();
    println!("READY {} {}", t.segment_name(), buf.addr());
    let n = t
        .receive_notification(Duration::from_secs(120))
        .expect("the initiator's notification");
    // The notification follows the data: everything is in place when it arrives.
    let intact = n.notify_msg == "written" && buf.to_vec(0, LEN).unwrap() == pattern(9, LEN);
    t.free_memory(buf.addr()).unwrap();
    std::process::exit(if intact { 0 } else { 3 });
}

#[test]
fn a_broken_shared_memory_path_fails_over_to_tcp() {
    let (mut target, ready) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("tent_target"))
            .env("TE_TENT_TARGET", "1"),
    );
    let (name, remote) = ready.split_once(' ').unwrap();
    let remote: u64 = remote.parse().unwrap();
    // Metrics on, from the configuration file's block, on any free loopback port.
    let t = tent(
        r#"{"metrics": {"enabled": true, "http_port": 0, "http_host": "127.0.0.1",
        "http_server_threads": 2, "report_interval_seconds": 0}}"#,
    );
    let local = Arc::new(HostBuffer::new(LEN).unwrap());
    local.write_at(0, &pattern(9, LEN)).unwrap();
    t.register_memory(&local, &private()).unwrap();
    let seg = t.open_segment(name).unwrap();
    // Break the shared-memory path: the owner keeps its mapping, but no peer can open the file.
    let path = t.core().segment(seg).unwrap().desc().buffers[0]
        .shm_name
        .clone()
        .expect("published as shared memory");
    std::fs::remove_file(&path).unwrap();
    let batch = t.allocate_batch(1).unwrap();
    let write = Request::new(Opcode::Write, local.addr(), seg, remote, LEN as u64);
    t.submit_with_notification(
        batch,
        &[write],
        Notification {
            name: t.segment_name().to_string(),
            notify_msg: "written".into(),
        },
    )
    .unwrap();
    let s = t.wait(batch, Duration::from_secs(120)).unwrap();
    assert_eq!(
        s.state,
        TransferState::Completed,
        "{:?}",
        t.task_errors(batch, 0)
    );
    assert_eq!(t.task_transport(batch, 0).unwrap(), "tcp", "failed over");
    let errors = t.task_errors(batch, 0).unwrap();
    assert!(
        errors.len() == 1 && errors[0].starts_with("shm"),
        "shm was tried first and failed: {errors:?}"
    );
    let status = target.wait().unwrap();
    assert!(status.success(), "the target found every byte: {status}");
    // The counters tell the same story: one request, ended on TCP with its bytes; one failed
    // shared-memory attempt, one TCP attempt; one failover from shm to TCP.
    let text = scrape("/metrics");
    for line in [
        r#"tent_write_requests_total{transport="tcp"} 1"#.to_string(),
        format!(r#"tent_write_bytes_total{{transport="tcp"}} {LEN}"#),
        r#"tent_transport_failover_total{from="shm",to="tcp"} 1"#.into(),
        r#"tent_transport_attempts_total{transport="shm",operation="write"} 1"#.into(),
        r#"tent_transport_attempt_failures_total{transport="shm",operation="write"} 1"#.into(),
        r#"tent_transport_attempts_total{transport="tcp",operation="write"} 1"#.into(),
        r#"tent_transport_attempt_failures_total{transport="tcp",operation="write"} 0"#.into(),
        r#"tent_stage_transport_us_count{transport="tcp"} 1"#.into(),
        r#"tent_stage_queue_wait_us_count{transport="tcp"} 1"#.into(),
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
    assert!(
        !text.contains(r#"tent_write_requests_total{transport="shm"}"#),
        "the request is counted once, on its final transport:\n{text}"
    );
    assert_eq!(scrape("/health"), "OK\n");
}

#[test]
fn private_memory_on_this_host_is_planned_past_shared_memory() {
    // Two engines of one host: the target's buffer is its own private memory, which shared
    // memory cannot reach, so the plan goes straight to TCP (nothing tried and failed first).
    let (a, b) = (tent("{}"), tent("{}"));
    let src = Arc::new(HostBuffer::new(1 << 20).unwrap());
    src.write_at(0, &pattern(4, 1 << 20)).unwrap();
    a.register_memory(&src, &private()).unwrap();
    let dst = Arc::new(HostBuffer::new(1 << 20).unwrap());
    b.register_memory(&dst, &MemoryOptions::default()).unwrap();
    let seg = a.open_segment(b.segment_name()).unwrap();
    let batch = a.allocate_batch(1).unwrap();
    let write = Request::new(Opcode::Write, src.addr(), seg, dst.addr(), 1 << 20);
    a.submit(batch, &[write]).unwrap();
    let s = a.wait(batch, Duration::from_secs(60)).unwrap();
    assert_eq!(s.state, TransferState::Completed);
    assert_eq!(a.task_transport(batch, 0).unwrap(), "tcp");
    assert_eq!(
        a.task_errors(batch, 0).unwrap(),
        Vec::<String>::new(),
        "nothing failed first"
    );
    assert_eq!(dst.to_vec(0, 1 << 20).unwrap(), pattern(4, 1 << 20));
}

/// The body of `GET path` from this process's metrics endpoint.
fn scrape(path: &str) -> String {
    let addr = te_metrics::endpoint().expect("the metrics endpoint started");
    assert!(addr.ip().is_loopback(), "{addr}");
    let (status, body) = te_testkit::services::http_get(addr, path).unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    body
}

#[test]
fn notifications_arrive_after_their_data() {
    let target = tent(r#"{"transports": {"shm": {"enable": false}}}"#);
    let tbuf = Arc::new(HostBuffer::new(LEN).unwrap());
    target
        .register_memory(&tbuf, &MemoryOptions::default())
        .unwrap();
    let init = tent("{}");
    let local = Arc::new(HostBuffer::new(LEN).unwrap());
    init.register_memory(&local, &private()).unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    for round in 0..4u64 {
        local.write_at(0, &pattern(round, LEN)).unwrap();
        let batch = init.allocate_batch(4).unwrap();
        // Four requests of 1 MiB; the notification follows all four.
        let requests: Vec<Request> = (0..4u64)
            .map(|i| {
                Request::new(
                    Opcode::Write,
                    local.addr() + i * (1 << 20),
                    seg,
                    tbuf.addr() + i * (1 << 20),
                    1 << 20,
                )
            })
            .collect();
        let note = Notification {
            name: "init".into(),
            notify_msg: format!("round {round}"),
        };
        init.submit_with_notification(batch, &requests, note)
            .unwrap();
        let n = target
            .receive_notification(Duration::from_secs(30))
            .expect("notified");
        assert_eq!(n.notify_msg, format!("round {round}"));
        assert!(
            tbuf.to_vec(0, LEN).unwrap() == pattern(round, LEN),
            "round {round}: the data was in place when the notification arrived"
        );
        assert_eq!(
            init.wait(batch, Duration::from_secs(10)).unwrap().state,
            TransferState::Completed
        );
        init.free_batch(batch).unwrap();
    }
    // A notification sent directly goes too.
    init.send_notification(
        seg,
        &Notification {
            name: "init".into(),
            notify_msg: "direct".into(),
        },
    )
    .unwrap();
    let n = target
        .receive_notification(Duration::from_secs(10))
        .unwrap();
    assert_eq!(n.notify_msg, "direct");
}

/// An engine dropped while a large READ over TCP is under way: the drop returns only once
/// nothing of the engine moves bytes any more, so the application may free its buffer at once,
/// and nothing lands in it afterwards.
#[test]
fn a_dropped_engine_moves_nothing_more_into_its_memory() {
    let len: usize = 256 << 20;
    let target = tent(r#"{"transports": {"shm": {"enable": false}}}"#);
    let tbuf = Arc::new(HostBuffer::new(len).unwrap());
    tbuf.write_at(0, &vec![0xa5; len]).unwrap();
    target
        .register_memory(&tbuf, &MemoryOptions::default())
        .unwrap();
    let init = tent(r#"{"transports": {"shm": {"enable": false}}}"#);
    let local = Arc::new(HostBuffer::new(len).unwrap());
    init.register_memory(&local, &private()).unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let batch = init.allocate_batch(1).unwrap();
    let read = Request::new(Opcode::Read, local.addr(), seg, tbuf.addr(), len as u64);
    init.submit(batch, &[read]).unwrap();
    te_testkit::wait_for_first_byte(&local, 0xa5);
    drop(init);
    te_testkit::assert_nothing_lands(&local, len, "its engine was dropped");
}

/// Copies between memory of this process: the device hop of staging (a GPU copy engine's
/// part, which this machine has none of).
#[derive(Default)]
struct DeviceCopy {
    sink: OnceLock<Arc<dyn CompletionSink>>,
}

impl Transport for DeviceCopy {
    fn name(&self) -> &'static str {
        "devcopy"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::GPU_LOCAL
    }

    fn install(&self, ctx: InstallContext) -> te_core::Result<()> {
        let _ = self.sink.set(ctx.sink);
        Ok(())
    }

    fn post(&self, slices: Vec<SliceOp>) {
        for op in slices {
            let (src, dst) = match op.opcode {
                Opcode::Read => (op.remote_addr, op.local_addr),
                _ => (op.local_addr, op.remote_addr),
            };
            // SAFETY: the engine posted this slice after checking the local range against its
            // registered regions and the remote range against the own segment's buffers, both
            // memory of this process that stays registered while the slice is in flight.
            unsafe {
                std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, op.len as usize)
            };
            if let Some(sink) = self.sink.get() {
                sink.complete(op, Ok(()));
            }
        }
    }
}

#[test]
fn gpu_located_memory_is_staged_through_host_memory() {
    let target = tent(r#"{"transports": {"shm": {"enable": false}}}"#);
    let tbuf = Arc::new(HostBuffer::new(LEN).unwrap());
    target
        .register_memory(&tbuf, &MemoryOptions::default())
        .unwrap();
    // Stage in 1 MiB chunks; only TCP (host memory) reaches the target.
    let init =
        tent(r#"{"transports": {"shm": {"enable": false}}, "staging": {"chunk_size": 1048576}}"#);
    let gpu_capable = init
        .core()
        .transport_capabilities()
        .iter()
        .any(|(_, c)| c.contains(Capabilities::GPU_REMOTE_HOST));
    if gpu_capable {
        // A machine with CUDA: TCP moves GPU memory itself, so nothing is staged here (the GPU
        // suite, `cargo xtask gpu`, covers that machine).
        eprintln!("a CUDA driver is present: staging through a stand-in copy engine not checked");
        return;
    }
    let gpu = Arc::new(HostBuffer::new(LEN).unwrap());
    let gpu_mem = MemoryOptions {
        location: "cuda:0".into(),
        permission: Permission::RemoteReadWrite,
    };
    assert!(
        init.register_memory(&gpu, &gpu_mem).is_err(),
        "GPU memory needs a transport that handles it"
    );
    init.install_transport(Arc::new(DeviceCopy::default()))
        .unwrap();
    init.register_memory(&gpu, &gpu_mem).unwrap();
    gpu.write_at(0, &pattern(21, LEN)).unwrap();
    let seg = init.open_segment(target.segment_name()).unwrap();
    let len = LEN as u64 - 4096 - 3;
    let batch = init.allocate_batch(2).unwrap();
    let write = Request::new(Opcode::Write, gpu.addr() + 3, seg, tbuf.addr() + 4096, len);
    init.submit(batch, &[write]).unwrap();
    assert_eq!(
        init.wait(batch, Duration::from_secs(60)).unwrap().state,
        TransferState::Completed,
        "{:?}",
        init.task_errors(batch, 0)
    );
    assert_eq!(init.task_transport(batch, 0).unwrap(), "staged");
    assert!(
        tbuf.to_vec(4096, len as usize).unwrap() == pattern(21, LEN)[3..3 + len as usize],
        "staged write: bytes differ"
    );
    // And back: a READ into GPU memory stages the other way.
    gpu.write_at(0, &vec![0; LEN]).unwrap();
    let read = Request::new(Opcode::Read, gpu.addr(), seg, tbuf.addr() + 4096, len);
    init.submit(batch, &[read]).unwrap();
    assert_eq!(
        init.wait(batch, Duration::from_secs(60)).unwrap().state,
        TransferState::Completed
    );
    assert!(
        gpu.to_vec(0, len as usize).unwrap() == pattern(21, LEN)[3..3 + len as usize],
        "staged read: bytes differ"
    );
}

#[cfg(feature = "nvlink")]
#[test]
fn nvlink_is_installed_where_a_cuda_driver_is_unless_disabled() {
    let names = |t: &TentEngine| -> Vec<&'static str> {
        t.core()
            .transport_capabilities()
            .iter()
            .map(|(n, _)| *n)
            .collect()
    };
    let installed = names(&tent("{}"));
    assert_eq!(
        installed.contains(&"nvlink"),
        te_cuda::driver().is_ok(),
        "{installed:?}"
    );
    assert!(installed.contains(&"tcp"), "the rest install either way");
    let disabled = names(&tent(r#"{"transports": {"nvlink": {"enable": false}}}"#));
    assert!(!disabled.contains(&"nvlink"), "{disabled:?}");
}
