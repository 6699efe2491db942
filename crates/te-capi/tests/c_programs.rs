//! The C API as C programs see it: `tests/c/capi_test.c` compiled with the system C compiler
//! against `include/transfer_engine_c.h` and run against the `libtransfer_engine.so` cargo
//! built; and a check that the library exports every function the header declares (and the
//! header declares every function the library exports).

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

/// The test program, compiled once.
fn program() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let lib = library_dir();
        let out = std::env::temp_dir().join(format!("te-capi-test-{}", std::process::id()));
        let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"])
            .arg("-I")
            .arg(crate_dir().join("include"))
            .arg(crate_dir().join("tests/c/capi_test.c"))
            .arg("-L")
            .arg(&lib)
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-ltransfer_engine")
            .arg("-o")
            .arg(&out)
            .status()
            .expect("run the C compiler (cc)");
        assert!(status.success(), "capi_test.c did not compile");
        out
    })
}

fn run(mode: &str) -> String {
    let out = Command::new(program())
        .arg(mode)
        .env("MC_FORCE_TCP", "1")
        .env("MC_TRANSFER_TIMEOUT", "30")
        .output()
        .expect("run capi_test");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "capi_test {mode} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
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

#[test]
fn bad_inputs_get_their_codes_and_the_engine_keeps_serving() {
    let out = run("bad");
    assert!(
        out.contains("bad: NULL, destroyed and made-up handles refused"),
        "{out}"
    );
    assert!(
        out.contains("bad: every bad input refused with its code"),
        "{out}"
    );
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
fn the_library_exports_exactly_what_the_header_declares() {
    let header = std::fs::read_to_string(crate_dir().join("include/transfer_engine_c.h")).unwrap();
    let names = declared(&header);
    assert_eq!(names.len(), 27, "functions in the header: {names:?}");
    let nm = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(library_dir().join("libtransfer_engine.so"))
        .output()
        .expect("run nm");
    let symbols = String::from_utf8_lossy(&nm.stdout);
    let exported: Vec<String> = symbols
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            (kind == "T" && names.iter().any(|n| n.eq_ignore_ascii_case(name)))
                .then(|| name.to_string())
        })
        .collect();
    for n in &names {
        assert!(exported.contains(n), "{n} is declared but not exported");
    }
    // Every exported C-named function (camelCase, no Rust mangling) is declared.
    for line in symbols.lines() {
        let mut f = line.split_whitespace();
        if let (Some(_), Some("T"), Some(name)) = (f.next(), f.next(), f.next())
            && name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && name.chars().any(|c| c.is_ascii_uppercase())
            && !name.contains('_')
        {
            assert!(
                names.iter().any(|n| n == name),
                "{name} is exported but not declared"
            );
        }
    }
}
