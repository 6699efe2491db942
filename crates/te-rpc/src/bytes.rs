//! A received payload's bytes: a `Vec`, or memory its handler gave to read them into (a
//! binding's own object, so the bytes reach the application without another copy).

use std::any::{Any, TypeId};

/// Memory a handler gives for a payload of a known length ([`crate::Handler::buffer`]).
pub trait Buffer: Send + 'static {
    /// The bytes.
    fn as_slice(&self) -> &[u8];
    /// The bytes, to be written.
    fn as_mut_slice(&mut self) -> &mut [u8];
    /// Itself, for [`Bytes::downcast`].
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
    /// Its concrete type (not to be overridden).
    fn concrete_type(&self) -> TypeId {
        TypeId::of::<Self>()
    }
}

enum Inner {
    Owned(Vec<u8>),
    Given(Box<dyn Buffer>),
}

/// A payload's bytes.
pub struct Bytes(Inner);

impl Bytes {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Inner::Owned(v) => v,
            Inner::Given(b) => b.as_slice(),
        }
    }

    /// The bytes as a `Vec` (a copy when they are in a handler's buffer).
    pub fn into_vec(self) -> Vec<u8> {
        match self.0 {
            Inner::Owned(v) => v,
            Inner::Given(b) => b.as_slice().to_vec(),
        }
    }

    /// The handler's buffer of type `T` holding the bytes, or the bytes back.
    ///
    /// # Errors
    /// The bytes are not in a `T`.
    pub fn downcast<T: Buffer>(self) -> Result<Box<T>, Self> {
        match self.0 {
            Inner::Given(b) if b.concrete_type() == TypeId::of::<T>() => b
                .into_any()
                .downcast::<T>()
                .map_err(|_| Bytes(Inner::Owned(Vec::new()))),
            other => Err(Bytes(other)),
        }
    }

    pub(crate) fn given(b: Box<dyn Buffer>) -> Self {
        Bytes(Inner::Given(b))
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Self {
        Bytes(Inner::Owned(v))
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Bytes {}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes)", self.len())
    }
}
