//! te-rdma on any machine: without a verbs device (or without rdma-core) installing the
//! transport fails with a clear error and the engine keeps working over other transports; with
//! one, it installs and publishes its devices. Settings from the environment are validated.

use std::sync::Arc;

use te_core::{Config, TransferEngine};
use te_rdma::{RdmaOptions, RdmaTransport, verbs};

#[test]
fn install_says_why_without_a_device() {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    let e = TransferEngine::init(c, "P2PHANDSHAKE", "127.0.0.1").unwrap();
    let result = e.install_transport(Arc::new(RdmaTransport::new(RdmaOptions::default())));
    match verbs::device_names().is_empty() {
        true => {
            let err = result.unwrap_err();
            assert!(err.to_string().contains("no RDMA device"), "{err}");
            // The engine still serves: TCP installs after the refusal.
            e.install_transport(Arc::new(te_tcp::TcpTransport::new()))
                .unwrap();
        }
        false => result.unwrap(),
    }
    let named = RdmaTransport::new(RdmaOptions {
        devices: Some(vec!["no-such-device".into()]),
        ..RdmaOptions::default()
    });
    let err = e.install_transport(Arc::new(named)).unwrap_err();
    assert!(err.to_string().contains("no-such-device"), "{err}");
}

#[test]
fn environment_settings_are_checked() {
    // Read in a child process, so no test of this binary sees the variables.
    let vars = [
        ("MC_IB_PORT", "2"),
        ("MC_IB_TIMEOUT", "19"),
        ("MC_MAX_WR", "64"),
        ("MC_GID_INDEX", "3"),
        ("MC_TE_RDMA_PEER_SWEEP_SECS", "7"),
    ];
    let child = |extra: Option<(&str, &str)>| {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "child_reads_the_environment",
            "--ignored",
            "--nocapture",
        ])
        .envs(vars);
        if let Some((k, v)) = extra {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let good = child(None);
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    let bad = child(Some(("MC_IB_TIMEOUT", "99")));
    assert!(
        !bad.status.success(),
        "an out-of-range MC_IB_TIMEOUT is refused"
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&bad.stdout),
        String::from_utf8_lossy(&bad.stderr)
    );
    assert!(said.contains("MC_IB_TIMEOUT"), "{said}");
    let bad = child(Some(("MC_TE_RDMA_PEER_SWEEP_SECS", "0")));
    assert!(!bad.status.success(), "a sweep every 0 s is refused");
}

#[test]
#[ignore = "helper: started by environment_settings_are_checked with the variables set"]
fn child_reads_the_environment() {
    let o = RdmaOptions::from_env().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((o.verbs.port, o.verbs.timeout, o.verbs.max_wr), (2, 19, 64));
    assert_eq!(o.verbs.gid_index, Some(3));
    assert_eq!(o.peer_sweep, std::time::Duration::from_secs(7));
}
