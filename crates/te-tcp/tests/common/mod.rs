//! Helpers shared by te-tcp's integration tests: engines on loopback and byte patterns.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use te_core::{
    Config, HostBuffer, Opcode, Permission, TransferEngine, TransferRequest, TransferState,
};
use te_tcp::TcpTransport;

pub const WAIT: Duration = Duration::from_secs(60);

pub fn config() -> Config {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    c
}

pub fn engine_with(config: Config) -> TransferEngine {
    let e = TransferEngine::init(config, "P2PHANDSHAKE", "127.0.0.1").expect("engine starts");
    e.install_transport(Arc::new(TcpTransport::new()))
        .expect("tcp installs");
    e
}

pub fn engine() -> TransferEngine {
    engine_with(config())
}

/// Deterministic bytes: a function of the seed and the byte's position.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn buffer(len: usize) -> Arc<HostBuffer> {
    Arc::new(HostBuffer::new(len).unwrap())
}

pub fn register(e: &TransferEngine, b: &Arc<HostBuffer>, p: Permission) {
    e.register_buffer(b, "*", p).expect("register");
}

pub fn request(op: Opcode, source: u64, target_id: u64, target: u64, len: u64) -> TransferRequest {
    TransferRequest {
        opcode: op,
        source,
        target_id,
        target_offset: target,
        length: len,
    }
}

/// Submits `requests` as one batch, waits, frees, and returns the final state.
pub fn run(e: &TransferEngine, requests: &[TransferRequest]) -> TransferState {
    let b = e.allocate_batch(requests.len()).unwrap();
    e.submit(b, requests).unwrap();
    let s = e.wait(b, WAIT).unwrap();
    e.free_batch(b).unwrap();
    s.state
}

/// An initiator and a target with one buffer each; the target's is remotely read-write.
pub struct Pair {
    pub initiator: TransferEngine,
    pub target: TransferEngine,
    pub local: Arc<HostBuffer>,
    pub remote: Arc<HostBuffer>,
    pub segment: u64,
}

pub fn pair(len: usize) -> Pair {
    let initiator = engine();
    let target = engine();
    let local = buffer(len);
    let remote = buffer(len);
    register(&initiator, &local, Permission::LocalOnly);
    register(&target, &remote, Permission::RemoteReadWrite);
    let segment = initiator.open_segment(target.segment_name()).unwrap();
    Pair {
        initiator,
        target,
        local,
        remote,
        segment,
    }
}
