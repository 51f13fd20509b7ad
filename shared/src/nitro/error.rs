//! Why an attestation document was refused.
//!
//! One variant per reason for the logs; [`NitroError::kind`] folds them into
//! the four [`Failure`]s a caller acts on (the server gives each its own
//! refusal reason and metric label).

use thiserror::Error;

use super::cbor::CborError;

/// The four ways a document fails, each answered differently by a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Failure {
    /// Not a document of the accepted shape: CBOR, COSE_Sign1 framing, the
    /// payload's fields, its size.
    Malformed,
    /// The certificates do not lead to the pinned root: another root, a
    /// broken link, a certificate that is not what its place in the chain
    /// requires.
    Untrusted,
    /// An authentic chain, but a certificate is not valid at the instant the
    /// document was checked at.
    Expired,
    /// The chain is trusted but the COSE signature over the payload is not
    /// the leaf key's.
    Signature,
}

impl Failure {
    /// A short stable name, for metric labels and logs.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Malformed => "malformed",
            Failure::Untrusted => "untrusted",
            Failure::Expired => "expired",
            Failure::Signature => "signature",
        }
    }
}

/// Why a document (or a root) was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NitroError {
    /// More bytes than [`super::MAX_DOCUMENT_BYTES`].
    #[error("the document is {0} bytes, more than the {max} accepted", max = super::MAX_DOCUMENT_BYTES)]
    TooLarge(usize),
    /// The bytes are not the strict CBOR accepted.
    #[error("{what} is not valid CBOR: {source}")]
    Cbor {
        /// Which part: the document, the protected header or the payload.
        what: &'static str,
        /// The reader's reason.
        source: CborError,
    },
    /// The COSE_Sign1 envelope is not the shape AWS sends.
    #[error("COSE_Sign1: {0}")]
    Cose(&'static str),
    /// A payload field is missing, of the wrong type or outside its bounds.
    #[error("payload: {0}")]
    Payload(String),
    /// A PEM given as the root is not one certificate.
    #[error("the root is not one PEM certificate: {0}")]
    RootPem(String),
    /// `cabundle[0]` is not the pinned root, byte for byte.
    #[error("cabundle[0] is not the pinned root certificate")]
    NotPinnedRoot,
    /// A certificate of the chain is refused (index 0 is the root, the last
    /// one the leaf).
    #[error("certificate {index} of the chain: {reason}")]
    Chain {
        /// Position in root → … → leaf.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A certificate of an authentic chain is not valid at the instant.
    #[error("certificate {index} of the chain is not valid at {at_ms} ms since the epoch (valid {not_before} .. {not_after} s)")]
    NotValidAt {
        /// Position in root → … → leaf.
        index: usize,
        /// The instant checked, in milliseconds since the Unix epoch.
        at_ms: i128,
        /// Its notBefore, in seconds since the Unix epoch.
        not_before: i64,
        /// Its notAfter, in seconds since the Unix epoch.
        not_after: i64,
    },
    /// The COSE signature is not the leaf key's over this payload.
    #[error("the COSE signature does not verify with the leaf certificate's key")]
    BadSignature,
}

impl NitroError {
    /// Which of the four failures this is.
    pub fn kind(&self) -> Failure {
        match self {
            NitroError::TooLarge(_)
            | NitroError::Cbor { .. }
            | NitroError::Cose(_)
            | NitroError::Payload(_)
            | NitroError::RootPem(_) => Failure::Malformed,
            NitroError::NotPinnedRoot | NitroError::Chain { .. } => Failure::Untrusted,
            NitroError::NotValidAt { .. } => Failure::Expired,
            NitroError::BadSignature => Failure::Signature,
        }
    }

    pub(crate) fn payload(reason: impl Into<String>) -> NitroError {
        NitroError::Payload(reason.into())
    }

    pub(crate) fn chain(index: usize, reason: impl Into<String>) -> NitroError {
        NitroError::Chain {
            index,
            reason: reason.into(),
        }
    }
}
