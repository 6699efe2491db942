//! The control listener's connections on the event loops ([`te_reactor`]): each a small
//! state machine that gathers request frames without blocking, answers them in order (through
//! [`ControlState::answer`]), and runs the cluster challenge-response as two steps
//! ([`auth::server_challenge`], [`auth::server_conclude`]).
//!
//! Bounds: a frame's length is checked before room is made for it, and a connection holds at
//! most one frame being gathered plus its pending replies; buffers shrink back once a large
//! frame is done. A connection silent for [`IDLE_TIMEOUT`] is closed, and so is one whose frame
//! is not whole [`FRAME_DEADLINE`] after its first byte (however it trickles in). When the
//! cluster has a secret, a peer must authenticate first: until it has, its frames may be at
//! most [`auth::AUTH_MAX`] bytes, and it has [`AUTH_DEADLINE`] from its connection to be done.
//! A bad frame closes only its own connection.
//!
//! Not here: what the answers say (`ControlState::answer`). Answers are computed on the loop
//! thread; they are table lookups, except an endpoint handshake, which sets up a transport's
//! queue pairs (microseconds to milliseconds; `MC_TE_CONTROL_THREADS` adds loops).

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tracing::{debug, warn};

use super::frame::{self, Frame, FrameType};
use super::{ControlState, IDLE_TIMEOUT, auth};
use te_reactor::{Outbox, Protocol, Refusal, Step};

/// Frames answered per turn before the other connections get theirs.
const FRAMES_PER_TURN: usize = 64;
/// Bytes read per call.
const READ_CHUNK: usize = 16 << 10;
/// Buffers larger than this are released once empty.
const KEEP_CAPACITY: usize = 4 << 10;
/// How long a frame may take to arrive whole, from its first byte.
pub(super) const FRAME_DEADLINE: Duration = Duration::from_secs(5);
/// How long a peer has, from its connection, to prove the cluster secret.
pub(super) const AUTH_DEADLINE: Duration = Duration::from_secs(5);
/// What every refusal at a connection cap says, so a client knows to ask again later.
pub(super) const AT_CAP: &str = "holds its cap";

enum AuthState {
    /// No cluster secret, or the peer proved it.
    Done,
    /// The peer must prove the secret before anything else.
    Needed,
    /// The challenge went out; the next frame is the answer.
    Proving(auth::PendingProof),
}

/// One control connection.
pub(super) struct ControlConn {
    peer: SocketAddr,
    input: Vec<u8>,
    output: Outbox,
    auth: AuthState,
    /// Served without the challenge (the Mooncake opt-in's allow-list admits the peer).
    admitted: bool,
    /// Close once the output is sent.
    closing: bool,
    last: Instant,
    /// When it was accepted.
    opened: Instant,
    /// When the first byte of the frame being gathered came.
    frame_started: Option<Instant>,
    /// The peer proved something: the cluster's challenge where there is a secret, else a
    /// well-formed request answered. Until then the connection makes room first at a cap.
    proven: bool,
}

/// The control listener's protocol.
pub(super) struct ControlProtocol {
    pub(super) state: Arc<ControlState>,
}

impl ControlConn {
    fn authenticated(&self) -> bool {
        matches!(self.auth, AuthState::Done)
    }

    /// Whether the peer still owes the cluster's proof (a Mooncake peer the opt-in admits
    /// owes none).
    fn owes_proof(&self) -> bool {
        !self.authenticated() && !self.admitted
    }

    fn queue(&mut self, request: &Frame, payload: &[u8]) {
        let kind = (!request.untyped).then_some(request.kind);
        self.output.push(&frame::encode_frame(kind, payload));
    }

    /// Answers one frame: replies are queued; a refusal marks the connection for closing.
    fn handle(&mut self, state: &ControlState, frame: Frame) {
        let peer = Some(self.peer);
        match std::mem::replace(&mut self.auth, AuthState::Done) {
            AuthState::Proving(pending) => {
                let Some(key) = &state.cluster_key else {
                    self.closing = true;
                    return;
                };
                let answer = (frame.kind == FrameType::Auth).then_some(frame.payload.as_slice());
                let (reply, ok) = auth::server_conclude(key, &pending, answer);
                self.queue(&frame, &reply);
                self.proven = ok;
                if !ok {
                    warn!(?peer, "control peer failed cluster authentication");
                    self.auth = AuthState::Needed;
                    self.closing = true;
                }
                return;
            }
            other => self.auth = other,
        }
        if frame.kind == FrameType::Auth && !self.authenticated() {
            if state.cluster_key.is_none() {
                self.closing = true;
                return;
            }
            match auth::server_challenge(&frame.payload) {
                Ok((challenge, pending)) => {
                    self.queue(&frame, &challenge);
                    self.auth = AuthState::Proving(pending);
                }
                Err(refusal) => {
                    self.queue(&frame, &refusal);
                    self.closing = true;
                }
            }
            return;
        }
        if !self.authenticated() && !self.admitted {
            debug!(?peer, kind = ?frame.kind, "unauthenticated control request refused");
            let refusal = json!({"error": "te: authentication required: this cluster has a secret (MC_TE_CLUSTER_SECRET)"});
            self.queue(&frame, refusal.to_string().as_bytes());
            self.closing = true;
            return;
        }
        let answer = state.answer(frame.kind, &frame.payload, self.authenticated(), peer);
        self.queue(&frame, &answer);
        self.proven = true;
    }

    /// Sends what is queued: `Some(step)` when the drive ends here.
    fn flush(&mut self, stream: &mio::net::TcpStream) -> Option<Step> {
        if let Some(step) = self.output.send(stream, &mut self.last) {
            return Some(step);
        }
        self.closing.then_some(Step::Close)
    }
}

impl Protocol for ControlProtocol {
    type Conn = ControlConn;

    fn name(&self) -> &'static str {
        "te-control"
    }

    fn open(&self, peer: SocketAddr, _stream: &mio::net::TcpStream) -> ControlConn {
        ControlConn {
            peer,
            input: Vec::new(),
            output: Outbox::default(),
            auth: match self.state.cluster_key {
                Some(_) => AuthState::Needed,
                None => AuthState::Done,
            },
            admitted: self.state.mooncake.admits(peer.ip()),
            closing: false,
            last: Instant::now(),
            opened: Instant::now(),
            frame_started: None,
            proven: false,
        }
    }

    fn drive(&self, c: &mut ControlConn, mut stream: &mio::net::TcpStream) -> Step {
        let mut frames = 0;
        loop {
            if let Some(step) = c.flush(stream) {
                return step;
            }
            // Small frames only, until a peer that owes the cluster's proof has given it.
            let limit = match c.owes_proof() {
                true => auth::AUTH_MAX.min(self.state.max_payload),
                false => self.state.max_payload,
            };
            // A notification larger than the queue takes is refused by its length alone.
            let max_notify = self.state.notifications.limits().max_message as u64;
            if let Some((len, Some(FrameType::Notify))) = frame::head(&c.input)
                && len.saturating_sub(1) > max_notify
                && !c.owes_proof()
            {
                let why = format!(
                    "te: notification of {} bytes exceeds MC_TE_NOTIFY_MAX_BYTES ({max_notify})",
                    len - 1
                );
                debug!(peer = %c.peer, "{why}");
                c.output.push(&frame::encode_frame(
                    Some(FrameType::Notify),
                    json!({ "error": why }).to_string().as_bytes(),
                ));
                c.input.clear();
                c.closing = true;
                continue;
            }
            match frame::parse_request(&c.input, limit) {
                Ok(Some((request, used))) => {
                    c.input.drain(..used);
                    c.frame_started = (!c.input.is_empty()).then(Instant::now);
                    if c.input.is_empty() && c.input.capacity() > KEEP_CAPACITY {
                        c.input = Vec::new();
                    }
                    c.handle(&self.state, request);
                    frames += 1;
                    if frames >= FRAMES_PER_TURN {
                        return match c.flush(stream) {
                            Some(step) => step,
                            None => Step::Yield,
                        };
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(peer = %c.peer, error = %e, "bad control frame; closing the connection");
                    return Step::Close;
                }
            }
            // Room for the rest of the frame being gathered (its length already bounded), or
            // for the next frame's head.
            let want = match frame::needed(&c.input, limit) {
                Ok(Some(total)) => total.saturating_sub(c.input.len()).clamp(1, READ_CHUNK),
                _ => READ_CHUNK,
            };
            let at = c.input.len();
            c.input.resize(at + want, 0);
            let read = stream.read(&mut c.input[at..]);
            c.input.truncate(at + *read.as_ref().unwrap_or(&0));
            match read {
                Ok(0) => return Step::Close,
                Ok(_) => {
                    c.last = Instant::now();
                    c.frame_started.get_or_insert(c.last);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Blocked,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Step::Close,
            }
        }
    }

    fn expired(&self, c: &ControlConn, now: Instant) -> bool {
        let frame_late = c
            .frame_started
            .is_some_and(|t| now.duration_since(t) > FRAME_DEADLINE);
        let proof_late = c.owes_proof() && now.duration_since(c.opened) > AUTH_DEADLINE;
        frame_late || proof_late || now.duration_since(c.last) > IDLE_TIMEOUT
    }

    fn proves(&self) -> bool {
        true
    }

    fn unproven_since(&self, c: &ControlConn) -> Option<Instant> {
        (!c.proven).then_some(c.opened)
    }

    fn idle_since(&self, c: &ControlConn) -> Option<Instant> {
        (c.input.is_empty() && c.output.is_empty() && !c.closing).then_some(c.last)
    }

    fn refuse(&self, mut stream: &mio::net::TcpStream, _peer: SocketAddr, why: Refusal) {
        let reason = match why {
            Refusal::AddressCap { max } => format!(
                "te: your address {AT_CAP} of {max} control connections \
                 (MC_TE_MAX_CONTROL_CONNECTIONS_PER_ADDRESS); try again later"
            ),
            Refusal::AtCapacity { max } => format!(
                "te: the control listener {AT_CAP} of {max} connections \
                 (MC_TE_MAX_CONTROL_CONNECTIONS); try again later"
            ),
        };
        let reason = json!({ "error": reason });
        let _ = stream.write(&frame::encode_frame(
            Some(FrameType::Probe),
            reason.to_string().as_bytes(),
        ));
    }
}
