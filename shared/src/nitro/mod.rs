//! AWS Nitro attestation documents (NitroTPM and Nitro Enclaves), verified
//! strictly against a pinned root.
//!
//! A NitroTPM on an EC2 instance (or the NSM of an enclave) signs, on
//! request, a document naming its module (`module_id`, which carries the
//! instance id), its PCRs at that moment and three values the caller chose:
//! `nonce`, `user_data` and `public_key`. [`verify`] decides whether bytes
//! are such a document, signed through AWS's Nitro PKI, and returns what it
//! says ([`Document`]).
//!
//! # What is checked, in order
//!
//! 1. **Size**: at most [`MAX_DOCUMENT_BYTES`] (real ones are 4.4–7.6 KB),
//!    before any parsing.
//! 2. **CBOR** ([`cbor`]): one item, nothing after it, no repeated map key
//!    (two readers must not see two different documents in the same
//!    signed bytes), bounded nesting, lengths checked before allocating.
//! 3. **COSE_Sign1** ([`cose`]): a 4-element array, optionally tag 18;
//!    protected header exactly `{1: -35}` (ES384, the only algorithm AWS
//!    uses, so there is nothing to negotiate); unprotected header empty
//!    (it is not signed); a 96-byte r‖s signature.
//! 4. **Payload** ([`document`]): the fields AWS defines and no others,
//!    each of its type and within its bounds; exactly one PCR map, which
//!    says the [`Kind`].
//! 5. **Chain** ([`chain`]): `cabundle[0]` byte-identical to the pinned
//!    [`Root`] (a document's own root is never trusted: anyone can make a
//!    root with AWS's name), then each link to the leaf: issuer name is the
//!    parent's subject, ECDSA P-384/SHA-384 signature by the parent's key,
//!    CAs with critical basicConstraints CA=true within their pathLen and
//!    keyCertSign, a leaf that is not a CA and has digitalSignature, no
//!    critical extension other than those two, and the bytes outside each
//!    signed part (signature algorithm, signature) in their one DER
//!    encoding. The root's own self-signature is checked once, when it is
//!    pinned ([`Root::from_pem`]), not per document.
//! 6. **Signature**: ECDSA P-384/SHA-384 by the leaf's key over
//!    `["Signature1", protected, h'', payload]`, built from the bytes
//!    received, never from a re-encoding (AWS's NitroTPM payloads are
//!    indefinite-length maps; re-encoding them changes the bytes).
//! 7. **Dates**: every certificate valid at the instant chosen with [`At`].
//!    Last, so that [`Failure::Expired`] is only said of a document that is
//!    authentic in every other way.
//!
//! # Which instant
//!
//! Leaf certificates live 3 hours and are reused, so a document is checked
//! at its own `timestamp` ([`At::DocumentTime`]): the chain was valid when
//! the module signed. That proves nothing about freshness: the timestamp is
//! the signer's claim, and a caller that needs a fresh document must demand
//! its own nonce in it (and may check the timestamp against its clock).
//! [`At::Instant`] checks at another time, e.g. now.
//!
//! # What a verified document does not prove
//!
//! - That it is fresh or meant for this caller: only a nonce the caller
//!   issued and checks proves that; [`verify`] returns the nonce, it does not
//!   judge it.
//! - That the instance is the one the caller thinks: compare
//!   [`Document::instance_id`] with what else the caller knows.
//! - That the PCRs are good: they are what the module measured; whether
//!   they are allowed is the caller's policy.
//! - That `user_data` or `public_key` belong to anyone in particular: they
//!   are whatever the process that asked the module passed in.
//! - Revocation: AWS's certificates name CRLs; they are not fetched (no I/O
//!   here, and the leaves live hours).

pub mod cbor;
pub mod chain;
pub mod cose;
pub mod document;
mod error;

#[cfg(test)]
mod tests;

use std::time::SystemTime;

use x509_parser::pem::Pem;

pub use chain::Memo;
pub use document::{Document, Kind};
pub use error::{Failure, NitroError};

/// The largest document accepted on the wire. Real ones are 4.4 to 7.6 KB
/// (the largest carry 1024 bytes each of nonce, user data and public key);
/// 16 KiB leaves room without letting one request cost more.
pub const MAX_DOCUMENT_BYTES: usize = 16 * 1024;

/// AWS Nitro Enclaves Root-G1 as AWS publishes it (PEM).
const AWS_ROOT_G1_PEM: &[u8] = include_bytes!("aws-nitro-root-g1.pem");

/// The pinned root of the Nitro PKI: the only certificate trusted as
/// `cabundle[0]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    der: Vec<u8>,
}

impl Root {
    /// AWS Nitro Enclaves Root-G1 (the root of NitroTPM documents too),
    /// compiled in; a test checks its SHA-256 against the fingerprint AWS
    /// publishes.
    pub fn aws() -> Root {
        // A test proves this constant parses. Were it ever not to, an empty
        // root matches no `cabundle[0]`: every document is refused
        // (fail closed) rather than the process panicking.
        Root::from_pem(AWS_ROOT_G1_PEM).unwrap_or(Root { der: Vec::new() })
    }

    /// One PEM certificate: a self-signed P-384 CA (e.g. a test PKI's root).
    pub fn from_pem(pem: &[u8]) -> Result<Root, NitroError> {
        let mut blocks = Pem::iter_from_buffer(pem);
        let first = blocks
            .next()
            .ok_or_else(|| NitroError::RootPem("no PEM block".into()))?
            .map_err(|e| NitroError::RootPem(e.to_string()))?;
        if blocks.next().is_some() {
            return Err(NitroError::RootPem("more than one PEM block".into()));
        }
        if first.label != "CERTIFICATE" {
            return Err(NitroError::RootPem(format!(
                "a {} block, not a CERTIFICATE",
                first.label
            )));
        }
        Root::from_der(first.contents)
    }

    /// One DER certificate: a self-signed P-384 CA.
    pub fn from_der(der: Vec<u8>) -> Result<Root, NitroError> {
        chain::check_root(&der).map_err(|e| NitroError::RootPem(e.to_string()))?;
        Ok(Root { der })
    }

    /// The root's DER.
    pub fn der(&self) -> &[u8] {
        &self.der
    }
}

/// The instant at which the certificates must be valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// The document's own `timestamp` (see the module docs for why).
    DocumentTime,
    /// Another instant, e.g. now.
    Instant(SystemTime),
}

/// Verifies a raw attestation document (the bytes `nitro-tpm-attest`
/// writes) against `root`, with certificates valid at `at`, and returns
/// what it says. See the module docs for every check.
pub fn verify(bytes: &[u8], root: &Root, at: At) -> Result<Document, NitroError> {
    verify_with(bytes, root, at, &Memo::new(0))
}

/// [`verify`], with the shared CAs' signatures remembered in `memo` from
/// one document to the next (a server verifying a fleet's documents keeps
/// one [`Memo`]).
pub fn verify_with(bytes: &[u8], root: &Root, at: At, memo: &Memo) -> Result<Document, NitroError> {
    if bytes.len() > MAX_DOCUMENT_BYTES {
        return Err(NitroError::TooLarge(bytes.len()));
    }
    let sign1 = cose::Sign1::parse(bytes)?;
    let payload = document::Payload::parse(&sign1.payload)?;
    let instant = match at {
        At::DocumentTime => payload.document.timestamp,
        At::Instant(instant) => instant,
    };
    // Authenticity first (chain, then signature), dates last: a tampered
    // document is never reported as merely expired.
    let chain =
        chain::Chain::authenticate(root.der(), &payload.cabundle, &payload.certificate, memo)?;
    sign1.verify(chain.leaf_point())?;
    chain.check_valid_at(instant)?;
    Ok(payload.document)
}
