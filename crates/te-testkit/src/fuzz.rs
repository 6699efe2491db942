//! A small mutation fuzzer for te's decoders of bytes from the network (for every crate's tests). Stable Rust, no instrumentation: seeds are mutated (bit flips, byte
//! values at the edges, insertions, deletions, repeats, splices, length fields) and fed to a
//! target that must not panic, for a time budget. A panic is saved under
//! `target/fuzz-crashes/<target>-<hash>.bin` and fails the run; saved inputs placed in a
//! crate's `fuzz/regressions/<target>/` are replayed first, every run.
//!
//! `cargo xtask fuzz <target> --secs N` runs one target for N seconds; CI runs each briefly.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The time budget: `TE_FUZZ_SECS` (seconds, fractional), else `default`.
pub fn budget(default: f64) -> Duration {
    let secs = std::env::var("TE_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(default);
    Duration::from_secs_f64(secs)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const EDGES: [u8; 8] = [0, 1, 0x7f, 0x80, 0xff, b'\n', b'"', b':'];

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, seeds: &[&[u8]]) {
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = EDGES[rng.below(EDGES.len())];
            }
            2 => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(8);
                for _ in 0..n {
                    input.insert(i, rng.next() as u8);
                }
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(16));
                input.drain(i..i + n);
            }
            4 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(32));
                let chunk: Vec<u8> = input[i..i + n].to_vec();
                let at = rng.below(input.len() + 1);
                input.splice(at..at, chunk);
            }
            5 if !seeds.is_empty() => {
                let other = seeds[rng.below(seeds.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                input.truncate(cut);
                input.extend_from_slice(&other[from..]);
            }
            6 if len >= 8 => {
                // A length-like field: 8 bytes of an edge value.
                let i = rng.below(len - 7);
                let v: u64 = match rng.below(4) {
                    0 => 0,
                    1 => u64::MAX,
                    2 => 1 << rng.below(63),
                    _ => rng.next(),
                };
                input[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
            7 if len > 0 => input.truncate(rng.below(len)),
            _ => {
                if let Some(b) = input.last().copied() {
                    input.push(b);
                }
            }
        }
        if input.len() > 1 << 16 {
            input.truncate(1 << 16);
        }
    }
}

fn save(target: &str, input: &[u8]) -> PathBuf {
    let dir = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            // Crates' tests run in the crate directory: the workspace target is two up.
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target")
        })
        .join("fuzz-crashes");
    let _ = std::fs::create_dir_all(&dir);
    let hash = input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    });
    let path = dir.join(format!("{target}-{hash:016x}.bin"));
    let _ = std::fs::write(&path, input);
    path
}

/// Inputs saved under `dir/<target>/`, for replay.
fn regressions(dir: &Path, target: &str) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir.join(target)) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path()).ok())
        .collect()
}

/// Runs `target` on the regressions saved under `<crate_dir>/fuzz/regressions/<name>/` (pass
/// the crate's `env!("CARGO_MANIFEST_DIR")`), the seeds, then mutations of them for `budget`.
/// Returns the number of inputs run.
///
/// # Panics
/// When `target` panics on an input (saved first, its path in the message).
pub fn run(
    name: &str,
    crate_dir: &str,
    seeds: &[&[u8]],
    budget: Duration,
    target: impl Fn(&[u8]),
) -> u64 {
    let seed = std::env::var("TE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
        | 1;
    let check = |input: &[u8]| {
        if catch_unwind(AssertUnwindSafe(|| target(input))).is_err() {
            let path = save(name, input);
            panic!(
                "fuzz target {name} panicked (TE_FUZZ_SEED={seed}); input saved at {}",
                path.display()
            );
        }
    };
    let mut count = 0u64;
    let saved = Path::new(crate_dir).join("fuzz/regressions");
    for input in regressions(&saved, name) {
        check(&input);
        count += 1;
    }
    for s in seeds {
        check(s);
        count += 1;
    }
    let mut rng = Rng(seed);
    let start = Instant::now();
    let mut input = Vec::new();
    while start.elapsed() < budget {
        if input.is_empty() || rng.below(16) == 0 {
            input = seeds
                .get(rng.below(seeds.len()))
                .map_or(Vec::new(), |s| s.to_vec());
        }
        mutate(&mut rng, &mut input, seeds);
        check(&input);
        count += 1;
    }
    eprintln!(
        "fuzz {name}: {count} inputs in {:.1} s (TE_FUZZ_SEED={seed}), no panic",
        start.elapsed().as_secs_f64()
    );
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_target_is_caught_and_its_input_saved() {
        let dir = std::env::temp_dir().join(format!("te-fuzz-{}", std::process::id()));
        let crate_dir = dir.to_str().unwrap();
        let hit = std::panic::catch_unwind(|| {
            run(
                "selftest",
                crate_dir,
                &[b"abc"],
                Duration::from_secs(5),
                |b: &[u8]| {
                    assert!(!b.contains(&0xff), "found it");
                },
            )
        });
        let msg = hit
            .expect_err("the fuzzer finds a 0xff within its budget")
            .downcast::<String>()
            .map(|s| *s)
            .unwrap_or_default();
        assert!(
            msg.contains("selftest") && msg.contains("saved at"),
            "{msg}"
        );
        let path = msg.rsplit("saved at ").next().unwrap().trim();
        let saved = std::fs::read(path).unwrap();
        assert!(saved.contains(&0xff));
        // The crate's saved regressions are replayed first.
        let saved_dir = dir.join("fuzz/regressions/replay");
        std::fs::create_dir_all(&saved_dir).unwrap();
        std::fs::write(saved_dir.join("one"), b"xyz").unwrap();
        let seen = std::sync::Mutex::new(Vec::new());
        run("replay", crate_dir, &[], Duration::ZERO, |b: &[u8]| {
            seen.lock().unwrap().push(b.to_vec())
        });
        assert_eq!(seen.into_inner().unwrap(), vec![b"xyz".to_vec()]);
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
