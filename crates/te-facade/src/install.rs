//! What each protocol installs: on the classic engine, te's TCP transport, or its RDMA one
//! where a device is up (TCP otherwise, as Mooncake falls back); on TENT, the transports its
//! configuration enables, which must include the protocol's. Anything else is an error naming
//! the protocol.

use std::sync::Arc;

use te_core::TransferEngine;
use tracing::warn;

use crate::error::{FacadeError, Result};
use crate::protocol::Protocol;

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

/// te's RDMA transport on the `devices` named (comma-separated; empty: all), with the
/// `MC_*` options.
pub(crate) fn rdma_transport(devices: &str) -> Result<te_rdma::RdmaTransport> {
    let mut options = te_rdma::RdmaOptions::from_env()?;
    if let Some(named) = device_list(devices) {
        options.devices = Some(named);
    }
    Ok(te_rdma::RdmaTransport::new(options))
}

/// Installs the classic engine's transport for `protocol`: te's RDMA transport for `rdma`
/// when verbs devices are there (and `MC_FORCE_TCP` is not set), TCP for `tcp` and otherwise
/// for `rdma`.
///
/// # Errors
/// A protocol whose transport the bindings do not install on the classic engine.
pub(crate) fn install_classic(
    engine: &TransferEngine,
    protocol: Protocol,
    device_name: &str,
    force_tcp: bool,
) -> Result<()> {
    match protocol {
        Protocol::Tcp => {}
        Protocol::Rdma => {
            if !force_tcp {
                match engine.install_transport(Arc::new(rdma_transport(device_name)?)) {
                    Ok(()) => return Ok(()),
                    Err(e) => warn!(error = %e, "no RDMA here; using TCP, as Mooncake does"),
                }
            }
        }
        other => return Err(not_on_classic(other)),
    }
    engine.install_transport(Arc::new(te_tcp::TcpTransport::new()))?;
    Ok(())
}

/// Why the classic engine of te's bindings cannot serve `protocol`.
pub(crate) fn not_on_classic(protocol: Protocol) -> FacadeError {
    let tent = match protocol {
        Protocol::Shm | Protocol::IoUring => {
            "; set MC_USE_TENT=1 (or te.Engine(backend=\"tent\")) to run on te's TENT runtime, which has it"
        }
        _ => "",
    };
    te_core::Error::NotSupportedTransport(format!(
        "protocol {:?}: te's {} transport is not installed by te's Python and C bindings on the classic engine (they install tcp and rdma){tent}",
        protocol.name(),
        protocol.transport()
    ))
    .into()
}

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
    let tent = te_tent::TentEngine::new(config)?;
    if let Some((p, _)) = protocol {
        let installed: Vec<&str> = tent
            .core()
            .transport_capabilities()
            .iter()
            .map(|(n, _)| *n)
            .collect();
        if !installed.contains(&p.transport()) {
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
