//! The reactor's own tests: a line-echo protocol on real sockets, served by the loops.

use super::*;
use std::io::{Read, Write};

/// Echoes bytes back, a line protocol with no framing: enough to exercise the loops.
struct Echo {
    promoted: AtomicUsize,
    /// Connections prove themselves by sending a `P`.
    proves: bool,
    /// How long a connection may idle before it expires.
    idle: Duration,
    /// Its protocol name (its servers' counts are the process's under it).
    name: &'static str,
}

impl Echo {
    fn new(idle: Duration) -> Arc<Echo> {
        Arc::new(Echo {
            promoted: AtomicUsize::new(0),
            proves: false,
            idle,
            name: "echo",
        })
    }
}

#[derive(Default)]
struct EchoConn {
    buf: Vec<u8>,
    last: Option<Instant>,
    /// Set by a `B` (and kept): the connection counts as bulk.
    bulk: bool,
    /// Bytes echoed so far: state that must travel with a moved connection.
    echoed: usize,
    /// When it was accepted, and whether it has sent a `P` since.
    opened: Option<Instant>,
    proved: bool,
}

impl Protocol for Echo {
    type Conn = EchoConn;
    fn name(&self) -> &'static str {
        self.name
    }
    fn admits(&self, peer: SocketAddr) -> bool {
        peer.ip().is_loopback()
    }
    fn open(&self, _peer: SocketAddr, _stream: &mio::net::TcpStream) -> EchoConn {
        EchoConn {
            last: Some(Instant::now()),
            opened: Some(Instant::now()),
            ..EchoConn::default()
        }
    }
    fn drive(&self, c: &mut EchoConn, mut s: &mio::net::TcpStream) -> Step {
        let mut chunk = [0u8; 4096];
        loop {
            if !c.buf.is_empty() {
                match s.write(&c.buf) {
                    Ok(n) => drop(c.buf.drain(..n)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Step::BlockedSending;
                    }
                    Err(_) => return Step::Close,
                }
                continue;
            }
            match s.read(&mut chunk) {
                Ok(0) => return Step::Close,
                Ok(n) if chunk[..n].contains(&b'!') => return Step::Promote,
                // `?`: which loop serves this connection, and how much it echoed.
                Ok(n) if chunk[..n].contains(&b'?') => {
                    let name = std::thread::current().name().unwrap_or("").to_string();
                    c.buf
                        .extend_from_slice(format!("{name}/{:05}", c.echoed).as_bytes());
                }
                Ok(n) => {
                    c.proved |= chunk[..n].contains(&b'P');
                    let turned = !c.bulk && chunk[..n].contains(&b'B');
                    c.bulk |= turned;
                    c.echoed += n;
                    c.buf.extend_from_slice(&chunk[..n]);
                    c.last = Some(Instant::now());
                    if turned {
                        // Answered, then the drive ends: the loop weighs moving it before
                        // anything more is read.
                        return match s.write(&c.buf) {
                            Ok(k) if k == c.buf.len() => {
                                c.buf.clear();
                                Step::Yield
                            }
                            _ => Step::Close,
                        };
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Blocked,
                Err(_) => return Step::Close,
            }
        }
    }
    fn bulk(&self, c: &EchoConn) -> bool {
        c.bulk
    }
    fn proves(&self) -> bool {
        self.proves
    }
    fn unproven_since(&self, c: &EchoConn) -> Option<Instant> {
        (!c.proved).then_some(c.opened).flatten()
    }
    fn expired(&self, c: &EchoConn, now: Instant) -> bool {
        c.last.is_some_and(|t| now.duration_since(t) > self.idle)
    }
    fn idle_since(&self, c: &EchoConn) -> Option<Instant> {
        c.buf.is_empty().then_some(c.last).flatten()
    }
    fn refuse(&self, mut s: &mio::net::TcpStream, _peer: SocketAddr, why: Refusal) {
        let _ = s.write_all(format!("{why:?}").as_bytes());
    }
    fn promote(self: &Arc<Self>, _c: EchoConn, mut s: TcpStream, _p: SocketAddr, slot: Slot) {
        self.promoted.fetch_add(1, Ordering::AcqRel);
        let _ = s.set_nonblocking(false);
        let _ = s.write_all(b"promoted");
        drop(slot);
    }
}

fn start(threads: usize, max: usize) -> (Server, Arc<Echo>) {
    start_dealing(threads, max, Deal::RoundRobin)
}

fn start_dealing(threads: usize, max: usize, deal: Deal) -> (Server, Arc<Echo>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let echo = Echo::new(Duration::from_secs(2));
    let settings = ServerSettings {
        threads,
        max_connections: max,
        per_address: crate::AddressCap::default(),
        deal,
        backlog: 1024,
        congestion: crate::congestion::Congestion::Auto,
    };
    (Server::start(l, echo.clone(), settings).unwrap(), echo)
}

fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
    s.write_all(msg).unwrap();
    let mut got = vec![0u8; msg.len()];
    s.read_exact(&mut got).unwrap();
    got
}

/// `n` connections to `server`.
fn connect(server: &Server, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| TcpStream::connect(server.local_addr()).unwrap())
        .collect()
}

/// The server's connection count once it reaches `n` (closes are seen asynchronously), or
/// what it is after 10 s.
fn settled(server: &Server, n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.connections() != n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    server.connections()
}

#[test]
fn many_connections_on_few_threads_each_get_their_own_bytes() {
    let (server, _) = start(2, 1000);
    let mut conns = connect(&server, 200);
    for (i, c) in conns.iter_mut().enumerate() {
        let msg = format!("connection {i} says hello");
        assert_eq!(roundtrip(c, msg.as_bytes()), msg.as_bytes());
    }
    // A large message crosses many turns and send-readiness waits.
    let big: Vec<u8> = (0..4 << 20).map(|i: u32| b'a' + (i % 26) as u8).collect();
    let mut c = conns.pop().unwrap();
    let writer = {
        let mut w = c.try_clone().unwrap();
        let big = big.clone();
        std::thread::spawn(move || w.write_all(&big).unwrap())
    };
    let mut got = vec![0u8; big.len()];
    c.read_exact(&mut got).unwrap();
    writer.join().unwrap();
    assert!(got == big);
    assert_eq!(server.connections(), 200);
    drop(conns);
    drop(c);
    assert_eq!(settled(&server, 0), 0);
}

/// Which loop serves `s`, and how many bytes it has echoed there: `echo0/00012`.
fn served_by(s: &mut TcpStream) -> String {
    s.write_all(b"?").unwrap();
    let mut got = [0u8; 11];
    s.read_exact(&mut got).unwrap();
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn gathered_connections_share_the_first_loop_until_bulk_ones_are_spread() {
    let (server, _) = start_dealing(2, 100, Deal::Gather);
    let mut c = connect(&server, 4);
    for (i, s) in c.iter_mut().enumerate() {
        let msg = format!("small {i}");
        assert_eq!(roundtrip(s, msg.as_bytes()), msg.as_bytes());
    }
    for s in &mut c {
        assert_eq!(
            served_by(s),
            "echo0/00007",
            "every connection starts on loop 0"
        );
    }
    // The first bulk connection has nobody to share with: it stays.
    assert_eq!(roundtrip(&mut c[0], b"B-one"), b"B-one");
    assert_eq!(served_by(&mut c[0]), "echo0/00012");
    // The second would make two on loop 0 and none on loop 1: it moves, state and all.
    assert_eq!(roundtrip(&mut c[1], b"B-two"), b"B-two");
    assert_eq!(served_by(&mut c[1]), "echo1/00012");
    assert_eq!(roundtrip(&mut c[1], b"more"), b"more");
    assert_eq!(served_by(&mut c[1]), "echo1/00016");
    // A third evens out at two and one: it stays; small ones never move.
    assert_eq!(roundtrip(&mut c[2], b"B-three"), b"B-three");
    assert_eq!(served_by(&mut c[2]), "echo0/00014");
    assert_eq!(served_by(&mut c[3]), "echo0/00007");
    // A moved connection closes like any other.
    drop(c.remove(1));
    assert_eq!(settled(&server, 3), 3);
}

#[test]
fn over_the_cap_a_peer_is_told_why_and_the_rest_are_served() {
    let (server, _) = start(1, 3);
    let mut held = connect(&server, 3);
    for c in &mut held {
        assert_eq!(roundtrip(c, b"x"), b"x");
    }
    let mut over = TcpStream::connect(server.local_addr()).unwrap();
    let mut why = String::new();
    over.read_to_string(&mut why).unwrap();
    assert_eq!(why, "AtCapacity { max: 3 }");
    assert_eq!(roundtrip(&mut held[0], b"still"), b"still");
    // A place freed is a place taken.
    drop(held.pop());
    settled(&server, 2);
    let mut again = TcpStream::connect(server.local_addr()).unwrap();
    assert_eq!(roundtrip(&mut again, b"in"), b"in");
}

#[test]
fn the_process_counts_each_protocols_connections_and_refusals() {
    let echo = Arc::new(Echo {
        promoted: AtomicUsize::new(0),
        proves: false,
        idle: Duration::from_secs(2),
        name: "echo-counted",
    });
    let settings = ServerSettings {
        threads: 1,
        max_connections: 2,
        per_address: crate::AddressCap::default(),
        deal: Deal::RoundRobin,
        backlog: 64,
        congestion: crate::congestion::Congestion::Auto,
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(l, echo, settings).unwrap();
    let counted = || {
        (crate::connection_counts().into_iter())
            .find(|c| c.protocol == "echo-counted")
            .map(|c| (c.open, c.refused))
    };
    assert_eq!(counted(), Some((0, 0)));
    let mut held = connect(&server, 2);
    for c in &mut held {
        assert_eq!(roundtrip(c, b"x"), b"x");
    }
    let mut over = TcpStream::connect(server.local_addr()).unwrap();
    let mut why = String::new();
    over.read_to_string(&mut why).unwrap();
    assert_eq!(counted(), Some((2, 1)));
    drop(held);
    settled(&server, 0);
    drop(server);
    assert_eq!(
        counted(),
        Some((0, 1)),
        "refusals stay counted after the server stops"
    );
}

#[test]
fn a_promoted_connection_leaves_the_loop_and_shutdown_closes_the_rest() {
    let (server, echo) = start(2, 10);
    let mut p = TcpStream::connect(server.local_addr()).unwrap();
    p.write_all(b"!").unwrap();
    let mut got = String::new();
    p.read_to_string(&mut got).unwrap();
    assert_eq!(got, "promoted");
    assert_eq!(echo.promoted.load(Ordering::Acquire), 1);
    let mut idle = TcpStream::connect(server.local_addr()).unwrap();
    assert_eq!(roundtrip(&mut idle, b"a"), b"a");
    server.shutdown();
    let mut rest = Vec::new();
    assert_eq!(idle.read_to_end(&mut rest).unwrap_or(0), 0);
    // Nobody is served any more: a connection is refused, or closed unanswered.
    let addr = server.local_addr();
    if let Ok(mut late) = TcpStream::connect(addr) {
        late.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = late.write_all(b"anyone?");
        assert_eq!(late.read(&mut [0u8; 8]).unwrap_or(0), 0);
    }
}

/// Keeps the accepting loop in `admits` until `open` is set, so connections made meanwhile wait
/// in the listener's backlog; served connections are only held.
struct Gate {
    open: AtomicBool,
}

impl Protocol for Gate {
    type Conn = ();
    fn name(&self) -> &'static str {
        "gate"
    }
    fn admits(&self, _peer: SocketAddr) -> bool {
        while !self.open.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
    fn open(&self, _peer: SocketAddr, _stream: &mio::net::TcpStream) {}
    fn drive(&self, _c: &mut (), _s: &mio::net::TcpStream) -> Step {
        Step::Blocked
    }
    fn expired(&self, _c: &(), _now: Instant) -> bool {
        false
    }
}

#[test]
fn connections_made_while_the_loop_is_busy_wait_in_the_settings_backlog() {
    let gate = Arc::new(Gate {
        open: AtomicBool::new(false),
    });
    let settings = ServerSettings {
        threads: 1,
        max_connections: 1000,
        per_address: crate::AddressCap::default(),
        deal: Deal::RoundRobin,
        backlog: 1024,
        congestion: crate::congestion::Congestion::Auto,
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(l, gate.clone(), settings).unwrap();
    // The first connection holds the only loop in `admits`; 300 more are taken into the
    // backlog by the kernel (with the standard library's 128, the 130th would wait for an
    // answer to its SYN until it timed out).
    let addr = server.local_addr();
    let mut held = Vec::new();
    let mut refused = None;
    for i in 0..301 {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(20)) {
            Ok(s) => held.push(s),
            Err(e) => {
                refused = Some(format!("connection {i} not taken into the backlog: {e}"));
                break;
            }
        }
    }
    // Opened before anything is asserted, so a failure does not leave the loop stuck.
    gate.open.store(true, Ordering::Release);
    assert_eq!(refused, None);
    assert_eq!(
        settled(&server, 301),
        301,
        "all accepted once the loop is free"
    );
    drop(held);
}

#[test]
fn a_loop_polls_for_the_next_request_only_when_its_connection_is_alone() {
    use super::HOT_SPIN;
    use super::event_loop::poll_window;
    for live in [0, 1, 2, 1000] {
        assert_eq!(poll_window(Step::Blocked, live), None);
        assert_eq!(poll_window(Step::BlockedSending, live), None);
        assert_eq!(poll_window(Step::Yield, live), None);
        assert_eq!(poll_window(Step::Close, live), None);
        assert_eq!(poll_window(Step::Parked, live), None);
    }
    assert_eq!(poll_window(Step::BlockedHotAlone, 1), Some(HOT_SPIN));
    assert_eq!(poll_window(Step::BlockedHotAlone, 2), None);
    assert_eq!(poll_window(Step::BlockedHotAlone, 1000), None);
}

/// Each request (a byte) parks its connection until the loop's turn ends; the reply is the
/// number of the turn end that released it.
#[derive(Default)]
struct Batch {
    turn_ends: AtomicUsize,
    /// Set once the first turn end is entered; it waits for `open` before it ends.
    entered: AtomicBool,
    open: AtomicBool,
}

#[derive(Default)]
struct BatchConn {
    /// The turn ends counted when this connection parked.
    parked_at: Option<usize>,
}

impl Protocol for Batch {
    type Conn = BatchConn;
    fn name(&self) -> &'static str {
        "batch"
    }
    fn open(&self, _peer: SocketAddr, _stream: &mio::net::TcpStream) -> BatchConn {
        BatchConn::default()
    }
    fn drive(&self, c: &mut BatchConn, mut s: &mio::net::TcpStream) -> Step {
        let now = self.turn_ends.load(Ordering::Acquire);
        if let Some(at) = c.parked_at {
            if now == at {
                return Step::Parked;
            }
            c.parked_at = None;
            let _ = s.write_all(format!("{now}").as_bytes());
        }
        let mut byte = [0u8; 1];
        match s.read(&mut byte) {
            Ok(0) => Step::Close,
            Ok(_) => {
                c.parked_at = Some(now);
                Step::Parked
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Step::Blocked,
            Err(_) => Step::Close,
        }
    }
    fn turn_end(&self) {
        if !self.entered.swap(true, Ordering::AcqRel) {
            while !self.open.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.turn_ends.fetch_add(1, Ordering::AcqRel);
    }
    fn expired(&self, _c: &BatchConn, _now: Instant) -> bool {
        false
    }
}

#[test]
fn parked_connections_are_driven_again_after_one_turn_end_for_all_of_them() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let batch = Arc::new(Batch::default());
    let settings = ServerSettings {
        threads: 1,
        max_connections: 64,
        per_address: crate::AddressCap::default(),
        deal: Deal::RoundRobin,
        backlog: 64,
        congestion: crate::congestion::Congestion::Auto,
    };
    let server = Server::start(l, batch.clone(), settings).unwrap();
    let connect = || {
        let s = TcpStream::connect(server.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    let reply = |s: &mut TcpStream| {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        b[0]
    };
    let mut first = connect();
    first.write_all(b"w").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !batch.entered.load(Ordering::Acquire) {
        assert!(Instant::now() < deadline, "the first request never parked");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The loop is held in its first turn end: these come in together, in one turn.
    let mut others: Vec<TcpStream> = (0..7).map(|_| connect()).collect();
    for s in &mut others {
        s.write_all(b"w").unwrap();
    }
    batch.open.store(true, Ordering::Release);
    assert_eq!(reply(&mut first), b'1');
    for s in &mut others {
        assert_eq!(reply(s), b'2', "all seven settled by the second turn end");
    }
    assert_eq!(batch.turn_ends.load(Ordering::Acquire), 2);
    // A connection parks again with its next request, and is answered after the next one.
    others[0].write_all(b"w").unwrap();
    assert_eq!(reply(&mut others[0]), b'3');
}

/// Reads nothing; counts the connections told their peer closed, and the drives after that.
#[derive(Default)]
struct Ender {
    told: AtomicUsize,
    driven_after: AtomicUsize,
}

impl Protocol for Ender {
    type Conn = bool;
    fn name(&self) -> &'static str {
        "ender"
    }
    fn open(&self, _peer: SocketAddr, _stream: &mio::net::TcpStream) -> bool {
        false
    }
    fn peer_closing(&self, told: &mut bool) {
        *told = true;
        self.told.fetch_add(1, Ordering::SeqCst);
    }
    fn drive(&self, told: &mut bool, _s: &mio::net::TcpStream) -> Step {
        if *told {
            self.driven_after.fetch_add(1, Ordering::SeqCst);
        }
        Step::Blocked
    }
    fn expired(&self, _c: &bool, _now: Instant) -> bool {
        false
    }
}

#[test]
fn a_peer_closing_its_side_is_told_to_the_protocol_before_a_drive() {
    let ender = Arc::new(Ender::default());
    let settings = ServerSettings {
        threads: 1,
        max_connections: 8,
        per_address: crate::AddressCap::default(),
        deal: Deal::RoundRobin,
        backlog: 8,
        congestion: crate::congestion::Congestion::Auto,
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(l, ender.clone(), settings).unwrap();
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    assert_eq!(settled(&server, 1), 1);
    // Bytes alone (left unread) are not an end.
    s.write_all(b"unread").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(ender.told.load(Ordering::SeqCst), 0);
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ender.driven_after.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(ender.told.load(Ordering::SeqCst), 1, "told once");
    assert!(
        ender.driven_after.load(Ordering::SeqCst) >= 1,
        "driven after it was told"
    );
}

/// Reads what the server sends until it closes, or nothing within `wait`.
fn read_until_closed(s: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => Some(got),
        Err(_) => None,
    }
}

#[test]
fn at_the_cap_the_connection_idle_longest_makes_room_for_a_new_peer() {
    let settings = ServerSettings {
        threads: 1,
        max_connections: 3,
        per_address: AddressCap::default(),
        deal: Deal::RoundRobin,
        backlog: 64,
        congestion: crate::congestion::Congestion::Host,
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(l, Echo::new(Duration::from_secs(60)), settings).unwrap();
    let mut held = connect(&server, 3);
    for (i, s) in held.iter_mut().enumerate() {
        // Each served once, a little apart: the first is idle longest.
        assert_eq!(roundtrip(s, b"hi"), b"hi");
        std::thread::sleep(Duration::from_millis(50 * (i as u64 + 1)));
    }
    // Not idle long enough yet: a newcomer is refused, no one is closed.
    let mut early = TcpStream::connect(server.local_addr()).unwrap();
    let said = read_until_closed(&mut early, Duration::from_secs(5)).unwrap();
    assert!(
        String::from_utf8_lossy(&said).contains("AtCapacity"),
        "{said:?}"
    );
    std::thread::sleep(EVICT_MIN_IDLE + Duration::from_millis(200));
    // Now the oldest idle one goes, and the newcomer is served.
    let mut late = TcpStream::connect(server.local_addr()).unwrap();
    assert_eq!(roundtrip(&mut late, b"in"), b"in");
    let told = read_until_closed(&mut held[0], Duration::from_secs(5))
        .expect("the first connection was closed to make room");
    assert!(
        String::from_utf8_lossy(&told).contains("AtCapacity"),
        "and told why: {told:?}"
    );
    assert_eq!(roundtrip(&mut held[2], b"still"), b"still");
    assert_eq!(server.connections(), 3);
}

/// Where connections prove themselves, those that have not hold at most three quarters of
/// the places and make room first, whatever their age: sockets that never say anything cannot
/// lock out a peer that proves itself, and never take a proven one's place.
#[test]
fn unproven_connections_make_room_and_never_take_a_proven_ones_place() {
    let settings = ServerSettings {
        threads: 1,
        max_connections: 4,
        per_address: AddressCap {
            max: 4,
            loopback: true,
        },
        deal: Deal::RoundRobin,
        backlog: 64,
        congestion: crate::congestion::Congestion::Host,
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let echo = Arc::new(Echo {
        proves: true,
        ..Arc::into_inner(Echo::new(Duration::from_secs(60))).unwrap()
    });
    let server = Server::start(l, echo, settings).unwrap();
    let mut honest = connect(&server, 1);
    assert_eq!(roundtrip(&mut honest[0], b"P1"), b"P1");
    // Strangers fill the unproven share (three of four places) and go on coming, fresh.
    let mut strangers = connect(&server, 3);
    std::thread::sleep(Duration::from_millis(100));
    let mut more = connect(&server, 2);
    for s in &mut more {
        assert_eq!(roundtrip(s, b"x"), b"x", "a newcomer is served");
    }
    for s in &mut strangers[..2] {
        let told = read_until_closed(s, Duration::from_secs(5))
            .expect("the oldest unproven were closed for them, young as they were");
        assert!(
            String::from_utf8_lossy(&told).contains("AddressCap"),
            "{told:?}"
        );
    }
    // A peer that proves itself gets in, and stays while strangers keep coming.
    let mut second = TcpStream::connect(server.local_addr()).unwrap();
    assert_eq!(roundtrip(&mut second, b"P2"), b"P2");
    let _flood = connect(&server, 6);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(roundtrip(&mut honest[0], b"still"), b"still");
    assert_eq!(roundtrip(&mut second, b"here"), b"here");
    assert!(server.connections() <= 4);
}

#[test]
fn one_address_cannot_take_every_place() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let settings = ServerSettings {
        threads: 1,
        max_connections: 10,
        per_address: AddressCap {
            max: 2,
            loopback: true,
        },
        deal: Deal::RoundRobin,
        backlog: 64,
        congestion: crate::congestion::Congestion::Host,
    };
    let server = Server::start(l, Echo::new(Duration::from_secs(2)), settings).unwrap();
    let mut two = connect(&server, 2);
    for s in &mut two {
        assert_eq!(roundtrip(s, b"ok"), b"ok");
    }
    let mut third = TcpStream::connect(server.local_addr()).unwrap();
    let said = read_until_closed(&mut third, Duration::from_secs(5)).unwrap();
    assert!(
        String::from_utf8_lossy(&said).contains("AddressCap"),
        "{said:?}"
    );
    drop(two.pop());
    // Its place comes back once the server sees the close.
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.connections() > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut again = TcpStream::connect(server.local_addr()).unwrap();
    assert_eq!(roundtrip(&mut again, b"back"), b"back");
    // Pages served apart from the server read the same count, and 0 once it is gone.
    let held = server.held();
    assert_eq!((held.now(), server.connections()), (2, 2));
    drop(server);
    drop((two, again));
    let deadline = Instant::now() + Duration::from_secs(5);
    while held.now() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(held.now(), 0);
}
