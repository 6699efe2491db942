//! What each protocol installs: on the classic engine, te's TCP transport, or its RDMA one
//! where a device is up (TCP otherwise, as Mooncake falls back); on TENT, the transports its
//! configuration enables, which must include the protocol's. Anything else is an error naming
//! the protocol. The transports themselves are made by te-catalog.

use std::sync::Arc;

use te_core::TransferEngine;
use te_core::transport::Transport;
use tracing::info;

use crate::error::{FacadeError, Result};
use te_catalog::Protocol;

/// The device names in a comma-separated list (empty: none named, which means all).
pub(crate) fn device_list(devices: &str) -> Option<Vec<String>> {
    let named: Vec<String> = devices
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(String::from)
        .collect();
    (!named.is_empty()).then_some(named)
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
            let transport = classic_transport(engine, protocol, source)?;
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
        let started = classic_transport(engine, p, source)
            .and_then(|t| engine.install_transport(t).map_err(|e| cannot_start(p, e)));
        match started {
            Ok(()) => installed.push(p.transport()),
            Err(e) => info!(protocol = p.name(), reason = %e, "auto: not installed"),
        }
        // Memory the application allocated, same host: one copy by cross-memory attach.
        #[cfg(feature = "shm")]
        if p == Protocol::Shm && !here("cma") {
            let cma = te_catalog::make("cma", &options(engine, ""))
                .and_then(|made| engine.install_transport(made.transport));
            match cma {
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
        let rdma = made(engine, Protocol::Rdma, devices, None)?;
        match engine.install_transport(rdma) {
            Ok(()) => return Ok("rdma"),
            Err(e) if asked => {
                tracing::warn!(error = %e, "no RDMA here; using TCP, as Mooncake does")
            }
            Err(e) => info!(reason = %e, "auto: no RDMA here; TCP"),
        }
    }
    let _ = (devices, settings, asked);
    engine.install_transport(made(engine, Protocol::Tcp, devices, None)?)?;
    Ok("tcp")
}

/// The transport `protocol` selects on the classic engine (any but `rdma`, which
/// [`install_network`] tries), made but not installed. Memory the transport allocates for
/// peers (shm, cxl) becomes where managed buffers come from, unless one came first.
///
/// # Errors
/// A transport this build lacks, or one whose set-up failed (a CXL device not configured).
pub(crate) fn classic_transport(
    engine: &TransferEngine,
    protocol: Protocol,
    source: &crate::managed::MemorySource,
) -> Result<Arc<dyn Transport>> {
    let protocol = match protocol {
        Protocol::Auto | Protocol::Rdma => Protocol::Tcp,
        other => other,
    };
    made(engine, protocol, "", Some(source))
}

/// What te-catalog's makers take on the classic engine: the `MC_*` variables of the process.
fn options<'a>(engine: &'a TransferEngine, devices: &str) -> te_catalog::Options<'a> {
    te_catalog::Options {
        config: engine.config(),
        lookup: &te_sys::env::process,
        devices: device_list(devices),
        shm_dir: None,
    }
}

/// te-catalog's transport for `protocol` (on `devices`, for RDMA), with the `MC_*` variables;
/// its allocator, where it has one, offered to `source`.
pub(crate) fn made(
    engine: &TransferEngine,
    protocol: Protocol,
    devices: &str,
    source: Option<&crate::managed::MemorySource>,
) -> Result<Arc<dyn Transport>> {
    let made =
        te_catalog::make(protocol.entry(), &options(engine, devices)).map_err(|e| match e {
            te_core::Error::NotSupportedTransport(why) => te_core::Error::NotSupportedTransport(
                format!("protocol {:?}: {why}", protocol.name()),
            )
            .into(),
            other => cannot_start(protocol, other),
        })?;
    if let (Some(source), Some(allocator)) = (source, made.allocator) {
        let _ = source.set(allocator);
    }
    Ok(made.transport)
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
