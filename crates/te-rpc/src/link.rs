//! One client connection: blocking, every exchange bound to its call's deadline, and what the
//! peer speaks, learned from te's greeting when the connection opens.

use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::time::Instant;

use te_reactor::deadline::DeadlineStream;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::handshake;
use crate::wire::{self, Function, RESPONSE_HEADER, RequestHeader, ResponseHeader, code};

/// What the peer speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// te's calls (it answered te's greeting).
    Te,
    /// Mooncake's calls only.
    Mooncake,
}

/// The largest response body a client reads (a greeting, a proof, an error's message).
const MAX_REPLY_BODY: u32 = 64 << 10;

/// An open connection to a peer.
#[derive(Debug)]
pub(crate) struct Link {
    stream: DeadlineStream,
    pub(crate) peer: SocketAddr,
    pub(crate) kind: Kind,
    /// Whether a call on it carried an attachment.
    pub(crate) carried_attachment: bool,
    /// When its last call ended.
    pub(crate) last_used: Instant,
    seq: u32,
    secs: f64,
}

impl Link {
    /// Connects to `peer` and learns what it speaks (`known` skips te's greeting for a peer
    /// already known to speak Mooncake's calls), proving the cluster secret where one is set.
    pub(crate) fn open(
        peer: SocketAddr,
        known: Option<Kind>,
        config: &Config,
        end: Instant,
    ) -> Result<Link> {
        let secs = config.timeout.as_secs_f64();
        let stream = DeadlineStream::connect(&peer, end).map_err(|e| match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Error::TimedOut {
                peer,
                what: "connecting",
                secs,
            },
            _ => Error::socket(format!("connecting to {peer}"), e),
        })?;
        let _ = stream.get_ref().set_nodelay(true);
        let mut link = Link {
            stream,
            peer,
            kind: Kind::Te,
            carried_attachment: false,
            last_used: Instant::now(),
            seq: 0,
            secs,
        };
        link.kind = match known {
            Some(Kind::Mooncake) => Kind::Mooncake,
            _ => link.greet(config, end)?,
        };
        if link.kind == Kind::Mooncake && config.key.is_some() {
            let allowed = config
                .mooncake_allow
                .as_ref()
                .is_some_and(|a| a.admits(peer.ip()));
            if !allowed {
                return Err(Error::Untrusted {
                    peer,
                    reason: "a Mooncake peer cannot prove the cluster secret and is not in \
                             MC_TE_MOONCAKE_ALLOW"
                        .into(),
                });
            }
        }
        Ok(link)
    }

    /// te's greeting, and the secret's proof: what the peer speaks.
    fn greet(&mut self, config: &Config, end: Instant) -> Result<Kind> {
        let mine = handshake::nonce()?;
        let answer = match self.call(Function::TeHello, &handshake::hello(&mine), &[], end) {
            Ok(body) => body,
            Err(Error::Refused {
                code: code::NOT_REGISTERED,
                ..
            }) => return Ok(Kind::Mooncake),
            Err(e) => return Err(e),
        };
        let (theirs, proof_required) =
            handshake::read_answer(&answer).map_err(|reason| Error::Malformed {
                peer: self.peer,
                reason,
            })?;
        let peer = self.peer;
        let untrusted = |reason: &str| Error::Untrusted {
            peer,
            reason: reason.into(),
        };
        match (&config.key, proof_required) {
            (None, false) => Ok(Kind::Te),
            (None, true) => Err(untrusted("it holds a cluster secret and this side none")),
            (Some(_), false) => Err(untrusted("it holds no cluster secret")),
            (Some(key), true) => {
                let proof = handshake::client_proof(key, &theirs, &mine);
                let back = self.call(Function::TeProof, &proof, &[], end)?;
                if handshake::check_server(key, &theirs, &mine, &back) {
                    Ok(Kind::Te)
                } else {
                    Err(untrusted("its proof of the cluster secret is wrong"))
                }
            }
        }
    }

    /// One call: the request out, the response's body back (its attachment read and dropped).
    pub(crate) fn call(
        &mut self,
        function: Function,
        body: &[u8],
        attachment: &[u8],
        end: Instant,
    ) -> Result<Vec<u8>> {
        self.seq = self.seq.wrapping_add(1);
        let head = RequestHeader {
            seq: self.seq,
            function: function.id(),
            body: body.len() as u32,
            attachment: attachment.len() as u32,
        }
        .encode();
        self.carried_attachment |= !attachment.is_empty();
        self.stream.set_deadline(end);
        self.write_all(&[&head, body, attachment])?;
        let mut raw = [0u8; RESPONSE_HEADER];
        self.read_exact(&mut raw)?;
        self.last_used = Instant::now();
        let reply = ResponseHeader::decode(&raw).map_err(|reason| self.malformed(reason))?;
        if reply.seq != self.seq {
            return Err(self.malformed(format!("answer {} to call {}", reply.seq, self.seq)));
        }
        if reply.body > MAX_REPLY_BODY {
            return Err(self.malformed(format!("a response body of {} bytes", reply.body)));
        }
        let mut back = vec![0u8; reply.body as usize];
        self.read_exact(&mut back)?;
        self.discard(u64::from(reply.attachment))?;
        if reply.error != 0 {
            let message = wire::unpack_string(&back)
                .map(|r| String::from_utf8_lossy(&back[r]).into_owned())
                .unwrap_or_default();
            return Err(Error::Refused {
                peer: self.peer,
                code: reply.error,
                message,
            });
        }
        Ok(back)
    }

    /// Whether the peer still holds the connection open (it closes idle ones): nothing to
    /// read, no end of stream, no error.
    pub(crate) fn alive(&self) -> bool {
        let mut byte = [0u8; 1];
        let stream = self.stream.get_ref();
        if stream.set_nonblocking(true).is_err() {
            return false;
        }
        let peeked = stream.peek(&mut byte);
        let restored = stream.set_nonblocking(false).is_ok();
        restored && matches!(peeked, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    fn malformed(&self, reason: String) -> Error {
        Error::Malformed {
            peer: self.peer,
            reason,
        }
    }

    /// `e`, met `sending` or waiting for the reply, as te-rpc's error: a timeout (the socket's,
    /// or the deadline's) as [`Error::TimedOut`].
    fn fail(&self, sending: bool, e: io::Error) -> Error {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::TimedOut {
                peer: self.peer,
                what: if sending {
                    "sending"
                } else {
                    "waiting for the reply"
                },
                secs: self.secs,
            },
            _ if sending => Error::socket(format!("sending to {}", self.peer), e),
            io::ErrorKind::UnexpectedEof => Error::socket(
                format!("reading from {}", self.peer),
                io::Error::new(e.kind(), "the peer closed the connection"),
            ),
            _ => Error::socket(format!("reading from {}", self.peer), e),
        }
    }

    /// Writes every part, gathered, by the call's deadline.
    fn write_all(&mut self, parts: &[&[u8]]) -> Result<()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut sent = 0usize;
        while sent < total {
            match self.stream.write_vectored(&remaining(parts, sent)) {
                Ok(0) => return Err(self.fail(true, io::ErrorKind::WriteZero.into())),
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.fail(true, e)),
            }
        }
        Ok(())
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        self.stream.read_exact(buf).map_err(|e| self.fail(false, e))
    }

    /// Reads and drops `n` bytes (the echo Mooncake's server attaches to a tensor's answer).
    fn discard(&mut self, n: u64) -> Result<()> {
        let copied = io::copy(&mut (&mut self.stream).take(n), &mut io::sink())
            .map_err(|e| self.fail(false, e))?;
        if copied < n {
            return Err(self.fail(false, io::ErrorKind::UnexpectedEof.into()));
        }
        Ok(())
    }
}

/// The parts' bytes from `skip` on, as slices for one gathered write.
fn remaining<'a>(parts: &[&'a [u8]], mut skip: usize) -> Vec<IoSlice<'a>> {
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        out.push(IoSlice::new(&p[skip..]));
        skip = 0;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathered_writes_resume_where_they_stopped() {
        let parts: [&[u8]; 3] = [b"abc", b"", b"defg"];
        let flat = |s: Vec<IoSlice<'_>>| s.iter().flat_map(|x| x.to_vec()).collect::<Vec<u8>>();
        assert_eq!(flat(remaining(&parts, 0)), b"abcdefg");
        assert_eq!(flat(remaining(&parts, 2)), b"cdefg");
        assert_eq!(flat(remaining(&parts, 3)), b"defg");
        assert_eq!(flat(remaining(&parts, 7)), b"");
    }
}
