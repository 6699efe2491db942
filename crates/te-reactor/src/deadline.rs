//! A blocking TCP stream whose reads and writes must all be done by one instant
//! ([`DeadlineStream`]): a client's exchange with a server (a metadata request, a control
//! request) ends by its deadline however the server trickles its answer. A socket's own timeout
//! bounds one read; a server sending a byte just before each would hold a client for ever.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A blocking stream bound to a deadline: every read and write is given what time is left,
/// and none starts after it (`TimedOut`).
#[derive(Debug)]
pub struct DeadlineStream {
    stream: TcpStream,
    end: Instant,
}

impl DeadlineStream {
    /// Connects to `addr` by `end`.
    ///
    /// # Errors
    /// The connection failed, or `end` passed first (`TimedOut`).
    pub fn connect(addr: &SocketAddr, end: Instant) -> io::Result<Self> {
        let stream = TcpStream::connect_timeout(addr, left(end)?)?;
        Ok(DeadlineStream { stream, end })
    }

    /// `stream`, bound to `end`.
    pub fn new(stream: TcpStream, end: Instant) -> Self {
        DeadlineStream { stream, end }
    }

    /// Binds the stream to a new deadline (a kept connection's next exchange).
    pub fn set_deadline(&mut self, end: Instant) {
        self.end = end;
    }

    /// The stream.
    pub fn get_ref(&self) -> &TcpStream {
        &self.stream
    }

    /// The stream, unbound.
    pub fn into_inner(self) -> TcpStream {
        self.stream
    }
}

/// The time left until `end`, or `TimedOut` when none is.
fn left(end: Instant) -> io::Result<Duration> {
    match end.checked_duration_since(Instant::now()) {
        Some(d) if !d.is_zero() => Ok(d),
        _ => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the exchange's deadline passed",
        )),
    }
}

impl Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(left(self.end)?))?;
        self.stream.read(buf)
    }
}

impl Write for DeadlineStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(left(self.end)?))?;
        self.stream.write(buf)
    }

    /// One gathered write (a frame's header and payload in one system call).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(left(self.end)?))?;
        self.stream.write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that sends one byte every 100 ms for ever holds a reader no longer than its
    /// deadline, though no single read waits long.
    #[test]
    fn a_trickling_peer_holds_a_reader_only_until_its_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            while s.write_all(b"x").is_ok() {
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let start = Instant::now();
        let mut s = DeadlineStream::connect(&addr, start + Duration::from_millis(700)).unwrap();
        let mut sink = Vec::new();
        let err = s.read_to_end(&mut sink).unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{err}"
        );
        assert!(!sink.is_empty(), "bytes came, slowly");
        assert!(took < Duration::from_secs(5), "{took:?}");
        // A new deadline serves the next exchange.
        s.set_deadline(Instant::now() + Duration::from_millis(300));
        let mut byte = [0u8; 1];
        s.read_exact(&mut byte).unwrap();
        s.set_deadline(Instant::now());
        assert_eq!(
            s.read(&mut byte).unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
    }
}
