//! EC2 instance identity: verify AWS-signed identity documents, strictly.
//!
//! A node proves which instance it is with the `rsa2048` signature IMDS
//! serves at `/latest/dynamic/instance-identity/rsa2048`. [`verify`] checks
//! it against a pinned certificate and returns the document it carries
//! ([`VerifiedDocument`]); [`Policy::check`] then decides whether that
//! instance may join now. No API accepts a document beside its signature:
//! the signed content is the document.
//!
//! # The shape accepted
//!
//! Base64 (any line length; IMDS uses 76 columns), optionally inside
//! `-----BEGIN PKCS7-----` armour, of a BER or DER `ContentInfo`:
//!
//! - `contentType` = id-signedData `1.2.840.113549.1.7.2`, and its
//!   `SignedData` has:
//!   - `digestAlgorithms` = { sha256 `2.16.840.1.101.3.4.2.1` } (parameters
//!     absent or NULL);
//!   - `encapContentInfo`: `eContentType` = id-data `1.2.840.113549.1.7.1`,
//!     `eContent` present (primitive or constructed OCTET STRING) and the
//!     JSON document;
//!   - no `certificates` and no `crls` (AWS sends none; a signature that
//!     carries any is refused, never trusted);
//!   - exactly one `SignerInfo`, with
//!     - `sid` = issuerAndSerialNumber, equal (issuer name compared in DER,
//!       serial as an integer) to a certificate pinned for the document's
//!       `region`;
//!     - `digestAlgorithm` = sha256;
//!     - `signedAttrs` containing exactly one content-type attribute
//!       (`1.2.840.113549.1.9.3`) with the single value id-data, and exactly
//!       one message-digest attribute (`1.2.840.113549.1.9.4`) with the
//!       single value SHA-256(eContent). Other attributes (AWS adds
//!       signingTime and CMSAlgorithmProtection) are signed but not read;
//!     - `signatureAlgorithm` = rsaEncryption `1.2.840.113549.1.1.1` or
//!       sha256WithRSAEncryption `1.2.840.113549.1.1.11` (AWS's real
//!       signatures use the latter), parameters absent or NULL;
//!     - `signature` = RSASSA-PKCS1-v1_5 with SHA-256 over the DER encoding
//!       of `signedAttrs` as a SET OF (tag 0x31, RFC 5652 §5.4).
//!     - `unsignedAttrs`, if any, are ignored.
//!
//! A signer that produces this shape with a key whose certificate the
//! operator pinned (see [`TrustStore`]) is accepted exactly like AWS; that
//! is how a test cloud plays AWS's role.
//!
//! The other two forms IMDS serves are named and refused: the `pkcs7`
//! endpoint's DSA/SHA-1 signature ([`IdentityError::DsaPkcs7Form`]) and the
//! `signature` endpoint's bare RSA-1024 blob
//! ([`IdentityError::Rsa1024SignatureForm`]).
//!
//! # Trust
//!
//! [`TrustStore::aws`] embeds AWS's rsa2048 certificate for each of its 39
//! regions, each trusted for its own region only. An operator adds more with
//! [`TrustStore::add_pem`] ([`Scope::Region`] or [`Scope::AnyRegion`]),
//! [`TrustStore::load_file`] or [`TrustStore::load_dir`], where a file named
//! `<region>.pem` is trusted for that region and `any.pem` for all. Validity
//! dates of pinned certificates are not enforced (AWS signs with expired
//! ones).
//!
//! # Why `rasn`
//!
//! AWS emits these signatures in BER with indefinite lengths and a
//! constructed OCTET STRING around the document. RustCrypto's `cms` (on
//! `der`, both 0.2 and 0.3-rc) is DER-only and refuses them ("indefinite
//! length disallowed"). `rasn` (with `rasn-cms` for the CMS types) is a
//! maintained, `no_std`, pure-Rust ASN.1 codec whose BER decoder reads them
//! as served, and whose DER encoder gives us the canonical encoding of the
//! signed attributes that the signature covers. Pinned keys are validated
//! with RustCrypto's `rsa` (RSA, >= 2048 bits); the PKCS#1 v1.5 / SHA-256
//! verification itself is ring's, which measured ~9x faster than `rsa` 0.9
//! on the real sample (see shared/IDENTITY.md). Only public-key operations
//! are done, so `rsa`'s private-key timing issue (Marvin) does not apply.

mod aws_certs;
mod document;
mod error;
mod pem;
mod policy;
mod signature;
mod trust;
mod verify;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod testutil;

pub use document::IdentityDocument;
pub use error::{IdentityError, PolicyError, TrustError};
pub use policy::{Policy, DEFAULT_CLOCK_SKEW, DEFAULT_MAX_AGE};
pub use signature::{oids, ParsedSignature};
pub use trust::{Scope, TrustStore};
pub use verify::{verify, verify_parsed, VerifiedDocument};
