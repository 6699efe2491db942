//! A client's threads end with its last clone (alone in this binary: other tests' threads
//! would blur the count).

mod common;

use common::*;
use te_rpc::Owned;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn a_dropped_client_leaves_no_threads_behind() {
    let (srv, rx) = server(&quick());
    let target = srv.local_addr().to_string();
    let before = threads();
    for _ in 0..20 {
        let c = client(quick());
        let copy = c.clone();
        block_on(copy.send_async(&target, Owned::Data(b"x".to_vec()))).unwrap();
        drop(copy);
        drop(c);
    }
    assert_eq!(rx.try_iter().count(), 20);
    let after = threads();
    assert!(
        after <= before + 2,
        "threads: {before} before, {after} after 20 clients"
    );
}
