//! `cargo xtask gpu`: the GPU suite, for a machine with a GPU: the `#[ignore]`d GPU tests of
//! te-nvlink (IPC between two processes, host ↔ GPU in one process, GPU memory over TCP
//! staged) and te-gds (GPU memory to a file and back through cuFile), then the IPC benchmark
//! next to `cuMemcpy` (`te-nvlink/examples/ipc_bench.rs`). Without a GPU it says so and fails.

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
    let step = |label: &str, args: &[&str]| -> Result<(), String> {
        eprintln!("xtask gpu: {label}");
        let ok = crate::cargo()
            .args(args)
            .status()
            .map_err(|e| format!("{label}: {e}"))?
            .success();
        match ok {
            true => Ok(()),
            false => Err(format!("{label} failed")),
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
    )?;
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
    )?;
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
    )
}
