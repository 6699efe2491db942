//! Secrets as servers hold and check them: a value never printed, and a comparison whose time
//! does not say where two values differ.

/// A setting that must not be printed (a password, a token): `Debug` shows `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Redacted(pub String);

impl Redacted {
    /// The value itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Whether `a` and `b` are the same bytes, compared in time independent of where they differ
/// (for secrets, tokens and proofs a peer sends).
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_by_content_and_never_print() {
        assert!(same_bytes(b"token", b"token"));
        assert!(!same_bytes(b"token", b"tokem"));
        assert!(!same_bytes(b"token", b"token!"));
        assert_eq!(format!("{:?}", Redacted("pw".into())), "<redacted>");
    }
}
