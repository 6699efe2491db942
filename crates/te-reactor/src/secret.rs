//! Secrets as servers hold and check them: a value never printed, a comparison whose time does
//! not say where two values differ, and a shared secret's strength and stretched key: a weak
//! secret refused ([`check_secret`]), and PBKDF2-HMAC-SHA256 over [`KDF_ROUNDS`] rounds under
//! te's own salt ([`stretched_key`]), so a guess at a recorded proof costs what an engine's
//! start does; [`ClusterKey`], the key every proof, seal and signature under a cluster secret is
//! keyed with, and [`keyed_mac`], the one MAC construction behind them (segment secrets' too).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// HMAC-SHA256.
pub type HmacSha256 = Hmac<Sha256>;

/// The key derived from a cluster secret.
#[derive(Clone)]
pub struct ClusterKey([u8; 32]);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(<redacted>)")
    }
}

impl ClusterKey {
    /// The key for `secret`, after its strength is checked ([`check_secret`]'s reason if not).
    ///
    /// # Errors
    /// Why the secret is too weak to be one (its value never shown).
    pub fn from_secret(secret: &str) -> Result<Self, String> {
        check_secret(secret)?;
        Ok(ClusterKey(stretched_key(secret)))
    }

    /// A MAC under this key over `parts` ([`keyed_mac`]).
    pub fn mac(&self, parts: &[&[u8]]) -> HmacSha256 {
        keyed_mac(&self.0, parts)
    }

    /// The tag of `parts` under this key.
    pub fn proof(&self, parts: &[&[u8]]) -> Vec<u8> {
        self.mac(parts).finalize().into_bytes().to_vec()
    }

    /// Whether `tag` is `parts`' tag under this key (compared in constant time).
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.mac(parts).verify_slice(tag).is_ok()
    }
}

/// HMAC-SHA256 keyed by `key` over `parts`, each length-prefixed so that no two lists of parts
/// hash alike: the one construction behind te's proofs and signatures.
pub fn keyed_mac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut m = <HmacSha256 as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    for p in parts {
        m.update(&(p.len() as u32).to_le_bytes());
        m.update(p);
    }
    m
}

/// PBKDF2 rounds: OWASP's figure for PBKDF2-HMAC-SHA256.
pub const KDF_ROUNDS: u32 = 600_000;
/// The salt: te's, with a version, so that no table made for another system applies.
const KDF_SALT: &[u8] = b"te cluster key v2";
/// The shortest secret accepted.
pub const MIN_SECRET_CHARS: usize = 16;
/// The least entropy a secret must show, in bits, by the crude estimate of [`check_secret`].
const MIN_SECRET_BITS: f64 = 80.0;

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

/// Whether `secret` can serve as a cluster secret: empty, shorter than [`MIN_SECRET_CHARS`]
/// characters, of fewer than 8 distinct characters, or under 80 bits by a crude estimate (its
/// length times the bits of the character classes it draws from) is refused, with what to do.
///
/// # Errors
/// Why it is refused.
pub fn check_secret(secret: &str) -> std::result::Result<(), String> {
    const HOW: &str = "generate one with `openssl rand -hex 32` (docs/security.md)";
    let chars = secret.chars().count();
    if chars == 0 {
        return Err(format!("empty: unset it for no cluster secret, or {HOW}"));
    }
    if chars < MIN_SECRET_CHARS {
        return Err(format!(
            "{chars} characters, fewer than {MIN_SECRET_CHARS}: {HOW}"
        ));
    }
    let mut distinct: Vec<char> = secret.chars().collect();
    distinct.sort_unstable();
    distinct.dedup();
    let classes = [
        (secret.chars().any(|c| c.is_ascii_lowercase()), 26.0),
        (secret.chars().any(|c| c.is_ascii_uppercase()), 26.0),
        (secret.chars().any(|c| c.is_ascii_digit()), 10.0),
        (secret.chars().any(|c| !c.is_ascii_alphanumeric()), 33.0),
    ];
    let alphabet: f64 = classes
        .iter()
        .filter(|(in_it, _)| *in_it)
        .map(|(_, n)| n)
        .sum();
    let bits = chars as f64 * alphabet.log2();
    if distinct.len() < 8 || bits < MIN_SECRET_BITS {
        return Err(format!("too little entropy to be a secret: {HOW}"));
    }
    Ok(())
}

/// PBKDF2-HMAC-SHA256 of `secret` (one 32-byte block), kept per secret for the life of the
/// process: an engine starts in milliseconds after the first.
pub fn stretched_key(secret: &str) -> [u8; 32] {
    type Memo = std::sync::Mutex<Vec<([u8; 32], [u8; 32])>>;
    static MEMO: std::sync::OnceLock<Memo> = std::sync::OnceLock::new();
    let id: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
    let memo = MEMO.get_or_init(Memo::default);
    if let Some((_, key)) = memo
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(known, _)| *known == id)
    {
        return *key;
    }
    let key = pbkdf2_sha256(secret.as_bytes(), KDF_SALT, KDF_ROUNDS);
    memo.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((id, key));
    key
}

/// The first 32-byte block of PBKDF2 (RFC 8018) with HMAC-SHA256. The rounds run on SHA-256's
/// compression function with the key's inner and outer states computed once (two compressions
/// a round, as every fast PBKDF2 does; each round's message is one 32-byte digest, so each
/// half is one last block): the generic HMAC would cost tens of times more in unoptimised
/// builds, where tests start engines.
fn pbkdf2_sha256(password: &[u8], salt: &[u8], rounds: u32) -> [u8; 32] {
    let prf = <HmacSha256 as Mac>::new_from_slice(password)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    let mut u: [u8; 32] = prf
        .chain_update(salt)
        .chain_update(1u32.to_be_bytes())
        .finalize()
        .into_bytes()
        .into();
    let mut block = [0u8; 64];
    match password.len() > 64 {
        true => block[..32].copy_from_slice(&Sha256::digest(password)),
        false => block[..password.len()].copy_from_slice(password),
    }
    let pad = |byte: u8| -> [u32; 8] {
        let mut padded = block;
        padded.iter_mut().for_each(|b| *b ^= byte);
        let mut state = SHA256_INIT;
        compress(&mut state, &padded);
        state
    };
    let (inner, outer) = (pad(0x36), pad(0x5c));
    // Plain loops over fixed arrays: unoptimised builds run these 600,000 times.
    let mut last = [0u8; 64];
    last[32] = 0x80;
    last[56..].copy_from_slice(&((64u64 + 32) * 8).to_be_bytes());
    let mut out = u;
    for _ in 1..rounds {
        for half in [inner, outer] {
            last[..32].copy_from_slice(&u);
            let mut state = half;
            compress(&mut state, &last);
            for i in 0..8 {
                u[i * 4..i * 4 + 4].copy_from_slice(&state[i].to_be_bytes());
            }
        }
        for i in 0..32 {
            out[i] ^= u[i];
        }
    }
    out
}

/// SHA-256's initial state.
const SHA256_INIT: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

fn compress(state: &mut [u32; 8], block: &[u8; 64]) {
    sha2::compress256(state, &[(*block).into()]);
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cluster_key_is_the_stretched_secret_and_weak_secrets_are_refused() {
        let secret = "0b6e6a1c5d7f43e2a9";
        let a = super::ClusterKey::from_secret(secret).unwrap();
        assert_eq!(a.0, super::stretched_key(secret));
        let b = super::ClusterKey::from_secret("0b6e6a1c5d7f43e2a8").unwrap();
        assert_ne!(a.0, b.0);
        let tag = a.proof(&[b"x", b"y"]);
        assert!(a.verify(&[b"x", b"y"], &tag));
        // Length prefixes: parts split differently are other messages.
        assert!(!a.verify(&[b"xy"], &tag) && !b.verify(&[b"x", b"y"], &tag));
        assert!(super::ClusterKey::from_secret("short").is_err());
        assert_eq!(format!("{a:?}"), "ClusterKey(<redacted>)");
    }

    use super::*;

    #[test]
    fn secrets_compare_by_content_and_never_print() {
        assert!(same_bytes(b"token", b"token"));
        assert!(!same_bytes(b"token", b"tokem"));
        assert!(!same_bytes(b"token", b"token!"));
        assert_eq!(format!("{:?}", Redacted("pw".into())), "<redacted>");
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn pbkdf2_matches_the_published_vectors() {
        // PBKDF2-HMAC-SHA256, P = "password", S = "salt", dkLen = 32 (RFC 7914's and the
        // widely reproduced vectors for 1, 2 and 4096 iterations).
        assert_eq!(
            hex(&pbkdf2_sha256(b"password", b"salt", 1)),
            "120fb6cffcf8b32c43e7225256c4f837a86548c92ccc35480805987cb70be17b"
        );
        assert_eq!(
            hex(&pbkdf2_sha256(b"password", b"salt", 2)),
            "ae4d0c95af6b46d32d0adff928f06dd02a303f8ef3c251dfd6e2d85a95474c43"
        );
        assert_eq!(
            hex(&pbkdf2_sha256(b"password", b"salt", 4096)),
            "c5e478d59288c841aa530db6845c4c8d962893a001ce4e11a4963873aa98134a"
        );
    }

    #[test]
    fn the_fast_rounds_agree_with_the_generic_hmac_for_any_password_length() {
        let reference = |password: &[u8], rounds: u32| {
            let prf = <HmacSha256 as Mac>::new_from_slice(password).unwrap();
            let mut u: [u8; 32] = prf
                .clone()
                .chain_update(b"salt")
                .chain_update(1u32.to_be_bytes())
                .finalize()
                .into_bytes()
                .into();
            let mut out = u;
            for _ in 1..rounds {
                u = prf.clone().chain_update(u).finalize().into_bytes().into();
                out.iter_mut().zip(&u).for_each(|(o, x)| *o ^= x);
            }
            out
        };
        for len in [0, 1, 32, 63, 64, 65, 200] {
            let password = vec![0xa5u8; len];
            assert_eq!(
                pbkdf2_sha256(&password, b"salt", 5),
                reference(&password, 5),
                "{len}"
            );
        }
        assert_eq!(
            hex(&pbkdf2_sha256(
                b"passwordPASSWORDpassword",
                b"saltSALTsaltSALTsaltSALTsaltSALTsalt",
                4096
            )),
            "348c89dbcbd32b2f32d814b8116e84cf2b17347ebc1800181c4e2a1fb8dd53e1"
        );
    }

    #[test]
    fn weak_secrets_are_refused_with_what_to_do() {
        for weak in [
            "",
            "s3cret",
            "cluster one",
            "passwordpassword",
            "aaaaaaaaaaaaaaaaaaaaaaaa",
            "0123456701234567",
            "abababababababababab",
        ] {
            let why = check_secret(weak).unwrap_err();
            assert!(why.contains("openssl rand"), "{weak:?}: {why}");
        }
        for strong in [
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "Tr0ub4dor&3-horse-battery",
            "0b6e6a1c5d7f43e2",
        ] {
            check_secret(strong).unwrap_or_else(|why| panic!("{strong}: {why}"));
        }
    }

    #[test]
    fn the_key_is_stretched_once_per_secret_and_is_no_plain_hash() {
        let secret = "0b6e6a1c5d7f43e2a9";
        let key = stretched_key(secret);
        assert_eq!(key, stretched_key(secret));
        assert_eq!(key, pbkdf2_sha256(secret.as_bytes(), KDF_SALT, KDF_ROUNDS));
        let plain: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        assert_ne!(key, plain);
    }
}
