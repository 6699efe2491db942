//! `cargo xtask ci`: every lane this machine supports, then a summary of each lane — passed,
//! failed, or skipped with the reason. A failed lane does not stop the others; the run fails
//! if any lane failed.
//!
//! Lanes: tidy; fmt; clippy with warnings denied over the workspace and a feature matrix per package;
//! every test (Redis, etcd and the HTTP metadata server run for real inside them); the
//! hwloc backend; the etcd scenarios; the simulation at 200 seeds; a short fuzz run of every
//! wire decoder; dependency licences; security advisories (needs the RustSec database); te's
//! Python package (pytest) and the consumers' call patterns on te and Mooncake's wheel; te's
//! NIXL plugin under the nixl-cu12 wheel's agent; the Soft-RoCE guest; the GPU suite (needs a
//! GPU); docs with warnings denied.

use std::process::Command;

use crate::{cargo, clippy, run};

/// How one lane ended.
enum Outcome {
    Passed,
    Failed(String),
    Skipped(String),
}

/// Per-package feature combinations linted beyond the workspace build (which unifies features).
const FEATURE_MATRIX: [(&str, &[&str]); 14] = [
    ("te-core", &["--no-default-features"]),
    ("te-core", &["--features", "cuda"]),
    ("te-topology", &["--features", "hwloc"]),
    // The buffered-I/O build: its tests exercise io_uring, so the library alone.
    ("te-uring", &["--no-default-features", "--lib"]),
    ("te-metadata", &["--features", "etcd"]),
    ("te-tent", &["--no-default-features"]),
    ("te-tent", &["--features", "rdma,nvlink"]),
    // The transports without CUDA (the workspace build enables it through te-bench).
    ("te-tcp", &[]),
    ("te-rdma", &[]),
    ("te-facade", &["--no-default-features"]),
    // A lean build of the one crate to depend on: TCP alone.
    ("te-facade", &["--no-default-features", "--features", "tcp"]),
    ("te-bench", &["--no-default-features"]),
    // The catalog without any transport: every name an error naming its feature.
    ("te-catalog", &[]),
    // The C library as `cargo xtask bench capi` builds it to measure its own cost.
    ("te-capi", &["--features", "instant"]),
];

/// Licences every dependency must be available under (an SPDX expression is accepted when an
/// `OR` branch, or every `AND` part, is in the list).
const LICENCES: [&str; 12] = [
    "MIT",
    "Apache-2.0",
    "Apache-2.0 WITH LLVM-exception",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "ISC",
    "Zlib",
    "Unicode-3.0",
    "Unicode-DFS-2016",
    "MPL-2.0",
    "CC0-1.0",
    "BSL-1.0",
];

fn tool_present(bin: &str, arg: &str) -> bool {
    Command::new(bin)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Why a lane is skipped when `bin arg` does not run: `why`; `None` when it runs.
fn skip_without(bin: &str, arg: &str, why: &str) -> Option<String> {
    (!tool_present(bin, arg)).then(|| why.to_string())
}

/// Whether an SPDX expression is allowed.
fn licence_ok(expr: &str) -> bool {
    let expr = expr.replace('/', " OR ");
    expr.split(" OR ").any(|branch| {
        let branch = branch.trim().trim_matches(|c| c == '(' || c == ')');
        branch.split(" AND ").all(|part| {
            let part = part.trim().trim_matches(|c| c == '(' || c == ')').trim();
            LICENCES.contains(&part)
        })
    })
}

/// Every non-workspace package's licence, checked against [`LICENCES`].
pub(crate) fn licences() -> Result<(), String> {
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--locked"])
        .output()
        .map_err(|e| format!("cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
    let members: Vec<&str> = meta["workspace_members"]
        .as_array()
        .map(|a| a.iter().filter_map(|m| m.as_str()).collect())
        .unwrap_or_default();
    let mut bad = Vec::new();
    let mut checked = 0;
    for p in meta["packages"].as_array().into_iter().flatten() {
        if members.contains(&p["id"].as_str().unwrap_or("")) {
            continue;
        }
        checked += 1;
        let name = format!("{} {}", p["name"], p["version"]);
        match p["license"].as_str() {
            Some(l) if licence_ok(l) => {}
            Some(l) => bad.push(format!("{name}: {l}")),
            None => bad.push(format!("{name}: no licence field")),
        }
    }
    eprintln!("xtask: licences of {checked} dependencies checked");
    match bad.is_empty() {
        true => Ok(()),
        false => Err(format!("licences not allowed: {}", bad.join("; "))),
    }
}

/// Runs `lane` unless `skip` gives a reason; records the outcome.
fn lane(
    results: &mut Vec<(String, Outcome)>,
    name: &str,
    skip: Option<String>,
    body: impl FnOnce() -> Result<(), String>,
) {
    let outcome = match skip {
        Some(why) => {
            eprintln!("xtask: {name}: skipped ({why})");
            Outcome::Skipped(why)
        }
        None => match body() {
            Ok(()) => Outcome::Passed,
            Err(e) => {
                eprintln!("xtask: {name}: FAILED: {e}");
                Outcome::Failed(e)
            }
        },
    };
    results.push((name.to_string(), outcome));
}

pub(crate) fn ci() -> Result<(), String> {
    let mut r = Vec::new();
    lane(&mut r, "tidy", None, crate::tidy::tidy);
    lane(&mut r, "fmt", None, || {
        run("fmt", cargo().args(["fmt", "--all", "--check"]))
    });
    lane(&mut r, "clippy (workspace)", None, || {
        clippy("clippy", &["--workspace", "--all-targets"])
    });
    lane(&mut r, "clippy (feature matrix)", None, || {
        for (package, features) in FEATURE_MATRIX {
            let mut args = vec!["-p", package];
            if !features.contains(&"--lib") {
                args.push("--all-targets");
            }
            args.extend_from_slice(features);
            clippy(&format!("clippy {package} {}", features.join(" ")), &args)?;
        }
        Ok(())
    });
    let redis = skip_without(
        "redis-server",
        "--version",
        "redis-server missing (.ci/setup installs it)",
    );
    let etcd = skip_without(
        "etcd",
        "--version",
        "etcd missing (.ci/setup installs etcd-server)",
    );
    lane(
        &mut r,
        "test (workspace; Redis, HTTP metadata, fuzz 1 s each)",
        redis,
        || {
            run(
                "test",
                cargo().args(["test", "--workspace", "--no-fail-fast"]),
            )
        },
    );
    lane(&mut r, "lean te-facade", None, || {
        run(
            "test (te-facade with TCP alone: the transports it lacks are named)",
            cargo().args([
                "test",
                "-p",
                "te-facade",
                "--no-default-features",
                "--features",
                "tcp",
                "--lib",
            ]),
        )
    });
    lane(&mut r, "hwloc backend", None, || {
        run(
            "test (te-topology with hwloc: the two backends agree)",
            cargo().args(["test", "-p", "te-topology", "--features", "hwloc"]),
        )
    });
    lane(&mut r, "etcd", etcd, || {
        run(
            "test (engines sharing a real etcd; 32 engines through a 3-member cluster losing one)",
            cargo().args([
                "test",
                "-p",
                "te-metadata",
                "--features",
                "etcd",
                "--test",
                "scenarios",
                "--test",
                "cluster",
                "etcd",
            ]),
        )
    });
    lane(&mut r, "simulation (200 seeds)", None, || {
        let mut sim = crate::sim_command();
        sim.env("TE_SIM_SEEDS", "200");
        run("simulation (te-core, 200 seeds)", &mut sim)
    });
    lane(&mut r, "fuzz (every wire decoder, 3 s each)", None, || {
        crate::fuzz::run_targets("all", 3.0, false)
    });
    lane(&mut r, "licences", None, licences);
    let advisory_db = std::env::var("HOME")
        .map(|h| std::path::Path::new(&h).join(".cargo/advisory-db").exists())
        .unwrap_or(false);
    // The database lives on github.com; without it cargo-audit has nothing to check against.
    let audit = match (advisory_db, tool_present("cargo-audit", "--version")) {
        (true, true) => None,
        (false, _) => Some(
            "the RustSec advisory database (github.com/rustsec/advisory-db) is not on this machine and cannot be fetched from it".into(),
        ),
        (true, false) => Some("cargo-audit is not installed (crates.io: cargo install cargo-audit)".into()),
    };
    lane(&mut r, "advisories", audit, || {
        run(
            "cargo audit (offline database)",
            Command::new("cargo-audit").args(["audit", "--no-fetch"]),
        )
    });
    let py_venv = std::path::Path::new(TE_PYTHON);
    let python = (!py_venv.exists()).then(|| {
        "target/te-py-venv missing (.ci/setup makes it, with maturin, pytest and numpy)".into()
    });
    lane(
        &mut r,
        "python (te package: pip install crates/te-py, pytest)",
        python,
        || {
            install_te_py()?;
            run(
                "pytest crates/te-py/tests",
                Command::new(py_venv).args(["-m", "pytest", "-q", "crates/te-py/tests"]),
            )
        },
    );
    let mooncake_venv = std::path::Path::new("target/mooncake-venv/bin/python3");
    let consumers = match (py_venv.exists(), mooncake_venv.exists()) {
        (true, true) => None,
        _ => {
            Some("target/te-py-venv or target/mooncake-venv missing (.ci/setup makes them)".into())
        }
    };
    lane(
        &mut r,
        "consumers (vLLM, SGLang, LMCache call patterns; te and Mooncake's wheel)",
        consumers,
        crate::consumers::consumers,
    );
    let gxx = skip_without("g++", "--version", "g++ missing (.ci/setup installs it)");
    lane(
        &mut r,
        "NIXL plugin (libplugin_TE.so under nixl-cu12's agent, two processes)",
        gxx,
        crate::nixl::test,
    );
    let others = other_pythons();
    let abi3 = match (py_venv.exists(), others.is_empty()) {
        (false, _) => Some("target/te-py-venv missing (.ci/setup makes it)".into()),
        (true, true) => Some("no other CPython (3.10, 3.12, 3.13) on this machine".into()),
        (true, false) => None,
    };
    lane(
        &mut r,
        "python abi3 (one wheel on every CPython 3.10-3.13 here)",
        abi3,
        || abi3_wheel(&others),
    );
    let qemu = skip_without(
        "qemu-system-x86_64",
        "--version",
        "qemu-system-x86_64 missing (.ci/setup installs it)",
    );
    lane(
        &mut r,
        "Soft-RoCE guest (te-rdma)",
        qemu,
        crate::softroce::rdma_lane,
    );
    let gpu = skip_without(
        "nvidia-smi",
        "-L",
        "no GPU on this machine (cargo xtask gpu runs the suite where there is one)",
    );
    lane(&mut r, "GPU suite", gpu, crate::gpu::gpu);
    lane(&mut r, "doc", None, || {
        run(
            "doc",
            cargo()
                .args(["doc", "--no-deps", "--workspace"])
                .env("RUSTDOCFLAGS", "-D warnings"),
        )
    });
    eprintln!("\nxtask ci summary:");
    let mut failed = Vec::new();
    for (name, outcome) in &r {
        match outcome {
            Outcome::Passed => eprintln!("  passed   {name}"),
            Outcome::Skipped(why) => eprintln!("  skipped  {name}: {why}"),
            Outcome::Failed(e) => {
                eprintln!("  FAILED   {name}: {e}");
                failed.push(name.clone());
            }
        }
    }
    match failed.is_empty() {
        true => {
            eprintln!("xtask: ci passed");
            Ok(())
        }
        false => Err(format!("ci failed: {}", failed.join(", "))),
    }
}

/// `cargo xtask abi3`: the CI lane that installs te's one abi3 wheel into every other CPython
/// here and runs the smoke script with each.
pub(crate) fn abi3() -> Result<(), String> {
    let others = other_pythons();
    if others.is_empty() {
        return Err("no CPython 3.10, 3.12 or 3.13 found (PATH or pyenv)".into());
    }
    abi3_wheel(&others)
}

/// CPython 3.10, 3.12 and 3.13 interpreters here (3.11 is te-py-venv's): on `PATH`, or
/// installed by pyenv (whose shims answer only for the selected version).
fn other_pythons() -> Vec<String> {
    let pyenv = std::env::var("PYENV_ROOT")
        .ok()
        .or_else(|| std::env::var("HOME").ok().map(|h| format!("{h}/.pyenv")));
    ["3.10", "3.12", "3.13"]
        .into_iter()
        .filter_map(|minor| {
            let on_path = format!("python{minor}");
            if tool_present(&on_path, "--version") {
                return Some(on_path);
            }
            let versions = std::path::PathBuf::from(pyenv.as_ref()?).join("versions");
            std::fs::read_dir(versions)
                .ok()?
                .filter_map(Result::ok)
                .filter(|v| {
                    v.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{minor}."))
                })
                .map(|v| v.path().join(format!("bin/python{minor}")))
                .find(|p| p.is_file())
                .map(|p| p.display().to_string())
        })
        .collect()
}

/// Builds te's one abi3 wheel and, for each interpreter in `pythons`, installs it into a fresh
/// virtual environment and runs `crates/te-py/tests/abi3_smoke.py` there.
fn abi3_wheel(pythons: &[String]) -> Result<(), String> {
    let bin = std::fs::canonicalize("target/te-py-venv/bin")
        .map_err(|e| format!("target/te-py-venv/bin: {e}"))?;
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let wheels = std::path::Path::new("target/te-py-wheels");
    let _ = std::fs::remove_dir_all(wheels);
    run(
        "maturin build --release (the abi3 wheel)",
        Command::new(bin.join("maturin"))
            .env("PATH", &path)
            .current_dir("crates/te-py")
            .args([
                "build",
                "--release",
                "-q",
                "--out",
                "../../target/te-py-wheels",
            ]),
    )?;
    let wheel = std::fs::read_dir(wheels)
        .map_err(|e| format!("{}: {e}", wheels.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or("maturin made no wheel")?;
    for python in pythons {
        let minor = python.rsplit("python").next().unwrap_or("3");
        let venv = std::path::PathBuf::from(format!("target/abi3-venv-{minor}"));
        let _ = std::fs::remove_dir_all(&venv);
        run(
            &format!("{python} -m venv"),
            Command::new(python).args(["-m", "venv"]).arg(&venv),
        )?;
        // Absolute, not resolved: the venv's own `python` (a link to the base interpreter
        // that knows it runs in the venv).
        let venv_python = std::env::current_dir()
            .map_err(|e| e.to_string())?
            .join(&venv)
            .join("bin/python");
        run(
            &format!("install the wheel with {python}"),
            Command::new(&venv_python)
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
                .arg(&wheel),
        )?;
        // Run from outside the source tree, so the installed package is the one imported.
        let script = std::fs::canonicalize("crates/te-py/tests/abi3_smoke.py")
            .map_err(|e| format!("abi3_smoke.py: {e}"))?;
        run(
            &format!("abi3_smoke.py with {python}"),
            Command::new(&venv_python)
                .arg(script)
                .current_dir(std::env::temp_dir()),
        )?;
    }
    Ok(())
}

/// te's Python environment: `.ci/setup` makes it (maturin, pytest, numpy), [`install_te_py`]
/// puts te in it.
pub(crate) const TE_PYTHON: &str = "target/te-py-venv/bin/python3";

/// Builds and installs crates/te-py (maturin, an abi3 wheel) into `target/te-py-venv`.
pub(crate) fn install_te_py() -> Result<(), String> {
    let python = std::path::Path::new(TE_PYTHON);
    // maturin's build hook runs the `maturin` program: the environment's bin first.
    let bin = std::fs::canonicalize("target/te-py-venv/bin")
        .map_err(|e| format!("target/te-py-venv/bin (.ci/setup makes it): {e}"))?;
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run(
        "pip install crates/te-py (maturin, abi3 wheel)",
        Command::new(python).env("PATH", path).args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-build-isolation",
            "--force-reinstall",
            "--no-deps",
            "./crates/te-py",
        ]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spdx_expressions_are_judged_by_their_branches() {
        assert!(licence_ok("MIT OR Apache-2.0"));
        assert!(licence_ok("(MIT OR Apache-2.0) AND Unicode-3.0"));
        assert!(licence_ok(
            "Apache-2.0 WITH LLVM-exception OR Apache-2.0 OR MIT"
        ));
        assert!(licence_ok("MIT/Apache-2.0"));
        assert!(!licence_ok("GPL-3.0"));
        assert!(!licence_ok("MIT AND GPL-3.0"));
        assert!(licence_ok("GPL-3.0 OR MIT"));
    }
}
