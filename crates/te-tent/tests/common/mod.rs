//! The rig te-tent's integration tests share: an engine over simulated transports.
#![allow(dead_code)] // not every test file uses all of it

use std::sync::Arc;

use te_core::transport::{Capabilities, SliceError};
use te_core::{HostBuffer, Opcode, Permission, SegmentId};
use te_tent::{MemoryOptions, Request, TentConfig, TentEngine, TentFile};
use te_testkit::SimTransport;

pub const KIB: u64 = 1024;

pub struct Rig {
    pub tent: TentEngine,
    pub a: Arc<SimTransport>,
    pub b: Arc<SimTransport>,
    pub local: Arc<HostBuffer>,
    pub target: Arc<HostBuffer>,
    pub seg: SegmentId,
}

/// An engine with two simulated transports, `sim-a` and `sim-b`, under `conf` (TENT JSON),
/// a local buffer and a target buffer in its own segment.
pub fn rig(conf: &str) -> Rig {
    rig_with(conf, |_| {})
}

/// As [`rig`], with `edit` applied to the configuration the file gives.
pub fn rig_with(conf: &str, edit: impl FnOnce(&mut TentConfig)) -> Rig {
    let file = TentFile::parse_source(conf).unwrap();
    let mut config = TentConfig::from_file(file, |name| {
        (name == "MC_TCP_BIND_ADDRESS").then(|| "127.0.0.1".to_string())
    })
    .unwrap();
    edit(&mut config);
    let tent = TentEngine::with_transports(config, false).unwrap();
    let a = Arc::new(SimTransport::named("sim-a", Capabilities::DRAM_REMOTE_HOST));
    let b = Arc::new(SimTransport::named("sim-b", Capabilities::DRAM_REMOTE_HOST));
    tent.install_transport(a.clone()).unwrap();
    tent.install_transport(b.clone()).unwrap();
    let local = Arc::new(HostBuffer::new(1 << 20).unwrap());
    let target = Arc::new(HostBuffer::new(1 << 20).unwrap());
    let private = MemoryOptions {
        permission: Permission::LocalOnly,
        ..MemoryOptions::default()
    };
    tent.register_memory(&local, &private).unwrap();
    tent.register_memory(&target, &MemoryOptions::default())
        .unwrap();
    let seg = tent.open_segment(tent.segment_name()).unwrap();
    Rig {
        tent,
        a,
        b,
        local,
        target,
        seg,
    }
}

impl Rig {
    /// A 4 KiB WRITE to target offset `slot` × 4 KiB (one slice).
    pub fn write(&self, slot: u64) -> Request {
        Request::new(
            Opcode::Write,
            self.local.addr() + slot * 4 * KIB,
            self.seg,
            self.target.addr() + slot * 4 * KIB,
            4 * KIB,
        )
    }

    /// Which slots `sim` holds slices of, in queue order.
    pub fn slots(&self, sim: &SimTransport) -> Vec<u64> {
        sim.inspect(|q| {
            q.iter()
                .map(|s| (s.remote_addr - self.target.addr()) / (4 * KIB))
                .collect()
        })
    }

    /// Completes every slice `sim` holds with `outcome`.
    pub fn finish_all(&self, sim: &SimTransport, outcome: Result<(), SliceError>) {
        while let Some(s) = sim.take(|_| 0) {
            sim.complete(s, outcome.clone());
        }
    }
}
