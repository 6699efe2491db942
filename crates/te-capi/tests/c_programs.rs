//! The C APIs as C programs see them: `tests/c/capi_test.c` (Mooncake's `transfer_engine_c.h`)
//! and `tests/c/tent_test.c` (TENT's `tent/transfer_engine.h`) compiled with the system C
//! compiler against te's headers and run against the `libtransfer_engine.so` cargo built; and
//! a check that the library exports every function the headers declare (and the headers
//! declare every C function the library exports).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The directory holding `libtransfer_engine.so`: beside the test binary (`deps`), where
/// `cargo test` builds it, or the profile directory above, where `cargo build` puts it.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps").to_path_buf();
    [
        deps.clone(),
        deps.parent().map(Path::to_path_buf).unwrap_or_default(),
    ]
    .into_iter()
    .find(|d| d.join("libtransfer_engine.so").exists())
    .unwrap_or_else(|| panic!("no libtransfer_engine.so in or above {}", deps.display()))
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles `tests/c/{name}.c` against the headers and the library.
fn compile(name: &str) -> PathBuf {
    let lib = library_dir();
    let out = std::env::temp_dir().join(format!("te-capi-{name}-{}", std::process::id()));
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join(format!("tests/c/{name}.c")))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-ltransfer_engine")
        .arg("-o")
        .arg(&out)
        .status()
        .expect("run the C compiler (cc)");
    assert!(status.success(), "{name}.c did not compile");
    out
}

/// The Mooncake C API test program, compiled once.
fn program() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| compile("capi_test"))
}

/// The TENT C API test program, compiled once.
fn tent_program() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| compile("tent_test"))
}

fn run(mode: &str) -> String {
    run_program(program(), mode)
}

fn run_program(program: &Path, mode: &str) -> String {
    run_with(program, &[mode], &[])
}

/// Runs `program` with `args` and the variables `env` (besides the tests' own, which `env`
/// may override); its standard output.
fn run_with(program: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    run_logged(program, args, env).0
}

/// As [`run_with`]: standard output and standard error (te's log).
fn run_logged(program: &Path, args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let mode = args.join(" ");
    // cargo's LD_LIBRARY_PATH names its profile directory, where an older library a plain
    // `cargo build` left would win over the program's rpath: the library under test first.
    let lib_path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", library_dir().display()),
        _ => library_dir().display().to_string(),
    };
    let out = Command::new(program)
        .args(args)
        .env("LD_LIBRARY_PATH", lib_path)
        .env("MC_FORCE_TCP", "1")
        .env("MC_TRANSFER_TIMEOUT", "30")
        .env_remove("MC_TENT_CONF")
        .env_remove("MC_LOG_LEVEL")
        .envs(env.iter().copied())
        .output()
        .expect("run the test program");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{} {mode} failed ({}):\n{stdout}\n{stderr}",
        program.display(),
        out.status,
    );
    (stdout, stderr)
}

#[test]
fn tent_engines_move_bytes_and_notifications() {
    let out = run_program(tent_program(), "local");
    for line in [
        "tent local: WRITE and READ of 4 MiB verified",
        "tent local: a batch of three with priorities and a transport hint, listed",
        "tent local: notifications with and without a transfer",
        "tent local: ok",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
}

#[test]
fn tent_engines_start_from_a_configuration_written_for_mooncakes_tent() {
    let sample = crate_dir().join("../te-tent/tests/data/mooncake-keys.json");
    let out = run_with(
        tent_program(),
        &["mooncake_config", sample.to_str().unwrap()],
        &[],
    );
    for line in [
        "tent mooncake_config: engines started from the file, WRITE of 4 MiB verified",
        "tent mooncake_config: hints honoured or refused",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
}

#[test]
fn a_file_opens_as_a_segment_from_c() {
    let out = run("files");
    assert!(
        out.contains("files: READ and WRITE of a file segment verified"),
        "{out}"
    );
}

#[test]
fn the_classic_api_runs_on_tent_under_mc_use_tent() {
    let out = run("transports");
    assert!(out.contains("transports: shm served"), "classic:\n{out}");
    // The classic engine runs what was installed (auto discovery's TCP, then shm by name).
    let installed = out
        .lines()
        .find(|l| l.starts_with("installed "))
        .unwrap_or_default();
    assert!(
        installed.starts_with("installed tcp (") && installed.contains("shm ("),
        "classic:\n{out}"
    );
    assert!(
        !installed.contains("uring") && !installed.contains("bufio"),
        "{out}"
    );
    // Mooncake's switch, with any value: TENT's transports, and every check of the program.
    for (var, value) in [
        ("MC_USE_TENT", "1"),
        ("MC_USE_TENT", "0"),
        ("MC_USE_TEV1", ""),
    ] {
        let out = run_with(program(), &["transports"], &[(var, value)]);
        assert!(
            out.contains("transports: shm served"),
            "{var}={value}:\n{out}"
        );
        // TENT starts its configured transports, its file transport among them.
        let installed = out
            .lines()
            .find(|l| l.starts_with("installed "))
            .unwrap_or_default();
        assert!(
            installed.contains("uring (") || installed.contains("bufio ("),
            "{var}={value}:\n{out}"
        );
        let out = run_with(program(), &["local"], &[(var, value)]);
        assert!(out.contains("local: ok"), "{var}={value}:\n{out}");
    }
    let out = run_with(program(), &["processes"], &[("MC_USE_TEV1", "")]);
    assert!(
        out.contains("processes: WRITE to and READ from another process verified"),
        "{out}"
    );
}

#[test]
fn tent_bad_inputs_fail_and_the_engine_keeps_serving() {
    let (out, log) = run_logged(tent_program(), &["bad"], &[]);
    assert!(out.contains("tent bad: every bad input refused"), "{out}");
    for function in ["tent_register_memory", "tent_open_segment"] {
        assert!(
            log.lines().any(|l| l.contains("WARN")
                && l.contains("TENT C API call failed")
                && l.contains(&format!("function=\"{function}\""))),
            "no logged reason for {function}:\n{log}"
        );
    }
}

#[test]
fn two_engines_in_one_process_move_bytes_both_ways() {
    let out = run("local");
    for line in [
        "local: WRITE 4 MiB a -> b verified",
        "local: READ 4 MiB b -> a verified",
        "local: one batch filled by two submits, four tasks verified",
        "local: notifications with and without a transfer",
        "local: ok",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
}

#[test]
fn two_processes_move_bytes_both_ways() {
    let out = run("processes");
    assert!(
        out.contains("processes: WRITE to and READ from another process verified"),
        "{out}"
    );
}

/// Two processes on one host through each same-host transport, picked by name from C: the
/// parent WRITEs into the child and READs from it, every byte checked in both; te's log says
/// which transport served the child's buffer.
#[test]
fn same_host_transports_move_bytes_between_processes_from_c() {
    let dir = std::env::temp_dir().join(format!("te-capi-cxl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A regular file stands in for the CXL device (a DAX device on a real machine).
    let device = dir.join("device");
    std::fs::File::create(&device)
        .and_then(|f| f.set_len(64 << 20))
        .unwrap();
    let device_path = device.to_str().unwrap();
    for (protocol, memory, chosen, installed) in [
        // Memory the program allocated: cross-memory attach, one copy.
        ("auto", "own", "cma", "cma"),
        // Memory te allocated: shared memory, mapped by the other process.
        ("auto", "managed", "shm", "shm"),
        ("shm", "managed", "shm", "shm"),
        // Memory te allocated on the (stand-in) CXL device both processes map.
        ("cxl", "managed", "cxl", "cxl"),
    ] {
        let (out, log) = run_logged(
            program(),
            &["same_host", protocol, memory],
            &[
                ("MC_LOG_LEVEL", "INFO"),
                ("MC_FORCE_TCP", "0"),
                ("MC_CXL_DEV_PATH", device_path),
            ],
        );
        let case = format!("{protocol} {memory}");
        assert!(
            out.contains(&format!(
                "same_host {case}: WRITE and READ between two processes verified"
            )),
            "{case}:\n{out}"
        );
        let line = out
            .lines()
            .find(|l| l.starts_with("installed "))
            .unwrap_or_default();
        assert!(line.contains(&format!("{installed} (")), "{case}: {line}");
        assert!(
            log.lines().any(|l| l.contains("transport chosen")
                && l.contains(&format!("transport=\"{chosen}\""))),
            "{case}: no choice of {chosen} in the log:\n{log}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_engines_figures_are_read_from_c() {
    let out = run("metrics");
    assert!(
        out.contains("metrics: counted from C, switched on and off"),
        "{out}"
    );
}

#[test]
fn bad_inputs_get_their_codes_and_the_engine_keeps_serving() {
    let (out, log) = run_logged(program(), &["bad"], &[]);
    assert!(
        out.contains("bad: NULL, destroyed and made-up handles refused"),
        "{out}"
    );
    assert!(
        out.contains("bad: every bad input refused with its code"),
        "{out}"
    );
    // A C caller gets only a code: the reason is logged at MC_LOG_LEVEL's default (WARNING),
    // naming the entry point, on each of the C API's conventions.
    for function in [
        "registerLocalMemory",
        "freeBatchID",
        "getTransferStatus",
        "openSegment",
        "allocateBatchID",
    ] {
        assert!(
            log.lines().any(|l| l.contains("WARN")
                && l.contains("C API call failed")
                && l.contains(&format!("function=\"{function}\""))
                && l.contains("error=")),
            "no logged reason for {function}:\n{log}"
        );
    }
}

/// The function names a header declares (a name followed by `(` at the start of a
/// declaration, after its return type).
fn declared(header: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut statement = String::new();
    for line in header.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with("/*") || line.starts_with('*') {
            continue;
        }
        statement.push_str(line);
        statement.push(' ');
        if line.ends_with(';') {
            let s = std::mem::take(&mut statement);
            if s.starts_with("typedef") || s.starts_with("struct") || !s.contains('(') {
                continue;
            }
            let before = s.split('(').next().unwrap_or_default();
            if let Some(name) = before
                .split(|c: char| c.is_whitespace() || c == '*')
                .rfind(|w| !w.is_empty())
            {
                names.push(name.to_string());
            }
        }
        if line.ends_with('}') || line.ends_with("};") {
            statement.clear();
        }
    }
    names.sort();
    names
}

#[test]
fn the_library_exports_exactly_what_the_headers_declare() {
    let read = |p: &str| std::fs::read_to_string(crate_dir().join(p)).unwrap();
    let mooncake = declared(&read("include/transfer_engine_c.h"));
    let tent = declared(&read("include/tent/transfer_engine.h"));
    // Mooncake's 27, and te's extensions (`te_*`).
    let (extensions, theirs): (Vec<&String>, Vec<&String>) =
        mooncake.iter().partition(|n| n.starts_with("te_"));
    assert_eq!(
        theirs.len(),
        27,
        "Mooncake's functions in transfer_engine_c.h: {theirs:?}"
    );
    assert_eq!(
        extensions,
        [
            "te_allocateManagedBuffer",
            "te_cancelBatch",
            "te_freeManagedBuffer",
            "te_getMetrics",
            "te_openFile",
            "te_waitBatch"
        ],
        "te's extensions in transfer_engine_c.h"
    );
    assert_eq!(
        tent.len(),
        33,
        "functions in tent/transfer_engine.h: {tent:?}"
    );
    let nm = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(library_dir().join("libtransfer_engine.so"))
        .output()
        .expect("run nm");
    let symbols = String::from_utf8_lossy(&nm.stdout);
    let exported: Vec<&str> = symbols
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            (kind == "T").then_some(name)
        })
        .collect();
    for n in mooncake.iter().chain(&tent) {
        assert!(
            exported.contains(&n.as_str()),
            "{n} is declared but not exported"
        );
    }
    // Every exported C-named function (Mooncake's camelCase, or tent_*) is declared.
    for name in exported {
        let camel = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && name.chars().any(|c| c.is_ascii_uppercase())
            && !name.contains('_');
        if camel {
            assert!(
                mooncake.iter().any(|n| n == name),
                "{name} is exported but not declared"
            );
        }
        if name.starts_with("te_") {
            assert!(
                mooncake.iter().any(|n| n == name),
                "{name} is exported but not declared"
            );
        }
        if name.starts_with("tent_") {
            assert!(
                tent.iter().any(|n| n == name),
                "{name} is exported but not declared"
            );
        }
    }
}
