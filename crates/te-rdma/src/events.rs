//! The event reader threads, one per device: a device's async events (its port going down or
//! coming back, a fatal error) turned into failover. What a pause means and when it lifts is
//! decided in [`crate::failover`]; this module only reads the events and applies them.
//!
//! Not here: completions (the workers poll those), and the sweep of initiators.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{debug, error, info};

use crate::State;
use crate::verbs::DeviceEvent;

/// Reads device `nic`'s async events until shutdown: a port down or a fatal error marks it
/// inactive and fails its queue pairs (their requests flush and retry on other devices); the
/// port coming back marks it active and lifts its pause.
pub(crate) fn watch(state: Arc<State>, nic: usize) {
    let device = state.nics[nic].clone();
    while !state.stop.load(Ordering::Acquire) {
        match device.next_event(Duration::from_secs(1), &state.stopping) {
            Some(event @ (DeviceEvent::PortDown | DeviceEvent::Fatal)) => {
                let fatal = event == DeviceEvent::Fatal;
                device.set_active(false);
                error!(device = %device.name, fatal, "RDMA device down: failing over to others");
                let groups = state
                    .endpoints
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove_where(|k| k.1 == nic);
                for ep in groups.iter().flat_map(|(_, g)| g.iter()) {
                    ep.fail();
                }
            }
            Some(DeviceEvent::PortActive) => {
                device.set_active(true);
                state
                    .pauses
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .resume_local(nic);
                info!(device = %device.name, "RDMA device active again");
            }
            Some(DeviceEvent::Other(what)) => debug!(device = %device.name, %what, "RDMA event"),
            None => {}
        }
    }
}
