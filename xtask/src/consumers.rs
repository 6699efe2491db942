//! `cargo xtask consumers`: the call patterns of vLLM, SGLang and LMCache
//! (`crates/te-py/tests/consumers/scenarios.py`) on te's `te.mooncake` and on Mooncake's wheel,
//! one after the other, then one table with both. te must pass every scenario; Mooncake's
//! failures are listed by name (they are its known limits, not this run's failures).

use std::path::Path;
use std::process::Command;

const SCENARIOS: &str = "crates/te-py/tests/consumers/scenarios.py";
use crate::ci::TE_PYTHON;
const MOONCAKE_PYTHON: &str = "target/mooncake-venv/bin/python3";

/// Runs the scenarios under `python` on `impl`; their results (scenario → ok, seconds, detail).
fn results(python: &str, implementation: &str) -> Result<serde_json::Value, String> {
    let out = format!("target/consumers/{implementation}.json");
    std::fs::create_dir_all("target/consumers").map_err(|e| format!("target/consumers: {e}"))?;
    let _ = std::fs::remove_file(&out);
    eprintln!("xtask: consumers on {implementation}: {python} {SCENARIOS}");
    // A scenario failing is a result: the run's exit code is read from the JSON instead.
    let status = Command::new(python)
        .args([SCENARIOS, implementation, "--json", &out])
        .status()
        .map_err(|e| format!("{python}: {e}"))?;
    let text = std::fs::read_to_string(&out)
        .map_err(|e| format!("{implementation}: no results ({status}): {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{out}: {e}"))
}

/// The one-line form of a scenario's result.
fn cell(r: Option<&serde_json::Value>) -> String {
    match r {
        None => "not run".into(),
        Some(r) if r["ok"] == true => format!("pass ({} s)", r["seconds"]),
        Some(r) => format!(
            "FAIL: {}",
            r["detail"]["failure"]
                .as_str()
                .unwrap_or("?")
                .replace('|', "/")
        ),
    }
}

pub(crate) fn consumers() -> Result<(), String> {
    for python in [TE_PYTHON, MOONCAKE_PYTHON] {
        if !Path::new(python).exists() {
            return Err(format!("{python} missing (.ci/setup makes it)"));
        }
    }
    crate::ci::install_te_py()?;
    let te = results(TE_PYTHON, "te")?;
    let mooncake = results(MOONCAKE_PYTHON, "mooncake")?;
    let names: Vec<&String> = te
        .as_object()
        .map(|m| m.keys().collect())
        .unwrap_or_default();
    let mut table = String::from("| scenario | te | Mooncake 0.3.13.post1 |\n|---|---|---|\n");
    for name in &names {
        table.push_str(&format!(
            "| {name} | {} | {} |\n",
            cell(te.get(name.as_str())),
            cell(mooncake.get(name.as_str()))
        ));
    }
    std::fs::write("target/consumers/report.md", &table)
        .map_err(|e| format!("target/consumers/report.md: {e}"))?;
    eprintln!("\nconsumer call patterns (target/consumers/report.md):\n{table}");
    let failed: Vec<&&String> = names
        .iter()
        .filter(|n| te[n.as_str()]["ok"] != true)
        .collect();
    match failed.is_empty() && !names.is_empty() {
        true => Ok(()),
        false => Err(format!("te failed consumer scenarios: {failed:?}")),
    }
}
