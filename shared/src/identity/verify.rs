//! Signature → verified document.

use super::document::{claimed_region, IdentityDocument};
use super::error::IdentityError;
use super::signature::ParsedSignature;
use super::trust::TrustStore;
use sha2::{Digest, Sha256};

/// A document whose signature verified against a pinned certificate. The
/// only way to obtain one is [`verify`] (or [`verify_parsed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedDocument {
    document: IdentityDocument,
    content: Vec<u8>,
}

impl VerifiedDocument {
    /// The parsed document.
    pub fn document(&self) -> &IdentityDocument {
        &self.document
    }

    /// The exact signed bytes the document was parsed from.
    pub fn content_bytes(&self) -> &[u8] {
        &self.content
    }

    /// The parsed document, by value.
    pub fn into_document(self) -> IdentityDocument {
        self.document
    }
}

/// Verify what IMDS serves at `/latest/dynamic/instance-identity/rsa2048`
/// (base64, with or without PEM armour) against `trust`, and return the
/// document it carries.
pub fn verify(rsa2048: &[u8], trust: &TrustStore) -> Result<VerifiedDocument, IdentityError> {
    verify_parsed(ParsedSignature::from_text(rsa2048)?, trust)
}

/// Verify an already decoded signature (see [`ParsedSignature::from_ber`]).
pub fn verify_parsed(
    parsed: ParsedSignature,
    trust: &TrustStore,
) -> Result<VerifiedDocument, IdentityError> {
    let region = claimed_region(parsed.content())?;
    // The digest check is cheap and names tampering precisely; the RSA
    // check then binds the digest (inside the signed attributes) to the key.
    if Sha256::digest(parsed.content()).as_slice() != parsed.message_digest() {
        return Err(IdentityError::MessageDigestMismatch);
    }
    trust.verify(
        &region,
        parsed.issuer_der(),
        parsed.serial(),
        parsed.signed_attrs_der(),
        parsed.signature(),
    )?;
    let document = IdentityDocument::from_verified(parsed.content())?;
    Ok(VerifiedDocument {
        document,
        content: parsed.content().to_vec(),
    })
}
