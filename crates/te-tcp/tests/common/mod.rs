//! Helpers shared by te-tcp's integration tests: engines on loopback and byte patterns.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use te_core::control::ControlState;
use te_core::notify::NotificationQueue;
use te_core::{
    Config, HostBuffer, Opcode, Permission, TransferEngine, TransferRequest, TransferState,
};
use te_tcp::{TcpSettings, TcpTransport};

pub const WAIT: Duration = Duration::from_secs(60);

pub fn config() -> Config {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    c
}

pub fn engine_with(config: Config) -> TransferEngine {
    engine_with_tcp(config, TcpSettings::default())
}

/// An engine with `config` and te-tcp's `settings`.
pub fn engine_with_tcp(config: Config, settings: TcpSettings) -> TransferEngine {
    let e = TransferEngine::init(config, "P2PHANDSHAKE", "127.0.0.1").expect("engine starts");
    e.install_transport(Arc::new(TcpTransport::with_settings(settings)))
        .expect("tcp installs");
    e
}

/// te-tcp's defaults with `set` applied.
pub fn tcp(set: impl FnOnce(&mut TcpSettings)) -> TcpSettings {
    let mut settings = TcpSettings::default();
    set(&mut settings);
    settings
}

pub fn engine() -> TransferEngine {
    engine_with(config())
}

/// A config with the listener for Mooncake initiators (`MC_TE_MOONCAKE_COMPAT=1`) and te-core's
/// further `MC_TE_MOONCAKE_*` settings in `vars` (the allow-list, the v1 framing).
pub fn compat_config(vars: &[(&str, &str)]) -> Config {
    let mut c = config();
    c.mooncake = te_core::mooncake::MooncakeCompat::from_lookup(|k| match k {
        "MC_TE_MOONCAKE_COMPAT" => Some("1".into()),
        k => vars
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string()),
    })
    .unwrap();
    c
}

/// A connection to `t`'s listener for Mooncake initiators, its reads timing out after 20 s.
pub fn connect_compat(t: &TransferEngine) -> std::net::TcpStream {
    let port = t.local_descriptor().tcp_data_port.expect("a Mooncake port");
    let s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// A request header in Mooncake's framing; `acked`: the acknowledged framing (v2).
pub fn mooncake_header(
    opcode: Opcode,
    addr: u64,
    size: u64,
    acked: bool,
) -> [u8; te_tcp::wire::mooncake::HEADER_LEN] {
    te_tcp::wire::mooncake::Header {
        opcode,
        addr,
        size,
        acked,
    }
    .encode()
}

/// Reads one status frame in Mooncake's framing.
pub fn mooncake_status(s: &mut impl std::io::Read) -> [u8; te_tcp::wire::mooncake::STATUS_LEN] {
    let mut b = [0u8; te_tcp::wire::mooncake::STATUS_LEN];
    s.read_exact(&mut b).unwrap();
    b
}

/// Reads one reply in Mooncake's framing on `s` and checks it: an OK status, then, for a READ
/// (`data`), as many bytes as `data` holds, equal to it; `what` names the request in failures.
pub fn expect_mooncake_ok(s: &mut impl std::io::Read, data: Option<&[u8]>, what: &str) {
    use te_tcp::wire::mooncake::{STATUS_OK, encode_status};
    assert_eq!(
        mooncake_status(s),
        encode_status(STATUS_OK),
        "{what}: status"
    );
    if let Some(want) = data {
        let mut got = vec![0u8; want.len()];
        s.read_exact(&mut got).unwrap();
        assert!(got == want, "{what}: the READ's data");
    }
}

/// Writes `wire` on `s` in the pieces that `cuts` end (and a last one to its end), each
/// reaching the target before the next is sent.
pub fn write_in_pieces(
    s: &std::net::TcpStream,
    wire: Vec<u8>,
    mut cuts: Vec<usize>,
) -> std::thread::JoinHandle<()> {
    use std::io::Write;
    cuts.push(wire.len());
    cuts.dedup();
    let mut s = s.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut at = 0;
        for cut in cuts {
            s.write_all(&wire[at..cut]).unwrap();
            at = cut;
            std::thread::sleep(Duration::from_millis(2));
        }
    })
}

#[allow(unused_imports)] // not every test file uses it
pub use te_testkit::pattern;

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

/// Serves `desc` as a segment descriptor on a real control listener (its `name` is set to the
/// listener's address); returns the listener and that name.
pub fn serve_descriptor(mut desc: serde_json::Value) -> (te_reactor::Server, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let name = listener.local_addr().unwrap().to_string();
    desc["name"] = name.clone().into();
    let state = Arc::new(ControlState {
        local_desc: std::sync::RwLock::new(Arc::new(desc.to_string())),
        notifications: Arc::new(NotificationQueue::new(te_core::notify::NotifyLimits {
            max_count: 4,
            ..Default::default()
        })),
        max_payload: 1 << 20,
        cluster_key: None,
        connection_handler: std::sync::RwLock::new(None),
        mooncake: Default::default(),
        public_desc: std::sync::RwLock::new(None),
    });
    (
        te_core::control::start_server(listener, state, &Default::default()).unwrap(),
        name,
    )
}

/// A segment whose descriptor points at a data port that accepts connections and never answers.
/// Keep the returned listeners alive for as long as the segment is used.
pub fn silent_segment(len: u64) -> (te_reactor::Server, String, std::net::TcpListener) {
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let desc = serde_json::json!({
        "protocol": "tcp", "te_wire_version": 2,
        "te_rails": [{"name": "lo", "ip": "127.0.0.1", "port": blackhole.local_addr().unwrap().port()}],
        "te_secret": "00".repeat(16),
        "buffers": [{"name": "cpu:0", "addr": 4096, "length": len, "permission": "remote_read_write"}],
    });
    let (control, name) = serve_descriptor(desc);
    (control, name, blackhole)
}

/// Asserts that `addr`'s region is pinned now (a request on it under way); `what` names the case.
pub fn assert_pinned(e: &TransferEngine, addr: u64, what: &str) {
    assert!(
        matches!(
            e.unregister_memory(addr),
            Err(te_core::Error::RegionBusy { .. })
        ),
        "{what}: pinned while the request is under way"
    );
}

/// Unregisters `addr`'s region once nothing pins it, within `within`; panics (naming `what`)
/// if it stays pinned that long, as it would if a closed connection kept its pin.
pub fn unregister_once_unpinned(e: &TransferEngine, addr: u64, within: Duration, what: &str) {
    let deadline = std::time::Instant::now() + within;
    loop {
        match e.unregister_memory(addr) {
            Ok(()) => return,
            Err(te_core::Error::RegionBusy { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(err) => panic!("{what}: the region stays pinned after its peer left: {err}"),
        }
    }
}

/// A reply expected on a raw data connection: its request id, its status and, for a READ, the
/// data that follows it.
pub type Expected = (u64, te_tcp::wire::Status, Option<Vec<u8>>);

/// Reads the replies on `conn` and checks each against `expected`, in order, READ data included.
pub fn expect_replies(conn: &mut impl std::io::Read, expected: Vec<Expected>) {
    use te_tcp::wire::{REPLY_LEN, Reply};
    for (id, status, data) in expected {
        let mut head = [0u8; REPLY_LEN];
        conn.read_exact(&mut head).unwrap();
        assert_eq!(
            Reply::decode(&head).unwrap(),
            Reply {
                status,
                request_id: id
            }
        );
        if let Some(want) = data {
            let mut got = vec![0u8; want.len()];
            conn.read_exact(&mut got).unwrap();
            assert!(
                got == want,
                "READ {id} returns what the WRITE before it wrote"
            );
        }
    }
}

/// A connection of a test's own to te's data listener at `port` on loopback, past the
/// listener's greeting, and the proof of `secret` its requests carry.
pub struct DataConn(pub std::net::TcpStream, pub [u8; 16]);

impl DataConn {
    pub fn open(port: u16, secret: te_core::segment::SegmentSecret) -> Self {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut greeting = [0u8; te_tcp::wire::GREETING_LEN];
        s.read_exact(&mut greeting).unwrap();
        let nonce = te_tcp::wire::decode_greeting(&greeting).unwrap();
        let proof = te_tcp::wire::connection_proof(&secret, &nonce);
        DataConn(s, proof)
    }

    /// Sends `r` (a WRITE with `body`) and reads its reply, and a READ's data.
    pub fn call(&mut self, r: te_tcp::wire::Request, body: &[u8]) -> te_tcp::wire::Reply {
        use std::io::{Read, Write};
        use te_tcp::wire::{REPLY_LEN, Reply, Status};
        self.0.write_all(&r.encode()).unwrap();
        if r.opcode == Opcode::Write {
            self.0.write_all(body).unwrap();
        }
        let mut head = [0u8; REPLY_LEN];
        self.0.read_exact(&mut head).unwrap();
        let reply = Reply::decode(&head).unwrap();
        if r.opcode == Opcode::Read && reply.status == Status::Ok {
            let mut data = vec![0u8; r.len as usize];
            self.0.read_exact(&mut data).unwrap();
        }
        reply
    }

    /// Sends raw bytes and reports whether the target closes the connection.
    pub fn closes_after(mut self, bytes: &[u8]) -> bool {
        use std::io::{Read, Write};
        let _ = self.0.write_all(bytes);
        let mut sink = [0u8; 256];
        loop {
            match self.0.read(&mut sink) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) => return matches!(e.kind(), std::io::ErrorKind::ConnectionReset),
            }
        }
    }
}
