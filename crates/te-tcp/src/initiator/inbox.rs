//! What a lane's connection has received but not yet used: replies read in bulk, so one
//! receive call takes the statuses (and small READs' data) of many requests at once. It only
//! buffers; the connection decides what the bytes are.

use std::io;
use std::os::fd::AsRawFd;

use crate::sys;

/// Bytes one bulk receive takes at most: the statuses of hundreds of WRITEs, or a few small
/// READs with their data.
pub(crate) const INBOX_BYTES: usize = 16 << 10;

/// Received bytes not yet taken, in order.
pub(crate) struct Inbox {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Inbox {
    pub(crate) fn new() -> Self {
        Inbox {
            buf: vec![0; INBOX_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Bytes waiting.
    pub(crate) fn len(&self) -> usize {
        self.end - self.start
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Takes the next `n` bytes (at most [`len`](Self::len)).
    pub(crate) fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.len());
        let at = self.start;
        self.start += n;
        &self.buf[at..at + n]
    }

    /// One receive without waiting into the free room: the bytes it brought (0: the peer
    /// closed), or `WouldBlock`.
    pub(crate) fn fill(&mut self, sock: &impl AsRawFd) -> io::Result<usize> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let n = sys::recv_now(sock, &mut self.buf[self.end..])?;
        self.end += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn bytes_come_out_in_order_across_fills() {
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let mut inbox = Inbox::new();
        assert_eq!(
            inbox.fill(&b).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        a.write_all(b"0123456789").unwrap();
        assert_eq!(inbox.fill(&b).unwrap(), 10);
        assert_eq!(inbox.take(4), b"0123");
        a.write_all(b"abc").unwrap();
        // The rest moves to the front before the next receive.
        assert_eq!(inbox.fill(&b).unwrap(), 3);
        assert_eq!(inbox.len(), 9);
        assert_eq!(inbox.take(100), b"456789abc");
        assert!(inbox.is_empty());
        drop(a);
        assert_eq!(inbox.fill(&b).unwrap(), 0, "the peer closed");
    }
}
