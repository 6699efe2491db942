//! te-gds. Without CUDA or cuFile (CI), install fails with a sentence naming what is missing.
//! With a GPU (`cargo xtask gpu`, `#[ignore]`d here), GPU memory is written to and read back
//! from a real file through cuFile, byte-verified against the file on disk.

#![allow(unsafe_code)] // registers device memory by address, as a GPU program does

use std::sync::Arc;

use te_core::{
    Config, FileAccess, Opcode, Permission, SubmitOptions, TransferEngine, TransferRequest,
    TransferState,
};
use te_cuda::DeviceBuffer;
use te_gds::GdsTransport;
use te_testkit::{pattern, transfer_one};

fn engine() -> TransferEngine {
    let mut c = Config::default();
    c.tcp_bind_address = Some("127.0.0.1".parse().unwrap());
    TransferEngine::init(c, "P2PHANDSHAKE", "127.0.0.1").unwrap()
}

#[test]
fn without_cuda_or_cufile_install_says_what_is_missing() {
    let e = engine();
    match e.install_transport(Arc::new(GdsTransport::new())) {
        Ok(()) => assert!(te_cuda::driver().is_ok() && te_gds::open_driver().is_ok()),
        Err(err) => {
            let msg = err.to_string();
            assert!(msg.starts_with("transport gds:"), "{msg}");
            assert!(
                msg.contains("libcuda") || msg.contains("libcufile") || msg.contains("cuFile"),
                "{msg}"
            );
        }
    }
}

#[test]
#[ignore = "needs a GPU and cuFile (GDS or its compatibility mode): cargo xtask gpu"]
fn gpu_memory_to_a_file_and_back() {
    const LEN: usize = 16 << 20;
    let e = engine();
    e.install_transport(Arc::new(GdsTransport::new())).unwrap();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join("te-gds.dat");
    std::fs::write(&path, vec![0u8; LEN]).unwrap();
    let file = e.open_file_segment(&path, FileAccess::ReadWrite).unwrap();
    let d = DeviceBuffer::new(0, LEN).unwrap();
    d.write_at(0, &pattern(8, LEN)).unwrap();
    // SAFETY: `d` outlives its registration (the engine is dropped first).
    unsafe { e.register_memory(d.addr() as *mut u8, LEN, "*", Permission::LocalOnly) }.unwrap();
    let via = SubmitOptions::default().via("gds");
    let run = |opcode| {
        let r = TransferRequest {
            opcode,
            source: d.addr(),
            target_id: file,
            target_offset: 0,
            length: LEN as u64,
        };
        let (state, error) = transfer_one(&e, r, &via);
        assert_eq!(state, TransferState::Completed, "{error:?}");
    };
    run(Opcode::Write);
    assert!(
        std::fs::read(&path).unwrap() == pattern(8, LEN),
        "GPU → file"
    );
    d.write_at(0, &vec![0; LEN]).unwrap();
    run(Opcode::Read);
    assert!(d.to_vec(0, LEN).unwrap() == pattern(8, LEN), "file → GPU");
    std::fs::remove_file(&path).unwrap();
}
