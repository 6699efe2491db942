//! The scheduling policy of the threads of te's listener for Mooncake initiators, read from
//! `/proc`: a loop serving a WRITE from this host runs in `SCHED_BATCH`, and back in the
//! default once it serves a READ; with `MC_TE_MOONCAKE_BATCH_LOCAL_WRITES=0` it stays in the
//! default. One test in its own process, so that no other engine's loops are counted.

mod common;

use std::io::Write;

use common::*;
use te_core::{Opcode, Permission};

/// `SCHED_BATCH` in `/proc/PID/task/TID/stat`'s policy field.
const SCHED_BATCH: u32 = 3;

/// The policies of this process's threads named `te-tcp-mooncake` (the loops; the name is cut
/// to 15 bytes there, as the kernel keeps it).
fn loop_policies() -> Vec<u32> {
    let mut policies = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let path = task.unwrap().path();
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != "te-tcp-mooncake" {
            continue;
        }
        // Field 41 is the policy; the fields after the name start at field 3.
        let policy = stat[close + 1..].split_whitespace().nth(41 - 3).unwrap();
        policies.push(policy.parse().unwrap());
    }
    policies
}

/// One acknowledged request of `len` bytes at `addr` on `s`, its status checked.
fn serve(s: &mut std::net::TcpStream, opcode: Opcode, addr: u64, data: &[u8]) {
    s.write_all(&mooncake_header(opcode, addr, data.len() as u64, true))
        .unwrap();
    if opcode == Opcode::Write {
        s.write_all(data).unwrap();
    }
    let read = (opcode == Opcode::Read).then_some(data);
    expect_mooncake_ok(s, read, &format!("{opcode:?}"));
}

#[test]
fn loops_serve_local_writes_in_batch_unless_told_not_to() {
    let data = pattern(7, 64 << 10);
    {
        let t = engine_with(compat_config(&[]));
        let mem = buffer(1 << 20);
        register(&t, &mem, Permission::RemoteReadWrite);
        let mut s = connect_compat(&t);
        let before = loop_policies();
        assert_eq!(before.len(), 2, "two loops by default: {before:?}");
        assert!(!before.contains(&SCHED_BATCH), "{before:?}");
        serve(&mut s, Opcode::Write, mem.addr(), &data);
        let after_write = loop_policies();
        assert_eq!(
            after_write.iter().filter(|p| **p == SCHED_BATCH).count(),
            1,
            "the loop that served the WRITE is in batch: {after_write:?}"
        );
        serve(&mut s, Opcode::Read, mem.addr(), &data);
        let after_read = loop_policies();
        assert!(
            !after_read.contains(&SCHED_BATCH),
            "a READ is served in the default policy: {after_read:?}"
        );
        serve(&mut s, Opcode::Write, mem.addr(), &data);
        assert!(
            loop_policies().contains(&SCHED_BATCH),
            "and WRITEs again in batch"
        );
        serve(&mut s, Opcode::Read, mem.addr(), &data);
    }
    let t = engine_with_tcp(compat_config(&[]), tcp(|t| t.batch_local_writes = false));
    let mem = buffer(1 << 20);
    register(&t, &mem, Permission::RemoteReadWrite);
    let mut s = connect_compat(&t);
    serve(&mut s, Opcode::Write, mem.addr(), &data);
    serve(&mut s, Opcode::Write, mem.addr() + 4096, &data);
    let policies = loop_policies();
    assert!(
        !policies.contains(&SCHED_BATCH),
        "with MC_TE_MOONCAKE_BATCH_LOCAL_WRITES=0 no loop is in batch: {policies:?}"
    );
}
