//! `--mode=swarm`: one process standing for many peers of one target, with real sockets, so a
//! single machine can drive a target with thousands of peers.
//!
//! Each peer opens the segment as an engine does (a descriptor request to the target's control
//! listener), then holds `--lanes` data connections, all served by `--threads` event loops
//! (mio). Every connection keeps `--depth` WRITEs of `--block_size` bytes in flight, into its
//! block of the target's buffer, in the framing the descriptor names: te's (with the segment
//! secret) or Mooncake's acknowledged framing (a Mooncake target). Blocks are `--slots` (0: one
//! per connection); connection `i` writes slot `i mod slots`, so a fixed working set keeps the
//! caches out of a sweep over peers. A WRITE counts once its acknowledgement is in; any refusal
//! or broken connection fails the run. With `--verify`, every connection then READs its block
//! back and compares each byte with its slot's pattern (each slot's its own, and the lanes of a
//! slot write the same bytes, so a misdirected write shows).
//!
//! Not here: te's engine. The swarm speaks the wire itself, so its cost per peer is a socket
//! and a block of memory, not an engine's threads; what it measures is the target.

use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use te_core::Opcode;
use te_core::control::{self, frame::FrameType};
use te_core::segment::SegmentDesc;
use te_tcp::wire::mooncake as mooncake_wire;
use te_tcp::wire::{REPLY_LEN, Reply, Request, Status};

use crate::BenchResult;
use crate::flags::Flags;

/// How the target is spoken to.
#[derive(Clone, Copy, Debug)]
enum Framing {
    Te { secret: [u8; 16] },
    Mooncake,
}

/// Where the swarm writes, from the target's descriptor.
#[derive(Clone, Debug)]
struct Target {
    data: SocketAddr,
    framing: Framing,
    base: u64,
    len: u64,
    /// The connections' congestion control: the host's default, as remote peers' connections
    /// under `auto`, unless `MC_TE_TCP_CONGESTION` names one.
    congestion: te_reactor::congestion::Congestion,
}

/// What a run measured.
#[derive(Default)]
struct Outcome {
    bytes: u64,
    writes: u64,
    verified: u64,
    failure: Option<String>,
    /// The connections, kept open for `--hold`.
    lanes: Vec<Lane>,
    /// When this loop began writing.
    started: Option<Instant>,
    /// When the last WRITE of this loop was acknowledged.
    finished: Option<Instant>,
}

/// How long the requests in flight at the end may take to be answered.
const DRAIN_MAX: Duration = Duration::from_secs(60);

/// One request being sent: its header and how much of header and body are out.
struct Sending {
    head: Vec<u8>,
    head_sent: usize,
    body: bool,
    body_sent: usize,
}

/// One data connection of one peer.
struct Lane {
    stream: mio::net::TcpStream,
    addr: u64,
    /// The bytes this lane writes (shared by the lanes of one slot).
    block: Arc<Vec<u8>>,
    framing: Framing,
    /// te's framing: the connection's proof of the segment secret.
    proof: [u8; 16],
    next_id: u64,
    sending: Option<Sending>,
    /// Requests sent whose reply has not come.
    in_flight: usize,
    /// Of those, READs (whose data follows the reply).
    reading: bool,
    reply: Vec<u8>,
    read_back: Vec<u8>,
    writes: u64,
}

fn pattern(slot: usize, len: usize) -> Vec<u8> {
    let seed = 0x5a4d_0000_u64 ^ (slot as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    crate::pattern::bytes(seed, 0, len)
}

impl Lane {
    fn request(&mut self, opcode: Opcode) -> Sending {
        let len = self.block.len() as u64;
        let head = match self.framing {
            Framing::Te { .. } => {
                self.next_id += 1;
                Request {
                    opcode,
                    request_id: self.next_id,
                    addr: self.addr,
                    len,
                    proof: self.proof,
                }
                .encode()
                .to_vec()
            }
            Framing::Mooncake => mooncake_wire::Header {
                opcode,
                addr: self.addr,
                size: len,
                acked: true,
            }
            .encode()
            .to_vec(),
        };
        Sending {
            head,
            head_sent: 0,
            body: opcode == Opcode::Write,
            body_sent: 0,
        }
    }

    fn reply_len(&self) -> usize {
        match self.framing {
            Framing::Te { .. } => REPLY_LEN,
            Framing::Mooncake => mooncake_wire::STATUS_LEN,
        }
    }

    /// Checks a whole reply.
    fn check(&self) -> Result<(), String> {
        let ok = match self.framing {
            Framing::Te { .. } => {
                let mut b = [0u8; REPLY_LEN];
                b.copy_from_slice(&self.reply);
                let r = Reply::decode(&b).map_err(|e| format!("bad reply: {e}"))?;
                match r.status {
                    Status::Ok => true,
                    Status::Busy => {
                        return Err(
                            "the target refused the connection at its cap (MC_TE_MAX_DATA_CONNECTIONS)"
                                .into(),
                        );
                    }
                    other => return Err(format!("the target refused a request: {other:?}")),
                }
            }
            Framing::Mooncake => {
                let mut b = [0u8; mooncake_wire::STATUS_LEN];
                b.copy_from_slice(&self.reply);
                mooncake_wire::decode_status(&b).map_err(|e| format!("bad status: {e}"))?
                    == mooncake_wire::STATUS_OK
            }
        };
        match ok {
            true => Ok(()),
            false => Err("the target refused a request".into()),
        }
    }

    /// Why sending failed: what the target said before it closed (a refusal at its connection
    /// cap comes before any request), else the socket's error.
    fn why_closed(&mut self, e: &io::Error) -> String {
        let mut said = [0u8; REPLY_LEN];
        let want = self.reply_len();
        if let Ok(n) = (&self.stream).read(&mut said[..want]) {
            if n == want {
                self.reply = said[..want].to_vec();
                if let Err(why) = self.check() {
                    return why;
                }
            }
        }
        format!("sending: {e}")
    }

    /// Sends and receives as far as the socket allows; `issue` says whether to start new
    /// WRITEs, at most `depth` of them in one call, so that a connection whose target answers as
    /// fast as it sends cannot keep its loop from the others (nor from the clock). Returns
    /// whether it stopped at that budget with more to start: the caller comes back to it.
    fn pump(&mut self, issue: bool, depth: usize) -> Result<bool, String> {
        let mut started = 0;
        let mut more = false;
        loop {
            let mut progress = false;
            if self.sending.is_none() && issue && self.in_flight < depth {
                match started < depth {
                    true => {
                        started += 1;
                        self.sending = Some(self.request(Opcode::Write));
                    }
                    false => more = true,
                }
            }
            if let Some(s) = self.sending.as_mut() {
                let body: &[u8] = if s.body { &self.block } else { &[] };
                let parts = [
                    IoSlice::new(&s.head[s.head_sent..]),
                    IoSlice::new(&body[s.body_sent..]),
                ];
                match (&self.stream).write_vectored(&parts) {
                    Ok(n) => {
                        let h = n.min(s.head.len() - s.head_sent);
                        s.head_sent += h;
                        s.body_sent += n - h;
                        progress |= n > 0;
                        if s.head_sent == s.head.len() && s.body_sent == body.len() {
                            self.reading |= !s.body;
                            self.sending = None;
                            self.in_flight += 1;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(self.why_closed(&e)),
                }
            }
            if self.in_flight > 0 {
                let want = self.reply_len();
                if self.reply.len() < want {
                    progress |= read_more(&self.stream, &mut self.reply, want)?;
                }
                if self.reply.len() == want {
                    self.check()?;
                    if !self.reading {
                        self.reply.clear();
                        self.in_flight -= 1;
                        self.writes += 1;
                        progress = true;
                    } else {
                        let len = self.block.len();
                        progress |= read_more(&self.stream, &mut self.read_back, len)?;
                        if self.read_back.len() == self.block.len() {
                            self.reply.clear();
                            self.in_flight -= 1;
                            self.reading = false;
                        }
                    }
                }
            }
            if !progress {
                return Ok(more);
            }
        }
    }
}

/// Reads what has come, appending to `into` until it holds `upto` bytes; whether anything came.
fn read_more(
    mut stream: &mio::net::TcpStream,
    into: &mut Vec<u8>,
    upto: usize,
) -> Result<bool, String> {
    let at = into.len();
    if at >= upto {
        return Ok(false);
    }
    into.resize(upto, 0);
    let read = stream.read(&mut into[at..]);
    into.truncate(at + *read.as_ref().unwrap_or(&0));
    match read {
        Ok(0) => Err("the target closed the connection".into()),
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(format!("receiving: {e}")),
    }
}

/// User and system CPU this process has used, all threads, in seconds (`/proc/self/stat`, in
/// Linux's fixed 100 ticks a second); `None` where it cannot be read.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces): utime and stime are the 12th and 13th.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) as f64 / 100.0)
}

/// The target's descriptor, fetched once per peer as an engine opening it would.
fn fetch(segment: &str) -> BenchResult<(SegmentDesc, String)> {
    let (host, port) = control::parse_segment_name(segment, 12001).map_err(|e| e.to_string())?;
    let ask = || {
        control::request(
            &host,
            port,
            FrameType::Metadata,
            b"{}",
            Duration::from_secs(10),
            64 << 20,
            None,
        )
    };
    // A target that has just printed its name may not listen yet: a few tries, a second apart.
    let mut reply = ask();
    for _ in 0..5 {
        if reply.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
        reply = ask();
    }
    let reply = reply.map_err(|e| format!("fetching {segment}'s descriptor: {e}"))?;
    let desc = SegmentDesc::from_json(&reply).map_err(|e| e.to_string())?;
    Ok((desc, host))
}

/// The target's descriptor once it lists a buffer. A bench target that has just logged its name
/// may publish its descriptor before it registers its buffer (Mooncake's logs `listening on`
/// when its engine starts, then allocates and registers), so a descriptor without buffers is
/// asked for again, 100 ms apart, for up to 10 s; after that it is what it is.
fn fetch_registered(segment: &str) -> BenchResult<(SegmentDesc, String)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (desc, host) = fetch(segment)?;
        if !desc.buffers.is_empty() || Instant::now() >= deadline {
            return Ok((desc, host));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A segment secret as descriptors carry it: 32 hex digits.
fn secret_from_hex(hex: &str) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    if hex.len() != 32 || !hex.is_ascii() {
        return None;
    }
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn target_of(
    desc: &SegmentDesc,
    host: &str,
    congestion: te_reactor::congestion::Congestion,
) -> BenchResult<Target> {
    let buffer = desc
        .buffers
        .first()
        .ok_or("the target has no registered buffer")?;
    let (ip, port, framing) = match desc.is_mooncake() {
        false => {
            let rail = desc
                .te_rails
                .first()
                .ok_or("the target publishes no tcp rail")?;
            let secret = desc
                .te_secret
                .as_deref()
                .and_then(secret_from_hex)
                .ok_or("the target's segment secret is sealed or missing (cluster secrets are not supported by the swarm)")?;
            (rail.ip.clone(), rail.port, Framing::Te { secret })
        }
        true => {
            let port = desc
                .tcp_data_port
                .ok_or("the Mooncake target publishes no tcp_data_port")?;
            let ip = desc
                .tcp_data_host
                .clone()
                .unwrap_or_else(|| host.to_string());
            (ip, port, Framing::Mooncake)
        }
    };
    let data = control::resolve(&ip, port)
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or("the target's data address does not resolve")?;
    Ok(Target {
        data,
        framing,
        base: buffer.addr,
        len: buffer.length,
        congestion,
    })
}

/// Reads te's greeting on a new connection (or the refusal of a target at its connection cap)
/// and returns the proof of `secret` its requests carry.
fn greeted(s: &std::net::TcpStream, secret: [u8; 16]) -> io::Result<[u8; 16]> {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut said = Vec::with_capacity(te_tcp::wire::GREETING_LEN);
    s.take(te_tcp::wire::GREETING_LEN as u64)
        .read_to_end(&mut said)?;
    let nonce = te_tcp::wire::greeting_of(&said).map_err(io::Error::other)?;
    s.set_read_timeout(None)?;
    let secret = te_core::segment::SegmentSecret::from_bytes(secret);
    Ok(te_tcp::wire::connection_proof(&secret, &nonce))
}

/// One event loop's share of the lanes: connects them, writes for `--duration` or until `stop`,
/// drains, verifies.
fn run_loop(
    target: &Target,
    lanes: &[usize],
    blocks: &[Arc<Vec<u8>>],
    flags: &Flags,
    start: &Barrier,
    stop: &AtomicBool,
) -> Outcome {
    let mut out = Outcome::default();
    let block = flags.block_size as usize;
    let mut poll = match Poll::new() {
        Ok(p) => p,
        Err(e) => {
            start.wait();
            out.failure = Some(format!("poll: {e}"));
            return out;
        }
    };
    let mut conns = Vec::with_capacity(lanes.len());
    for &i in lanes {
        let connected = std::net::TcpStream::connect(target.data).and_then(|s| {
            s.set_nodelay(true)?;
            target
                .congestion
                .apply(&s, target.data.ip(), || s.local_addr().ok().map(|a| a.ip()));
            let proof = match target.framing {
                Framing::Te { secret } => greeted(&s, secret)?,
                Framing::Mooncake => [0; 16],
            };
            s.set_nonblocking(true)?;
            Ok((s, proof))
        });
        match connected {
            Ok((s, proof)) => {
                let mut stream = mio::net::TcpStream::from_std(s);
                let interest = Interest::READABLE | Interest::WRITABLE;
                if let Err(e) = poll
                    .registry()
                    .register(&mut stream, Token(conns.len()), interest)
                {
                    out.failure = Some(format!("register: {e}"));
                    break;
                }
                conns.push(Lane {
                    stream,
                    addr: target.base + ((i % blocks.len()) * block) as u64,
                    block: blocks[i % blocks.len()].clone(),
                    framing: target.framing,
                    proof,
                    next_id: 0,
                    sending: None,
                    in_flight: 0,
                    reading: false,
                    reply: Vec::new(),
                    read_back: Vec::new(),
                    writes: 0,
                });
            }
            Err(e) => {
                out.failure = Some(format!("connection {i} to {}: {e}", target.data));
                break;
            }
        }
    }
    start.wait();
    if out.failure.is_some() {
        return out;
    }
    let started = Instant::now();
    out.started = Some(started);
    let mut events = Events::with_capacity(1024);
    let depth = flags.depth;
    // Writes until told to stop, then until nothing is in flight; every connection writes at
    // least once (its block is then the one it verifies), even one whose turn came late.
    let mut phase = |conns: &mut Vec<Lane>, issue: &dyn Fn() -> bool| -> Result<(), String> {
        // Connections that stopped at their budget with more to start: their turn comes again
        // after the events of the next poll, which then does not wait.
        let mut again: Vec<usize> = Vec::new();
        for (i, c) in conns.iter_mut().enumerate() {
            let first = c.writes == 0;
            if c.pump(issue() || first, depth)? {
                again.push(i);
            }
        }
        let mut draining: Option<Instant> = None;
        loop {
            let issuing = issue();
            if !issuing
                && conns
                    .iter()
                    .all(|c| c.in_flight == 0 && c.sending.is_none() && c.writes > 0)
            {
                return Ok(());
            }
            if !issuing && draining.get_or_insert_with(Instant::now).elapsed() > DRAIN_MAX {
                let left: usize = conns.iter().map(|c| c.in_flight).sum();
                return Err(format!(
                    "{left} requests still unanswered {} s after the last was sent",
                    DRAIN_MAX.as_secs()
                ));
            }
            let wait = match again.is_empty() {
                true => Duration::from_millis(100),
                false => Duration::ZERO,
            };
            poll.poll(&mut events, Some(wait))
                .map_err(|e| format!("poll: {e}"))?;
            let turns = std::mem::take(&mut again);
            for i in events.iter().map(|ev| ev.token().0).chain(turns) {
                let c = &mut conns[i];
                let first = c.writes == 0;
                if c.pump(issuing || first, depth)? {
                    again.push(i);
                }
            }
            if !issuing {
                // Edge-triggered: drive everything once more so nothing waits on a missed edge.
                for c in conns.iter_mut() {
                    let first = c.writes == 0;
                    c.pump(first, depth)?;
                }
            }
        }
    };
    // Each loop keeps the time itself: on a busy host (a swarm at a low priority under a busy
    // target) the main thread can wake seconds late and the run would go on past `--duration`;
    // the flag still stops it early (a signal).
    let deadline = started + Duration::from_secs_f64(flags.duration);
    if let Err(e) = phase(&mut conns, &|| {
        !stop.load(Ordering::Acquire) && Instant::now() < deadline
    }) {
        out.failure = Some(e);
        return out;
    }
    out.finished = Some(Instant::now());
    out.writes = conns.iter().map(|c| c.writes).sum();
    out.lanes = conns;
    out.bytes = out.writes * block as u64;
    if flags.verify {
        for c in out.lanes.iter_mut() {
            c.sending = Some(c.request(Opcode::Read));
        }
        if let Err(e) = phase(&mut out.lanes, &|| false) {
            out.failure = Some(format!("verifying: {e}"));
            return out;
        }
        for (c, &i) in out.lanes.iter().zip(lanes) {
            if c.read_back != *c.block {
                out.failure = Some(format!(
                    "connection {i}: the block read back differs from the one written"
                ));
                return out;
            }
            out.verified += 1;
        }
    }
    out
}

/// `--mode=swarm`.
///
/// # Errors
/// The target cannot be reached or described, its buffer is too small, or a transfer failed.
pub fn run(flags: &Flags, default_lanes: usize) -> BenchResult<()> {
    if flags.segment_id.is_empty() {
        return Err("--mode=swarm needs --segment_id=HOST:PORT (a target's segment)".into());
    }
    let lanes = match flags.lanes {
        0 => default_lanes,
        n => n,
    };
    // From the first descriptor request to the last connection established: what it takes a
    // swarm of peers starting at once to open the segment and connect.
    let setup = Instant::now();
    // The swarm stands for peers on other hosts, whose connections keep the host's default
    // under `auto`; MC_TE_TCP_CONGESTION=NAME sets one for every connection. (Measured: 16
    // peers x 4 lanes with depth 2 moved 7.6 GB/s sending with bbr and 4.7 with reno.)
    let congestion = match std::env::var("MC_TE_TCP_CONGESTION") {
        Ok(v) => match te_reactor::congestion::Congestion::parse(&v).map_err(|e| e.to_string())? {
            te_reactor::congestion::Congestion::Auto => te_reactor::congestion::Congestion::Host,
            chosen => chosen,
        },
        Err(_) => te_reactor::congestion::Congestion::Host,
    };
    let (desc, host) = fetch_registered(&flags.segment_id)?;
    let target = target_of(&desc, &host, congestion)?;
    // Every peer opens the segment, as an engine would.
    for _ in 1..flags.peers {
        fetch(&flags.segment_id)?;
    }
    let connections = flags.peers * lanes;
    let slots = match flags.slots {
        0 => connections,
        n => n.min(connections),
    };
    let need = slots as u64 * flags.block_size;
    if need > target.len {
        return Err(format!(
            "{slots} blocks of {} B need {need} bytes of the target's buffer; it has {} (raise its --buffer_size, or set --slots)",
            flags.block_size, target.len
        ));
    }
    let blocks: Arc<Vec<Arc<Vec<u8>>>> = Arc::new(
        (0..slots)
            .map(|s| Arc::new(pattern(s, flags.block_size as usize)))
            .collect(),
    );
    let threads = flags.threads.clamp(1, connections);
    let shares: Vec<Vec<usize>> = (0..threads)
        .map(|t| (t..connections).step_by(threads).collect())
        .collect();
    let start = Arc::new(Barrier::new(threads + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let target = Arc::new(target);
    let flags_shared = Arc::new(flags.clone());
    let handles: Vec<_> = shares
        .into_iter()
        .map(|share| {
            let (start, stop, target, flags, blocks) = (
                start.clone(),
                stop.clone(),
                target.clone(),
                flags_shared.clone(),
                blocks.clone(),
            );
            std::thread::spawn(move || run_loop(&target, &share, &blocks, &flags, &start, &stop))
        })
        .collect();
    start.wait();
    let connect_secs = setup.elapsed().as_secs_f64();
    eprintln!("swarm: running");
    let began = Instant::now();
    let cpu_began = cpu_seconds();
    crate::pause(Duration::from_secs_f64(flags.duration));
    stop.store(true, Ordering::Release);
    let mut total = Outcome::default();
    for h in handles {
        let o = h.join().map_err(|_| "a swarm loop panicked")?;
        total.bytes += o.bytes;
        total.writes += o.writes;
        total.verified += o.verified;
        total.failure = total.failure.or(o.failure);
        total.lanes.extend(o.lanes);
        total.finished = total.finished.max(o.finished);
        total.started = match (total.started, o.started) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    // The swarm's own CPU while it wrote and read back: what standing for these peers cost
    // this host, apart from the target.
    let cpu = cpu_seconds()
        .zip(cpu_began)
        .map_or(f64::NAN, |(end, start)| end - start);
    if let Some(signal) = crate::interrupted() {
        return Err(crate::stopped_by(signal));
    }
    // From the first loop's start to the last acknowledgement (the read-back of --verify not
    // counted), as the loops saw them: this thread may run late at a low priority.
    let began = total.started.unwrap_or(began);
    let secs = total
        .finished
        .unwrap_or_else(Instant::now)
        .duration_since(began)
        .as_secs_f64();
    // How evenly the connections were served (the verifying READ is not a write).
    let per_connection =
        |pick: fn(u64, u64) -> u64| total.lanes.iter().map(|l| l.writes).reduce(pick);
    let (writes_min, writes_max) = (
        per_connection(u64::min).unwrap_or(0),
        per_connection(u64::max).unwrap_or(0),
    );
    if flags.hold > 0.0 && total.failure.is_none() {
        eprintln!("swarm: holding {} idle connections", total.lanes.len());
        crate::pause(Duration::from_secs_f64(flags.hold));
    }
    drop(total.lanes);
    if let Some(f) = total.failure {
        return Err(format!("swarm failed: {f}"));
    }
    let gbps = total.bytes as f64 / secs / 1e9;
    let framing = match target.framing {
        Framing::Te { .. } => "te",
        Framing::Mooncake => "mooncake",
    };
    println!(
        "swarm: {} peers x {lanes} lanes = {connections} connections to {} ({framing} framing, opened and connected in {connect_secs:.2} s), block {} B in {slots} slots, depth {}: {gbps:.3} GB/s, {} writes in {secs:.2} s{}",
        flags.peers,
        target.data,
        flags.block_size,
        flags.depth,
        total.writes,
        match flags.verify {
            true => format!(", {} blocks verified", total.verified),
            false => String::new(),
        }
    );
    if flags.json {
        println!(
            "{}",
            serde_json::json!({
                "mode": "swarm", "peers": flags.peers, "lanes": lanes, "connections": connections,
                "framing": framing, "block_size": flags.block_size, "depth": flags.depth, "slots": slots,
                "gbps": gbps, "writes": total.writes, "seconds": secs, "verified": total.verified,
                "connect_seconds": connect_secs, "cpu_seconds": cpu,
                "writes_per_connection_min": writes_min, "writes_per_connection_max": writes_max,
            })
        );
    }
    Ok(())
}
