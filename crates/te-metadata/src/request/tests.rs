use super::*;

const MAX: usize = 1 << 10;

/// Feeds `bytes` `step` bytes at a time; every result but `More`, in order.
fn feed(bytes: &[u8], step: usize) -> Vec<Result<Gathered, Refusal>> {
    feed_with(bytes, step, &mut Unbounded)
}

/// Room for `left` bytes in all, never given back; what was asked for is kept.
#[derive(Debug, Default)]
struct Limited {
    left: usize,
    asked: Vec<usize>,
}

impl Room for Limited {
    fn make(&mut self, bytes: usize) -> Result<(), String> {
        self.asked.push(bytes);
        match self.left.checked_sub(bytes) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(format!("no room for {bytes}")),
        }
    }

    fn fits(&self, bytes: usize) -> Result<(), String> {
        match bytes <= self.left {
            true => Ok(()),
            false => Err(format!("no room for {bytes}")),
        }
    }
}

/// As [`feed`], with room from `room`.
fn feed_with(bytes: &[u8], step: usize, room: &mut impl Room) -> Vec<Result<Gathered, Refusal>> {
    let mut g = Gatherer::new(MAX);
    let mut input = Vec::new();
    let mut out = Vec::new();
    for piece in bytes.chunks(step.max(1)) {
        input.extend_from_slice(piece);
        loop {
            match g.gather(&mut input, room) {
                Ok(Gathered::More) => break,
                Err(e) => {
                    out.push(Err(e));
                    return out;
                }
                other => out.push(other),
            }
        }
    }
    out
}

fn request(method: &str, target: &str, keep_alive: bool, body: &[u8]) -> Result<Gathered, Refusal> {
    Ok(Gathered::Request(Request {
        method: method.into(),
        target: target.into(),
        keep_alive,
        body: body.to_vec(),
    }))
}

fn status(results: &[Result<Gathered, Refusal>]) -> u16 {
    match results.last() {
        Some(Err(r)) => r.status,
        other => panic!("no refusal: {other:?}"),
    }
}

/// Each request gets its status (a refusal's code) whether its bytes arrive whole or one by
/// one.
fn refused_alike(cases: &[(&[u8], u16)]) {
    for (bytes, want) in cases {
        for step in [1, bytes.len()] {
            let got = feed(bytes, step);
            assert_eq!(
                status(&got),
                *want,
                "{:?} by {step}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}

#[test]
fn requests_come_whole_however_their_bytes_arrive() {
    let bytes = b"PUT /metadata?key=a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello\
GET /metadata?key=a HTTP/1.1\r\nConnection: close\r\n\r\n";
    let want = vec![
        request("PUT", "/metadata?key=a", true, b"hello"),
        request("GET", "/metadata?key=a", false, b""),
    ];
    for step in [1, 2, 3, 7, 50, bytes.len()] {
        assert_eq!(feed(bytes, step), want, "{step} bytes at a time");
    }
}

#[test]
fn chunked_bodies_with_extensions_and_trailers() {
    let bytes = b"PUT /m?key=a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\nDELETE /m?key=a HTTP/1.1\n\n";
    let want = vec![
        request("PUT", "/m?key=a", true, b"hello world"),
        request("DELETE", "/m?key=a", true, b""),
    ];
    for step in [1, 4, bytes.len()] {
        assert_eq!(feed(bytes, step), want, "{step} bytes at a time");
    }
}

#[test]
fn a_client_that_expects_100_continue_is_told_to_go_on() {
    let head = b"PUT /m?key=a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
    let mut g = Gatherer::new(MAX);
    let mut input = head.to_vec();
    assert_eq!(g.gather(&mut input, &mut Unbounded), Ok(Gathered::Continue));
    assert!(g.in_body());
    assert_eq!(g.gather(&mut input, &mut Unbounded), Ok(Gathered::More));
    input.extend_from_slice(b"ok");
    assert_eq!(
        g.gather(&mut input, &mut Unbounded),
        request("PUT", "/m?key=a", true, b"ok")
    );
    assert!(!g.in_body());
    // The body already sent with the head: nothing to wait for.
    let mut both = head.to_vec();
    both.extend_from_slice(b"ok");
    assert_eq!(
        feed(&both, both.len()),
        vec![request("PUT", "/m?key=a", true, b"ok")]
    );
}

#[test]
fn keep_alive_follows_the_version_and_the_connection_header() {
    let one = |head: &str| match feed(head.as_bytes(), head.len()).pop() {
        Some(Ok(Gathered::Request(r))) => r.keep_alive,
        other => panic!("{head:?}: {other:?}"),
    };
    assert!(one("GET /m HTTP/1.1\r\n\r\n"));
    assert!(!one("GET /m HTTP/1.1\r\nConnection: Close\r\n\r\n"));
    assert!(!one("GET /m HTTP/1.0\r\n\r\n"));
    assert!(one("GET /m HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
}

#[test]
fn bad_heads_and_bodies_are_refused_with_their_status() {
    let huge = format!("GET /m HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
    let unended = "a".repeat(MAX_HEAD + 10);
    let cases: &[(&[u8], u16)] = &[
        (b"GET /m HTTP/1.1\r\nno colon\r\n\r\n", 400),
        (b"GET /m HTTP/1.1\r\nX: \xff\r\n\r\n", 400),
        (b"PUT /m HTTP/1.1\r\nContent-Length: banana\r\n\r\n", 400),
        (b"PUT /m HTTP/1.1\r\nContent-Length: +5\r\n\r\n", 400),
        (
            b"PUT /m HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            400,
        ),
        (
            b"PUT /m HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            400,
        ),
        (b"PUT /m HTTP/1.1\r\nContent-Length: 1025\r\n\r\n", 413),
        (
            b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            400,
        ),
        (
            b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n401\r\n",
            413,
        ),
        (
            b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",
            400,
        ),
        (huge.as_bytes(), 400),
        (unended.as_bytes(), 400),
    ];
    refused_alike(cases);
    // Chunks adding up past the limit are refused as the one that crosses it arrives.
    let mut bytes = b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..4 {
        bytes.extend_from_slice(b"100\r\n");
        bytes.extend(vec![b'x'; 0x100]);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"1\r\n");
    assert_eq!(status(&feed(&bytes, 64)), 413);
}

#[test]
fn room_is_asked_for_as_a_bodys_bytes_arrive() {
    // A head announcing a body holds no room: only bytes that came are counted.
    let mut room = Limited {
        left: 100,
        ..Limited::default()
    };
    let mut g = Gatherer::new(MAX);
    let mut input = b"PUT /m?key=a HTTP/1.1\r\nContent-Length: 5\r\n\r\n".to_vec();
    assert_eq!(g.gather(&mut input, &mut room), Ok(Gathered::More));
    assert!(
        room.asked.is_empty(),
        "announced, not sent: {:?}",
        room.asked
    );
    input.extend_from_slice(b"he");
    assert_eq!(g.gather(&mut input, &mut room), Ok(Gathered::More));
    assert_eq!(room.asked, [2]);
    input.extend_from_slice(b"llo");
    assert_eq!(
        g.gather(&mut input, &mut room),
        request("PUT", "/m?key=a", true, b"hello")
    );
    assert_eq!(room.asked, [2, 3]);
    // Chunks too: a chunk's announced size is not counted, its data is, as it comes.
    let chunked = b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n";
    let mut room = Limited {
        left: 100,
        ..Limited::default()
    };
    assert_eq!(
        feed_with(chunked, 1, &mut room),
        vec![request("PUT", "/m", true, b"abcde")]
    );
    assert_eq!(room.asked, [1, 1, 1, 1, 1]);
    let mut g = Gatherer::new(MAX);
    let mut room = Limited::default();
    let mut input = b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3ff\r\n".to_vec();
    assert_eq!(g.gather(&mut input, &mut room), Ok(Gathered::More));
    assert!(room.asked.is_empty(), "a chunk announced, none of it sent");
    // Requests without a body ask for nothing.
    let mut room = Limited::default();
    assert_eq!(
        feed_with(b"GET /m HTTP/1.1\r\n\r\n", 1, &mut room),
        vec![request("GET", "/m", true, b"")]
    );
    assert!(room.asked.is_empty());
}

#[test]
fn a_body_without_room_is_read_past_and_answered_503_on_an_open_connection() {
    let bytes = b"PUT /m?key=a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello\
GET /m?key=a HTTP/1.1\r\n\r\nPUT /m?key=b HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi";
    for step in [1, 3, bytes.len()] {
        let got = feed_with(bytes, step, &mut Limited::default());
        assert_eq!(got.len(), 3, "{got:?}");
        let turned = |r: &Result<Gathered, Refusal>, open| match r {
            Ok(Gathered::Turned {
                refusal,
                keep_alive,
            }) => refusal.status == 503 && *keep_alive == open,
            _ => false,
        };
        assert!(turned(&got[0], true), "by {step}: {:?}", got[0]);
        assert_eq!(got[1], request("GET", "/m?key=a", true, b""), "by {step}");
        // An HTTP/1.0 request without keep-alive closes after its answer, as any other.
        assert!(turned(&got[2], false), "by {step}: {:?}", got[2]);
    }
    // Room that runs out midway: what was kept goes, the rest is read past.
    let mut room = Limited {
        left: 3,
        ..Limited::default()
    };
    let got = feed_with(bytes, 2, &mut room);
    assert!(matches!(&got[0], Ok(Gathered::Turned { refusal, .. }) if refusal.status == 503));
    assert_eq!(got[1], request("GET", "/m?key=a", true, b""));
}

#[test]
fn without_room_a_client_waiting_to_send_its_body_is_refused_before_it_does() {
    let head = b"PUT /m?key=a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 9\r\n\r\n";
    let got = feed_with(head, head.len(), &mut Limited::default());
    assert_eq!(got, vec![Err(refuse(503, "no room for 9"))]);
    // With room, it is told to go on, and nothing is held until its body comes.
    let mut room = Limited {
        left: 9,
        ..Limited::default()
    };
    assert_eq!(
        feed_with(head, head.len(), &mut room),
        vec![Ok(Gathered::Continue)]
    );
    assert!(room.asked.is_empty());
    // A chunked body cannot be read past without its framing: refused, to be closed.
    let chunked = b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n3\r\ncde\r\n";
    let mut room = Limited {
        left: 4,
        ..Limited::default()
    };
    assert_eq!(status(&feed_with(chunked, 1, &mut room)), 503);
}

#[test]
fn framing_that_another_parser_would_read_otherwise_is_refused() {
    let cases: &[(&[u8], u16)] = &[
        // Several codings headers, even if each says chunked.
        (
            b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
        ),
        // A coding and a length together.
        (
            b"PUT /m HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
        (
            b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            400,
        ),
        // Codings that do not end in chunked, or that te does not decode.
        (b"PUT /m HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
        (
            b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            400,
        ),
        (b"PUT /m HTTP/1.1\r\nTransfer-Encoding: \r\n\r\n", 400),
        (
            b"PUT /m HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            501,
        ),
        (
            b"PUT /m HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            501,
        ),
        // HTTP/1.0 has no transfer codings.
        (
            b"PUT /m HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
        // Whitespace before the colon, a folded line, an empty name.
        (b"PUT /m HTTP/1.1\r\nContent-Length : 3\r\n\r\nabc", 400),
        (
            b"PUT /m HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n",
            400,
        ),
        (b"PUT /m HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400),
        (b"PUT /m HTTP/1.1\r\n: 3\r\n\r\n", 400),
    ];
    refused_alike(cases);
    // A tab or spaces around a value are fine; the same length twice is one length.
    assert_eq!(
        feed(
            b"PUT /m HTTP/1.1\r\nContent-Length:\t2 \r\nContent-Length: 2\r\n\r\nhi",
            1
        ),
        vec![request("PUT", "/m", true, b"hi")]
    );
}

#[test]
fn garbage_is_a_request_with_a_strange_method_not_a_crash() {
    assert_eq!(
        feed(b"\x00\x01\x02garbage\r\n\r\n", 3),
        vec![request("\u{0}\u{1}\u{2}garbage", "", true, b"")]
    );
}

/// Fuzz target `http-request` (`cargo xtask fuzz http-request`; `cargo test` runs it for 1 s):
/// the gatherer never panics, keeps every body within its limit, and gathers the same
/// requests and refusal from bytes arriving whole as from bytes arriving in pieces.
#[test]
fn http_request() {
    use te_testkit::fuzz::{budget, run};
    let seeds: &[&[u8]] = &[
        b"PUT /metadata?key=a HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhelloGET /metadata?key=a HTTP/1.0\r\n\r\n",
        b"POST /m?key=b HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3;x\r\nabc\r\n0\r\nT: 1\r\n\r\n",
        b"\r\n\r\nDELETE /metadata?key=c HTTP/1.1\n\n",
    ];
    // Whether a client is told to go on depends on where the head's bytes end, not on what
    // they say: compared are the requests and the refusal.
    let gathered = |bytes: &[u8], step: usize| -> Vec<Result<Gathered, Refusal>> {
        feed(bytes, step)
            .into_iter()
            .filter(|r| *r != Ok(Gathered::Continue))
            .collect()
    };
    run(
        "http-request",
        env!("CARGO_MANIFEST_DIR"),
        seeds,
        budget(1.0),
        |b: &[u8]| {
            let whole = gathered(b, b.len());
            let step = 1 + b.first().map_or(0, |&x| usize::from(x % 7));
            assert_eq!(gathered(b, step), whole, "whole and by {step} agree");
            for r in &whole {
                if let Ok(Gathered::Request(r)) = r {
                    assert!(r.body.len() <= MAX, "a body within the limit");
                }
            }
            // With little room, no body kept is larger than the room it was given.
            let mut room = Limited {
                left: 16,
                ..Limited::default()
            };
            for r in feed_with(b, step, &mut room) {
                if let Ok(Gathered::Request(r)) = r {
                    assert!(r.body.len() <= 16, "a body within its room");
                }
            }
        },
    );
}
