//! The engine's rails, from its configuration: [`te_topology::rails::plan`] over what
//! [`Config`] chooses, its errors in te-core's terms.

use std::net::IpAddr;

use te_topology::rails::{RailChoice, RailError};
use te_topology::{PriorityMatrix, Topology};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::transport::Rail;
use te_sys::InterfaceAddr;

/// The local rails and the matrix over them.
///
/// # Errors
/// [`Error::InvalidArgument`] when a NIC named explicitly has no running IPv4 address;
/// [`Error::InvalidConfig`] when `MC_CUSTOM_TOPO_JSON` cannot be loaded.
pub fn plan(
    config: &Config,
    bind_ip: IpAddr,
    topology: &Topology,
    interfaces: &[InterfaceAddr],
) -> Result<(Vec<Rail>, PriorityMatrix)> {
    let choice = RailChoice {
        named: config.rails.as_deref(),
        filter: &config.nic_filter,
        bind_address_given: config.tcp_bind_address.is_some(),
        custom_matrix: config.custom_topo_json.as_deref(),
    };
    te_topology::rails::plan(&choice, bind_ip, topology, interfaces).map_err(|e| match e {
        RailError::NoAddress(_) => Error::InvalidArgument(e.to_string()),
        RailError::Matrix { path, reason } => Error::InvalidConfig {
            name: crate::settings::CUSTOM_TOPO_JSON.name.into(),
            value: path,
            reason,
        },
    })
}
