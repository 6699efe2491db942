//! A buffer filled from a socket up to an announced length, touched as the bytes come rather
//! than as announced: a peer that announces a gigabyte and sends ten bytes costs about what it
//! sent (address space is reserved up to [`RESERVE`], memory is touched as bytes arrive), and
//! each byte is zeroed once.

use crate::bytes::{Buffer, Bytes};

/// The first growth of a buffer's touched part.
const FIRST: usize = 64 << 10;
/// Address space reserved up front (so a message up to this size is never moved while it
/// grows); larger ones grow by doubling from there.
const RESERVE: usize = 64 << 20;

/// Bytes on their way into one owned buffer.
#[derive(Default)]
pub(crate) struct Filling {
    buf: Vec<u8>,
    given: Option<Box<dyn Buffer>>,
    got: usize,
    want: usize,
}

impl std::fmt::Debug for Filling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filling")
            .field("got", &self.got)
            .field("want", &self.want)
            .field("given", &self.given.is_some())
            .finish()
    }
}

impl Filling {
    /// An empty buffer that will hold `want` bytes.
    pub(crate) fn new(want: usize) -> Self {
        // Reserved address space only; where even that is refused (strict overcommit), the
        // buffer grows as bytes come instead.
        let mut buf = Vec::new();
        let _ = buf.try_reserve_exact(want.min(RESERVE));
        Filling {
            buf,
            given: None,
            got: 0,
            want,
        }
    }

    /// A buffer that fills `given`, whose length is the bytes due.
    pub(crate) fn into(given: Box<dyn Buffer>) -> Self {
        Filling {
            buf: Vec::new(),
            want: given.as_slice().len(),
            given: Some(given),
            got: 0,
        }
    }

    /// Bytes still to come.
    pub(crate) fn left(&self) -> usize {
        self.want - self.got
    }

    /// Whether every byte came.
    pub(crate) fn done(&self) -> bool {
        self.got == self.want
    }

    /// Room for the next bytes: at least one byte while any are due, the buffer grown by
    /// doubling (at most to the announced length).
    pub(crate) fn room(&mut self) -> &mut [u8] {
        if let Some(given) = &mut self.given {
            return &mut given.as_mut_slice()[self.got..];
        }
        if self.got == self.buf.len() && self.got < self.want {
            let grown = (self.buf.len() * 2).max(FIRST).min(self.want);
            self.buf.resize(grown, 0);
        }
        let end = self.buf.len().min(self.want);
        &mut self.buf[self.got..end]
    }

    /// `n` bytes were written into [`Filling::room`].
    pub(crate) fn advance(&mut self, n: usize) {
        self.got += n;
    }

    /// Copies what `src` has toward what is due; returns how much it took.
    pub(crate) fn take_from(&mut self, src: &[u8]) -> usize {
        let n = src.len().min(self.left());
        let mut copied = 0;
        while copied < n {
            let room = self.room();
            let k = room.len().min(n - copied);
            room[..k].copy_from_slice(&src[copied..copied + k]);
            self.advance(k);
            copied += k;
        }
        n
    }

    /// The bytes, once all came.
    pub(crate) fn into_vec(mut self) -> Vec<u8> {
        if let Some(given) = self.given {
            return given.as_slice()[..self.got].to_vec();
        }
        self.buf.truncate(self.got);
        self.buf
    }

    /// The bytes, once all came, where they were read.
    pub(crate) fn into_bytes(self) -> Bytes {
        match self.given {
            Some(given) => Bytes::given(given),
            None => self.into_vec().into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_with_what_comes_not_with_what_is_announced() {
        let mut f = Filling::new(1 << 30);
        assert_eq!(f.take_from(&[1; 10]), 10);
        assert!(f.buf.len() <= FIRST, "{}", f.buf.len());
        assert!(f.buf.capacity() <= RESERVE);
        assert!(!f.done());
        let mut small = Filling::new(5);
        assert_eq!(small.take_from(&[1, 2, 3, 4, 5, 6, 7]), 5);
        assert!(small.done());
        assert_eq!(small.into_vec(), vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn fills_exactly_across_many_pieces() {
        let want = 300_000;
        let src: Vec<u8> = (0..want).map(|i| (i * 7) as u8).collect();
        let mut f = Filling::new(want);
        let mut at = 0;
        while !f.done() {
            let room = f.room();
            let k = room.len().min(9_999).min(want - at);
            room[..k].copy_from_slice(&src[at..at + k]);
            f.advance(k);
            at += k;
        }
        assert_eq!(f.into_vec(), src);
        let mut empty = Filling::new(0);
        assert!(empty.done());
        assert!(empty.room().is_empty());
    }
}
