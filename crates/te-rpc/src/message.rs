//! What a server hands its handler: a message or a tensor, owned, with who sent it and in
//! which protocol.

use std::net::SocketAddr;

use crate::bytes::{Buffer, Bytes};
use crate::tensor::TensorMeta;

/// Which protocol a message came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// te's own calls, after te's greeting (and the cluster secret's proof where one is set).
    Te,
    /// Mooncake's `RpcInterface` calls.
    Mooncake,
}

/// What came.
#[derive(Debug, PartialEq, Eq)]
pub enum Payload {
    /// A message: exactly the bytes sent.
    Data(Bytes),
    /// A tensor.
    Tensor(Tensor),
}

/// A received tensor.
#[derive(Debug, PartialEq, Eq)]
pub struct Tensor {
    /// Its dtype and shape.
    pub meta: TensorMeta,
    /// The bytes as they came: from a Mooncake peer the header its receiver reads, then the
    /// data; from te, the data only.
    pub bytes: Bytes,
    /// Where the data starts in `bytes` (0 from te, the header's length from Mooncake).
    pub header: usize,
}

impl Tensor {
    /// The tensor's data, without a header.
    pub fn data(&self) -> &[u8] {
        &self.bytes[self.header..]
    }
}

/// One received message.
#[derive(Debug, PartialEq, Eq)]
pub struct Received {
    /// The sender's address (its connection's).
    pub source: SocketAddr,
    /// The protocol it came in.
    pub origin: Origin,
    /// What came.
    pub payload: Payload,
}

/// Takes what a server receives. Called on the server's threads, one message at a time per
/// connection; the sender's call returns once it has returned (a slow handler slows its
/// senders, not the server's memory).
pub trait Handler: Send + Sync + 'static {
    /// One message.
    fn receive(&self, message: Received);

    /// Memory to read a payload of `len` bytes into (asked for payloads of
    /// [`GIVEN_MIN`] bytes or more, once the call is admitted), so that the bytes need no copy on
    /// their way to the application; `None` (the default) reads them into a `Vec`.
    fn buffer(&self, _len: usize) -> Option<Box<dyn Buffer>> {
        None
    }
}

/// The smallest payload a server reads into its handler's [`Handler::buffer`].
pub const GIVEN_MIN: usize = 64 << 10;

impl<F: Fn(Received) + Send + Sync + 'static> Handler for F {
    fn receive(&self, message: Received) {
        self(message);
    }
}
