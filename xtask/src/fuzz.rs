//! `cargo xtask fuzz <target> [--secs N]`: one wire decoder's fuzz target for N seconds (10 by
//! default), in release mode; `all` runs every target. Targets live beside their decoders as
//! tests that read `TE_FUZZ_SECS` (so `cargo test` runs each for 1 s); a crashing input is saved
//! under `target/fuzz-crashes/` — copy it into the crate's `fuzz/regressions/<target>/` to keep
//! it as a regression test, replayed on every run.

/// (target, crate, test path).
pub(crate) const TARGETS: [(&str, &str, &str); 15] = [
    ("control-frame", "te-core", "fuzz_targets::control_frame"),
    ("descriptor", "te-core", "fuzz_targets::descriptor"),
    ("http-head", "te-core", "fuzz_targets::http_head"),
    ("resp", "te-core", "fuzz_targets::resp"),
    ("percent-decode", "te-core", "fuzz_targets::percent_decode"),
    (
        "http-request",
        "te-metadata",
        "request::tests::http_request",
    ),
    ("tcp-request", "te-tcp", "wire::fuzz_targets::tcp_request"),
    ("tcp-reply", "te-tcp", "wire::fuzz_targets::tcp_reply"),
    ("tcp-greeting", "te-tcp", "wire::fuzz_targets::tcp_greeting"),
    (
        "mooncake-header",
        "te-tcp",
        "mooncake_wire::fuzz_targets::mooncake_header",
    ),
    (
        "mooncake-status",
        "te-tcp",
        "mooncake_wire::fuzz_targets::mooncake_status",
    ),
    (
        "rdma-handshake",
        "te-rdma",
        "handshake::tests::rdma_handshake",
    ),
    ("gpu-name", "te-nvlink", "handle::tests::gpu_name"),
    ("rpc-frame", "te-rpc", "fuzz_targets::rpc_frame"),
    ("rpc-reply", "te-rpc", "fuzz_targets::rpc_reply"),
];

const USAGE: &str = "usage: cargo xtask fuzz <target|all> [--secs N]";

/// Runs `target` (or all) for `secs` seconds each (`release`: optimised, more inputs).
pub(crate) fn run_targets(target: &str, secs: f64, release: bool) -> Result<(), String> {
    let chosen: Vec<_> = TARGETS
        .iter()
        .filter(|(name, _, _)| target == "all" || *name == target)
        .collect();
    if chosen.is_empty() {
        let names: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
        return Err(format!(
            "unknown fuzz target {target:?}; targets: {}",
            names.join(", ")
        ));
    }
    for (name, krate, path) in chosen {
        eprintln!("xtask fuzz: {name} ({krate}) for {secs} s");
        let mut cmd = crate::cargo();
        cmd.arg("test");
        if release {
            cmd.arg("--release");
        }
        let ok = cmd
            .args(["-p", krate, "--lib", path, "--", "--exact", "--nocapture"])
            .env("TE_FUZZ_SECS", secs.to_string())
            .status()
            .map_err(|e| format!("cargo test: {e}"))?
            .success();
        if !ok {
            return Err(format!(
                "fuzz target {name} failed: its input is under target/fuzz-crashes/"
            ));
        }
    }
    Ok(())
}

pub(crate) fn fuzz(args: &[&str]) -> Result<(), String> {
    let (target, rest) = args.split_first().ok_or(USAGE)?;
    let secs = match rest {
        [] => 10.0,
        ["--secs", n] => n
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .ok_or(USAGE)?,
        _ => return Err(USAGE.into()),
    };
    run_targets(target, secs, true)
}
