//! The shape rules of `cargo xtask tidy`, each a ratchet on today's code:
//!
//! - No library function over [`FN_MAX_LINES`] lines unless `xtask/long-functions.txt` lists it;
//!   a listed function that is gone or has shrunk under the limit must leave the list, so the
//!   list only shrinks.
//! - `unsafe_code` is denied by the workspace's lints; the only library files that allow it are
//!   the boundary files in [`UNSAFE_BOUNDARY`].
//! - te-core's modules import each other without circles.
//! - te-testkit is only ever a dev-dependency.
//! - `docs/*.md`: one level-1 heading, first; no heading skips a level; no line over
//!   [`DOCS_MAX_WIDTH`] characters outside tables, code blocks and the generated report.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::tidy::{read, rust_files};

/// Longest library function, in lines (its signature to its closing brace).
const FN_MAX_LINES: usize = 70;
/// The functions over [`FN_MAX_LINES`] today: `path name` per line.
const LONG_FUNCTIONS: &str = "xtask/long-functions.txt";
/// Longest line of `docs/*.md` outside tables and code.
const DOCS_MAX_WIDTH: usize = 200;
/// Library files that may allow `unsafe_code`: te's boundaries with the OS, the CUDA driver,
/// the NIC, the C ABI and Python, and the few places that hand registered memory to them.
const UNSAFE_BOUNDARY: [&str; 20] = [
    "crates/te-sys/src/lib.rs",
    "crates/te-cuda/src/lib.rs",
    "crates/te-capi/src/lib.rs",
    "crates/te-py/src/lib.rs",
    "crates/te-py/src/engine.rs",
    "crates/te-py/src/dlpack.rs",
    "crates/te-py/src/rpc.rs",
    "crates/te-rdma/src/verbs.rs",
    "crates/te-tcp/src/sys.rs",
    "crates/te-uring/src/uring.rs",
    "crates/te-uring/src/bufio.rs",
    "crates/te-core/src/engine/registration.rs",
    "crates/te-core/src/memory.rs",
    "crates/te-core/src/transport.rs",
    "crates/te-cxl/src/device.rs",
    "crates/te-cxl/src/lib.rs",
    "crates/te-gds/src/cufile.rs",
    "crates/te-gds/src/lib.rs",
    "crates/te-nvlink/src/handle.rs",
    "crates/te-shm/src/lib.rs",
];
/// Library files of te-facade that forward the registration contract of raw addresses.
const UNSAFE_FORWARDING: [&str; 3] = [
    "crates/te-facade/src/engine.rs",
    "crates/te-facade/src/managed.rs",
    "crates/te-facade/src/runtime.rs",
];
/// Circles among te-core's modules that remain (none: the list is here to stay empty).
const KNOWN_CIRCLES: [&[&str]; 0] = [];

/// Every shape rule's problems.
pub(crate) fn check() -> Result<Vec<String>, String> {
    let mut problems = long_functions()?;
    problems.extend(unsafe_allows()?);
    problems.extend(core_circles()?);
    problems.extend(docs()?);
    problems.extend(testkit_for_tests()?);
    Ok(problems)
}

/// Sections of a manifest where `te-testkit` is named, other than `[dev-dependencies]`.
pub(crate) fn testkit_outside_dev(manifest: &str) -> Vec<String> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
        } else if line.starts_with("te-testkit") && section != "[dev-dependencies]" {
            out.push(section.clone());
        }
    }
    out
}

fn testkit_for_tests() -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    for manifest in crate_dirs()?.iter().map(|d| d.join("Cargo.toml")) {
        if manifest.is_file() {
            for section in testkit_outside_dev(&read(&manifest)?) {
                problems.push(format!(
                    "{}: te-testkit under {section}: it is a dev-dependency only",
                    manifest.display()
                ));
            }
        }
    }
    Ok(problems)
}

/// `line` without string and character literals and comments, for counting braces.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                while let Some(d) = chars.next() {
                    match d {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '\'' => {
                // A character literal ('{', '\''), or a lifetime: skip a literal only.
                let rest: String = chars.clone().take(4).collect();
                if let Some(end) = rest
                    .find('\'')
                    .filter(|&e| e == 1 || rest.starts_with('\\'))
                {
                    for _ in 0..=end {
                        chars.next();
                    }
                }
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

/// The name of the function `line` declares, if it does.
fn declared_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    rest = rest.strip_prefix("extern \"C\" ").unwrap_or(rest);
    let name = rest.strip_prefix("fn ")?;
    let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&name[..end])
}

/// Functions of `text` with their length in lines, test modules left out.
pub(crate) fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let next = lines.get(i + 1).map_or("", |l| l.trim_start());
        if line.trim() == "#[cfg(test)]" && next.starts_with("mod ") {
            break;
        }
        let Some(name) = declared_fn(line) else {
            continue;
        };
        let (mut depth, mut opened) = (0i64, false);
        for (j, l) in lines.iter().enumerate().skip(i) {
            let code = code_of(l);
            if !opened && code.contains(';') && !code.contains('{') {
                break;
            }
            opened |= code.contains('{');
            depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
            if opened && depth <= 0 {
                out.push((name.to_string(), j - i + 1));
                break;
            }
        }
    }
    out
}

/// Every crate's directory: `crates/*`.
fn crate_dirs() -> Result<Vec<std::path::PathBuf>, String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("crates").map_err(|e| format!("crates: {e}"))? {
        out.push(entry.map_err(|e| format!("crates: {e}"))?.path());
    }
    out.sort();
    Ok(out)
}

/// Library source files: `crates/*/src`, test files left out.
fn library_files() -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for dir in crate_dirs()? {
        for file in rust_files(&dir.join("src")) {
            if file.file_name().is_some_and(|n| n != "tests.rs") {
                out.push(file.display().to_string());
            }
        }
    }
    out.sort();
    Ok(out)
}

fn long_functions() -> Result<Vec<String>, String> {
    let listed: BTreeSet<String> = read(Path::new(LONG_FUNCTIONS))?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let mut long = BTreeMap::new();
    for file in library_files()? {
        for (name, n) in function_lengths(&read(Path::new(&file))?) {
            if n > FN_MAX_LINES {
                long.insert(format!("{file} {name}"), n);
            }
        }
    }
    let mut problems = Vec::new();
    for (key, n) in &long {
        if !listed.contains(key) {
            problems.push(format!(
                "{key}: {n} lines, at most {FN_MAX_LINES} (split it; the list in {LONG_FUNCTIONS} only shrinks)"
            ));
        }
    }
    for key in listed.iter().filter(|k| !long.contains_key(*k)) {
        problems.push(format!(
            "{LONG_FUNCTIONS}: `{key}` is gone or within {FN_MAX_LINES} lines: take it off the list"
        ));
    }
    Ok(problems)
}

fn unsafe_allows() -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    for file in library_files()? {
        let allowed =
            UNSAFE_BOUNDARY.contains(&file.as_str()) || UNSAFE_FORWARDING.contains(&file.as_str());
        if !allowed && read(Path::new(&file))?.contains("allow(unsafe_code)") {
            problems.push(format!(
                "{file}: allows unsafe_code outside te's unsafe boundary (xtask/src/shape.rs)"
            ));
        }
    }
    Ok(problems)
}

/// te-core's top-level modules and the others each imports (`crate::name`), test code left out.
fn core_imports() -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let src = Path::new("crates/te-core/src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rust_files(src) {
        let rel = file.strip_prefix(src).map_err(|e| e.to_string())?;
        let first = rel
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy());
        let module = first
            .unwrap_or_default()
            .trim_end_matches(".rs")
            .to_string();
        if ["lib", "tests"].contains(&module.as_str()) || file.ends_with("tests.rs") {
            continue;
        }
        let text = read(&file)?;
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let uses = graph.entry(module.clone()).or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let name: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    uses.insert(name);
                }
            }
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for uses in graph.values_mut() {
        uses.retain(|m| modules.contains(m));
    }
    Ok(graph)
}

/// The modules that reach each other, as sorted groups of two or more.
pub(crate) fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut groups = BTreeSet::new();
    for (m, r) in &reaches {
        let group: Vec<String> = r
            .iter()
            .filter(|o| reaches.get(o).is_some_and(|back| back.contains(*m)))
            .cloned()
            .collect();
        if group.len() > 1 {
            groups.insert(group);
        }
    }
    groups.into_iter().collect()
}

fn core_circles() -> Result<Vec<String>, String> {
    let known: Vec<Vec<String>> = KNOWN_CIRCLES
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect();
    Ok(circles(&core_imports()?)
        .into_iter()
        .filter(|c| !known.contains(c))
        .map(|c| {
            format!(
                "crates/te-core/src: modules {} import each other in a circle",
                c.join(", ")
            )
        })
        .collect())
}

/// The heading and width rules of one doc.
pub(crate) fn doc_problems(name: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let (mut fenced, mut generated) = (false, false);
    let mut levels = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let at = format!("{name}:{}", i + 1);
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if line.starts_with("<!-- report:start") {
            generated = true;
        } else if line.starts_with("<!-- performance:end") {
            generated = false;
        }
        if fenced || generated {
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes > 0 && line[hashes..].starts_with(' ') {
            let before = levels.last().copied().unwrap_or(0);
            if levels.is_empty() && hashes != 1 || !levels.is_empty() && hashes == 1 {
                problems.push(format!("{at}: one level-1 heading, and it comes first"));
            } else if hashes > before + 1 {
                problems.push(format!(
                    "{at}: a level-{hashes} heading under a level-{before} one"
                ));
            }
            levels.push(hashes);
        } else if line.chars().count() > DOCS_MAX_WIDTH && !line.trim_start().starts_with('|') {
            problems.push(format!(
                "{at}: {} characters, at most {DOCS_MAX_WIDTH} outside tables and code",
                line.chars().count()
            ));
        }
    }
    problems
}

fn docs() -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir("docs")
        .map_err(|e| format!("docs: {e}"))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.sort();
    for file in files {
        problems.extend(doc_problems(&file.display().to_string(), &read(&file)?));
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_are_measured_to_their_closing_brace() {
        let text = "fn a() {\n    let c = '{';\n    let s = \"}}\";\n}\npub(crate) fn b(x: u8)\n    -> u8\n{\n    x\n}\nfn decl();\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\n";
        assert_eq!(
            function_lengths(text),
            vec![("a".to_string(), 4), ("b".to_string(), 5)]
        );
    }

    #[test]
    fn circles_are_found_and_chains_are_not() {
        let graph = |edges: &[(&str, &str)]| {
            let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (a, b) in edges {
                g.entry(a.to_string()).or_default().insert(b.to_string());
                g.entry(b.to_string()).or_default();
            }
            g
        };
        assert!(circles(&graph(&[("a", "b"), ("b", "c")])).is_empty());
        let found = circles(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]));
        assert_eq!(found, vec![vec!["a".to_string(), "b".into(), "c".into()]]);
    }

    #[test]
    fn testkit_is_found_outside_dev_dependencies() {
        let manifest = "[dependencies]\nte-testkit.workspace = true\n\n[dev-dependencies]\nte-testkit.workspace = true\n[features]\nx = []\n";
        assert_eq!(
            testkit_outside_dev(manifest),
            vec!["[dependencies]".to_string()]
        );
        assert!(
            testkit_outside_dev("[dev-dependencies]\nte-testkit = { path = \"x\" }\n").is_empty()
        );
    }

    #[test]
    fn doc_rules_name_the_line() {
        let long = "x".repeat(DOCS_MAX_WIDTH + 1);
        let text = format!(
            "# T\n\n### skipped\n\n{long}\n\n| {long} |\n\n```\n# not a heading\n{long}\n```\n# second\n"
        );
        assert_eq!(
            doc_problems("d.md", &text),
            vec![
                "d.md:3: a level-3 heading under a level-1 one".to_string(),
                format!(
                    "d.md:5: {} characters, at most {DOCS_MAX_WIDTH} outside tables and code",
                    DOCS_MAX_WIDTH + 1
                ),
                "d.md:13: one level-1 heading, and it comes first".to_string(),
            ]
        );
    }
}
