//! te-core's fuzz targets: every decoder of bytes from the network (control frames, segment
//! descriptors, HTTP heads and bodies, Redis replies, percent-encoded keys), each fed mutated
//! inputs for `TE_FUZZ_SECS` (1 s by default, so CI runs them all briefly). None may panic;
//! each must refuse garbage with an error. Run one longer: `cargo xtask fuzz <target> --secs N`.

use std::io::BufReader;

use crate::control::frame::{FrameType, read_frame, write_frame};
use crate::memory::Opcode;
use crate::segment::{RemoteSegment, SegmentDesc};
use te_testkit::fuzz::{budget, run};

#[test]
fn control_frame() {
    let mut frame = Vec::new();
    write_frame(&mut frame, FrameType::Metadata, b"{}").unwrap();
    let mut notify = Vec::new();
    write_frame(
        &mut notify,
        FrameType::Notify,
        br#"{"name":"a","notify_msg":"b"}"#,
    )
    .unwrap();
    // An untyped frame of older Mooncake: length, then JSON.
    let mut untyped = 9u64.to_le_bytes().to_vec();
    untyped.extend_from_slice(br#"{"a":"b"}"#);
    run(
        "control-frame",
        env!("CARGO_MANIFEST_DIR"),
        &[&frame, &notify, &untyped],
        budget(1.0),
        |b: &[u8]| {
            let mut r = b;
            while read_frame(&mut r, 1 << 16).is_ok() {}
            let mut r = b;
            while let Ok(f) = crate::control::frame::read_request_frame(&mut r, 1 << 16) {
                assert!(f.payload.len() <= 1 << 16, "bounded by the limit");
            }
            // The event loops' incremental parser reads the same frames the same way.
            let (mut at, mut blocking) = (0, b);
            while let Ok(Some((f, used))) = crate::control::frame::parse_request(&b[at..], 1 << 16)
            {
                assert!(used > 0 && f.payload.len() <= 1 << 16);
                let read = crate::control::frame::read_request_frame(&mut blocking, 1 << 16);
                assert_eq!(read.ok().as_ref(), Some(&f), "both parsers agree");
                at += used;
            }
        },
    );
}

#[test]
fn descriptor() {
    let seed = br#"{"name":"h:1","protocol":"rdma","tcp_data_port":9,"devices":[{"name":"rxe0","lid":0,"gid":"::"}],"buffers":[{"name":"cpu:0","addr":4096,"length":4096,"rkey":[7],"permission":"remote_read"}],"te_rails":[{"name":"eth0","ip":"10.0.0.1","port":9}],"priority_matrix":{"cpu:0":[["eth0"],[]]}}"#;
    let tcp =
        br#"{"name":"h:1","protocol":"tcp","buffers":[{"name":"cpu:0","addr":0,"length":1}]}"#;
    // Mooncake's: a protocol array (multi-protocol builds) and its TCP fields.
    let mooncake = br#"{"name":"h:1","protocol":["rdma","tcp"],"tcp_data_host":"h","tcp_data_port":9,"tcp_proto_version":2,"buffers":[{"name":"h:1","addr":4096,"length":4096}]}"#;
    run(
        "descriptor",
        env!("CARGO_MANIFEST_DIR"),
        &[seed, tcp, mooncake],
        budget(1.0),
        |b: &[u8]| {
            if let Ok(desc) = SegmentDesc::from_json(b) {
                let addrs: Vec<(u64, u64)> =
                    desc.buffers.iter().map(|b| (b.addr, b.length)).collect();
                let seg = RemoteSegment::new(1, "h".into(), 1, desc);
                for (addr, len) in addrs {
                    for (a, l) in [
                        (addr, len),
                        (addr, 1),
                        (addr.wrapping_add(len), 1),
                        (addr, u64::MAX),
                    ] {
                        let _ = seg.check_access(a, l, Opcode::Write);
                        let _ = seg.check_access(a, l, Opcode::Read);
                    }
                }
            }
        },
    );
}

#[test]
fn http_head() {
    let get =
        b"GET /metadata?key=mooncake%2Fram%2Fh HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc";
    let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nConnection: keep-alive\r\n\r\n{}";
    let chunked =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n";
    run(
        "http-head",
        env!("CARGO_MANIFEST_DIR"),
        &[get, reply, chunked],
        budget(1.0),
        |b: &[u8]| {
            let mut r = BufReader::new(b);
            if let Ok(Some(head)) = te_reactor::http::read_head(&mut r) {
                let _ = te_reactor::http::read_body(&mut r, &head, 1 << 16, false);
                let _ = head
                    .first_line
                    .split(' ')
                    .nth(1)
                    .map(te_reactor::http::percent_decode);
            }
        },
    );
}

#[test]
fn resp() {
    let seeds: [&[u8]; 4] = [
        b"+OK\r\n",
        b"$5\r\nhello\r\n",
        b"$-1\r\n",
        b":42\r\n-ERR no\r\n",
    ];
    run(
        "resp",
        env!("CARGO_MANIFEST_DIR"),
        &seeds,
        budget(1.0),
        |b: &[u8]| {
            let mut r = BufReader::new(b);
            while crate::metadata::redis::read_reply(&mut r, 1 << 16).is_ok() {}
        },
    );
}

#[test]
fn percent_decode() {
    run(
        "percent-decode",
        env!("CARGO_MANIFEST_DIR"),
        &[b"mooncake%2Fram%2Fh%3A1", b"%zz%"],
        budget(1.0),
        |b: &[u8]| {
            if let Ok(s) = std::str::from_utf8(b) {
                if let Some(d) = te_reactor::http::percent_decode(s) {
                    assert_eq!(
                        te_reactor::http::percent_decode(&te_reactor::http::percent_encode(&d)),
                        Some(d),
                        "encode then decode gives the text back"
                    );
                }
            }
        },
    );
}
