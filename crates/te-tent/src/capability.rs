//! The capability matrix: which (source kind → target kind) moves a transport can make, and
//! over which scope, derived from the [`Capabilities`] each transport declares. Pure data: no
//! transport is called here.

use te_core::transport::Capabilities;

/// Where bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryKind {
    /// Host memory.
    Dram,
    /// GPU memory (a `cuda:N` location).
    Gpu,
    /// A file segment.
    File,
}

impl MemoryKind {
    /// The kind of a buffer location (`cpu:0`, `cuda:1`, `*`).
    pub fn of_location(location: &str) -> MemoryKind {
        match location.starts_with("cuda") || location.starts_with("gpu") {
            true => MemoryKind::Gpu,
            false => MemoryKind::Dram,
        }
    }

    /// TENT's name (`cpu`, `cuda`, `file`), as policies match it.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Dram => "cpu",
            MemoryKind::Gpu => "cuda",
            MemoryKind::File => "file",
        }
    }
}

/// How far apart the two sides are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Both in this process (a local segment or a file).
    SameProcess,
    /// Another process on this host.
    SameHost,
    /// Another host.
    CrossHost,
}

/// One move a transport can make: local `from` to (or from) remote `to`, over `scope`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Move {
    /// The kind of the local buffer.
    pub from: MemoryKind,
    /// The kind of the target buffer.
    pub to: MemoryKind,
    /// How far the target is.
    pub scope: Scope,
}

impl Move {
    /// A move between `from` and `to` over `scope`.
    pub fn new(from: MemoryKind, to: MemoryKind, scope: Scope) -> Self {
        Move { from, to, scope }
    }
}

/// Every move `caps` allows. A transport that reaches other hosts also serves nearer scopes
/// (TCP works within a host too); a same-host transport serves this process as well.
pub fn moves(caps: Capabilities) -> Vec<Move> {
    use MemoryKind::{Dram, File, Gpu};
    use Scope::{CrossHost, SameHost, SameProcess};
    let mut out = Vec::new();
    let mut add = |from, to, scopes: &[Scope]| {
        for &scope in scopes {
            out.push(Move { from, to, scope });
        }
    };
    let all = [SameProcess, SameHost, CrossHost];
    let near = [SameProcess, SameHost];
    if caps.contains(Capabilities::DRAM_REMOTE_HOST) {
        add(Dram, Dram, &all);
    }
    if caps.contains(Capabilities::DRAM_SAME_HOST) || caps.contains(Capabilities::DRAM_CXL) {
        add(Dram, Dram, &near);
    }
    if caps.contains(Capabilities::DRAM_FILE) {
        add(Dram, File, &[SameProcess]);
    }
    if caps.contains(Capabilities::GPU_REMOTE_HOST) {
        add(Gpu, Gpu, &all);
        add(Gpu, Dram, &all);
        add(Dram, Gpu, &all);
    }
    if caps.contains(Capabilities::GPU_SAME_HOST) {
        add(Gpu, Gpu, &near);
        add(Gpu, Dram, &near);
        add(Dram, Gpu, &near);
    }
    if caps.contains(Capabilities::GPU_FILE) {
        add(Gpu, File, &[SameProcess]);
    }
    if caps.contains(Capabilities::GPU_LOCAL) {
        add(Gpu, Dram, &[SameProcess]);
        add(Dram, Gpu, &[SameProcess]);
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether `caps` allows `m`.
pub fn can(caps: Capabilities, m: Move) -> bool {
    moves(caps).contains(&m)
}

/// The capability matrix of installed transports: (name, moves), in install order.
pub fn matrix(transports: &[(&'static str, Capabilities)]) -> Vec<(&'static str, Vec<Move>)> {
    transports.iter().map(|(n, c)| (*n, moves(*c))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use MemoryKind::{Dram, File, Gpu};
    use Scope::{CrossHost, SameHost, SameProcess};

    #[test]
    fn each_transport_kind_declares_its_moves() {
        let tcp = Capabilities::DRAM_REMOTE_HOST | Capabilities::DRAM_SAME_HOST;
        assert!(can(tcp, Move::new(Dram, Dram, CrossHost)));
        assert!(can(tcp, Move::new(Dram, Dram, SameProcess)));
        assert!(!can(tcp, Move::new(Gpu, Dram, CrossHost)));
        assert!(!can(tcp, Move::new(Dram, File, SameProcess)));
        let shm = Capabilities::DRAM_SAME_HOST;
        assert!(can(shm, Move::new(Dram, Dram, SameHost)));
        assert!(!can(shm, Move::new(Dram, Dram, CrossHost)));
        let uring = Capabilities::DRAM_FILE;
        assert_eq!(moves(uring), vec![Move::new(Dram, File, SameProcess)]);
        let gdr = Capabilities::GPU_REMOTE_HOST;
        assert!(can(gdr, Move::new(Gpu, Dram, CrossHost)));
        let copy = Capabilities::GPU_LOCAL;
        assert!(can(copy, Move::new(Gpu, Dram, SameProcess)));
        assert!(!can(copy, Move::new(Gpu, Dram, SameHost)));
        assert_eq!(MemoryKind::of_location("cuda:3"), Gpu);
        assert_eq!(MemoryKind::of_location("cpu:0"), Dram);
        assert_eq!(MemoryKind::of_location("*"), Dram);
        let m = matrix(&[("tcp", tcp), ("uring", uring)]);
        assert_eq!(m[1], ("uring", vec![Move::new(Dram, File, SameProcess)]));
    }
}
