//! Why a CSR was refused: one variant per rule, so the log, the Event and
//! the metric label all say which.

use std::net::IpAddr;

use super::{NODES_GROUP, RSA_MAX_BITS, RSA_MIN_BITS};

/// Why a CSR (or its usages) was refused. Messages name what was found and
/// what was expected; [`CsrError::reason`] gives the metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    /// The input is larger than [`MAX_CSR_PEM_BYTES`](super::MAX_CSR_PEM_BYTES).
    #[error("CSR PEM is {len} bytes, more than the {max} allowed")]
    TooLarge {
        /// Input length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// No PEM block at all (empty input, garbage, DER without armour).
    #[error("no PEM block found, expected one CERTIFICATE REQUEST block")]
    NoPemBlock,
    /// More than one PEM block.
    #[error("found {found} PEM blocks, expected exactly one")]
    MultiplePemBlocks {
        /// How many BEGIN lines were seen.
        found: usize,
    },
    /// A PEM block that is not a certificate request.
    #[error("PEM block is {found:?}, expected \"CERTIFICATE REQUEST\"")]
    WrongPemLabel {
        /// The label found.
        found: String,
    },
    /// The PEM armour or the DER inside does not decode as a CSR.
    #[error("CSR does not parse: {detail}")]
    Unparsable {
        /// What failed.
        detail: String,
    },
    /// The same extension is requested twice (readers would disagree on
    /// which one counts).
    #[error("CSR requests extension {oid} more than once")]
    DuplicateExtension {
        /// Dotted OID of the extension.
        oid: String,
    },
    /// A SAN of a type kubelet never requests (otherName, directoryName...).
    #[error("CSR has a {kind} SAN; only DNS and IP SANs are ever accepted")]
    UnsupportedSan {
        /// The GeneralName type.
        kind: &'static str,
    },
    /// RSA key below [`RSA_MIN_BITS`].
    #[error("CSR key is rsa {bits} bits, expected at least {RSA_MIN_BITS}")]
    WeakKey {
        /// Modulus length found.
        bits: usize,
    },
    /// RSA key above [`RSA_MAX_BITS`].
    #[error("CSR key is rsa {bits} bits, expected at most {RSA_MAX_BITS}")]
    OversizedKey {
        /// Modulus length found.
        bits: usize,
    },
    /// A key type outside the policy.
    #[error("CSR key is {found}, expected ecdsa P-256, ecdsa P-384 or rsa {RSA_MIN_BITS}..={RSA_MAX_BITS} bits")]
    UnsupportedKey {
        /// Description of the key.
        found: String,
    },
    /// A signature algorithm outside the allow-list (SHA-1, PSS, ...).
    #[error("CSR is signed with {found}, expected ecdsa-with-SHA256/384 or sha256/384/512WithRSAEncryption")]
    UnsupportedSignatureAlgorithm {
        /// Dotted OID of the algorithm.
        found: String,
    },
    /// The self-signature does not verify: no proof of possession.
    #[error("CSR self-signature does not verify with its own public key")]
    BadSignature,
    /// The subject holds two or more CNs.
    #[error("CSR subject has {} common names {found:?}, expected exactly one", found.len())]
    MultipleCommonNames {
        /// Every CN found.
        found: Vec<String>,
    },
    /// A subject attribute that is not a readable string.
    #[error("CSR subject attribute {oid} is not a string")]
    UnreadableSubject {
        /// Dotted OID of the attribute.
        oid: String,
    },
    /// The node name the CN is checked against is empty.
    #[error("node name to check the CSR against is empty")]
    EmptyNodeName,
    /// The CN is not `system:node:<node name>`.
    #[error("CSR common name is {found:?}, expected {expected:?}")]
    BadCommonName {
        /// CN found, if any.
        found: Option<String>,
        /// CN required.
        expected: String,
    },
    /// O is not exactly `["system:nodes"]`.
    #[error("CSR organizations are {found:?}, expected [\"{NODES_GROUP}\"]")]
    BadOrganizations {
        /// Organizations found.
        found: Vec<String>,
    },
    /// Subject attributes besides CN and O.
    #[error("CSR subject has attributes other than CN and O, expected only CN and O")]
    UnexpectedSubjectFields,
    /// A client CSR with SANs.
    #[error("client CSR has SANs (dns {dns:?}, ip {ips:?}, email {emails:?}, uri {uris:?}), expected none")]
    HasSans {
        /// DNS SANs found.
        dns: Vec<String>,
        /// IP SANs found.
        ips: Vec<IpAddr>,
        /// Email SANs found.
        emails: Vec<String>,
        /// URI SANs found.
        uris: Vec<String>,
    },
    /// A serving CSR with neither DNS nor IP SANs.
    #[error("serving CSR has no DNS or IP SAN, expected at least one")]
    NoSans,
    /// A serving CSR with email or URI SANs.
    #[error("serving CSR has {kind} SAN {value:?}, expected only DNS and IP SANs")]
    ForbiddenSan {
        /// "email" or "uri".
        kind: &'static str,
        /// The SAN.
        value: String,
    },
    /// A DNS SAN with a wildcard.
    #[error("serving CSR has wildcard DNS SAN {found:?}; wildcards are never allowed")]
    WildcardSan {
        /// The SAN.
        found: String,
    },
    /// A DNS SAN that is not one of the instance's names.
    #[error("serving CSR DNS SAN {found:?} is not one of the instance's names {allowed:?}")]
    DnsSanNotAllowed {
        /// The SAN.
        found: String,
        /// The names allowed.
        allowed: Vec<String>,
    },
    /// An IP SAN that is not one of the instance's addresses.
    #[error("serving CSR IP SAN {found} is not one of the instance's addresses {allowed:?}")]
    IpSanNotAllowed {
        /// The SAN.
        found: IpAddr,
        /// The addresses allowed.
        allowed: Vec<IpAddr>,
    },
    /// A required usage is missing.
    #[error("usages {found:?} lack {missing:?}")]
    MissingUsage {
        /// The usage required.
        missing: &'static str,
        /// The usages found.
        found: Vec<String>,
    },
    /// A usage that is not allowed for this purpose.
    #[error("usages {found:?} include {unexpected:?}, allowed only {allowed:?}")]
    UnexpectedUsage {
        /// The offending usage.
        unexpected: String,
        /// The usages found.
        found: Vec<String>,
        /// What may appear.
        allowed: Vec<&'static str>,
    },
    /// A usage listed twice.
    #[error("usages {found:?} list {duplicate:?} more than once")]
    DuplicateUsage {
        /// The repeated usage.
        duplicate: String,
        /// The usages found.
        found: Vec<String>,
    },
}

impl CsrError {
    /// Short snake_case label for metrics and Events.
    pub fn reason(&self) -> &'static str {
        match self {
            CsrError::TooLarge { .. } => "csr_too_large",
            CsrError::NoPemBlock
            | CsrError::MultiplePemBlocks { .. }
            | CsrError::WrongPemLabel { .. } => "csr_bad_pem",
            CsrError::Unparsable { .. } | CsrError::UnreadableSubject { .. } => "csr_unparsable",
            CsrError::DuplicateExtension { .. } => "csr_duplicate_extension",
            CsrError::UnsupportedSan { .. } => "csr_unsupported_san",
            CsrError::WeakKey { .. } => "csr_weak_key",
            CsrError::OversizedKey { .. } => "csr_oversized_key",
            CsrError::UnsupportedKey { .. } => "csr_unsupported_key",
            CsrError::UnsupportedSignatureAlgorithm { .. } => "csr_bad_signature_algorithm",
            CsrError::BadSignature => "csr_bad_signature",
            CsrError::MultipleCommonNames { .. }
            | CsrError::EmptyNodeName
            | CsrError::BadCommonName { .. } => "csr_bad_common_name",
            CsrError::BadOrganizations { .. } => "csr_bad_organization",
            CsrError::UnexpectedSubjectFields => "csr_unexpected_subject_fields",
            CsrError::HasSans { .. } => "csr_has_sans",
            CsrError::NoSans => "csr_no_sans",
            CsrError::ForbiddenSan { .. } => "csr_forbidden_san",
            CsrError::WildcardSan { .. } => "csr_wildcard_san",
            CsrError::DnsSanNotAllowed { .. } | CsrError::IpSanNotAllowed { .. } => {
                "csr_san_not_allowed"
            }
            CsrError::MissingUsage { .. }
            | CsrError::UnexpectedUsage { .. }
            | CsrError::DuplicateUsage { .. } => "csr_bad_usages",
        }
    }
}
