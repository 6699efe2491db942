//! The house rules (`cargo xtask tidy`) as a test: `cargo test` fails where tidy does.

use std::process::Command;

#[test]
fn every_house_rule_holds() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("tidy")
        .current_dir(root)
        .output()
        .expect("xtask runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
