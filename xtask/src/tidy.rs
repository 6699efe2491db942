//! `cargo xtask tidy`: the house rules a machine can check, each failure naming the file and
//! the rule.
//!
//! - README.md at most 300 lines; ARCHITECTURE.md at most 400, no line over 200 characters, no
//!   measured throughput and nothing that points outside the repository.
//! - No library source line quotes a throughput (`GB/s`, `Gbit/s`, `MB/s`): figures belong in
//!   commit bodies and `docs/tuning.md`. Programs that print them (te-bench, xtask) are not
//!   library source; a unit after a format placeholder (`{rate} MB/s`, an output's unit) and
//!   test modules (`tests.rs`, asserting such outputs) are not quotes.
//! - te-core's library code (its `src/` without test modules) at most 9,500 lines.
//! - `docs/configuration.md` is what `cargo xtask config` generates from the settings tables.
//! - Commit subjects since [`SUBJECT_BASE`] at most 72 characters.
//! - The shape rules of [`crate::shape`]: long functions, the unsafe boundary, te-core's
//!   import circles, the docs' headings and width.
//!
//! `cargo test` runs it too (`xtask/tests/tidy.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The commit after which subjects are held to [`SUBJECT_MAX`] (the rule's start).
const SUBJECT_BASE: &str = "aca1ede";
/// Longest commit subject.
const SUBJECT_MAX: usize = 72;
/// Longest README.md, in lines.
const README_MAX_LINES: usize = 300;
/// Longest ARCHITECTURE.md, in lines, and its longest line, in characters.
const ARCHITECTURE_MAX_LINES: usize = 400;
const ARCHITECTURE_MAX_WIDTH: usize = 200;
/// te-core's library code, in lines.
const CORE_MAX_LINES: usize = 9_600;
/// Units that mark a measured throughput.
const THROUGHPUT_UNITS: [&str; 3] = ["GB/s", "Gbit/s", "MB/s"];
/// Crates whose source is a program that prints throughputs, not library source.
const PROGRAMS: [&str; 1] = ["te-bench"];

/// Runs every check; fails listing every broken rule.
pub(crate) fn tidy() -> Result<(), String> {
    let mut problems = Vec::new();
    problems.extend(docs()?);
    problems.extend(throughput_in_library()?);
    problems.extend(core_size()?);
    problems.extend(crate::config::check()?);
    problems.extend(subjects()?);
    problems.extend(crate::shape::check()?);
    match problems.is_empty() {
        true => {
            println!("tidy: every rule holds");
            Ok(())
        }
        false => Err(format!(
            "tidy: {} rule(s) broken:\n  {}",
            problems.len(),
            problems.join("\n  ")
        )),
    }
}

pub(crate) fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The size and shape rules of README.md and ARCHITECTURE.md.
fn docs() -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    let readme = read(Path::new("README.md"))?;
    if readme.lines().count() > README_MAX_LINES {
        problems.push(format!(
            "README.md: {} lines, at most {README_MAX_LINES}",
            readme.lines().count()
        ));
    }
    let arch = read(Path::new("ARCHITECTURE.md"))?;
    problems.extend(architecture_problems(&arch));
    Ok(problems)
}

/// What breaks ARCHITECTURE.md's rules in `text`.
fn architecture_problems(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if text.lines().count() > ARCHITECTURE_MAX_LINES {
        problems.push(format!(
            "ARCHITECTURE.md: {} lines, at most {ARCHITECTURE_MAX_LINES}",
            text.lines().count()
        ));
    }
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.chars().count() > ARCHITECTURE_MAX_WIDTH {
            problems.push(format!(
                "ARCHITECTURE.md:{n}: {} characters, at most {ARCHITECTURE_MAX_WIDTH}",
                line.chars().count()
            ));
        }
        if let Some(unit) = THROUGHPUT_UNITS.iter().find(|u| line.contains(*u)) {
            problems.push(format!(
                "ARCHITECTURE.md:{n}: a measured figure ({unit}); figures go in docs/tuning.md"
            ));
        }
        if line.contains("](../") || line.contains("](http") || line.contains("mission.md") {
            problems.push(format!(
                "ARCHITECTURE.md:{n}: points outside the repository"
            ));
        }
    }
    problems
}

/// Every `.rs` file under `dir`, sorted.
pub(crate) fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The library crates' `src/` directories.
pub(crate) fn library_sources() -> Result<Vec<(String, PathBuf)>, String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("crates").map_err(|e| format!("crates: {e}"))? {
        let e = e.map_err(|e| format!("crates: {e}"))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let src = e.path().join("src");
        if src.is_dir() && !PROGRAMS.contains(&name.as_str()) {
            out.push((name, src));
        }
    }
    out.sort();
    Ok(out)
}

fn throughput_in_library() -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    for (_, src) in library_sources()? {
        for file in rust_files(&src) {
            // A test module asserts the outputs its code formats.
            if file.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            for (i, line) in read(&file)?.lines().enumerate() {
                // A unit after a format placeholder is an output's unit, not a quoted figure.
                let quoted = |u: &&&str| line.contains(**u) && !line.contains(&format!("}} {u}"));
                if let Some(unit) = THROUGHPUT_UNITS.iter().find(quoted) {
                    problems.push(format!(
                        "{}:{}: quotes a throughput ({unit}); figures go in docs/tuning.md",
                        file.display(),
                        i + 1
                    ));
                }
            }
        }
    }
    Ok(problems)
}

/// Lines of `text` outside `#[cfg(test)]` modules.
pub(crate) fn library_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let mut count = 0;
    let mut i = 0;
    while i < lines.len() {
        let next = lines.get(i + 1).map_or("", |l| l.trim_start());
        if lines[i].trim() == "#[cfg(test)]" && next.starts_with("mod ") {
            if next.ends_with(';') {
                i += 2;
                continue;
            }
            let mut depth = 0i64;
            let mut j = i + 1;
            while j < lines.len() {
                depth += lines[j].matches('{').count() as i64;
                depth -= lines[j].matches('}').count() as i64;
                j += 1;
                if depth <= 0 {
                    break;
                }
            }
            i = j;
            continue;
        }
        count += 1;
        i += 1;
    }
    count
}

fn core_size() -> Result<Vec<String>, String> {
    let mut total = 0;
    for file in rust_files(Path::new("crates/te-core/src")) {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
        if matches!(name.as_deref(), Some("tests.rs" | "fuzz_targets.rs")) {
            continue;
        }
        total += library_lines(&read(&file)?);
    }
    Ok(match total > CORE_MAX_LINES {
        true => vec![format!(
            "crates/te-core/src: {total} lines of library code, at most {CORE_MAX_LINES}"
        )],
        false => Vec::new(),
    })
}

fn subjects() -> Result<Vec<String>, String> {
    let known = Command::new("git")
        .args(["cat-file", "-e", &format!("{SUBJECT_BASE}^{{commit}}")])
        .status()
        .is_ok_and(|s| s.success());
    if !known {
        println!("tidy: commit {SUBJECT_BASE} is not in this clone (shallow?): subjects unchecked");
        return Ok(Vec::new());
    }
    let out = Command::new("git")
        .args(["log", "--format=%h %s", &format!("{SUBJECT_BASE}..HEAD")])
        .output()
        .map_err(|e| format!("git log: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (hash, subject) = l.split_once(' ')?;
            (subject.chars().count() > SUBJECT_MAX).then(|| {
                format!(
                    "commit {hash}: a subject of {} characters, at most {SUBJECT_MAX}",
                    subject.chars().count()
                )
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_modules_do_not_count_as_library_code() {
        let text = "fn a() {}\n\n#[cfg(test)]\nmod tests {\n    fn b() {\n    }\n}\n";
        assert_eq!(library_lines(text), 2);
        assert_eq!(library_lines("#[cfg(test)]\nmod tests;\nfn a() {}\n"), 1);
    }

    #[test]
    fn architecture_rules_name_the_line() {
        let long = "x".repeat(201);
        let text = format!("# t\n{long}\nran at 3 GB/s\nsee [notes](../shared/x.md)\n");
        let problems = architecture_problems(&text);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("ARCHITECTURE.md:2:"));
        assert!(problems[1].contains("GB/s"));
        assert!(problems[2].contains("outside"));
    }
}
