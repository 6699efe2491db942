//! te-bench: measures te with Mooncake's `transfer_engine_bench` flags and output line.
//!
//! Modes: `--mode=target` (register a buffer, print the segment name, serve until killed),
//! `--mode=initiator --segment_id=HOST:PORT` (drive transfers at the target), and `--loopback`
//! (both in one command, over real TCP sockets on 127.0.0.1), `--mode=swarm --peers=N` (N
//! peers' connections at one target from this one process, speaking the wire directly). `--verify` fills patterns and
//! compares every byte of the working set after the timed run; `--json` prints the figures as
//! one JSON object last.
#![forbid(unsafe_code)]

mod engine_bench;
mod flags;
mod latency;
mod memory;
mod pattern;
mod report;
mod swarm;
mod tent_bench;
mod transports;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use flags::Flags;
use latency::Latencies;
use memory::BenchMemory;
use te_core::{Config, Opcode, Permission, TransferEngine, TransferRequest, TransferState};
use transports::start_engine;

pub(crate) const TARGET_SEED: u64 = 0x7e7a_0001;
pub(crate) const INITIATOR_SEED: u64 = 0x1e17_0002;
const WAIT: Duration = Duration::from_secs(120);

pub(crate) type BenchResult<T> = Result<T, String>;

/// SIGINT and SIGTERM, caught so that te-bench stops through its own code: engines delete
/// their descriptors and close their listeners, shared-memory files are removed.
static TERMINATION: std::sync::OnceLock<te_sys::signals::Termination> = std::sync::OnceLock::new();
/// How long te-bench may take to shut down after a signal before it is made to exit.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The termination signal received, if any: timed loops end early when there is one.
pub(crate) fn interrupted() -> Option<i32> {
    TERMINATION.get().and_then(|t| t.received())
}

/// Sleeps `d`, or less when a termination signal arrives.
pub(crate) fn pause(d: Duration) {
    match TERMINATION.get() {
        Some(t) => {
            t.wait_timeout(d);
        }
        None => std::thread::sleep(d),
    }
}

/// Whether a timed loop goes on: before `end`, with no termination signal received.
pub(crate) fn running(end: Instant) -> bool {
    running_at(Instant::now(), end)
}

/// As [`running`], at `now` (a loop that has just read the clock).
pub(crate) fn running_at(now: Instant, end: Instant) -> bool {
    now < end && interrupted().is_none()
}

fn init_logging(level: te_core::config::LogLevel) {
    use te_core::config::LogLevel;
    let max = match level {
        LogLevel::Trace => tracing::Level::TRACE,
        LogLevel::Debug => tracing::Level::DEBUG,
        LogLevel::Info => tracing::Level::INFO,
        LogLevel::Warning => tracing::Level::WARN,
        _ => tracing::Level::ERROR,
    };
    // Colours only for a terminal: a log read from a file or a pipe stays plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_max_level(max)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(ansi)
        .init();
}

fn start_target(config: Config, flags: &Flags) -> BenchResult<(TransferEngine, BenchMemory)> {
    let (engine, installed) = start_engine(config, flags, &flags.local_server_name)?;
    let size = target_size(flags) as usize;
    // Shared memory or CXL device memory, so initiators on this host (or device) can map it;
    // GPU memory for --use_vram.
    let buffer = installed.allocate(size, flags.gpu())?;
    if flags.verify {
        pattern::fill(&buffer, TARGET_SEED, 0, size as u64)?;
    }
    buffer
        .register(&engine, Permission::RemoteReadWrite)
        .map_err(|e| format!("registering the target buffer: {e}"))?;
    Ok((engine, buffer))
}

struct Measured {
    elapsed: f64,
    batches: u64,
    latencies: Latencies,
    verified_bytes: Option<u64>,
}

fn run_thread(
    e: &TransferEngine,
    f: &Flags,
    tid: usize,
    local: u64,
    remote: (u64, u64),
    end: Instant,
) -> BenchResult<(u64, Latencies)> {
    let op = if f.operation == "write" {
        Opcode::Write
    } else {
        Opcode::Read
    };
    let (segment, remote_base) = remote;
    let requests: Vec<TransferRequest> = (0..f.batch_size)
        .map(|i| {
            let off = f.block_offset(f.block_size, i, tid, f.threads);
            TransferRequest {
                opcode: op,
                source: local + off,
                target_id: segment,
                target_offset: remote_base + off,
                length: f.block_size,
            }
        })
        .collect();
    let mut batches = 0;
    let mut latencies = Latencies::default();
    // Up to `--inflight` batches outstanding: the oldest is waited for, freed and replaced.
    let mut flying: std::collections::VecDeque<(te_core::BatchId, Instant)> =
        std::collections::VecDeque::new();
    // One clock read per batch: the moment a batch is freed ends its latency, starts the
    // batch that replaces it, and says whether the run goes on (a read costs in a VM).
    let mut now = Instant::now();
    loop {
        let go_on = running_at(now, end);
        if go_on && flying.len() < f.inflight {
            let b = e.allocate_batch(f.batch_size).map_err(|e| e.to_string())?;
            e.submit(b, &requests).map_err(|e| format!("submit: {e}"))?;
            flying.push_back((b, now));
            if flying.len() < f.inflight {
                // Filling up: the next batch starts now, not when the last one was freed.
                now = Instant::now();
            }
            continue;
        }
        let Some((b, started)) = flying.pop_front() else {
            break;
        };
        let status = e.wait(b, WAIT).map_err(|e| format!("wait: {e}"))?;
        if status.state != TransferState::Completed {
            let why = (0..f.batch_size).find_map(|i| e.task_error(b, i).ok().flatten());
            return Err(format!(
                "batch ended {:?}: {}",
                status.state,
                why.map_or("-".into(), |w| w.to_string())
            ));
        }
        e.free_batch(b).map_err(|e| e.to_string())?;
        now = Instant::now();
        latencies.record(now - started);
        batches += 1;
    }
    Ok((batches, latencies))
}

/// What `drive` measured.
pub(crate) struct Driven {
    pub(crate) elapsed: f64,
    pub(crate) batches: u64,
    pub(crate) latencies: Latencies,
}

/// Runs `--threads` threads of batches (see `run_thread`) for `--duration`; sums what they did.
pub(crate) fn drive(
    e: &TransferEngine,
    f: &Flags,
    local: u64,
    remote: (u64, u64),
) -> BenchResult<Driven> {
    fan_out(f.threads, f.duration, |tid, end| {
        run_thread(e, f, tid, local, remote, end)
    })
}

/// Runs `thread(tid, end)` on `threads` threads until `end`, `seconds` from now; sums the
/// batches each did and gathers their latencies (the first error wins).
pub(crate) fn fan_out(
    threads: usize,
    seconds: f64,
    thread: impl Fn(usize, Instant) -> BenchResult<(u64, Latencies)> + Sync,
) -> BenchResult<Driven> {
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(seconds);
    let thread = &thread;
    let results: Vec<BenchResult<(u64, Latencies)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|tid| s.spawn(move || thread(tid, end)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    if let Some(signal) = interrupted() {
        return Err(stopped_by(signal));
    }
    let mut driven = Driven {
        elapsed: started.elapsed().as_secs_f64(),
        batches: 0,
        latencies: Latencies::default(),
    };
    for r in results {
        let (b, l) = r?;
        driven.batches += b;
        driven.latencies.merge(&l);
    }
    Ok(driven)
}

/// The error a run stopped by `signal` ends with.
pub(crate) fn stopped_by(signal: i32) -> String {
    format!(
        "stopped by {} before the run finished",
        te_sys::signals::Termination::name(signal)
    )
}

/// Reads `[0, len)` of the remote buffer back into a scratch buffer, outside the timed run.
pub(crate) fn read_back(
    e: &TransferEngine,
    segment: u64,
    remote: u64,
    len: u64,
) -> BenchResult<BenchMemory> {
    let scratch = BenchMemory::new(None, len as usize)?;
    scratch.register(e, Permission::LocalOnly)?;
    move_untimed(e, Opcode::Read, scratch.addr(), (segment, remote), len)?;
    Ok(scratch)
}

/// Writes the target's pattern into a target that did not fill it itself (a Mooncake
/// `transfer_engine_bench` target), so a verified READ has something to compare against.
fn seed_target(e: &TransferEngine, segment: u64, remote: u64, len: u64) -> BenchResult<()> {
    let scratch = BenchMemory::new(None, len as usize)?;
    pattern::fill(&scratch, TARGET_SEED, 0, len)?;
    scratch.register(e, Permission::LocalOnly)?;
    move_untimed(e, Opcode::Write, scratch.addr(), (segment, remote), len)
}

/// Moves `len` bytes between `local` and the target in 1 MiB requests, outside the timed run.
fn move_untimed(
    e: &TransferEngine,
    opcode: Opcode,
    local: u64,
    (segment, remote): (u64, u64),
    len: u64,
) -> BenchResult<()> {
    let chunk = 1u64 << 20;
    let requests: Vec<_> = (0..len.div_ceil(chunk))
        .map(|i| TransferRequest {
            opcode,
            source: local + i * chunk,
            target_id: segment,
            target_offset: remote + i * chunk,
            length: chunk.min(len - i * chunk),
        })
        .collect();
    for group in requests.chunks(256) {
        let b = e.allocate_batch(group.len()).map_err(|e| e.to_string())?;
        e.submit(b, group).map_err(|e| e.to_string())?;
        let s = e.wait(b, WAIT).map_err(|e| e.to_string())?;
        e.free_batch(b).map_err(|e| e.to_string())?;
        if s.state != TransferState::Completed {
            return Err(format!("untimed {opcode:?} ended {:?}", s.state));
        }
    }
    Ok(())
}

/// Bytes of the target buffer: `--buffer_size`, at least the working set.
fn target_size(flags: &Flags) -> u64 {
    flags.buffer_size.max(flags.working_set())
}

fn run_initiator(e: &TransferEngine, f: &Flags, target: &str) -> BenchResult<Measured> {
    let segment = match f.is_file() {
        true => transports::open_file_target(e, f)?.0,
        false => e
            .open_segment(target)
            .map_err(|e| format!("opening {target}: {e}"))?,
    };
    let desc = e.segment(segment).map_err(|e| e.to_string())?;
    let ws = f.working_set();
    let remote = desc
        .desc()
        .buffers
        .first()
        .ok_or_else(|| format!("segment {target} publishes no buffer"))?;
    if remote.length < ws {
        return Err(format!(
            "target buffer holds {} bytes; block_size × batch_size × threads needs {ws}",
            remote.length
        ));
    }
    // A Mooncake target (no te_wire_version) does not fill the pattern: te-bench does.
    if f.verify && f.operation == "read" && desc.desc().is_mooncake() {
        seed_target(e, segment, remote.addr, ws)?;
    }
    let local = BenchMemory::new(f.gpu(), ws as usize)?;
    if f.verify && f.operation == "write" {
        pattern::fill(&local, INITIATOR_SEED, 0, ws)?;
    }
    local
        .register(e, Permission::LocalOnly)
        .map_err(|e| format!("registering: {e}"))?;
    let Driven {
        elapsed,
        batches,
        latencies,
    } = drive(e, f, local.addr(), (segment, remote.addr))?;
    let verified_bytes = if f.verify {
        let covered = f.covered(f.block_size, f.batch_size, f.threads);
        let mismatch = if f.operation == "write" {
            let back = read_back(e, segment, remote.addr, ws)?;
            pattern::first_mismatch_in(&back, INITIATOR_SEED, &covered)?
        } else {
            pattern::first_mismatch_in(&local, TARGET_SEED, &covered)?
        };
        if let Some(at) = mismatch {
            return Err(format!(
                "verification failed: byte {at} of the working set differs from the pattern"
            ));
        }
        Some(covered.iter().map(|(_, n)| n).sum())
    } else {
        None
    };
    Ok(Measured {
        elapsed,
        batches,
        latencies,
        verified_bytes,
    })
}

fn print_report(f: &Flags, m: &Measured) {
    let bytes = m.batches * f.batch_size as u64 * f.block_size;
    let rate = bytes as f64 / m.elapsed;
    let p = |q| m.latencies.percentile_us(q);
    println!(
        "te-bench: {} {}{}, block {} B, batch {}, {} thread(s); batch latency p50 {:.0} us, p99 {:.0} us, p999 {:.0} us",
        f.protocol,
        f.operation,
        f.gpu()
            .map_or(String::new(), |g| format!(" (GPU {g} memory)")),
        f.block_size,
        f.batch_size,
        f.threads,
        p(0.5),
        p(0.99),
        p(0.999)
    );
    if let Some(v) = m.verified_bytes {
        println!(
            "te-bench: verified {v} bytes byte by byte against the pattern (after the timed run)"
        );
    }
    println!(
        "{}",
        report::completed_line(
            m.elapsed,
            m.batches,
            rate,
            &f.report_unit,
            f.report_precision
        )
    );
    if f.json {
        let json = serde_json::json!({
            "protocol": f.protocol, "operation": f.operation, "block_size": f.block_size,
            "batch_size": f.batch_size, "threads": f.threads, "duration_s": m.elapsed,
            "batch_count": m.batches, "bytes": bytes, "throughput_gb_s": rate / 1e9,
            "batch_latency_us": {"p50": p(0.5), "p99": p(0.99), "p999": p(0.999)},
            "verified_bytes": m.verified_bytes, "loopback": f.loopback,
            "gpu": f.gpu(),
            "includes": "batch allocate/free, submit, slicing, transfer, completion wait, lane connection set-up in the first batch",
            "excludes": "engine start, registration, segment open, verification",
        });
        println!("{json}");
    }
}

/// `--mode=topology`: what discovery found, the matrices, and the rails te would use.
fn print_topology(config: &Config) -> BenchResult<()> {
    use te_topology::{NicKind, PriorityMatrix, Topology};
    let topology = Topology::discover().map_err(|e| e.to_string())?;
    let bind_ip = te_topology::bind::bind_ip_for(
        config.tcp_bind_address,
        None,
        &topology,
        &te_sys::interface_addrs(),
    );
    let (rails, matrix) =
        te_core::rails::plan(config, bind_ip, &topology, &te_sys::interface_addrs())
            .map_err(|e| e.to_string())?;
    let json = serde_json::json!({
        "topology": topology,
        "priority_matrix": {
            "rdma": PriorityMatrix::from_topology(&topology, NicKind::Rdma, &config.nic_filter),
            "ethernet": PriorityMatrix::from_topology(&topology, NicKind::Ethernet, &config.nic_filter),
        },
        "tcp_rails": rails.iter().map(|r| serde_json::json!({"name": r.name, "ip": r.ip.to_string()})).collect::<Vec<_>>(),
        "tcp_priority_matrix": matrix,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?
    );
    Ok(())
}

fn main_inner(flags: Flags) -> BenchResult<()> {
    let mut config = Config::from_env().map_err(|e| e.to_string())?;
    init_logging(config.log_level);
    // For TCP the devices are interfaces (rails); for RDMA they are verbs devices.
    if !flags.device_name.is_empty() && flags.protocol != "rdma" {
        config.rails = Some(flags.devices());
    }
    if !flags.nic_priority_matrix.is_empty() {
        config.custom_topo_json = Some(flags.nic_priority_matrix.clone());
    }
    if flags.mode == "topology" {
        return print_topology(&config);
    }
    if flags.mode == "memcpy" {
        return engine_bench::memcpy(&flags);
    }
    if flags.mode == "engine" && flags.backend == "tent" {
        return engine_bench::run_tent(config, &flags);
    }
    if flags.mode == "engine" {
        return engine_bench::run(config, &flags);
    }
    if flags.mode == "swarm" {
        let tcp = te_tcp::TcpSettings::from_env().map_err(|e| e.to_string())?;
        return swarm::run(&flags, tcp.lanes_per_peer);
    }
    if flags.loopback && config.tcp_bind_address.is_none() {
        config.tcp_bind_address = Some(std::net::Ipv4Addr::LOCALHOST.into());
    }
    if flags.mode == "target" {
        let (engine, _buffer) = start_target(config, &flags)?;
        println!(
            "te-bench target ready, segment name: {}",
            engine.segment_name()
        );
        let signal = TERMINATION.get().map_or(0, |t| t.wait());
        eprintln!(
            "te-bench target: {}: shutting down",
            te_sys::signals::Termination::name(signal)
        );
        return Ok(());
    }
    if flags.backend == "tent" {
        if flags.is_file() || flags.protocol == "cxl" {
            return Err(format!(
                "--backend=tent: --protocol={} is not wired into the tent bench yet (tcp, shm, rdma)",
                flags.protocol
            ));
        }
        if flags.loopback {
            let (target, _buffer) = start_target(config.clone(), &flags)?;
            return tent_bench::run(config, &flags, target.segment_name());
        }
        return tent_bench::run(config, &flags, &flags.segment_id);
    }
    let _stand_in = match (flags.protocol.as_str(), flags.loopback) {
        ("cxl", true) => transports::StandIn::make(&mut config, target_size(&flags))?,
        _ => None,
    };
    if flags.is_file() {
        let (initiator, _) = start_engine(config, &flags, "")?;
        let m = run_initiator(&initiator, &flags, &flags.file_path)?;
        print_report(&flags, &m);
        return Ok(());
    }
    if flags.loopback {
        let (target, _buffer) = start_target(config.clone(), &flags)?;
        let (initiator, _) = start_engine(config, &flags, "")?;
        let m = run_initiator(&initiator, &flags, target.segment_name())?;
        print_report(&flags, &m);
        hold_metrics(&flags);
        return Ok(());
    }
    let (initiator, _) = start_engine(config, &flags, &flags.local_server_name)?;
    let m = run_initiator(&initiator, &flags, &flags.segment_id)?;
    print_report(&flags, &m);
    hold_metrics(&flags);
    Ok(())
}

/// Keeps the metrics endpoint up `--metrics_hold` seconds after the report, for a last scrape.
fn hold_metrics(flags: &Flags) {
    if flags.metrics.is_some() && flags.metrics_hold > 0.0 {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::thread::sleep(std::time::Duration::from_secs_f64(flags.metrics_hold));
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", flags::USAGE);
        return ExitCode::SUCCESS;
    }
    if args.iter().any(|a| a == "--version" || a == "-V") {
        println!("te-bench {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let flags = match Flags::parse(args) {
        Ok(f) => f,
        Err(msg) => {
            eprintln!("te-bench: {msg}");
            return ExitCode::from(2);
        }
    };
    // First, before any thread starts: every thread inherits the blocked signals.
    match te_sys::signals::Termination::install(SHUTDOWN_GRACE) {
        Ok(t) => {
            let _ = TERMINATION.set(t);
        }
        Err(e) => eprintln!("te-bench: SIGINT and SIGTERM not caught ({e}): a kill skips clean-up"),
    }
    let outcome = main_inner(flags);
    match (outcome, interrupted()) {
        (Ok(()), _) => ExitCode::SUCCESS,
        // Stopped by a signal mid-run: cleaned up, exit as a shell reports the signal.
        (Err(msg), Some(signal)) => {
            eprintln!("te-bench: {msg}");
            ExitCode::from(128 + signal as u8)
        }
        (Err(msg), None) => {
            eprintln!("te-bench: {msg}");
            ExitCode::FAILURE
        }
    }
}
