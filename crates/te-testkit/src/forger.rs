//! A forger of descriptors, for attack tests: it takes a real engine's descriptor (as anyone who
//! reaches a control port may, without a cluster secret), rewrites it, and serves it from a
//! control listener of its own, in its own process. Its rails lead to a dead port, so the only
//! way a transfer through the forged descriptor could complete is a same-host path.

use std::io::Write;
use std::time::Duration;

use te_core::control::frame::{FrameType, read_frame, write_frame};

/// How the forger rewrites the descriptor it serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Forgery {
    /// Name itself (pid and start time) as the owner, so the descriptor is proven its own.
    pub claim_self: bool,
    /// Make every buffer read-write.
    pub widen: bool,
}

/// Fetches the descriptor of segment `from` (`host:port`), rewrites it as `how` says, prints
/// `READY <ip:port>` and serves it at `at` (`ip:port`; port 0 for any) until killed.
///
/// # Panics
/// When `from` cannot be fetched or `at` bound (a test helper).
pub fn serve_forged(from: &str, at: &str, how: Forgery) -> ! {
    let (host, port) = from.rsplit_once(':').expect("host:port");
    let reply = te_core::control::request(
        host,
        port.parse().expect("a port"),
        FrameType::Metadata,
        b"{}",
        Duration::from_secs(5),
        1 << 20,
        None,
    )
    .expect("the template descriptor");
    let listener = std::net::TcpListener::bind(at).expect("the forger's listener");
    let served = listener.local_addr().expect("bound").to_string();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to close");
    let dead_port = dead.local_addr().expect("bound").port();
    drop(dead);
    let mut desc: serde_json::Value = serde_json::from_slice(&reply).expect("JSON");
    desc["name"] = served.clone().into();
    desc["te_rails"] = serde_json::json!([{"name": "lo", "ip": "127.0.0.1", "port": dead_port}]);
    if how.claim_self {
        desc["te_owner"] = te_core::segment::process_identity(std::process::id())
            .expect("this process")
            .into();
    }
    if how.widen {
        for b in desc["buffers"].as_array_mut().into_iter().flatten() {
            b["permission"] = "remote_read_write".into();
        }
    }
    let desc = desc.to_string();
    println!("READY {served}");
    let _ = std::io::stdout().flush();
    for stream in listener.incoming() {
        let Ok(mut s) = stream else { continue };
        let Ok(mut r) = s.try_clone() else { continue };
        while read_frame(&mut r, 1 << 20).is_ok() {
            if write_frame(&mut s, FrameType::Metadata, desc.as_bytes()).is_err() {
                break;
            }
        }
    }
    unreachable!("a listener's incoming connections never end")
}
