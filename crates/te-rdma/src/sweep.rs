//! The sweep thread: dials the initiators a target keeps queue pairs for and drops the groups
//! of those that are gone. What counts as gone is decided in [`crate::liveness`]; this module
//! only dials and applies the answer.
//!
//! A te initiator's control listener is asked with a bare connection (accepted means alive).
//! A Mooncake initiator's handshake listener is asked with a probe frame, as Mooncake's own
//! `send_probe` does: it answers `{"status":"success"}` without logging, where a connection
//! closed unasked makes it log two warnings. A Mooncake address is a guess until it has answered
//! once; guesses are dialled within a tenth of a second of their handshake, the rest every
//! sweep period.
//!
//! Not here: which address a handshake names ([`crate::liveness::control_address`]), the
//! handshakes themselves.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use te_core::control::frame::{FrameType, read_frame, write_frame};
use tracing::info;

use crate::State;
use crate::liveness::{Listener, Probe};

/// How long one dial (and a Mooncake listener's answer) may take.
const DIAL: Duration = Duration::from_secs(2);

/// Largest probe answer read: Mooncake's is a few bytes.
const MAX_ANSWER: usize = 4096;

/// Every `every`, dials each initiator the target keeps queue pairs for, and drops the groups
/// of those that are gone; guesses not yet confirmed are dialled on the next tick. Returns
/// once the transport shuts down or is dropped. The state is held only to list whom to dial
/// and to apply each answer, never across a dial (up to two seconds), so a shutdown does not
/// wait on a dial to release the state.
pub(crate) fn run(state: &Weak<State>, every: Duration) {
    let mut last = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100).min(every));
        let due = last.elapsed() >= every;
        if due {
            last = Instant::now();
        }
        let peers = {
            let Some(s) = live(state) else { return };
            let initiators = s.initiators.lock().unwrap_or_else(|e| e.into_inner());
            let mut peers = initiators.unconfirmed();
            if due {
                peers.extend(initiators.addresses());
            }
            peers
        };
        if !dial_all(state, peers) {
            return;
        }
    }
}

/// The state, while the transport runs.
fn live(state: &Weak<State>) -> Option<Arc<State>> {
    state.upgrade().filter(|s| !s.stop.load(Ordering::Acquire))
}

/// Dials each of `peers` and applies what it found; false once the transport stops.
fn dial_all(state: &Weak<State>, peers: Vec<(SocketAddr, Listener)>) -> bool {
    for (addr, listener) in peers {
        let probe = dial(addr, listener);
        let Some(s) = live(state) else { return false };
        // The groups are taken out under the initiators' lock, as they are replaced under it.
        let mut initiators = s.initiators.lock().unwrap_or_else(|e| e.into_inner());
        let gone = initiators.observe(addr, probe);
        if !gone.is_empty() {
            let dropped: Vec<_> = {
                let mut passive = s.passive.lock().unwrap_or_else(|e| e.into_inner());
                gone.iter().filter_map(|k| passive.remove(k)).collect()
            };
            drop(initiators);
            info!(initiator = %addr, ?listener, groups = gone.len(), "dropped the queue pairs of an initiator that is gone");
            // Their queue pairs are destroyed here, with no lock held.
            drop(dropped);
        }
    }
    true
}

/// What dialling `addr` finds.
fn dial(addr: SocketAddr, listener: Listener) -> Probe {
    let stream = match TcpStream::connect_timeout(&addr, DIAL) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Probe::Refused,
        Err(_) => return Probe::Silent,
    };
    match listener {
        Listener::Te => Probe::Alive,
        Listener::Mooncake if answers_probe(&stream) => Probe::Alive,
        Listener::Mooncake => Probe::Silent,
    }
}

/// Whether the listener on `stream` answers a probe frame as Mooncake's does.
fn answers_probe(stream: &TcpStream) -> bool {
    let mut s = stream;
    let asked = stream
        .set_read_timeout(Some(DIAL))
        .and_then(|()| stream.set_write_timeout(Some(DIAL)))
        .and_then(|()| write_frame(&mut s, FrameType::Probe, b"{}"));
    asked.is_ok()
        && read_frame(&mut s, MAX_ANSWER).is_ok_and(|(_, answer)| {
            serde_json::from_slice::<serde_json::Value>(&answer)
                .is_ok_and(|v| v["status"] == "success")
        })
}
