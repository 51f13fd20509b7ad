//! Why an identity document was refused.
//!
//! One variant per reason, so the server can put the precise reason in its
//! log, an Event and a metric label (see [`IdentityError::label`]) while the
//! caller only gets a generic refusal.

use thiserror::Error;

/// Why a signature (and so the document it carries) was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdentityError {
    /// Nothing, or only whitespace, was supplied.
    #[error("the signature is empty")]
    Empty,
    /// The text is not base64 (optionally inside PEM armour).
    #[error("the signature is not base64 or PEM: {0}")]
    NotBase64(String),
    /// A bare 128-byte blob: what IMDS serves at `.../instance-identity/signature`.
    #[error(
        "this is the RSA-1024 `signature` form (a bare 128-byte signature); \
         send the `rsa2048` form from /latest/dynamic/instance-identity/rsa2048"
    )]
    Rsa1024SignatureForm,
    /// The bytes are not a BER-encoded CMS `ContentInfo`.
    #[error("the signature is not BER-encoded PKCS#7/CMS: {0}")]
    NotCms(String),
    /// A `ContentInfo` of another type than signed-data.
    #[error("the PKCS#7 content type is {0}, not signed-data (1.2.840.113549.1.7.2)")]
    NotSignedData(String),
    /// DSA or SHA-1: what IMDS serves at `.../instance-identity/pkcs7`.
    #[error(
        "this is the DSA/SHA-1 `pkcs7` form; send the `rsa2048` form from \
         /latest/dynamic/instance-identity/rsa2048"
    )]
    DsaPkcs7Form,
    /// The signature carries certificates; AWS's never do, and a carried
    /// certificate is never trusted.
    #[error("the signature carries certificates; AWS's carry none and only pinned certificates are trusted")]
    CarriesCertificates,
    /// The signature carries revocation lists; AWS's never do.
    #[error("the signature carries revocation information; AWS's carry none")]
    CarriesRevocationInfo,
    /// The encapsulated content is not `id-data`.
    #[error("the signed content type is {0}, not id-data (1.2.840.113549.1.7.1)")]
    ContentNotData(String),
    /// A detached signature: there is no document inside.
    #[error(
        "the signature carries no content (detached); the document must be the signed content"
    )]
    NoContent,
    /// Not exactly one signer.
    #[error("the signature has {0} signers; exactly one is expected")]
    SignerCount(usize),
    /// The signer is named by subject key identifier, not issuer and serial.
    #[error(
        "the signer is identified by subject key identifier; issuer and serial number are expected"
    )]
    SignerNotIssuerSerial,
    /// A digest algorithm other than SHA-256.
    #[error("digest algorithm {0} is not accepted; only sha256 (2.16.840.1.101.3.4.2.1) is")]
    UnsupportedDigest(String),
    /// A signature algorithm other than RSA (PKCS#1 v1.5) with SHA-256.
    #[error("signature algorithm {0} is not accepted; only rsaEncryption and sha256WithRSAEncryption are")]
    UnsupportedSignatureAlgorithm(String),
    /// Algorithm parameters other than absent or NULL.
    #[error("algorithm {0} has parameters other than NULL")]
    UnexpectedAlgorithmParameters(String),
    /// No signed attributes, so nothing binds the content to the signature.
    #[error("the signer has no signed attributes")]
    NoSignedAttributes,
    /// The signed content-type attribute is missing, repeated or malformed.
    #[error("the signed content-type attribute is missing, repeated or malformed")]
    BadContentTypeAttribute,
    /// The signed content-type attribute names another type than the content.
    #[error("the signed content-type attribute is {0}, not id-data")]
    ContentTypeAttributeMismatch(String),
    /// The signed message-digest attribute is missing, repeated or malformed.
    #[error("the signed message-digest attribute is missing, repeated or malformed")]
    BadMessageDigestAttribute,
    /// The content's SHA-256 is not the signed message digest.
    #[error("the content does not match the signed message digest (the document was altered)")]
    MessageDigestMismatch,
    /// The content has no readable `region`, so no certificate can be chosen.
    #[error("the signed content has no readable region: {0}")]
    NoRegion(String),
    /// No certificate is pinned for the document's region.
    #[error("no certificate is pinned for region {0:?}")]
    NoPinnedCertificate(String),
    /// Certificates are pinned for the region, but none has the signer's
    /// issuer and serial number.
    #[error(
        "the signer (issuer and serial number) is none of the certificates pinned for region {0:?}"
    )]
    SignerNotPinned(String),
    /// The RSA signature does not verify with the pinned key.
    #[error("the RSA signature does not verify with the pinned certificate for region {0:?}")]
    BadSignature(String),
    /// The verified content is not an identity document.
    #[error("the signed content is not a valid instance identity document: {0}")]
    BadDocument(String),
}

impl IdentityError {
    /// A short, stable, low-cardinality name for metrics labels.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::NotBase64(_) => "not_base64",
            Self::Rsa1024SignatureForm => "rsa1024_signature_form",
            Self::NotCms(_) => "not_cms",
            Self::NotSignedData(_) => "not_signed_data",
            Self::DsaPkcs7Form => "dsa_pkcs7_form",
            Self::CarriesCertificates => "carries_certificates",
            Self::CarriesRevocationInfo => "carries_revocation_info",
            Self::ContentNotData(_) => "content_not_data",
            Self::NoContent => "no_content",
            Self::SignerCount(_) => "signer_count",
            Self::SignerNotIssuerSerial => "signer_not_issuer_serial",
            Self::UnsupportedDigest(_) => "unsupported_digest",
            Self::UnsupportedSignatureAlgorithm(_) => "unsupported_signature_algorithm",
            Self::UnexpectedAlgorithmParameters(_) => "unexpected_algorithm_parameters",
            Self::NoSignedAttributes => "no_signed_attributes",
            Self::BadContentTypeAttribute => "bad_content_type_attribute",
            Self::ContentTypeAttributeMismatch(_) => "content_type_attribute_mismatch",
            Self::BadMessageDigestAttribute => "bad_message_digest_attribute",
            Self::MessageDigestMismatch => "message_digest_mismatch",
            Self::NoRegion(_) => "no_region",
            Self::NoPinnedCertificate(_) => "no_pinned_certificate",
            Self::SignerNotPinned(_) => "signer_not_pinned",
            Self::BadSignature(_) => "bad_signature",
            Self::BadDocument(_) => "bad_document",
        }
    }
}

/// Why a certificate could not be pinned. Configuration errors: the server
/// should refuse to start rather than run with a partial trust store.
#[derive(Debug, Error)]
pub enum TrustError {
    /// The text has no `CERTIFICATE` PEM block, or a malformed one.
    #[error("{source_name}: {reason}")]
    Pem {
        /// File name or other label of where the PEM came from.
        source_name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A PEM block that is not an X.509 certificate.
    #[error("{source_name}: not an X.509 certificate: {reason}")]
    Certificate {
        /// File name or other label of where the PEM came from.
        source_name: String,
        /// The decoder's message.
        reason: String,
    },
    /// A certificate whose key is not RSA, or is shorter than 2048 bits.
    #[error("{source_name}: the certificate's key must be RSA of at least 2048 bits: {reason}")]
    Key {
        /// File name or other label of where the PEM came from.
        source_name: String,
        /// What is wrong with the key.
        reason: String,
    },
    /// A file in a certificate directory whose name says no region.
    #[error(
        "{0}: a certificate file must be named <region>.pem (e.g. us-west-2.pem) \
         or any.pem (trusted for every region)"
    )]
    FileName(String),
    /// Reading a file or directory failed.
    #[error("{path}: {source}")]
    Io {
        /// The path that could not be read.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Why a verified document is not allowed to join.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    /// The account is not on the allow-list.
    #[error("account {0} is not allowed")]
    AccountNotAllowed(String),
    /// The region is not on the allow-list.
    #[error("region {0} is not allowed")]
    RegionNotAllowed(String),
    /// `pendingTime` is later than now plus the clock-skew allowance.
    #[error("pendingTime {pending} is in the future (now {now}, clock-skew allowance {skew_s} s)")]
    PendingTimeInFuture {
        /// The document's pendingTime (RFC 3339).
        pending: String,
        /// The verifier's clock (RFC 3339).
        now: String,
        /// The allowance in seconds.
        skew_s: i64,
    },
    /// `pendingTime` is older than the configured maximum age.
    #[error("pendingTime {pending} is older than the maximum age of {max_age_s} s (now {now})")]
    TooOld {
        /// The document's pendingTime (RFC 3339).
        pending: String,
        /// The verifier's clock (RFC 3339).
        now: String,
        /// The maximum age in seconds.
        max_age_s: i64,
    },
}

impl PolicyError {
    /// A short, stable, low-cardinality name for metrics labels.
    pub fn label(&self) -> &'static str {
        match self {
            Self::AccountNotAllowed(_) => "account_not_allowed",
            Self::RegionNotAllowed(_) => "region_not_allowed",
            Self::PendingTimeInFuture { .. } => "pending_time_in_future",
            Self::TooOld { .. } => "too_old",
        }
    }
}
