//! `te-metadata [--addr 0.0.0.0:8080] [--path /metadata] [--persist FILE] [--max-value BYTES]
//! [--max-stored BYTES] [--max-buffered BYTES] [--backlog N] [--max-connections N] [--threads N] [--idle-timeout SECS]
//! [--request-timeout SECS] [--max-connections-per-address N] [--token-file FILE]
//! [--metrics-addr HOST:PORT]`:
//! Mooncake's HTTP metadata server. Engines use it with
//! `--metadata_server=http://HOST:PORT/metadata`. At start it raises its open-file limit to the
//! hard limit, and warns when that is still below `--max-connections`. SIGINT or SIGTERM closes
//! the listener and exits 0; `--help` and `--version` exit 0; a bad argument exits 2 with the
//! usage.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use te_metadata::{Options, Server};
use te_sys::signals::Termination;

const USAGE: &str = "usage: te-metadata [--addr 0.0.0.0:8080] [--path /metadata] [--persist FILE] \
[--max-value BYTES (16 MiB)] [--max-stored BYTES (2 GiB)] [--max-buffered BYTES (1 GiB)] [--backlog N (4096)] [--max-connections N (10000)] [--threads N (2)] \
[--idle-timeout SECS (30)] [--request-timeout SECS (30)] [--max-connections-per-address N (256; 0: none)] \
[--token-file FILE (requests must carry Authorization: Bearer <its content>)] \
[--metrics-addr HOST:PORT (serve /metrics, /metrics/json, /metrics/summary, /health)]";

/// Why `run` ended without serving.
enum Stop {
    /// Bad arguments: exit 2 with the usage.
    Usage(String),
    /// Anything else: exit 1.
    Failed(String),
}

impl From<String> for Stop {
    fn from(e: String) -> Self {
        Stop::Failed(e)
    }
}

/// `value` of argument `name` as a whole number from `min` to `max`.
fn count(name: &str, value: &str, min: u64, max: u64) -> Result<u64, Stop> {
    value
        .parse()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or(Stop::Usage(format!(
            "{name}: a whole number from {min} to {max}\n{USAGE}"
        )))
}

/// The token in `path`: its content without the trailing line end, printable ASCII without
/// spaces (what an HTTP header carries), at least 16 characters.
fn token_from(path: &str) -> Result<te_reactor::secret::Redacted, Stop> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Stop::Usage(format!("--token-file {path}: {e}\n{USAGE}")))?;
    let token = text.trim_end_matches(['\n', '\r']);
    match token.len() >= 16 && token.bytes().all(|b| b.is_ascii_graphic()) {
        true => Ok(te_reactor::secret::Redacted(token.to_string())),
        false => Err(Stop::Usage(format!(
            "--token-file {path}: the token must be at least 16 printable ASCII characters \
             without spaces"
        ))),
    }
}

fn run(termination: Option<&Termination>) -> Result<(), Stop> {
    let mut addr = "0.0.0.0:8080".to_string();
    let mut options = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or(Stop::Usage(format!("{name} needs a value\n{USAGE}")))
        };
        match name.as_str() {
            "--addr" => addr = value()?,
            "--path" => options.path = value()?,
            "--persist" => options.persist = Some(value()?.into()),
            "--max-value" => {
                options.max_value = value()?
                    .parse()
                    .map_err(|_| Stop::Usage(format!("--max-value: not a byte count\n{USAGE}")))?
            }
            "--max-stored" => {
                options.max_stored = value()?
                    .parse()
                    .map_err(|_| Stop::Usage(format!("--max-stored: not a byte count\n{USAGE}")))?
            }
            "--max-buffered" => {
                options.max_buffered = value()?.parse().map_err(|_| {
                    Stop::Usage(format!("--max-buffered: not a byte count\n{USAGE}"))
                })?
            }
            "--backlog" => {
                options.backlog = value()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=65_535).contains(n))
                    .ok_or(Stop::Usage(format!(
                        "--backlog: a count from 1 to 65535\n{USAGE}"
                    )))?
            }
            "--max-connections" => {
                options.max_connections = count(&name, &value()?, 1, 1_000_000)? as usize
            }
            "--threads" => options.threads = count(&name, &value()?, 1, 256)? as usize,
            "--idle-timeout" => {
                options.idle_timeout = Duration::from_secs(count(&name, &value()?, 1, 86_400)?)
            }
            "--request-timeout" => {
                options.request_timeout = Duration::from_secs(count(&name, &value()?, 1, 86_400)?)
            }
            "--max-connections-per-address" => {
                options.max_per_address = count(&name, &value()?, 0, 1_000_000)? as usize
            }
            "--token-file" => options.token = Some(token_from(&value()?)?),
            "--metrics-addr" => {
                let v = value()?;
                options.metrics_addr = Some(v.parse().map_err(|_| {
                    Stop::Usage(format!(
                        "--metrics-addr {v}: not an address (127.0.0.1:9101)\n{USAGE}"
                    ))
                })?)
            }
            other => return Err(Stop::Usage(format!("unknown argument {other}\n{USAGE}"))),
        }
    }
    options.check().map_err(Stop::Usage)?;
    if !options.path.starts_with('/') {
        return Err(Stop::Usage(format!(
            "--path {}: must start with /",
            options.path
        )));
    }
    // Each connection is a file descriptor: the cap, plus the listener, the persistence file
    // and the loops' own.
    let wanted = options.max_connections as u64 + 64;
    if let Err(e) = te_reactor::limits::raise_open_files(wanted, "--max-connections") {
        tracing::warn!(error = %e, "open-file limit unknown");
    }
    let listener =
        std::net::TcpListener::bind(&addr).map_err(|e| format!("binding {addr}: {e}"))?;
    let server = Server::start(listener, options).map_err(|e| e.to_string())?;
    // Tests and scripts read the bound address from this line.
    println!("te-metadata listening on {}", server.addr());
    if let Some(at) = server.metrics_addr() {
        println!("te-metadata metrics on {at}");
    }
    match termination {
        Some(t) => {
            let signal = t.wait();
            tracing::info!(
                "{}: closing the listener and exiting",
                Termination::name(signal)
            );
            drop(server);
            Ok(())
        }
        None => loop {
            std::thread::park();
        },
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if args.iter().any(|a| a == "--version" || a == "-V") {
        println!("te-metadata {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    // Before any thread starts (they inherit the blocked signals): SIGINT and SIGTERM close
    // the listener and exit 0 instead of killing the server mid-request.
    let termination = Termination::install(std::time::Duration::from_secs(10))
        .map_err(|e| eprintln!("te-metadata: SIGINT and SIGTERM not caught: {e}"))
        .ok();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_max_level(tracing::Level::INFO)
        .init();
    match run(termination.as_ref()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Stop::Usage(e)) => {
            eprintln!("te-metadata: {e}");
            ExitCode::from(2)
        }
        Err(Stop::Failed(e)) => {
            eprintln!("te-metadata: {e}");
            ExitCode::FAILURE
        }
    }
}
