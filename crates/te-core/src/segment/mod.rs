//! Segment descriptors in Mooncake's JSON shape, the segment secret, and opened remote segments.
//!
//! A [`SegmentDesc`] is what a process publishes about its memory: Mooncake's fields (`name`,
//! `protocol`, `tcp_data_port`, `buffers[{name, addr, length}]`) plus te's own (`permission` per
//! buffer, `te_secret`). Local-only regions are never published.
//! A [`RemoteSegment`] is a validated descriptor of a peer, opened by name and cached by id;
//! [`RemoteSegment::check_access`] is the initiator-side bounds and permission check.
//! Fetching descriptors is the metadata module's job, not this one's.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::memory::{Permission, Region};

mod origin;
mod remote;
mod signed;

pub use origin::Origin;
pub use remote::{RemoteSegment, SegmentCache};
pub use signed::Received;

/// Segment id of a remote segment opened by this engine (Mooncake's `SegmentHandle`).
pub type SegmentId = u64;

/// Buffers a descriptor may list before it is refused as malformed.
pub const MAX_BUFFERS: usize = 1 << 20;

/// A per-segment random secret. Every remote data request must prove it (`prove`); te's own
/// requests never carry it.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentSecret([u8; 16]);

impl fmt::Debug for SegmentSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SegmentSecret(..)")
    }
}

impl SegmentSecret {
    /// 16 bytes from the kernel's random source.
    ///
    /// # Errors
    /// [`Error::Transport`] if `/dev/urandom` cannot be read.
    pub fn random() -> Result<Self> {
        Ok(SegmentSecret(te_sys::random_bytes()?))
    }

    /// Wraps raw bytes (as read from the wire).
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        SegmentSecret(bytes)
    }

    /// The raw bytes (to put on the wire).
    pub fn to_bytes(self) -> [u8; 16] {
        self.0
    }

    /// A proof of holding this secret for `context` (a connection's nonce, a handshake's
    /// fields): the first 16 bytes of HMAC-SHA256 keyed by the secret over the context's parts
    /// (each length-prefixed). It tells nothing of the secret, and fits no other context.
    pub fn prove(&self, context: &[&[u8]]) -> [u8; 16] {
        use hmac::Mac;
        let tag = te_reactor::secret::keyed_mac(&self.0, context)
            .finalize()
            .into_bytes();
        let mut out = [0u8; 16];
        out.copy_from_slice(&tag[..16]);
        out
    }

    /// Compares in time independent of where the inputs differ.
    pub fn matches(&self, other: &[u8; 16]) -> bool {
        te_reactor::secret::same_bytes(&self.0, other)
    }

    fn to_hex(self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 32 || !s.is_ascii() {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(SegmentSecret(out))
    }
}

/// One published buffer (Mooncake's `BufferDesc` plus te's `permission`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferDesc {
    /// Location, Mooncake's field name (`cpu:0`).
    pub name: String,
    /// Start address in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// te: `remote_read` or `remote_read_write`. Absent (a Mooncake peer) means read-write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission: Option<String>,
    /// Shared-memory file a peer on the same host may map instead of using the network
    /// (Mooncake's field name for IPC handles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_name: Option<String>,
    /// te: offset of the buffer on the CXL device named by the segment's `te_cxl_device`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cxl_offset: Option<u64>,
    /// RDMA remote keys, one per device in the segment's `devices` (Mooncake's field). A
    /// buffer registered in pieces (`te_mr_chunk`) lists every piece's keys, piece after piece:
    /// key `piece * devices + device`, so the first piece's keys sit where Mooncake looks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rkey: Vec<u32>,
    /// te: the buffer is registered as memory regions of this many bytes each from `addr`
    /// (the last may be shorter), split at `MC_MAX_MR_SIZE`; absent means one region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub te_mr_chunk: Option<u64>,
    /// RDMA local keys, one per device (Mooncake's field; informational for peers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lkey: Vec<u32>,
}

/// One RDMA device a segment serves on (Mooncake's `devices[]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceDesc {
    /// Verbs device name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// Port LID (0 on RoCE).
    #[serde(default)]
    pub lid: u16,
    /// GID in colon-separated hex (`fe80:0000:…`).
    pub gid: String,
    /// te: the network interface under the device (RoCE), so rails named by interface map to
    /// devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub te_netdev: Option<String>,
}

/// One rail a segment serves on (te): a NIC name and the address its transport listens on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RailAddr {
    /// NIC name, as in the priority matrix (`eth0`).
    pub name: String,
    /// Address on that NIC.
    pub ip: String,
    /// Port the transport listens on there.
    pub port: u16,
}

/// Rails a descriptor may list before it is refused as malformed.
pub const MAX_RAILS: usize = 1024;

/// A segment descriptor in Mooncake's JSON shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SegmentDesc {
    /// Segment name (P2P: `host:port` of the control listener).
    pub name: String,
    /// Transport protocol the segment is served by (`tcp`). Mooncake's multi-protocol builds
    /// publish an array (`["rdma","tcp"]`): its first entry lands here and every entry in
    /// [`SegmentDesc::protocols`].
    #[serde(deserialize_with = "protocol_string_or_list")]
    pub protocol: String,
    /// Every protocol of a descriptor that published `protocol` as an array, in its order;
    /// empty when it was a string. Never published.
    #[serde(skip)]
    pub protocols: Vec<String>,
    /// Mooncake's TCP data port: where a Mooncake initiator sends its framing. te publishes
    /// one only for its Mooncake-compatible listener (`MC_TE_MOONCAKE_COMPAT`); te's own
    /// listeners are in `te_rails`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_data_port: Option<u16>,
    /// Mooncake's host for `tcp_data_port` (absent: the host of the segment name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_data_host: Option<String>,
    /// Mooncake's TCP framing version at `tcp_data_port`: 2 acknowledges WRITEs, absent or 1
    /// does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_proto_version: Option<u32>,
    /// Publication time, informational.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<serde_json::Value>,
    /// Remotely accessible buffers.
    #[serde(default)]
    pub buffers: Vec<BufferDesc>,
    /// RDMA devices, in the order of each buffer's `rkey` (Mooncake's field).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceDesc>,
    /// For each buffer location, the preferred and other usable NICs (Mooncake's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_matrix: Option<te_topology::PriorityMatrix>,
    /// te: the rails the segment serves on, with their addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub te_rails: Vec<RailAddr>,
    /// te: the segment secret, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub te_secret: Option<String>,
    /// te: the segment secret sealed with the cluster key (`nonce:sealed:tag`, hex), in place of
    /// `te_secret` when a cluster secret is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub te_secret_sealed: Option<String>,
    /// te: version of te's data wire format (2: requests carry a per-connection proof of the
    /// segment secret, never the secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub te_wire_version: Option<u32>,
    /// te: identifies the host and shared-memory mount (same value = same host, same `/dev/shm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub te_host_id: Option<String>,
    /// te: the owning process, `pid:start-time`, so a peer on the same host can tell it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub te_owner: Option<String>,
    /// te: the identity of the CXL device the segment's `cxl_offset`s refer to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub te_cxl_device: Option<String>,
    /// te: for a file segment (protocol [`FILE_PROTOCOL`]), the file's path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub te_file: Option<String>,
    /// te: under a cluster secret, an HMAC with the cluster key of the whole descriptor
    /// (every other field, its name included), hex ([`crate::control::auth::sign`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub te_signature: Option<String>,
    /// What a received descriptor's signature covers: its JSON as received, in canonical form,
    /// and the name it was published under. Never published.
    #[serde(skip)]
    pub received: Option<Arc<Received>>,
    /// What proves who owns this received descriptor: what it names on this host is used only
    /// when its owner is proven. Never published.
    #[serde(skip)]
    pub origin: Origin,
}

/// Protocols a descriptor's `protocol` array may list before it is refused.
const MAX_PROTOCOLS: usize = 16;

/// Reads `protocol` as Mooncake writes it: a string, or (multi-protocol builds) an array of
/// strings whose first entry is taken; the whole list is kept by `SegmentDesc::from_json`.
fn protocol_string_or_list<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<String, D::Error> {
    use serde::de::Error as _;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => Ok(s),
        serde_json::Value::Array(list) => match list.first() {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            _ => Err(D::Error::custom(
                "protocol must be a string or a non-empty array of strings",
            )),
        },
        _ => Err(D::Error::custom(
            "protocol must be a string or an array of strings",
        )),
    }
}

/// The protocol of a file segment: its one buffer is the file, addressed by file offset.
pub const FILE_PROTOCOL: &str = "file";

impl SegmentDesc {
    /// The descriptor of a local segment: remotely accessible regions only.
    pub fn local(
        name: &str,
        protocol: &str,
        secret: SegmentSecret,
        regions: &[Arc<Region>],
    ) -> Self {
        let buffers = regions
            .iter()
            .filter(|r| r.permission() != Permission::LocalOnly)
            .map(|r| BufferDesc {
                name: r.location().to_string(),
                addr: r.addr(),
                length: r.len(),
                permission: Some(r.permission().as_str().to_string()),
                shm_name: None,
                cxl_offset: None,
                rkey: Vec::new(),
                te_mr_chunk: None,
                lkey: Vec::new(),
            })
            .collect();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        SegmentDesc {
            name: name.to_string(),
            protocol: protocol.to_string(),
            protocols: Vec::new(),
            tcp_data_port: None,
            tcp_data_host: None,
            tcp_proto_version: None,
            timestamp: Some(serde_json::Value::from(now.to_string())),
            buffers,
            devices: Vec::new(),
            priority_matrix: None,
            te_rails: Vec::new(),
            te_secret: Some(secret.to_hex()),
            te_secret_sealed: None,
            te_wire_version: Some(2),
            te_host_id: Some(host_id().to_string()),
            te_owner: process_identity(std::process::id()),
            te_cxl_device: None,
            te_file: None,
            te_signature: None,
            received: None,
            origin: Origin::Unproven,
        }
    }

    /// The descriptor of a file segment: one buffer, the file's bytes `[0, length)` addressed by
    /// offset, readable, and writable when `permission` says so. Served by a transport with
    /// [`Capabilities::DRAM_FILE`](crate::transport::Capabilities::DRAM_FILE).
    pub fn file(name: &str, path: &str, length: u64, permission: Permission) -> Self {
        SegmentDesc {
            name: name.to_string(),
            protocol: FILE_PROTOCOL.to_string(),
            protocols: Vec::new(),
            tcp_data_port: None,
            tcp_data_host: None,
            tcp_proto_version: None,
            timestamp: None,
            buffers: vec![BufferDesc {
                name: FILE_PROTOCOL.to_string(),
                addr: 0,
                length,
                permission: Some(permission.as_str().to_string()),
                shm_name: None,
                cxl_offset: None,
                rkey: Vec::new(),
                te_mr_chunk: None,
                lkey: Vec::new(),
            }],
            devices: Vec::new(),
            priority_matrix: None,
            te_rails: Vec::new(),
            te_secret: None,
            te_secret_sealed: None,
            te_wire_version: None,
            te_host_id: Some(host_id().to_string()),
            te_owner: None,
            te_cxl_device: None,
            te_file: Some(path.to_string()),
            te_signature: None,
            received: None,
            origin: Origin::Unproven,
        }
    }

    /// Whether this is a file segment.
    pub fn is_file(&self) -> bool {
        self.protocol == FILE_PROTOCOL
    }

    /// Whether a Mooncake engine published this: a peer segment without te's wire version,
    /// spoken to in Mooncake's protocols, without a segment secret.
    pub fn is_mooncake(&self) -> bool {
        self.te_wire_version.is_none() && !self.is_file()
    }

    /// Serialises to Mooncake's compact JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }

    /// Parses and validates a descriptor received from a peer or a metadata store.
    ///
    /// # Errors
    /// [`Error::MalformedMessage`] for bad JSON, an empty name, too many buffers, a zero-length,
    /// overflowing or overlapping buffer, an unknown permission, a bad secret, or a file
    /// segment (those are local only).
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let malformed =
            |e: serde_json::Error| Error::MalformedMessage(format!("segment descriptor: {e}"));
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(malformed)?;
        let received = Received::of(&value);
        let protocols = match value.get("protocol") {
            Some(serde_json::Value::Array(list)) => {
                if list.len() > MAX_PROTOCOLS || list.iter().any(|p| !p.is_string()) {
                    return Err(Error::MalformedMessage(format!(
                        "segment descriptor: protocol array must hold 1..={MAX_PROTOCOLS} strings"
                    )));
                }
                list.iter()
                    .filter_map(|p| p.as_str().map(str::to_string))
                    .collect()
            }
            _ => Vec::new(),
        };
        let mut desc: SegmentDesc = serde_json::from_value(value).map_err(malformed)?;
        desc.protocols = protocols;
        desc.received = received.map(Arc::new);
        desc.validate()?;
        Ok(desc)
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| {
            Err(Error::MalformedMessage(format!(
                "segment {:?}: {m}",
                self.name
            )))
        };
        if self.name.is_empty() || self.name.len() > 1024 {
            return bad("name must be 1..=1024 bytes".into());
        }
        if self.tcp_data_host.as_ref().is_some_and(|h| h.len() > 1024) {
            return bad("tcp_data_host over 1024 bytes".into());
        }
        // A file segment names a path on this host: only the engine itself makes one
        // (`open_file_segment`); a peer's descriptor must never steer local file I/O.
        if self.is_file() || self.te_file.is_some() {
            return bad("file segments are opened locally, never received".into());
        }
        if self.buffers.len() > MAX_BUFFERS {
            return bad(format!(
                "{} buffers (max {MAX_BUFFERS})",
                self.buffers.len()
            ));
        }
        let mut spans: Vec<(u64, u64)> = Vec::with_capacity(self.buffers.len());
        for b in &self.buffers {
            if b.length == 0 || b.addr.checked_add(b.length).is_none() {
                return bad(format!(
                    "buffer {:#x}+{} is empty or overflows",
                    b.addr, b.length
                ));
            }
            if let Some(p) = &b.permission {
                if Permission::parse(p).is_none() {
                    return bad(format!("unknown permission {p:?}"));
                }
            }
            spans.push((b.addr, b.addr + b.length));
        }
        spans.sort_unstable();
        if spans.windows(2).any(|w| w[0].1 > w[1].0) {
            return bad("overlapping buffers".into());
        }
        if self.te_rails.len() > MAX_RAILS
            || self
                .te_rails
                .iter()
                .any(|r| r.name.is_empty() || r.port == 0)
        {
            return bad("te_rails: too many, or a rail without name or port".into());
        }
        if self.devices.len() > MAX_RAILS
            || self
                .devices
                .iter()
                .any(|d| d.name.is_empty() || d.gid.len() > 64)
        {
            return bad("devices: too many, or a device without a name".into());
        }
        for b in &self.buffers {
            let pieces = match b.te_mr_chunk {
                None => 1,
                Some(0) => return bad("te_mr_chunk of 0".into()),
                Some(c) => b.length.div_ceil(c),
            };
            let keys = pieces.checked_mul(self.devices.len() as u64);
            if !b.rkey.is_empty() && keys != Some(b.rkey.len() as u64) {
                return bad(format!(
                    "buffer {:#x}: {} rkeys for {} devices and {pieces} memory regions",
                    b.addr,
                    b.rkey.len(),
                    self.devices.len()
                ));
            }
        }
        if let Some(s) = &self.te_secret {
            if SegmentSecret::from_hex(s).is_none() {
                return bad("te_secret is not 32 hex digits".into());
            }
        }
        Ok(())
    }
}

/// This host's identity for same-host decisions: the kernel boot id and the device and inode
/// of `/dev/shm` (so containers with separate shared-memory mounts do not match).
pub fn host_id() -> &'static str {
    use std::os::unix::fs::MetadataExt;
    // Read once: `serves` asks on every submit, and neither value changes while we run.
    static HOST_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST_ID.get_or_init(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let shm = std::fs::metadata("/dev/shm")
            .map(|m| format!("{}:{}", m.dev(), m.ino()))
            .unwrap_or_default();
        format!("{}/{shm}", boot.trim())
    })
}

/// `pid:start-time` of a live process on this host (start time in clock ticks since boot, from
/// `/proc/<pid>/stat`), or `None` when there is no such process. A reused pid gets a new start
/// time, so the pair names one process.
pub fn process_identity(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may itself hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let start = rest.split_whitespace().nth(19)?;
    Some(format!("{pid}:{start}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Location;
    use crate::memory::Opcode;

    fn desc_json(buffers: &str) -> String {
        format!(r#"{{"name":"h:1","protocol":"tcp","tcp_data_port":9,"buffers":[{buffers}]}}"#)
    }

    #[test]
    fn a_received_file_segment_is_refused() {
        let file = SegmentDesc::file("f", "/etc/passwd", 10, Permission::RemoteReadWrite);
        let err = SegmentDesc::from_json(file.to_json().as_bytes()).unwrap_err();
        assert!(err.to_string().contains("opened locally"), "{err}");
        let sneaky = r#"{"name":"h:1","protocol":"tcp","te_file":"/etc/passwd","buffers":[]}"#;
        assert!(matches!(
            SegmentDesc::from_json(sneaky.as_bytes()),
            Err(Error::MalformedMessage(_))
        ));
    }

    #[test]
    fn local_descriptor_round_trips_and_hides_local_only_regions() {
        let secret = SegmentSecret::random().unwrap();
        let regions = vec![
            Arc::new(Region::new(
                0x1000,
                64,
                Location::Cpu(0),
                Permission::RemoteRead,
                None,
            )),
            Arc::new(Region::new(
                0x2000,
                64,
                Location::Cpu(0),
                Permission::LocalOnly,
                None,
            )),
        ];
        let mut d = SegmentDesc::local("127.0.0.1:1", "tcp", secret, &regions);
        d.tcp_data_port = Some(4000);
        let mut back = SegmentDesc::from_json(d.to_json().as_bytes()).unwrap();
        let received = back
            .received
            .take()
            .expect("kept as received, for its signature");
        assert_eq!(received.name, "127.0.0.1:1");
        assert_eq!(back, d);
        assert_eq!(back.buffers.len(), 1);
        let seg = RemoteSegment::new(1, "127.0.0.1".into(), 1, back);
        assert!(seg.secret().matches(&secret.to_bytes()));
    }

    #[test]
    fn mooncake_descriptors_parse_as_read_write() {
        let json = desc_json(r#"{"name":"cpu:0","addr":4096,"length":4096}"#);
        let d = SegmentDesc::from_json(json.as_bytes()).unwrap();
        let seg = RemoteSegment::new(1, "h".into(), 1, d);
        seg.check_access(4096, 4096, Opcode::Write).unwrap();
    }

    #[test]
    fn mooncake_tcp_fields_and_protocol_arrays_are_read() {
        // As Mooncake 0.3.13's TCP target publishes it (observed), trailing newline included.
        let observed = br#"{"buffers":[{"addr":140542174298112,"length":16777216,"name":"127.0.0.1:15900"}],"name":"127.0.0.1:15900","protocol":"tcp","rdma_server_name":"","tcp_data_host":"127.0.0.1","tcp_data_port":15903,"tcp_proto_version":2,"timestamp":"2026-11-30 19:12:40.627646"}
"#;
        let d = SegmentDesc::from_json(observed).unwrap();
        assert_eq!(
            (d.protocol.as_str(), d.tcp_data_host.as_deref()),
            ("tcp", Some("127.0.0.1"))
        );
        assert_eq!(
            (d.tcp_data_port, d.tcp_proto_version),
            (Some(15903), Some(2))
        );
        assert!(d.protocols.is_empty() && d.te_wire_version.is_none());
        // Multi-protocol builds publish an array: the first entry is the protocol, all are kept.
        let multi = br#"{"name":"h:1","protocol":["rdma","tcp"],"buffers":[]}"#;
        let d = SegmentDesc::from_json(multi).unwrap();
        assert_eq!(d.protocol, "rdma");
        assert_eq!(d.protocols, ["rdma", "tcp"]);
        assert!(!d.to_json().contains("protocols"), "never published");
        for bad in [
            r#"{"name":"h:1","protocol":[]}"#.to_string(),
            r#"{"name":"h:1","protocol":[1]}"#.to_string(),
            r#"{"name":"h:1","protocol":{"a":1}}"#.to_string(),
            format!(
                r#"{{"name":"h:1","protocol":[{}"tcp"]}}"#,
                r#""x","#.repeat(16)
            ),
            format!(
                r#"{{"name":"h:1","protocol":"tcp","tcp_data_host":"{}"}}"#,
                "h".repeat(1025)
            ),
        ] {
            assert!(
                matches!(
                    SegmentDesc::from_json(bad.as_bytes()),
                    Err(Error::MalformedMessage(_))
                ),
                "{bad}"
            );
        }
    }

    /// A segment with two RDMA devices and one 4 KiB buffer with `fields`.
    fn rdma_json(fields: &str) -> String {
        let dev = |n| format!(r#"{{"name":"rxe{n}","lid":0,"gid":"::","te_netdev":"eth{n}"}}"#);
        format!(
            r#"{{"name":"h:1","protocol":"rdma","devices":[{},{}],"buffers":[{{"name":"cpu:0","addr":4096,"length":4096,{fields}}}]}}"#,
            dev(0),
            dev(1)
        )
    }

    #[test]
    fn malformed_descriptors_are_refused() {
        let rdma_ok = [
            rdma_json(r#""rkey":[1,2]"#),
            rdma_json(r#""rkey":[1,2,3,4,5,6,7,8],"te_mr_chunk":1024"#),
            rdma_json(r#""rkey":[1,2,3,4],"te_mr_chunk":3000"#),
        ];
        let cases = [
            "not json".to_string(),
            r#"{"name":"","protocol":"tcp"}"#.to_string(),
            desc_json(r#"{"name":"cpu:0","addr":4096,"length":0}"#),
            desc_json(r#"{"name":"cpu:0","addr":18446744073709551615,"length":2}"#),
            desc_json(
                r#"{"name":"cpu:0","addr":4096,"length":4096},{"name":"cpu:0","addr":8000,"length":10}"#,
            ),
            desc_json(r#"{"name":"cpu:0","addr":4096,"length":1,"permission":"all"}"#),
            r#"{"name":"a","protocol":"tcp","te_secret":"xyz"}"#.to_string(),
            // RDMA keys: one per device, or one per device and memory region piece.
            rdma_json(r#""rkey":[1,2,3]"#),
            rdma_json(r#""rkey":[1,2],"te_mr_chunk":1024"#),
            rdma_json(r#""rkey":[1,2,3,4],"te_mr_chunk":0"#),
        ];
        for json in rdma_ok {
            SegmentDesc::from_json(json.as_bytes()).unwrap();
        }
        for json in cases {
            assert!(
                matches!(
                    SegmentDesc::from_json(json.as_bytes()),
                    Err(Error::MalformedMessage(_))
                ),
                "{json}"
            );
        }
    }

    #[test]
    fn initiator_side_access_check() {
        let json = desc_json(
            r#"{"name":"cpu:0","addr":4096,"length":4096,"permission":"remote_read"},
               {"name":"cpu:0","addr":16384,"length":4096,"permission":"remote_read_write"}"#,
        );
        let seg = RemoteSegment::new(
            1,
            "h".into(),
            1,
            SegmentDesc::from_json(json.as_bytes()).unwrap(),
        );
        seg.check_access(4096, 4096, Opcode::Read).unwrap();
        seg.check_access(16384 + 1, 4095, Opcode::Write).unwrap();
        assert!(matches!(
            seg.check_access(4096, 1, Opcode::Write),
            Err(Error::PermissionDenied { .. })
        ));
        for (addr, len) in [
            (4095, 2),
            (8191, 2),
            (12000, 1),
            (4096, 0),
            (u64::MAX, 1),
            (0, 1),
        ] {
            assert!(
                matches!(
                    seg.check_access(addr, len, Opcode::Read),
                    Err(Error::RemoteAddressNotRegistered { .. })
                ),
                "{addr}+{len}"
            );
        }
    }

    #[test]
    fn cache_keeps_ids_per_name() {
        let c = SegmentCache::default();
        let d = SegmentDesc::from_json(desc_json("").as_bytes()).unwrap();
        let a = c.insert("h".into(), 1, d.clone());
        let b = c.insert("h".into(), 1, d);
        assert_eq!(a.id(), b.id());
        assert_eq!(c.by_name("h:1").unwrap().id(), a.id());
        c.remove(a.id()).unwrap();
        assert!(c.by_id(a.id()).is_none() && c.by_name("h:1").is_none());
    }
}
