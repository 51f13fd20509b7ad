//! Proof that a report comes from the holder of the node's client key.
//!
//! The agent signs [`crate::protocol::ReportRequest::signed_bytes`] with its
//! ECDSA client key (the key the instance is bound to); the server checks
//! the signature and that the key's fingerprint is the bound one.

use crate::protocol::KeyProof;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use thiserror::Error;
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ProofError {
    #[error("proof is not base64: {0}")]
    NotBase64(&'static str),
    #[error("public key is not a DER SubjectPublicKeyInfo")]
    BadPublicKey,
    #[error("signature does not verify with the offered key")]
    BadSignature,
}

/// Verifies `proof` over `message`; returns the key's fingerprint
/// (lowercase hex SHA-256 of its SubjectPublicKeyInfo DER), which the
/// caller compares with the bound one.
pub fn verify(proof: &KeyProof, message: &[u8]) -> Result<String, ProofError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let spki_der = b64
        .decode(&proof.public_key)
        .map_err(|_| ProofError::NotBase64("publicKey"))?;
    let signature = b64
        .decode(&proof.signature)
        .map_err(|_| ProofError::NotBase64("signature"))?;
    let (rest, spki) =
        SubjectPublicKeyInfo::from_der(&spki_der).map_err(|_| ProofError::BadPublicKey)?;
    if !rest.is_empty() {
        return Err(ProofError::BadPublicKey);
    }
    let point = spki.subject_public_key.data.as_ref();
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_ASN1, point)
        .verify(message, &signature)
        .map_err(|_| ProofError::BadSignature)?;
    Ok(fingerprint(&spki_der))
}

/// What the server remembers of an accepted signed report, to refuse the
/// same report again: SHA-256 of its signed bytes.
///
/// The signature is left out on purpose: ECDSA signatures are malleable
/// (for a valid `(r, s)`, `(r, n - s)` verifies too), so anyone holding a
/// captured report could make a second valid signature over the same bytes
/// and slip past a set keyed on the signature. The signed bytes name the
/// instance (its identity document) and carry the timestamp, so two honest
/// reports share a digest only if they say the same thing in the same
/// second, and dropping the second of those loses nothing.
pub fn replay_digest(signed_bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(signed_bytes).into()
}

/// Lowercase hex SHA-256 of a SubjectPublicKeyInfo DER.
pub fn fingerprint(spki_der: &[u8]) -> String {
    Sha256::digest(spki_der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{KeyPair, PublicKeyData, SigningKey};

    fn proof(key: &KeyPair, message: &[u8]) -> KeyProof {
        let b64 = base64::engine::general_purpose::STANDARD;
        KeyProof {
            public_key: b64.encode(key.subject_public_key_info()),
            signature: b64.encode(key.sign(message).unwrap()),
        }
    }

    #[test]
    fn a_signature_by_the_key_verifies_and_names_it() {
        let key = KeyPair::generate().unwrap();
        let fp = verify(&proof(&key, b"report"), b"report").unwrap();
        assert_eq!(fp, fingerprint(&key.subject_public_key_info()));
    }

    #[test]
    fn the_replay_digest_ignores_the_signature() {
        let key = KeyPair::generate().unwrap();
        // ECDSA signs with a fresh nonce: two signatures, one message.
        let (a, b) = (proof(&key, b"report"), proof(&key, b"report"));
        assert_ne!(a.signature, b.signature);
        assert_eq!(replay_digest(b"report"), replay_digest(b"report"));
        assert_ne!(replay_digest(b"report"), replay_digest(b"report2"));
    }

    #[test]
    fn another_message_or_key_is_refused() {
        let key = KeyPair::generate().unwrap();
        assert_eq!(
            verify(&proof(&key, b"report"), b"other"),
            Err(ProofError::BadSignature)
        );
        let mut mixed = proof(&key, b"report");
        mixed.public_key = proof(&KeyPair::generate().unwrap(), b"x").public_key;
        assert_eq!(verify(&mixed, b"report"), Err(ProofError::BadSignature));
        let mut garbage = proof(&key, b"report");
        garbage.public_key = "AAAA".into();
        assert_eq!(verify(&garbage, b"report"), Err(ProofError::BadPublicKey));
    }
}
