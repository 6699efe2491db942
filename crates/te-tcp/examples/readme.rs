//! The README's API example, kept compiling: writes 18 bytes to the first buffer of a target
//! segment (`cargo run -p te-bench -- --mode=target` prints one) and waits for completion.
//!
//! Usage: `cargo run --example readme -- HOST:PORT`

use std::{sync::Arc, time::Duration};
use te_core::{
    Config, HostBuffer, Opcode, Permission, TransferEngine, TransferRequest, TransferState,
};

fn main() -> te_core::Result<()> {
    let Some(target) = std::env::args().nth(1) else {
        eprintln!("usage: readme HOST:PORT (a target's segment name)");
        return Ok(());
    };
    let engine = TransferEngine::init(Config::from_env()?, "P2PHANDSHAKE", "")?;
    engine.install_transport(Arc::new(te_tcp::TcpTransport::new()))?;
    let local = Arc::new(HostBuffer::new(1 << 20)?);
    local.write_at(0, b"hello, decode node")?;
    engine.register_buffer(&local, "*", Permission::LocalOnly)?;

    let peer = engine.open_segment(&target)?;
    let remote = engine.segment(peer)?.desc().buffers[0].addr;
    let batch = engine.allocate_batch(1)?;
    let write = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: peer,
        target_offset: remote,
        length: 18,
    };
    engine.submit(batch, &[write])?;
    let status = engine.wait(batch, Duration::from_secs(10))?;
    assert_eq!(status.state, TransferState::Completed);
    engine.free_batch(batch)?;
    eprintln!("wrote 18 bytes to {target}");
    Ok(())
}
