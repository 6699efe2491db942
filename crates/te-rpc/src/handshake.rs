//! te's greeting on a new connection, and the cluster secret's proof when there is one.
//!
//! 1. client → `TeHello`: `te-rpc`, version, client nonce `N_c`
//! 2. server → version, whether the secret must be proved, server nonce `N_s`. A Mooncake
//!    server answers "not registered": the client then speaks Mooncake's calls only.
//! 3. with a cluster secret, client → `TeProof`: `HMAC(K, "te-rpc-client-1" | N_s | N_c)`;
//!    server checks it → `HMAC(K, "te-rpc-server-1" | N_c | N_s)`, or refuses and closes; the
//!    client checks the server's proof.
//!
//! The server proves the secret only to a client that proved it first. `K` is the cluster key
//! (te-reactor's, the one te's control channel uses). Pure: building and checking bodies.

use te_reactor::secret::ClusterKey;

/// What a greeting starts with.
const TAG: &[u8; 6] = b"te-rpc";
/// The version of te's calls this build speaks.
pub const VERSION: u8 = 1;
/// Bytes of a nonce.
pub const NONCE: usize = 16;
/// Bytes of a proof.
pub const PROOF: usize = 32;
/// Bytes of a greeting, either way.
pub const HELLO: usize = 8 + NONCE;

/// A nonce.
pub type Nonce = [u8; NONCE];

/// The client's greeting.
pub fn hello(client: &Nonce) -> [u8; HELLO] {
    let mut b = [0u8; HELLO];
    b[..6].copy_from_slice(TAG);
    b[6] = VERSION;
    b[8..].copy_from_slice(client);
    b
}

/// The client's nonce from its greeting.
///
/// # Errors
/// What is wrong with it.
pub fn read_hello(b: &[u8]) -> std::result::Result<Nonce, String> {
    if b.len() != HELLO || &b[..6] != TAG {
        return Err(format!("a greeting of {} bytes, not te's", b.len()));
    }
    if b[6] != VERSION {
        return Err(format!(
            "te-rpc version {}, this build speaks {VERSION}",
            b[6]
        ));
    }
    Ok(b[8..].try_into().unwrap_or_default())
}

/// The server's answer to a greeting.
pub fn answer(server: &Nonce, proof_required: bool) -> [u8; HELLO] {
    let mut b = [0u8; HELLO];
    b[..6].copy_from_slice(TAG);
    b[6] = VERSION;
    b[7] = u8::from(proof_required);
    b[8..].copy_from_slice(server);
    b
}

/// The server's nonce and whether it wants the secret proved.
///
/// # Errors
/// What is wrong with it.
pub fn read_answer(b: &[u8]) -> std::result::Result<(Nonce, bool), String> {
    let nonce = read_hello(b)?;
    match b[7] {
        0 => Ok((nonce, false)),
        1 => Ok((nonce, true)),
        x => Err(format!("greeting flags {x:#04x}")),
    }
}

/// The client's proof.
pub fn client_proof(key: &ClusterKey, server: &Nonce, client: &Nonce) -> Vec<u8> {
    key.proof(&[b"te-rpc-client-1", server, client])
}

/// Whether `proof` is the client's proof.
pub fn check_client(key: &ClusterKey, server: &Nonce, client: &Nonce, proof: &[u8]) -> bool {
    proof.len() == PROOF && key.verify(&[b"te-rpc-client-1", server, client], proof)
}

/// The server's proof.
pub fn server_proof(key: &ClusterKey, server: &Nonce, client: &Nonce) -> Vec<u8> {
    key.proof(&[b"te-rpc-server-1", client, server])
}

/// Whether `proof` is the server's proof.
pub fn check_server(key: &ClusterKey, server: &Nonce, client: &Nonce, proof: &[u8]) -> bool {
    proof.len() == PROOF && key.verify(&[b"te-rpc-server-1", client, server], proof)
}

/// A fresh nonce.
///
/// # Errors
/// No randomness.
pub fn nonce() -> crate::Result<Nonce> {
    te_sys::random_bytes::<NONCE>()
        .map_err(|e| crate::Error::socket("a nonce", std::io::Error::other(e.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> ClusterKey {
        ClusterKey::from_secret(s).unwrap()
    }

    #[test]
    fn greetings_round_trip_and_refuse_strangers() {
        let n = [7u8; NONCE];
        assert_eq!(read_hello(&hello(&n)), Ok(n));
        assert_eq!(read_answer(&answer(&n, true)), Ok((n, true)));
        let mut other = hello(&n);
        other[6] = 9;
        assert!(read_hello(&other).unwrap_err().contains("version 9"));
        assert!(read_hello(b"GET / HTTP/1.1\r\n").is_err());
        let mut flags = answer(&n, false);
        flags[7] = 2;
        assert!(read_answer(&flags).is_err());
    }

    #[test]
    fn proofs_bind_both_nonces_and_the_secret() {
        let k = key("a cluster secret of some length");
        let (s, c) = ([1u8; NONCE], [2u8; NONCE]);
        let p = client_proof(&k, &s, &c);
        assert!(check_client(&k, &s, &c, &p));
        assert!(!check_client(&k, &c, &s, &p));
        assert!(!check_client(
            &key("another secret of some length"),
            &s,
            &c,
            &p
        ));
        assert!(!check_client(&k, &s, &c, &p[..31]));
        let q = server_proof(&k, &s, &c);
        assert!(check_server(&k, &s, &c, &q));
        assert!(
            !check_server(&k, &s, &c, &p),
            "a client's proof is not the server's"
        );
    }
}
