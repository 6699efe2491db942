//! `cargo xtask bench metadata [--duration S]`: te-metadata next to Mooncake's own HTTP
//! metadata server (`mooncake_http_metadata_server`, from the wheel) in one run, over loopback.
//!
//! Mooncake's engines keep one open connection to the metadata server per thread that touched
//! it (a thread-local curl handle), so a cluster's server holds many connections at once, each
//! asking now and then. This stands for them: 16, 256 and 1,024 keep-alive connections, opened
//! first, then every one with a GET of a 1.5 KiB descriptor always in flight, driven by 4 client
//! threads; each reply's status and length checked. Then the cluster's engines re-publishing:
//! 2,000 keys of 2 KiB stored (1,000 engines' descriptors and `rpc_meta` entries), and 64
//! keep-alive connections each with a PUT always in flight, every one a new value: te-metadata
//! in memory, as Mooncake's server always is, and once more persisting every change
//! (`--persist`, synced before it is answered), shown beside Mooncake's in-memory figure. Printed
//! per point: requests answered per second, failed requests, and the server's threads and
//! resident memory sampled while the load runs.
//!
//! `TE_METADATA_BIN` runs another build of te-metadata in place of this tree's.
//!
//! Goal: te answers at least as many requests per second as Mooncake's server at every point
//! both run in memory, and fails none.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::bench::{KillOnDrop, duration_arg, start_announcing};

const CONNECTIONS: [usize; 3] = [16, 256, 1024];
const CLIENT_THREADS: usize = 4;
/// Descriptors stored, and their size (a Mooncake segment with a few buffers).
const KEYS: usize = 64;
const VALUE_BYTES: usize = 1536;
/// The re-publishing point: keys stored, their size, and the connections writing them.
const PUT_KEYS: usize = 2000;
const PUT_BYTES: usize = 2048;
const PUT_CONNECTIONS: usize = 64;

/// What the connections of a point ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Load {
    /// A GET of one of [`KEYS`] descriptors.
    Get,
    /// A PUT of a new value to one of [`PUT_KEYS`] keys.
    Put,
}

/// One point's figures.
#[derive(Clone, Copy, Debug, Default)]
struct Point {
    per_second: f64,
    failed: u64,
    threads: u64,
    rss_kib: u64,
}

fn key(i: usize) -> String {
    format!("mooncake%2Fram%2Fnode{i}")
}

fn value(i: usize) -> Vec<u8> {
    sized_value(i, 0, VALUE_BYTES)
}

/// A descriptor of `bytes` bytes for key `i`, its `round`th version.
fn sized_value(i: usize, round: usize, bytes: usize) -> Vec<u8> {
    let mut v = format!("{{\"name\":\"node{i}\",\"version\":{round},\"buffers\":\"").into_bytes();
    v.resize(bytes - 2, b'x');
    v.extend_from_slice(b"\"}");
    v
}

/// A PUT of `body` under `key`.
fn put_request(key: &str, body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "PUT /metadata?key={key} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

/// Reads one reply: its status and body length (`None`: the connection ended or the reply
/// was garbled).
fn read_reply(r: &mut BufReader<TcpStream>) -> Option<(u16, usize)> {
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let status = line.split_whitespace().nth(1)?.parse().ok()?;
    let mut len = 0;
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((n, v)) = l.split_once(':') {
            if n.trim().eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    Some((status, len))
}

fn connect(port: u16) -> Option<BufReader<TcpStream>> {
    let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let _ = s.set_nodelay(true);
    Some(BufReader::new(s))
}

/// Stores the keys the loads read and write.
fn preload(port: u16) -> Result<(), String> {
    let mut c = connect(port).ok_or("cannot connect")?;
    let gets = (0..KEYS).map(|i| (key(i), value(i)));
    let puts = (0..PUT_KEYS).map(|i| (key(KEYS + i), sized_value(i, 0, PUT_BYTES)));
    for (k, body) in gets.chain(puts) {
        c.get_mut()
            .write_all(&put_request(&k, &body))
            .map_err(|e| e.to_string())?;
        match read_reply(&mut c) {
            Some((200, _)) => {}
            other => return Err(format!("PUT {k}: {other:?}")),
        }
    }
    Ok(())
}

/// One client thread: `conns` connections opened, then (once every thread has opened its own,
/// at `ready`) each with a request of `load` always in flight for `seconds`; the replies that
/// were right and the requests that failed (a connection that could not be opened counts as
/// one).
fn client(
    port: u16,
    load: Load,
    conns: usize,
    first: usize,
    ready: &Barrier,
    seconds: u64,
) -> (u64, u64) {
    let mut all: Vec<Option<BufReader<TcpStream>>> = (0..conns).map(|_| connect(port)).collect();
    let (mut ok, mut failed) = (0u64, all.iter().filter(|c| c.is_none()).count() as u64);
    ready.wait();
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut round = 0usize;
    while Instant::now() < until {
        let mut sent = vec![false; all.len()];
        for (i, c) in all.iter_mut().enumerate() {
            let Some(conn) = c.as_mut() else {
                *c = connect(port);
                failed += 1;
                continue;
            };
            let req = match load {
                Load::Get => {
                    let k = key((first + i + round) % KEYS);
                    format!("GET /metadata?key={k} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                        .into_bytes()
                }
                Load::Put => {
                    let n = (first + i + round * conns) % PUT_KEYS;
                    put_request(&key(KEYS + n), &sized_value(n, round + 1, PUT_BYTES))
                }
            };
            match conn.get_mut().write_all(&req) {
                Ok(()) => sent[i] = true,
                Err(_) => {
                    *c = None;
                    failed += 1;
                }
            }
        }
        for (i, c) in all.iter_mut().enumerate() {
            if !sent[i] {
                continue;
            }
            match (load, c.as_mut().and_then(read_reply)) {
                (Load::Get, Some((200, VALUE_BYTES))) | (Load::Put, Some((200, _))) => ok += 1,
                _ => {
                    *c = None;
                    failed += 1;
                }
            }
        }
        round += 1;
    }
    (ok, failed)
}

/// `load` on `connections` for `seconds` once every connection is open, the server (`pid`)
/// sampled halfway.
fn point(port: u16, pid: u32, load: Load, connections: usize, seconds: u64) -> Point {
    let per = connections / CLIENT_THREADS;
    let ready = Arc::new(Barrier::new(CLIENT_THREADS + 1));
    let threads: Vec<_> = (0..CLIENT_THREADS)
        .map(|t| {
            let ready = ready.clone();
            std::thread::spawn(move || client(port, load, per, t * per, &ready, seconds))
        })
        .collect();
    ready.wait();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds) / 2);
    let server = crate::scale_bench::sample(pid);
    let (ok, failed) = threads
        .into_iter()
        .map(|t| t.join().unwrap_or((0, 1)))
        .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
    Point {
        per_second: ok as f64 / start.elapsed().as_secs_f64(),
        failed,
        threads: server.threads,
        rss_kib: server.rss_kib,
    }
}

/// Where the persisting te-metadata keeps its files, under the system's temporary folder.
fn persist_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("te-metadata-bench-{}", std::process::id()))
}

/// The te-metadata binary: `$TE_METADATA_BIN` (another build, to compare), else this tree's,
/// built in release mode; with `persist`, persisting to a fresh file in [`persist_dir`].
fn te_metadata(persist: bool) -> Result<(KillOnDrop, u16), String> {
    let bin = match std::env::var_os("TE_METADATA_BIN") {
        Some(bin) => std::path::PathBuf::from(bin),
        None => {
            crate::run(
                "build te-metadata",
                crate::cargo().args(["build", "--release", "-p", "te-metadata"]),
            )?;
            let target_dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
            std::path::Path::new(&target_dir).join("release/te-metadata")
        }
    };
    let mut cmd = Command::new(&bin);
    cmd.args(["--addr", "127.0.0.1:0"]).stderr(Stdio::null());
    if persist {
        let dir = persist_dir();
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        cmd.arg("--persist").arg(dir.join("store.json"));
    }
    let (child, addr) = start_announcing(cmd, "listening on", "te-metadata")?;
    let port = addr
        .rsplit(':')
        .next()
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| format!("te-metadata: no port in {addr:?}"))?;
    Ok((child, port))
}

fn mooncake_server() -> Result<(KillOnDrop, u16), String> {
    let program = crate::interop_bench::mooncake_venv()?.join("bin/mooncake_http_metadata_server");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = KillOnDrop(
        Command::new(&program)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--log-level", "WARNING"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", program.display()))?,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("Mooncake's metadata server did not listen within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok((child, port))
}

/// `points` against one server.
fn sweep(
    name: &str,
    server: (KillOnDrop, u16),
    seconds: u64,
    points: &[(Load, usize)],
) -> Result<Vec<Point>, String> {
    let (child, port) = server;
    let pid = child.0.id();
    eprintln!("  {name} (pid {pid}) on port {port}");
    preload(port).map_err(|e| format!("{name}: {e}"))?;
    Ok(points
        .iter()
        .map(|&(load, c)| point(port, pid, load, c, seconds))
        .collect())
}

/// The points: GETs at every count of [`CONNECTIONS`], then the re-publishing PUTs.
fn points() -> Vec<(Load, usize)> {
    CONNECTIONS
        .iter()
        .map(|&c| (Load::Get, c))
        .chain([(Load::Put, PUT_CONNECTIONS)])
        .collect()
}

/// One row of the table: te's point `t` beside Mooncake's `m`; recorded for the report, and
/// held to the goal (as many requests per second, none failed) when `goal` says so.
fn row(
    label: &str,
    case: String,
    t: &Point,
    m: Option<Point>,
    goal: bool,
    missed: &mut Vec<String>,
) {
    let cells = |p: &Point| {
        format!(
            "{:>9.0} {:>7} {:>8} {:>8.1}",
            p.per_second,
            p.failed,
            p.threads,
            p.rss_kib as f64 / 1024.0
        )
    };
    let m_cells = m.as_ref().map_or_else(
        || format!("{:>9} {:>7} {:>8} {:>8}", "-", "-", "-", "-"),
        cells,
    );
    let ratio = m.filter(|m| m.per_second > 0.0).map_or_else(
        || format!("{:>7}", "-"),
        |m| format!("{:>6.2}x", t.per_second / m.per_second),
    );
    println!("{label:<17} | {} | {m_cells} | {ratio}", cells(t));
    if t.failed > 0 {
        missed.push(format!("te failed {} requests: {label}", t.failed));
    }
    if let Some(m) = m.filter(|m| goal && t.per_second < m.per_second) {
        missed.push(format!(
            "te {:.0} req/s < Mooncake's {:.0}: {label}",
            t.per_second, m.per_second
        ));
    }
    crate::report::record(crate::report::Record {
        bench: "metadata",
        case,
        series: None,
        te: t.per_second,
        unit: "req/s",
        reference: m.map(|m| {
            (
                "Mooncake's HTTP metadata server (wheel)".to_string(),
                m.per_second,
            )
        }),
        goal: goal.then(|| ">= Mooncake, none failed".into()),
        met: goal.then(|| t.failed == 0 && m.is_none_or(|m| t.per_second >= m.per_second)),
        mooncake: None,
    });
}

pub(crate) fn metadata(args: &[&str]) -> Result<(), String> {
    let seconds = duration_arg(
        args,
        "usage: cargo xtask bench metadata [--duration SECONDS]",
    )?;
    let te = sweep("te-metadata", te_metadata(false)?, seconds, &points())?;
    let durable = te_metadata(true).and_then(|server| {
        sweep(
            "te-metadata --persist",
            server,
            seconds,
            &[(Load::Put, PUT_CONNECTIONS)],
        )
    });
    // The server is gone with its sweep: what it persisted goes too.
    let _ = std::fs::remove_dir_all(persist_dir());
    let durable = durable?;
    let mc = match mooncake_server().and_then(|s| sweep("Mooncake's server", s, seconds, &points()))
    {
        Ok(rows) => Some(rows),
        Err(e) => {
            eprintln!("  Mooncake's metadata server cannot run: {e}");
            None
        }
    };
    println!(
        "HTTP metadata server, N keep-alive connections each with a request always in flight ({CLIENT_THREADS} client threads, loopback), {seconds} s per point: GET of one of {KEYS} {VALUE_BYTES} B descriptors; PUT of a new {PUT_BYTES} B value to one of {PUT_KEYS} keys"
    );
    println!(
        "{:<17} | {:>9} {:>7} {:>8} {:>8} | {:>9} {:>7} {:>8} {:>8} | {:>7}",
        "request, conns",
        "te req/s",
        "failed",
        "threads",
        "RSS MiB",
        "MC req/s",
        "failed",
        "threads",
        "RSS MiB",
        "te/MC"
    );
    let mut missed = Vec::new();
    let mc_at = |i: usize| mc.as_ref().and_then(|m| m.get(i)).copied();
    for (i, (&(load, conns), t)) in points().iter().zip(&te).enumerate() {
        let (label, case) = match load {
            Load::Get => (
                format!("GET {conns}"),
                format!("{conns} keep-alive connections, GET 1.5 KiB"),
            ),
            Load::Put => (
                format!("PUT {conns}"),
                format!("{conns} keep-alive connections, PUT 2 KiB over {PUT_KEYS} keys"),
            ),
        };
        row(&label, case, t, mc_at(i), true, &mut missed);
    }
    // Persisted by te, in memory only at Mooncake's: shown beside it, held to no goal.
    if let Some(t) = durable.first() {
        row(
            &format!("PUT {PUT_CONNECTIONS} persisted"),
            format!(
                "{PUT_CONNECTIONS} keep-alive connections, PUT 2 KiB over {PUT_KEYS} keys, te persisting every change (Mooncake's in memory)"
            ),
            t,
            mc_at(points().len() - 1),
            false,
            &mut missed,
        );
    }
    match missed.is_empty() {
        true => Ok(()),
        false => Err(format!("missed: {}", missed.join("; "))),
    }
}
