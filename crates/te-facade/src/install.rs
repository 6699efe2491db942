//! What each protocol installs: on the classic engine, te's TCP transport, or its RDMA one
//! where a device is up (TCP otherwise, as Mooncake falls back); on TENT, the transports its
//! configuration enables, which must include the protocol's. Anything else is an error naming
//! the protocol.

use std::sync::Arc;

use te_core::TransferEngine;
use te_core::transport::Transport;
use tracing::info;

use crate::error::{FacadeError, Result};
use crate::protocol::Protocol;

/// The device names in a comma-separated list (empty: none named, which means all).
#[cfg(any(feature = "rdma", feature = "tent"))]
pub(crate) fn device_list(devices: &str) -> Option<Vec<String>> {
    let named: Vec<String> = devices
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(String::from)
        .collect();
    (!named.is_empty()).then_some(named)
}

/// te's RDMA transport on the `devices` named (comma-separated; empty: all), with the
/// `MC_*` options.
#[cfg(feature = "rdma")]
pub(crate) fn rdma_transport(devices: &str) -> Result<te_rdma::RdmaTransport> {
    let mut options = te_rdma::RdmaOptions::from_env()?;
    if let Some(named) = device_list(devices) {
        options.devices = Some(named);
    }
    Ok(te_rdma::RdmaTransport::new(options))
}

/// Installs the classic engine's transports for `protocol`. A name selects one transport:
/// `rdma` te's RDMA transport where verbs devices are up and `MC_FORCE_TCP` is unset (TCP
/// otherwise, as Mooncake falls back); every other name its own transport, or an error naming
/// why it cannot start here. `auto` installs every transport this build has that can start on
/// this machine, the network one first (it is the protocol the descriptor publishes), with
/// cross-memory attach beside shared memory (for memory the application allocated), and the
/// engine then chooses per buffer ([`TransferEngine::submit`]'s rule: a transport that serves a
/// buffer better, such as shared memory on this host, else the network one).
///
/// # Errors
/// A transport this build lacks (its Cargo feature named) or that cannot start here.
pub(crate) fn install_classic(
    engine: &TransferEngine,
    protocol: Protocol,
    device_name: &str,
    settings: &crate::settings::FacadeSettings,
    source: &crate::managed::MemorySource,
) -> Result<()> {
    match protocol {
        Protocol::Rdma => {
            #[cfg(not(feature = "rdma"))]
            return Err(not_built(protocol, "rdma"));
            #[cfg(feature = "rdma")]
            return install_network(engine, device_name, settings, true).map(drop);
        }
        Protocol::Auto => {}
        _ => {
            let transport = classic_transport(engine, protocol, settings, source)?;
            return engine
                .install_transport(transport)
                .map_err(|e| cannot_start(protocol, e));
        }
    }
    let here = |name: &str| {
        engine
            .transport_capabilities()
            .iter()
            .any(|(n, _)| *n == name)
    };
    let mut installed = Vec::new();
    if !here("tcp") && !here("rdma") {
        installed.push(install_network(engine, device_name, settings, false)?);
    }
    for p in [
        Protocol::Shm,
        Protocol::IoUring,
        Protocol::Cxl,
        Protocol::Nvlink,
        Protocol::Gds,
    ] {
        if p.transports().iter().any(|n| here(n)) {
            continue;
        }
        let started = classic_transport(engine, p, settings, source)
            .and_then(|t| engine.install_transport(t).map_err(|e| cannot_start(p, e)));
        match started {
            Ok(()) => installed.push(p.transport()),
            Err(e) => info!(protocol = p.name(), reason = %e, "auto: not installed"),
        }
        // Memory the application allocated, same host: one copy by cross-memory attach.
        #[cfg(feature = "shm")]
        if p == Protocol::Shm && !here("cma") {
            match engine.install_transport(Arc::new(te_shm::CmaTransport::new())) {
                Ok(()) => installed.push("cma"),
                Err(e) => info!(reason = %e, "auto: cma not installed"),
            }
        }
    }
    info!(transports = %installed.join(", "), "auto: installed");
    Ok(())
}

/// A transport that was built in but cannot start here (no device, no driver).
fn cannot_start(protocol: Protocol, e: impl std::fmt::Display) -> FacadeError {
    te_core::Error::NotSupportedTransport(format!(
        "protocol {:?}: te's {} transport cannot start here: {e}",
        protocol.name(),
        protocol.transport()
    ))
    .into()
}

/// A transport te-facade was built without.
#[allow(dead_code)] // every feature on leaves it unused
fn not_built(protocol: Protocol, feature: &str) -> FacadeError {
    te_core::Error::NotSupportedTransport(format!(
        "protocol {:?}: te-facade was built without its `{feature}` feature (te's {} transport)",
        protocol.name(),
        protocol.transport()
    ))
    .into()
}

/// Installs the network transport: te's RDMA one on `devices` where it starts (unless
/// `MC_FORCE_TCP`), else TCP, as Mooncake falls back (a warning when RDMA was `asked` for by
/// name; under `auto` a machine without it is no surprise). Its name.
fn install_network(
    engine: &TransferEngine,
    devices: &str,
    settings: &crate::settings::FacadeSettings,
    asked: bool,
) -> Result<&'static str> {
    #[cfg(feature = "rdma")]
    if !settings.force_tcp {
        match engine.install_transport(Arc::new(rdma_transport(devices)?)) {
            Ok(()) => return Ok("rdma"),
            Err(e) if asked => {
                tracing::warn!(error = %e, "no RDMA here; using TCP, as Mooncake does")
            }
            Err(e) => info!(reason = %e, "auto: no RDMA here; TCP"),
        }
    }
    let _ = (devices, settings, asked);
    engine.install_transport(tcp()?)?;
    Ok("tcp")
}

/// The transport `protocol` selects on the classic engine (any but `rdma`, which
/// [`install_network`] tries), made but not installed.
///
/// # Errors
/// A transport this build lacks, or one whose set-up failed (a CXL device not configured).
pub(crate) fn classic_transport(
    engine: &TransferEngine,
    protocol: Protocol,
    settings: &crate::settings::FacadeSettings,
    source: &crate::managed::MemorySource,
) -> Result<Arc<dyn Transport>> {
    let _ = (engine, settings, source);
    match protocol {
        Protocol::Tcp | Protocol::Auto | Protocol::Rdma => tcp(),
        Protocol::Shm => {
            // Managed buffers are then allocated as shared memory.
            #[cfg(feature = "shm")]
            return {
                let shm = Arc::new(te_shm::ShmTransport::default());
                let allocator = shm.clone();
                let _ = source.set(Arc::new(move |len| allocator.allocate(len)));
                Ok(shm)
            };
            #[cfg(not(feature = "shm"))]
            Err(not_built(protocol, "shm"))
        }
        Protocol::IoUring => {
            #[cfg(feature = "uring")]
            return Ok(te_uring::file_transport(te_uring::FileOptions::default()));
            #[cfg(not(feature = "uring"))]
            Err(not_built(protocol, "uring"))
        }
        Protocol::Cxl => {
            // Managed buffers then come from the device, unless shared memory came first.
            #[cfg(feature = "cxl")]
            return match te_cxl::CxlTransport::open(engine.config()) {
                Ok(cxl) => {
                    let cxl = Arc::new(cxl);
                    let allocator = cxl.clone();
                    let _ = source.set(Arc::new(move |len| allocator.allocate(len)));
                    Ok(cxl)
                }
                Err(e) => Err(cannot_start(protocol, e)),
            };
            #[cfg(not(feature = "cxl"))]
            Err(not_built(protocol, "cxl"))
        }
        Protocol::Nvlink | Protocol::NvlinkIntra | Protocol::Mnnvl => {
            #[cfg(feature = "nvlink")]
            return Ok(Arc::new(match protocol {
                Protocol::Mnnvl => {
                    let mut o =
                        te_nvlink::NvlinkOptions::from_env().map_err(te_core::Error::from)?;
                    (o.mnnvl, o.use_fabric) = (true, true);
                    te_nvlink::NvlinkTransport::with_options(o)
                }
                _ => te_nvlink::NvlinkTransport::new(),
            }));
            #[cfg(not(feature = "nvlink"))]
            Err(not_built(protocol, "nvlink"))
        }
        Protocol::Gds => {
            #[cfg(feature = "gds")]
            return Ok(Arc::new(te_gds::GdsTransport::new()));
            #[cfg(not(feature = "gds"))]
            Err(not_built(protocol, "gds"))
        }
    }
}

/// te's TCP transport.
fn tcp() -> Result<Arc<dyn Transport>> {
    #[cfg(feature = "tcp")]
    return Ok(Arc::new(te_tcp::TcpTransport::new()));
    #[cfg(not(feature = "tcp"))]
    Err(not_built(Protocol::Tcp, "tcp"))
}

#[cfg(feature = "tent")]
/// te's TENT runtime named `local`, with `MC_TENT_CONF` and the `MC_*` variables; `protocol`
/// (with its devices) must be among the transports it runs (`rdma` is enabled for it).
pub(crate) fn start_tent(
    metadata: &str,
    local: &str,
    protocol: Option<(Protocol, &str)>,
) -> Result<te_tent::TentEngine> {
    let mut config = te_tent::TentConfig::from_env()?;
    config.metadata_conn = metadata.to_string();
    config.local_segment_name = local.to_string();
    if let Some((Protocol::Rdma, devices)) = protocol {
        let rdma = config.transports.entry("rdma".into()).or_default();
        rdma.enable = Some(true);
        if let Some(named) = device_list(devices) {
            rdma.devices = Some(named);
        }
    }
    // A protocol named goes first in TENT's plans (after a hint); TENT's other transports stay
    // for failover and for memory it cannot reach, as TENT runs them whatever `initialize`
    // names. `auto` leaves the policy's order.
    if let Some((p, _)) = protocol.filter(|(p, _)| *p != Protocol::Auto) {
        config.plan_first = Some(p.transports().iter().map(|t| t.to_string()).collect());
    }
    let tent = te_tent::TentEngine::new(config)?;
    if let Some((p, _)) = protocol.filter(|(p, _)| *p != Protocol::Auto) {
        let installed: Vec<&str> = tent
            .core()
            .transport_capabilities()
            .iter()
            .map(|(n, _)| *n)
            .collect();
        if !p.transports().iter().any(|n| installed.contains(n)) {
            return Err(te_core::Error::NotSupportedTransport(format!(
                "protocol {:?}: te's TENT runtime runs {} here; its {} transport is disabled in MC_TENT_CONF, not in this build, or cannot start on this machine",
                p.name(),
                installed.join(", "),
                p.transport()
            ))
            .into());
        }
    }
    Ok(tent)
}

/// Runs in the lean build CI makes (`--no-default-features --features tcp`).
#[cfg(all(test, feature = "tcp", not(feature = "shm"), not(feature = "tent")))]
mod tests {
    use crate::{MooncakeEngine, RuntimeKind};

    /// What the build lacks is named by its feature, and `auto` runs what it has.
    #[test]
    fn a_build_without_a_transport_names_its_feature() {
        for (protocol, feature) in [
            ("shm", "`shm`"),
            ("io_uring", "`uring`"),
            ("rdma", "`rdma`"),
        ] {
            let e = MooncakeEngine::started("127.0.0.1", "P2PHANDSHAKE", protocol)
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(feature) && e.contains(protocol),
                "{protocol}: {e}"
            );
        }
        let e = MooncakeEngine::new();
        let err = e
            .initialize_on(RuntimeKind::Tent, "127.0.0.1", "P2PHANDSHAKE", "tcp", "")
            .unwrap_err()
            .to_string();
        assert!(err.contains("`tent`"), "{err}");
        let auto = MooncakeEngine::started("127.0.0.1", "P2PHANDSHAKE", "auto").unwrap();
        let installed: Vec<&str> = auto.transports().unwrap().iter().map(|t| t.0).collect();
        assert_eq!(installed, ["tcp"]);
    }
}
