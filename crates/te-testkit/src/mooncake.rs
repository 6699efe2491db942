//! The real Mooncake engine as a test peer: Mooncake's PyPI wheel
//! (`mooncake-transfer-engine-non-cuda`), installed by `.ci/setup` into a virtual environment,
//! driven through its Python module by `mooncake_peer.py` in a child process. Nothing here
//! imitates Mooncake: every call runs Mooncake's own code, and its return codes come back as
//! Mooncake reports them.
//!
//! The environment is `$TE_MOONCAKE_VENV`, else `target/mooncake-venv` in the workspace.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// The virtual environment holding Mooncake's wheel.
pub fn venv() -> PathBuf {
    std::env::var_os("TE_MOONCAKE_VENV").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/mooncake-venv"),
        PathBuf::from,
    )
}

/// The path of one of the wheel's programs (`transfer_engine_bench`,
/// `mooncake_http_metadata_server`) in the environment. Where the wheel ships a native binary
/// inside its package (`transfer_engine_bench`), that binary, not the `bin/` wrapper: the
/// wrapper runs it as a child, and killing the wrapper would leave the engine running.
///
/// # Panics
/// When the environment is missing (`.ci/setup` makes it).
pub fn program(name: &str) -> PathBuf {
    let venv = venv();
    if let Some(native) = packaged(&venv, name) {
        return native;
    }
    let path = venv.join("bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: .ci/setup installs Mooncake's wheel into {} (or set TE_MOONCAKE_VENV)",
        path.display(),
        venv.display()
    );
    path
}

/// `<venv>/lib/python3.*/site-packages/mooncake/<name>`, when that is a file.
fn packaged(venv: &std::path::Path, name: &str) -> Option<PathBuf> {
    std::fs::read_dir(venv.join("lib"))
        .ok()?
        .filter_map(Result::ok)
        .map(|python| python.path().join("site-packages/mooncake").join(name))
        .find(|p| p.is_file())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect()
}

/// A Python script run by the wheel's interpreter in a child process, spoken to in JSON lines
/// (one request on stdin, one reply on stdout); its stderr (Mooncake's glog output) is kept in a
/// log file, for the message of a failing assertion.
struct Script {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    log: PathBuf,
}

impl Script {
    /// Starts `peers/<name>` with `env` added to its environment.
    fn start(name: &str, env: &[(&str, &str)]) -> Self {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("peers")
            .join(name);
        let log = std::env::temp_dir().join(format!(
            "te-{name}-{}-{}.log",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let mut cmd = Command::new(program("python3"));
        cmd.arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("a log file for the Mooncake peer"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("the Mooncake peer starts");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Script {
            child,
            stdin,
            stdout,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// One request, one reply; panics (with the log) when the peer died.
    fn call(&mut self, request: Value) -> Value {
        let sent = writeln!(self.stdin, "{request}").and_then(|()| self.stdin.flush());
        let mut line = String::new();
        let read = sent.and_then(|()| self.stdout.read_line(&mut line));
        match read {
            Ok(n) if n > 0 => serde_json::from_str(&line).unwrap_or(Value::Null),
            _ => panic!(
                "the Mooncake peer died on {request}; its log:\n{}",
                self.log()
            ),
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A Mooncake engine in a child process; killed on drop. Its log (Mooncake's glog output) is
/// kept in a file, for the message of a failing assertion.
pub struct MooncakePeer {
    script: Script,
    /// Mooncake's rpc port (P2PHANDSHAKE).
    pub rpc_port: u16,
    /// Its segment name, `host:rpc_port`.
    pub name: String,
}

impl std::fmt::Debug for MooncakePeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MooncakePeer")
            .field("name", &self.name)
            .finish()
    }
}

impl MooncakePeer {
    /// Starts Mooncake's engine with `initialize(host, metadata, "tcp", "")`, TCP only
    /// (`MC_FORCE_TCP`), with `env` added to its environment.
    ///
    /// # Panics
    /// When the wheel is missing or Mooncake's `initialize` fails.
    pub fn start(host: &str, metadata: &str, env: &[(&str, &str)]) -> Self {
        let mut all = vec![("MC_FORCE_TCP", "1")];
        all.extend_from_slice(env);
        Self::start_with(host, metadata, ("tcp", ""), &all)
    }

    /// Starts Mooncake's engine with `initialize(host, metadata, protocol, device)` and `env`
    /// added to its environment (RDMA: `("rdma", "rxe0")`, on a machine with verbs devices).
    ///
    /// # Panics
    /// When the wheel is missing or Mooncake's `initialize` fails.
    pub fn start_with(
        host: &str,
        metadata: &str,
        (protocol, device): (&str, &str),
        env: &[(&str, &str)],
    ) -> Self {
        // Mooncake's smallest transfer timeout, so a refused transfer fails in seconds.
        let mut all = vec![("MC_TRANSFER_TIMEOUT", "5")];
        all.extend_from_slice(env);
        let mut peer = MooncakePeer {
            script: Script::start("mooncake_peer.py", &all),
            rpc_port: 0,
            name: String::new(),
        };
        let r = peer.call(json!({"op": "init", "host": host, "metadata": metadata,
                                  "protocol": protocol, "device": device}));
        assert_eq!(r["rc"], 0, "Mooncake's initialize failed:\n{}", peer.log());
        peer.rpc_port = r["rpc_port"].as_u64().unwrap_or(0) as u16;
        peer.name = if metadata == "P2PHANDSHAKE" {
            format!("{host}:{}", peer.rpc_port)
        } else {
            host.to_string()
        };
        peer
    }

    /// Mooncake's log so far.
    pub fn log(&self) -> String {
        self.script.log()
    }

    /// One request, one reply.
    ///
    /// # Panics
    /// When the peer died (its log is in the message).
    pub fn call(&mut self, request: Value) -> Value {
        self.script.call(request)
    }

    /// `len` bytes of the peer's own memory registered with Mooncake's `register_memory` (as
    /// vLLM and SGLang register theirs).
    pub fn alloc(&mut self, len: usize) -> u64 {
        let r = self.call(json!({"op": "alloc", "len": len}));
        let addr = r["addr"].as_u64().unwrap_or(0);
        assert_ne!(
            addr,
            0,
            "Mooncake could not register {len} bytes (rc {}):\n{}",
            r["rc"],
            self.log()
        );
        addr
    }

    /// Writes `data` into its own memory at `addr`.
    pub fn put(&mut self, addr: u64, data: &[u8]) {
        let r = self.call(json!({"op": "put", "addr": addr, "hex": hex(data)}));
        assert_eq!(r["rc"], 0);
    }

    /// Reads `len` bytes of its own memory at `addr`.
    pub fn get(&mut self, addr: u64, len: usize) -> Vec<u8> {
        let r = self.call(json!({"op": "get", "addr": addr, "len": len}));
        unhex(r["hex"].as_str().unwrap_or(""))
    }

    /// `transfer_sync_write(target, local, remote, len)`: Mooncake's return code.
    pub fn write(&mut self, target: &str, local: u64, remote: u64, len: usize) -> i64 {
        self.transfer("write", target, local, remote, len)
    }

    /// `transfer_sync_read(target, local, remote, len)`: Mooncake's return code.
    pub fn read(&mut self, target: &str, local: u64, remote: u64, len: usize) -> i64 {
        self.transfer("read", target, local, remote, len)
    }

    fn transfer(&mut self, op: &str, target: &str, local: u64, remote: u64, len: usize) -> i64 {
        let r = self.call(json!({"op": op, "target": target, "local": local,
                                 "remote": remote, "len": len}));
        r["rc"].as_i64().unwrap_or(i64::MIN)
    }

    /// `batch_transfer_sync_{write,read}` of `(local, remote, len)` triples: the return code.
    pub fn batch(&mut self, write: bool, target: &str, items: &[(u64, u64, usize)]) -> i64 {
        let r = self.call(batch_request(write, target, items));
        r["rc"].as_i64().unwrap_or(i64::MIN)
    }

    /// Starts `batch_transfer_sync_{write,read}` of `items` (as [`batch`](Self::batch)), runs
    /// `meanwhile` while Mooncake moves the bytes, then kills the peer's process (SIGKILL): its
    /// sockets close as a crash closes them. Returns the call's return code if it had ended
    /// before the kill, `None` if the kill cut it short.
    pub fn batch_then_kill(
        mut self,
        write: bool,
        target: &str,
        items: &[(u64, u64, usize)],
        meanwhile: impl FnOnce(),
    ) -> Option<i64> {
        let request = batch_request(write, target, items);
        writeln!(self.script.stdin, "{request}")
            .and_then(|()| self.script.stdin.flush())
            .unwrap_or_else(|e| panic!("the Mooncake peer died: {e}\n{}", self.log()));
        meanwhile();
        self.end();
        // A reply written before the kill is still in the pipe; otherwise the pipe is at its end.
        let mut line = String::new();
        match self.script.stdout.read_line(&mut line) {
            Ok(n) if n > 0 => serde_json::from_str::<Value>(&line)
                .ok()
                .and_then(|r| r["rc"].as_i64()),
            _ => None,
        }
    }

    /// The peer's process id (to stop and continue it with signals).
    pub fn pid(&self) -> u32 {
        self.script.child.id()
    }

    /// Kills the peer's process at once (SIGKILL), as a crash would end it.
    pub fn kill(mut self) {
        self.end();
    }

    /// SIGKILL, and the process reaped.
    fn end(&mut self) {
        self.script.kill();
    }

    /// `transfer_sync(target, local, remote, len, Write, TransferNotify(name, msg))`: a WRITE
    /// whose notification follows its data.
    pub fn write_with_notify(
        &mut self,
        target: &str,
        (local, remote, len): (u64, u64, usize),
        name: &str,
        msg: &str,
    ) -> i64 {
        let r = self.call(
            json!({"op": "notify_write", "target": target, "local": local,
                                 "remote": remote, "len": len, "name": name, "msg": msg}),
        );
        r["rc"].as_i64().unwrap_or(i64::MIN)
    }

    /// `get_first_buffer_address(target)`: 0 when Mooncake cannot open the segment.
    pub fn first_buffer(&mut self, target: &str) -> u64 {
        self.call(json!({"op": "first", "target": target}))["addr"]
            .as_u64()
            .unwrap_or(0)
    }

    /// The notifications received so far, as (name, message).
    pub fn notifies(&mut self) -> Vec<(String, String)> {
        let r = self.call(json!({"op": "notifies"}));
        r["notifies"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|n| {
                        (
                            n[0].as_str().unwrap_or("").to_string(),
                            n[1].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The peer's request for `batch_transfer_sync_{write,read}` of `(local, remote, len)` items.
fn batch_request(write: bool, target: &str, items: &[(u64, u64, usize)]) -> Value {
    json!({
        "op": "batch", "opcode": if write { "write" } else { "read" }, "target": target,
        "locals": items.iter().map(|i| i.0).collect::<Vec<_>>(),
        "remotes": items.iter().map(|i| i.1).collect::<Vec<_>>(),
        "lens": items.iter().map(|i| i.2).collect::<Vec<_>>(),
    })
}

impl Drop for MooncakePeer {
    fn drop(&mut self) {
        let _ = writeln!(self.script.stdin, "{{\"op\":\"quit\"}}");
        let _ = self.script.stdin.flush();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < deadline {
            if matches!(self.script.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// Mooncake's own HTTP metadata server (`mooncake_http_metadata_server`, from the wheel) on a
/// free loopback port; its `url` is what both engines are given (`http://…/metadata`).
///
/// # Panics
/// When the wheel is missing or the server does not start.
pub fn http_metadata_server() -> super::services::Service {
    let port = super::services::free_port();
    let child = Command::new(program("mooncake_http_metadata_server"))
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--log-level", "WARNING"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("Mooncake's metadata server starts");
    let service =
        super::services::Service::new(child, format!("http://127.0.0.1:{port}/metadata"), port);
    super::services::wait_for(
        port,
        "mooncake_http_metadata_server",
        Duration::from_secs(20),
    );
    service
}

/// Mooncake's `transfer_engine_bench` as a target (`--mode=target`, P2PHANDSHAKE, on
/// 127.0.0.1), with `args` added; killed on drop.
pub struct MooncakeBenchTarget {
    child: Child,
    /// The segment name it serves (`127.0.0.1:<rpc port>`, read from its log).
    pub name: String,
}

impl MooncakeBenchTarget {
    /// Starts it on 127.0.0.1 and waits until it says where it listens.
    ///
    /// # Panics
    /// When the wheel is missing or the target does not start within 30 s.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_at("127.0.0.1", args, env)
    }

    /// As [`start`](Self::start), named by `host` (`--local_server_name`).
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_at(host: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(program("transfer_engine_bench"));
        cmd.args(["--mode=target", "--metadata_server=P2PHANDSHAKE"])
            .arg(format!("--local_server_name={host}"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("transfer_engine_bench starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent {
                    if let Some(at) = line.find("listening on ") {
                        let name = line[at + "listening on ".len()..].trim().to_string();
                        sent = tx.send(name).is_ok();
                    }
                }
            }
        });
        let name = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("transfer_engine_bench target says where it listens");
        MooncakeBenchTarget { child, name }
    }
}

impl Drop for MooncakeBenchTarget {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Mooncake's RPC communicator (`mooncake.engine.RpcInterface`) in a child process, driven by
/// `peers/mooncake_rpc_peer.py`; killed on drop.
pub struct MooncakeRpc {
    script: Script,
}

impl MooncakeRpc {
    /// A Mooncake RPC communicator; `serve` starts its server on loopback (its port returned),
    /// else it is a client.
    ///
    /// # Panics
    /// When the wheel is missing or Mooncake's initialize fails.
    pub fn start(serve: bool) -> (Self, u16) {
        let mut peer = MooncakeRpc {
            script: Script::start("mooncake_rpc_peer.py", &[]),
        };
        let r = match serve {
            true => peer.call(json!({"op": "serve"})),
            false => peer.call(json!({"op": "client"})),
        };
        assert_eq!(
            r["ok"],
            true,
            "Mooncake's RpcInterface did not start:\n{}",
            peer.log()
        );
        let port = r["port"].as_u64().unwrap_or(0) as u16;
        (peer, port)
    }

    /// Mooncake's log so far.
    pub fn log(&self) -> String {
        self.script.log()
    }

    /// One request, one reply.
    ///
    /// # Panics
    /// When the peer died (its log is in the message).
    pub fn call(&mut self, request: Value) -> Value {
        self.script.call(request)
    }

    /// Mooncake's `send_data(target, data)`: its return code.
    pub fn send_data(&mut self, target: &str, data: &[u8]) -> i64 {
        let r = self.call(json!({"op": "send_data", "target": target, "hex": hex(data)}));
        r["rc"].as_i64().unwrap_or(i64::MIN)
    }

    /// Mooncake's `send_tensor(target, tensor)` for a tensor of `dtype` (`torch.float32`…)
    /// and `shape` over `data`: its return code.
    pub fn send_tensor(
        &mut self,
        target: &str,
        data: &[u8],
        dtype: &str,
        shape: &[u64],
        element_size: usize,
    ) -> i64 {
        let r = self.call(
            json!({"op": "send_tensor", "target": target, "hex": hex(data),
                                  "dtype": dtype, "shape": shape, "element_size": element_size}),
        );
        r["rc"].as_i64().unwrap_or(i64::MIN)
    }

    /// What its callbacks were given since the last call, waiting up to `wait` for `count`.
    pub fn received(&mut self, count: usize, wait: Duration) -> Vec<MooncakeReceived> {
        let r = self.call(json!({"op": "received", "count": count, "wait": wait.as_secs_f64()}));
        let messages = r["messages"].as_array().cloned().unwrap_or_default();
        messages
            .iter()
            .map(|m| MooncakeReceived {
                tensor: m["kind"] == "tensor",
                source: m["source"].as_str().unwrap_or("").to_string(),
                data: unhex(m["hex"].as_str().unwrap_or("")),
                dtype: m["dtype"].as_str().unwrap_or("").to_string(),
                shape: m["shape"].clone(),
                total_bytes: m["total_bytes"].as_u64().unwrap_or(0),
            })
            .collect()
    }
}

/// What one of Mooncake's receive callbacks was given.
#[derive(Clone, Debug, PartialEq)]
pub struct MooncakeReceived {
    /// The tensor callback (else the data callback).
    pub tensor: bool,
    /// `source` / `source_address`.
    pub source: String,
    /// The bytes (`data`, or the tensor's `get_data_as_bytes()`).
    pub data: Vec<u8>,
    /// A tensor's `dtype`.
    pub dtype: String,
    /// A tensor's `shape` as read (the wheel raises on it: then a string saying so).
    pub shape: Value,
    /// A tensor's `total_bytes`.
    pub total_bytes: u64,
}
