//! `cargo xtask gpu`: the GPU suite, for a machine with a GPU: the `#[ignore]`d GPU tests of
//! te-nvlink (IPC and fabric handles between two processes, host ↔ GPU in one process, GPU
//! memory over TCP staged) and te-gds (GPU memory to a file and back through cuFile), a
//! verified `te-bench --use_vram` run over nvlink, then the IPC benchmark next to `cuMemcpy`
//! (`te-nvlink/examples/ipc_bench.rs`). Every step runs even when one fails; the summary names
//! the failures. Without a GPU it says so and fails.

use std::process::Command;

pub(crate) fn gpu() -> Result<(), String> {
    let visible = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .is_ok_and(|o| o.status.success());
    if !visible {
        return Err(
            "no GPU here (nvidia-smi -L failed): the GPU suite needs a machine with a CUDA driver"
                .into(),
        );
    }
    // Every step runs, so one failure still leaves the others' results (a GPU machine is rare).
    let mut failed = Vec::new();
    let mut step = |label: &str, args: &[&str]| {
        eprintln!("xtask gpu: {label}");
        let ok = crate::cargo()
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        eprintln!(
            "xtask gpu: {label}: {}",
            if ok { "passed" } else { "FAILED" }
        );
        if !ok {
            failed.push(label.to_string());
        }
    };
    step(
        "te-core: the CUDA driver loads and sees a device",
        &[
            "test",
            "--release",
            "-p",
            "te-core",
            "--features",
            "cuda",
            "--lib",
            "cuda",
        ],
    );
    step(
        "te-nvlink and te-gds GPU suites",
        &[
            "test",
            "--release",
            "-p",
            "te-nvlink",
            "-p",
            "te-gds",
            "--",
            "--ignored",
            "--test-threads=1",
        ],
    );
    for (protocol, block) in [("nvlink", "4194304"), ("tcp", "1048576")] {
        step(
            &format!("te-bench --use_vram over {protocol}, verified"),
            &[
                "run",
                "--release",
                "-p",
                "te-bench",
                "--",
                "--loopback",
                "--use_vram",
                &format!("--protocol={protocol}"),
                "--operation=write",
                &format!("--block_size={block}"),
                "--batch_size=16",
                "--threads=2",
                "--duration=3",
                "--verify",
            ],
        );
    }
    step(
        "IPC copies vs cuMemcpy, 64 MiB",
        &[
            "run",
            "--release",
            "-p",
            "te-nvlink",
            "--example",
            "ipc_bench",
        ],
    );
    match failed.is_empty() {
        true => Ok(()),
        false => Err(format!("failed: {}", failed.join("; "))),
    }
}
