//! Notifications from strangers, against a real engine's control listener on loopback: a
//! notification larger than `MC_TE_NOTIFY_MAX_BYTES` is refused from its length alone, before
//! its body is sent; one source (another loopback address here) holds at most a quarter of the
//! queue's bytes however much it sends; an honest sender from another address still gets
//! through; and every notification carries the address of the connection it came on, whatever
//! name its sender wrote.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use te_core::control::frame::{FrameType, read_frame, write_frame};
use te_core::notify::NotifyLimits;
use te_core::{Config, Notification, TransferEngine};

fn engine(limits: NotifyLimits) -> TransferEngine {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    c.notify = limits;
    TransferEngine::init(c, "P2PHANDSHAKE", "127.0.0.1").unwrap()
}

/// A control connection from `source` (a loopback address) to `e`'s listener.
fn connect_from(source: &str, e: &TransferEngine) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let from: SocketAddr = format!("{source}:0").parse().unwrap();
    socket.bind(&from.into()).unwrap();
    let to: SocketAddr = e.segment_name().parse().unwrap();
    socket.connect(&to.into()).unwrap();
    let s: TcpStream = socket.into();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Sends one notification on `s` and returns the reply's text.
fn notify(s: &mut TcpStream, name: &str, msg: &str) -> String {
    let n = Notification {
        name: name.into(),
        notify_msg: msg.into(),
    };
    write_frame(s, FrameType::Notify, &serde_json::to_vec(&n).unwrap()).unwrap();
    let (_, reply) = read_frame(s, 1 << 20).unwrap();
    String::from_utf8(reply).unwrap()
}

#[test]
fn a_notification_over_the_bound_is_refused_from_its_length_alone() {
    let e = engine(NotifyLimits::default());
    let mut s = connect_from("127.0.0.2", &e);
    // The head of a 1 MiB notification, and nothing of its body.
    let mut head = ((1u64 << 20) + 1).to_le_bytes().to_vec();
    head.push(FrameType::Notify as u8);
    s.write_all(&head).unwrap();
    let (kind, reply) = read_frame(&mut s, 1 << 20).expect("refused before the body came");
    let reply = String::from_utf8(reply).unwrap();
    assert_eq!(kind, FrameType::Notify);
    assert!(
        reply.contains("MC_TE_NOTIFY_MAX_BYTES") && reply.contains("1048576"),
        "{reply}"
    );
    assert!(e.take_notifies().is_empty());
}

#[test]
fn a_source_holds_a_quarter_of_the_queue_and_every_notification_names_its_connection() {
    let limits = NotifyLimits {
        max_queued: 4 << 20,
        ..NotifyLimits::default()
    };
    let e = engine(limits);
    let mut stranger = connect_from("127.0.0.2", &e);
    let body = "x".repeat(60 << 10);
    let mut accepted = 0usize;
    let mut refusal = None;
    // 16 MiB offered, four times the queue.
    for _ in 0..280 {
        let reply = notify(&mut stranger, "honest-peer", &body);
        match reply.contains("success") {
            true => accepted += 1,
            false => {
                refusal.get_or_insert(reply);
            }
        }
    }
    let refusal = refusal.expect("the stranger was refused once its share was held");
    assert!(refusal.contains("your address"), "{refusal}");
    assert!(
        accepted * body.len() <= limits.max_queued / 4,
        "{accepted} notifications of 60 KiB held for one source"
    );
    assert!(accepted >= 10, "its share was given: {accepted}");
    // Another source still gets through.
    let mut honest = connect_from("127.0.0.1", &e);
    assert!(notify(&mut honest, "honest-peer", "hello").contains("success"));
    let got = e.take_notifies();
    assert_eq!(got.len(), accepted + 1);
    let (forged, real): (Vec<_>, Vec<_>) = got
        .iter()
        .partition(|r| r.sender.addr.ip().to_string() == "127.0.0.2");
    assert_eq!(forged.len(), accepted);
    assert_eq!(real.len(), 1);
    assert_eq!(real[0].notification.notify_msg, "hello");
    assert!(
        got.iter()
            .all(|r| r.notification.name == "honest-peer" && !r.sender.authenticated),
        "the name is the sender's word; the address tells them apart"
    );
    // Taking them gave the share back.
    assert!(notify(&mut stranger, "x", &body).contains("success"));
}
