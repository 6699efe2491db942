//! A hostile peer against te-shm, with real processes on loopback: a peer (its own process, a
//! fake control listener) serves a descriptor whose buffer's `shm_name` names a file of the
//! initiator's choosing on this host, with this host's id and no owner. The initiator's WRITE
//! must not touch that file: te-shm maps only te's own files in its directory.

use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use te_core::control::frame::{FrameType, read_frame, write_frame};
use te_core::{
    Config, HostBuffer, Opcode, Permission, TransferEngine, TransferRequest, TransferState,
};
use te_testkit::{Killed, self_test_args, spawn_ready};

const ADDR: u64 = 0x7000_0000;
const LEN: u64 = 1 << 20;

#[test]
#[ignore = "helper: started by a_descriptor_cannot_make_te_write_a_local_file as the peer"]
fn hostile_peer() {
    let Ok(victim) = std::env::var("TE_VICTIM") else {
        return;
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // A dead rail: the only other way to the "buffer" is shared memory.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_port = dead.local_addr().unwrap().port();
    drop(dead);
    let desc = serde_json::json!({
        "name": format!("127.0.0.1:{port}"),
        "protocol": "tcp",
        "buffers": [{"name": "cpu:0", "addr": ADDR, "length": LEN, "shm_name": victim,
                     "permission": "remote_read_write"}],
        "te_rails": [{"name": "lo", "ip": "127.0.0.1", "port": dead_port}],
        "te_secret": "00112233445566778899aabbccddeeff",
        "te_wire_version": 2,
        "te_host_id": te_core::segment::host_id(),
    })
    .to_string();
    println!("READY 127.0.0.1:{port}");
    std::io::stdout().flush().unwrap();
    for stream in listener.incoming() {
        let Ok(mut s) = stream else { continue };
        let mut r = s.try_clone().unwrap();
        while let Ok((_kind, _payload)) = read_frame(&mut r, 1 << 20) {
            if write_frame(&mut s, FrameType::Metadata, desc.as_bytes()).is_err() {
                break;
            }
        }
    }
}

#[test]
fn a_descriptor_cannot_make_te_write_a_local_file() {
    let victim = std::env::temp_dir().join(format!("te-victim-{}", std::process::id()));
    std::fs::write(&victim, vec![0x5au8; LEN as usize]).unwrap();
    let (peer, name) = spawn_ready(
        Command::new(std::env::current_exe().unwrap())
            .args(self_test_args("hostile_peer"))
            .env("TE_VICTIM", &victim),
    );
    let _peer = Killed(peer);
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    c.retry_cnt = 1;
    let e = TransferEngine::init(c, "P2PHANDSHAKE", "127.0.0.1").unwrap();
    e.install_transport(Arc::new(te_tcp::TcpTransport::new()))
        .unwrap();
    e.install_transport(Arc::new(te_shm::ShmTransport::default()))
        .unwrap();
    let local = Arc::new(HostBuffer::new(LEN as usize).unwrap());
    local.write_at(0, &vec![0xeeu8; LEN as usize]).unwrap();
    e.register_buffer(&local, "*", Permission::LocalOnly)
        .unwrap();
    let seg = e
        .open_segment(&name)
        .expect("the peer's descriptor is well formed");
    assert!(
        !e.segment(seg).unwrap().same_host(),
        "it claims this host, but names no owner that served it"
    );
    let b = e.allocate_batch(1).unwrap();
    let w = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: ADDR,
        length: 4096,
    };
    let state = match e.submit(b, &[w]) {
        Ok(()) => e.wait(b, Duration::from_secs(60)).unwrap().state,
        Err(_) => TransferState::Failed,
    };
    let _ = e.free_batch(b);
    assert_ne!(state, TransferState::Completed);
    let after = std::fs::read(&victim).unwrap();
    std::fs::remove_file(&victim).unwrap();
    assert!(
        after.iter().all(|&b| b == 0x5a),
        "the victim file was written through a peer's shm_name"
    );
}
