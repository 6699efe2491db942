//! Command-line flags, in Mooncake's `transfer_engine_bench` spelling (gflags style:
//! `--name=value`, `--name value`, `--flag`, `--noflag`).

use std::collections::HashMap;

/// What one run is asked to do.
#[derive(Clone, Debug, PartialEq)]
pub struct Flags {
    pub mode: String,
    pub metadata_server: String,
    pub local_server_name: String,
    pub segment_id: String,
    pub operation: String,
    pub protocol: String,
    pub block_size: u64,
    /// Distance between the starts of consecutive blocks (`--block_stride`; 0: the block size,
    /// so a one-thread batch is one contiguous range that the engine merges). A larger stride
    /// leaves gaps, so nothing merges: the small-request path is measured as such.
    pub block_stride: u64,
    pub batch_size: usize,
    /// Batches each thread keeps outstanding (`--inflight`, te's; 1: submit, wait, free, as
    /// Mooncake's bench), as UCX's bandwidth tests keep several puts in flight.
    pub inflight: usize,
    pub buffer_size: u64,
    pub duration: f64,
    pub threads: usize,
    pub report_unit: String,
    pub report_precision: usize,
    pub verify: bool,
    pub json: bool,
    pub loopback: bool,
    /// NICs to use as rails (for TCP: interface names), comma-separated.
    pub device_name: String,
    /// A priority matrix file (Mooncake's shape), instead of discovery.
    pub nic_priority_matrix: String,
    /// Discover the topology (te always does; accepted for Mooncake's scripts).
    pub auto_discovery: bool,
    /// The file a `uring` or `bufio` run reads and writes (created and sized when missing).
    pub file_path: String,
    /// `classic` (te-core's engine) or `tent` (te-tent's runtime, with tebench's sweeps).
    pub backend: String,
    /// Buffers in GPU memory (`--use_vram`) on device `--gpu_id`.
    pub use_vram: bool,
    pub gpu_id: u32,
    /// tebench's power-of-two sweeps (`--start_block_size`/`--max_block_size`, `..._batch_size`,
    /// `..._num_threads`); each defaults to the single value of its classic flag.
    pub sweep: Sweep,
    /// `--mode=swarm`: peers stood for, connections (lanes) per peer (0: `MC_TCP_LANES_PER_PEER`),
    /// and requests in flight per connection.
    pub peers: usize,
    pub lanes: usize,
    pub depth: usize,
    /// `--mode=swarm`: seconds to keep the connections open and idle after the run.
    pub hold: f64,
    /// `--mode=swarm`: distinct blocks of the target written (0: one per connection).
    pub slots: usize,
    /// Count requests and serve Prometheus metrics on this port of `--metrics_host`
    /// (`--metrics_port`, te's; off when not given, unless `TENT_METRICS_ENABLED`).
    pub metrics: Option<std::net::SocketAddr>,
    /// Seconds the metrics endpoint stays up after the run (`--metrics_hold`, te's), so a
    /// scraper sees the final counts.
    pub metrics_hold: f64,
}

/// Power-of-two ranges of block size, batch size and threads (tebench's flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sweep {
    pub block: (u64, u64),
    pub batch: (usize, usize),
    pub threads: (usize, usize),
}

/// `lo, 2·lo, 4·lo, …` up to `hi`.
pub fn powers(lo: u64, hi: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut v = lo.max(1);
    while v <= hi {
        out.push(v);
        match v.checked_mul(2) {
            Some(next) => v = next,
            None => break,
        }
    }
    out
}

const BOOLS: [&str; 6] = [
    "verify",
    "json",
    "loopback",
    "auto_discovery",
    "use_vram",
    "init_mem",
];
/// Mooncake flags accepted for compatibility; they select hardware te-bench does not drive yet.
const IGNORED: [&str; 1] = ["init_mem"];

pub const USAGE: &str =
    "usage: te-bench [--mode=initiator|target|topology|engine|swarm] [--loopback] [--metadata_server=P2PHANDSHAKE]
  [--local_server_name=HOST:PORT] [--segment_id=HOST:PORT] [--operation=read|write] [--protocol=tcp|rdma|shm|cxl|uring|bufio]
  [--block_size=65536] [--block_stride=0 (block_size: a batch is contiguous)] [--batch_size=128] [--inflight=1 (batches outstanding per thread)] [--buffer_size=1073741824] [--duration=10] [--threads=12]
  [--report_unit=GB] [--report_precision=2] [--verify] [--json] [--metrics_port=N [--metrics_host=127.0.0.1] [--metrics_hold=0]]
  [--device_name=eth0,eth1] [--nic_priority_matrix=FILE] [--auto_discovery] [--file_path=te-bench.dat]
  [--use_vram --gpu_id=0] (buffers in GPU memory: tcp stages them, rdma registers them by dma-buf, nvlink copies them)
  [--backend=classic|tent] [--start_block_size=N --max_block_size=N] [--start_batch_size=N --max_batch_size=N]
  [--start_num_threads=N --max_num_threads=N] (tent: power-of-two sweeps, one row per case)
  [--peers=1 --lanes=4 --depth=2 --slots=0 --hold=0] (swarm: that many peers' connections at --segment_id, te's or a Mooncake
  target's framing, in --threads event loops, writing --block_size blocks; --verify reads every block back;
  --slots bounds the blocks written (lanes share them); --hold keeps the connections open and idle that many seconds after)
protocols: tcp (any host), rdma (verbs devices, --device_name=mlx5_0,mlx5_1), nvlink (GPU memory, --use_vram; same host, or the
  NVLink domain with MC_FORCE_MNNVL), shm (same host), cxl (a DAX device, MC_CXL_DEV_PATH; a stand-in file
  is made for --loopback without it), uring and bufio (a file segment at --file_path; no target)";

fn number<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("--{name}: {v:?} is not a valid number"))
}

impl Flags {
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Flags, String> {
        let mut values: HashMap<String, String> = HashMap::new();
        let mut args = args.into_iter().peekable();
        while let Some(arg) = args.next() {
            let body = arg
                .strip_prefix("--")
                .or_else(|| arg.strip_prefix('-'))
                .ok_or_else(|| format!("unexpected argument {arg:?}\n{USAGE}"))?;
            let (name, value) = match body.split_once('=') {
                Some((n, v)) => (n.to_string(), v.to_string()),
                None if BOOLS.contains(&body) => (body.to_string(), "true".to_string()),
                None if body.starts_with("no") && BOOLS.contains(&&body[2..]) => {
                    (body[2..].to_string(), "false".to_string())
                }
                None => {
                    let v = args
                        .next()
                        .ok_or_else(|| format!("--{body} needs a value"))?;
                    (body.to_string(), v)
                }
            };
            values.insert(name, value);
        }
        let mut take =
            |name: &str, default: &str| values.remove(name).unwrap_or_else(|| default.to_string());
        let bool_of = |name: &str, v: String| match v.as_str() {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" => Ok(false),
            _ => Err(format!("--{name}: expected true or false, got {v:?}")),
        };
        let mut flags = Flags {
            mode: take("mode", "initiator"),
            metadata_server: take("metadata_server", "P2PHANDSHAKE"),
            local_server_name: take("local_server_name", ""),
            segment_id: take("segment_id", ""),
            operation: take("operation", "read"),
            protocol: take("protocol", "tcp"),
            block_size: number("block_size", &take("block_size", "65536"))?,
            block_stride: number("block_stride", &take("block_stride", "0"))?,
            batch_size: number("batch_size", &take("batch_size", "128"))?,
            inflight: number("inflight", &take("inflight", "1"))?,
            buffer_size: number("buffer_size", &take("buffer_size", "1073741824"))?,
            duration: number("duration", &take("duration", "10"))?,
            threads: number("threads", &take("threads", "12"))?,
            report_unit: take("report_unit", "GB"),
            report_precision: number("report_precision", &take("report_precision", "2"))?,
            verify: bool_of("verify", take("verify", "false"))?,
            json: bool_of("json", take("json", "false"))?,
            loopback: bool_of("loopback", take("loopback", "false"))?,
            device_name: take("device_name", ""),
            nic_priority_matrix: take("nic_priority_matrix", ""),
            auto_discovery: bool_of("auto_discovery", take("auto_discovery", "true"))?,
            file_path: take("file_path", "te-bench.dat"),
            backend: String::new(),
            use_vram: bool_of("use_vram", take("use_vram", "false"))?,
            gpu_id: 0,
            sweep: Sweep {
                block: (0, 0),
                batch: (0, 0),
                threads: (0, 0),
            },
            peers: number("peers", &take("peers", "1"))?,
            lanes: number("lanes", &take("lanes", "0"))?,
            depth: number("depth", &take("depth", "2"))?,
            hold: number("hold", &take("hold", "0"))?,
            slots: number("slots", &take("slots", "0"))?,
            metrics: None,
            metrics_hold: number("metrics_hold", &take("metrics_hold", "0"))?,
        };
        let metrics_host = take("metrics_host", "127.0.0.1");
        let metrics_port = take("metrics_port", "");
        if !metrics_port.is_empty() {
            let port = metrics_port;
            let port: u16 = number("metrics_port", &port)?;
            let host: std::net::IpAddr = metrics_host
                .parse()
                .map_err(|_| format!("--metrics_host={metrics_host}: not an IP address"))?;
            flags.metrics = Some(std::net::SocketAddr::new(host, port));
        }
        let backend = take("backend", "classic");
        if backend != "classic" && backend != "tent" {
            return Err(format!("--backend={backend}: expected classic or tent"));
        }
        let gpu_id = take("gpu_id", "0");
        flags.gpu_id = gpu_id.parse().map_err(|_| {
            format!("--gpu_id={gpu_id}: expected a device ordinal (te-bench drives one GPU per run; -1, all GPUs, is not supported)")
        })?;
        for name in IGNORED {
            if let Some(v) = values.remove(name) {
                tracing::warn!("--{name}={v} is accepted for compatibility and ignored");
            }
        }
        let mut range = |name: &str, single: u64| -> Result<(u64, u64), String> {
            let lo = match values.remove(&format!("start_{name}")) {
                Some(v) => number(&format!("start_{name}"), &v)?,
                None => single,
            };
            let hi = match values.remove(&format!("max_{name}")) {
                Some(v) => number(&format!("max_{name}"), &v)?,
                None => lo.max(single),
            };
            match lo > 0 && lo <= hi {
                true => Ok((lo, hi)),
                false => Err(format!(
                    "--start_{name}={lo} must be positive and <= --max_{name}={hi}"
                )),
            }
        };
        let block = range("block_size", flags.block_size)?;
        let batch = range("batch_size", flags.batch_size as u64)?;
        let threads = range("num_threads", flags.threads as u64)?;
        flags.backend = backend;
        flags.sweep = Sweep {
            block,
            batch: (batch.0 as usize, batch.1 as usize),
            threads: (threads.0 as usize, threads.1 as usize),
        };
        if flags.sweep.block.0 != flags.block_size
            || flags.sweep.batch.0 != flags.batch_size
            || flags.sweep.threads.0 != flags.threads
        {
            // The sweep's start is the run's first case.
            flags.block_size = flags.sweep.block.0;
            flags.batch_size = flags.sweep.batch.0;
            flags.threads = flags.sweep.threads.0;
        }
        if let Some(unknown) = values.keys().next() {
            return Err(format!("unknown flag --{unknown}\n{USAGE}"));
        }
        flags.check()?;
        Ok(flags)
    }

    fn check(&self) -> Result<(), String> {
        if !matches!(
            self.mode.as_str(),
            "initiator" | "target" | "topology" | "engine" | "memcpy" | "swarm"
        ) {
            return Err(format!(
                "--mode={}: expected initiator, target, topology, engine, memcpy or swarm",
                self.mode
            ));
        }
        if !matches!(self.operation.as_str(), "read" | "write") {
            return Err(format!(
                "--operation={}: expected read or write",
                self.operation
            ));
        }
        if !matches!(
            self.protocol.as_str(),
            "tcp" | "shm" | "cxl" | "uring" | "bufio" | "rdma" | "nvlink"
        ) {
            return Err(format!(
                "--protocol={}: not available in this build (tcp, rdma, nvlink, shm, cxl, uring or bufio)",
                self.protocol
            ));
        }
        if self.use_vram && !matches!(self.protocol.as_str(), "tcp" | "rdma" | "nvlink") {
            return Err(format!(
                "--use_vram: --protocol={} moves host memory only (GPU memory: tcp, rdma or nvlink)",
                self.protocol
            ));
        }
        if self.protocol == "nvlink" && !self.use_vram {
            return Err("--protocol=nvlink moves GPU memory: add --use_vram".into());
        }
        if self.use_vram && self.backend == "tent" {
            return Err(
                "--use_vram: the tent bench moves host memory only; use --backend=classic".into(),
            );
        }
        if self.is_file() && self.mode == "target" {
            return Err(format!(
                "--protocol={}: a file segment needs no target; run the initiator",
                self.protocol
            ));
        }
        if !(0.0..=3600.0).contains(&self.hold) {
            return Err("--hold: seconds between 0 and 3600".into());
        }
        if self.peers == 0 || self.depth == 0 || self.peers > 1 << 20 || self.depth > 1024 {
            return Err("--peers (up to 1048576) and --depth (up to 1024) must be positive".into());
        }
        if self.inflight == 0 || self.inflight > 64 {
            return Err("--inflight: batches outstanding per thread, 1 to 64".into());
        }
        if self.block_size == 0 || self.batch_size == 0 || self.threads == 0 {
            return Err("--block_size, --batch_size and --threads must be positive".into());
        }
        let largest = self.block_size.max(self.sweep.block.1);
        if self.block_stride != 0 && self.block_stride < largest {
            return Err(format!(
                "--block_stride={} is below the block size {largest}: blocks would overlap",
                self.block_stride
            ));
        }
        if !(self.duration > 0.0 && self.duration.is_finite()) {
            return Err("--duration must be a positive number of seconds".into());
        }
        if crate::report::unit_scale(&self.report_unit).is_none() {
            return Err(format!(
                "--report_unit={}: expected GB, GiB, Gb, MB, MiB, Mb, KB, KiB or Kb",
                self.report_unit
            ));
        }
        if self.mode == "initiator"
            && !self.loopback
            && !self.is_file()
            && self.segment_id.is_empty()
        {
            return Err(
                "--segment_id=HOST:PORT (printed by the target) is required, or use --loopback"
                    .into(),
            );
        }
        Ok(())
    }

    /// Whether the target is a file segment (`uring`, `bufio`).
    pub fn is_file(&self) -> bool {
        matches!(self.protocol.as_str(), "uring" | "bufio")
    }

    /// The GPU the run's buffers live on, for `--use_vram`.
    pub fn gpu(&self) -> Option<u32> {
        self.use_vram.then_some(self.gpu_id)
    }

    /// `--device_name`'s names, trimmed, empty ones dropped.
    pub fn devices(&self) -> Vec<String> {
        self.device_name
            .split(',')
            .map(|d| d.trim().to_string())
            .filter(|d| !d.is_empty())
            .collect()
    }

    /// Bytes each side needs: at least one full round of every thread's batch (the largest
    /// case of a sweep).
    pub fn working_set(&self) -> u64 {
        let block = self.block_size.max(self.sweep.block.1);
        let batch = self.batch_size.max(self.sweep.batch.1) as u64;
        let threads = self.threads.max(self.sweep.threads.1) as u64;
        self.stride(block) * batch * threads
    }

    /// Distance between block starts for blocks of `block` bytes.
    pub fn stride(&self, block: u64) -> u64 {
        match self.block_stride {
            0 => block,
            s => s,
        }
    }

    /// Where block `i` of thread `tid` starts (in both buffers), for a case of `threads`
    /// threads with blocks of `block` bytes: Mooncake's layout, blocks of all threads
    /// interleaved, spaced by the stride.
    pub fn block_offset(&self, block: u64, i: usize, tid: usize, threads: usize) -> u64 {
        self.stride(block) * (i * threads + tid) as u64
    }

    /// The byte ranges a case's blocks cover (one range when there are no gaps), for
    /// verification.
    pub fn covered(&self, block: u64, batch: usize, threads: usize) -> Vec<(u64, u64)> {
        let n = batch * threads;
        match self.stride(block) == block {
            true => vec![(0, block * n as u64)],
            false => (0..n)
                .map(|k| (self.stride(block) * k as u64, block))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Flags, String> {
        Flags::parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn mooncake_flags_parse() {
        let f = parse(&[
            "--mode=initiator",
            "--metadata_server=P2PHANDSHAKE",
            "--segment_id",
            "127.0.0.1:15000",
            "--operation=write",
            "--protocol=tcp",
            "--block_size=1048576",
            "--batch_size=64",
            "--duration=3",
            "--threads=1",
            "--report_unit=GiB",
            "--verify",
            "--nojson",
            "--device_name=eth0,eth1",
            "--nic_priority_matrix=/tmp/m.json",
        ])
        .unwrap();
        assert_eq!(f.segment_id, "127.0.0.1:15000");
        assert_eq!((f.block_size, f.batch_size, f.threads), (1 << 20, 64, 1));
        assert!(f.verify && !f.json && f.auto_discovery);
        assert_eq!(
            (f.device_name.as_str(), f.nic_priority_matrix.as_str()),
            ("eth0,eth1", "/tmp/m.json")
        );
        assert_eq!(f.working_set(), 64 << 20);
        assert_eq!(f.gpu(), None);
        let f = parse(&[
            "--loopback",
            "--use_vram",
            "--gpu_id=1",
            "--protocol=nvlink",
        ])
        .unwrap();
        assert_eq!(f.gpu(), Some(1));
        let f = parse(&["--protocol=uring", "--file_path=/tmp/x"]).unwrap();
        assert!(f.is_file() && f.segment_id.is_empty());
        let f = parse(&[
            "--loopback",
            "--backend=tent",
            "--start_block_size=4096",
            "--max_block_size=65536",
            "--max_num_threads=4",
            "--threads=1",
            "--batch_size=8",
        ])
        .unwrap();
        assert_eq!(f.backend, "tent");
        assert_eq!(
            powers(f.sweep.block.0, f.sweep.block.1),
            [4096, 8192, 16384, 32768, 65536]
        );
        assert_eq!((f.sweep.batch, f.sweep.threads), ((8, 8), (1, 4)));
        assert_eq!((f.block_size, f.threads), (4096, 1));
        assert_eq!(f.working_set(), 65536 * 8 * 4);
    }

    #[test]
    fn bad_flags_are_explained() {
        for (args, needle) in [
            (&["--segment_id=x", "--block_size=abc"][..], "block_size"),
            (&["--segment_id=x", "--operation=copy"], "operation"),
            (&["--segment_id=x", "--protocol=gpudirect"], "protocol"),
            (&["--mode=target", "--protocol=uring"], "needs no target"),
            (&["--segment_id=x", "--frobnicate=1"], "unknown flag"),
            (&["--mode=initiator"], "segment_id"),
            (&["--segment_id=x", "--report_unit=parsecs"], "report_unit"),
            (&["--segment_id=x", "--threads=0"], "positive"),
            (
                &["--segment_id=x", "--use_vram", "--protocol=shm"],
                "host memory only",
            ),
            (&["--segment_id=x", "--protocol=nvlink"], "add --use_vram"),
            (
                &["--segment_id=x", "--use_vram", "--gpu_id=-1"],
                "one GPU per run",
            ),
            (&["--loopback", "--use_vram", "--backend=tent"], "classic"),
            (&["--segment_id=x", "--backend=nccl"], "backend"),
            (
                &[
                    "--segment_id=x",
                    "--start_block_size=8192",
                    "--max_block_size=4096",
                ],
                "max_block_size",
            ),
        ] {
            let err = parse(args).unwrap_err();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }
}
