//! `te-metadata [--addr 0.0.0.0:8080] [--path /metadata] [--persist FILE] [--max-value BYTES]`:
//! Mooncake's HTTP metadata server. Engines use it with `--metadata_server=http://HOST:PORT/metadata`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use te_metadata::{Options, Server};

const USAGE: &str = "usage: te-metadata [--addr 0.0.0.0:8080] [--path /metadata] [--persist FILE] [--max-value BYTES]";

fn run() -> Result<(), String> {
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
                .ok_or(format!("{name} needs a value\n{USAGE}"))
        };
        match name.as_str() {
            "--addr" => addr = value()?,
            "--path" => options.path = value()?,
            "--persist" => options.persist = Some(value()?.into()),
            "--max-value" => {
                options.max_value = value()?
                    .parse()
                    .map_err(|_| format!("--max-value: not a byte count\n{USAGE}"))?
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if !options.path.starts_with('/') {
        return Err(format!("--path {}: must start with /", options.path));
    }
    let listener =
        std::net::TcpListener::bind(&addr).map_err(|e| format!("binding {addr}: {e}"))?;
    let server = Server::start(listener, options).map_err(|e| e.to_string())?;
    // Tests and scripts read the bound address from this line.
    println!("te-metadata listening on {}", server.addr());
    loop {
        std::thread::park();
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_max_level(tracing::Level::INFO)
        .init();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("te-metadata: {e}");
            ExitCode::FAILURE
        }
    }
}
