//! The README's file-segment example, runnable: writes 1 MiB of memory into a file through the
//! engine, reads it back into other memory, and checks every byte.
//! `cargo run -p te-uring --example file_segment [PATH]`

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use te_core::{
    Config, FileAccess, HostBuffer, Opcode, Permission, TransferEngine, TransferRequest,
    TransferState,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from("te-file-segment.dat"), PathBuf::from);
    let engine = TransferEngine::init(Config::from_env()?, "P2PHANDSHAKE", "127.0.0.1")?;
    engine.install_transport(te_uring::file_transport(te_uring::FileOptions::default()))?;
    std::fs::File::create(&path)?.set_len(1 << 20)?;

    let out = Arc::new(HostBuffer::new(1 << 20)?);
    let back = Arc::new(HostBuffer::new(1 << 20)?);
    let bytes: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    out.write_at(0, &bytes)?;
    engine.register_buffer(&out, "cpu:0", Permission::LocalOnly)?;
    engine.register_buffer(&back, "cpu:0", Permission::LocalOnly)?;

    let file = engine.open_file_segment(&path, FileAccess::ReadWrite)?;
    for (opcode, buf) in [(Opcode::Write, &out), (Opcode::Read, &back)] {
        let batch = engine.allocate_batch(1)?;
        let request = TransferRequest {
            opcode,
            source: buf.addr(),
            target_id: file,
            target_offset: 0,
            length: 1 << 20,
        };
        engine.submit(batch, &[request])?;
        let status = engine.wait(batch, Duration::from_secs(30))?;
        engine.free_batch(batch)?;
        assert_eq!(status.state, TransferState::Completed, "{opcode:?}");
    }
    assert!(
        back.to_vec(0, 1 << 20)? == bytes,
        "read back what was written"
    );
    let used: Vec<String> = engine
        .transport_capabilities()
        .iter()
        .map(|(name, caps)| format!("{name} ({caps})"))
        .collect();
    println!(
        "1 MiB written to {} and read back intact via {}",
        path.display(),
        used.join(", ")
    );
    std::fs::remove_file(&path)?;
    Ok(())
}
