//! Kubelet certificate signing requests: parsing and the approval rules.
//!
//! The server auto-approves a kubelet CSR only when every rule here passes,
//! so this module is deliberately strict: it accepts what kubelet (and the
//! agent) actually produce and refuses everything else, with one
//! [`CsrError`] variant per refusal so the server's log, Event and metric
//! label say exactly why.
//!
//! The flow is: [`parse_csr`] (PEM, DER, key policy, proof of possession),
//! then [`check_client_csr`] or [`check_serving_csr`] with names the server
//! took from EC2/the NodeClaim (never from the request), and for CSR objects
//! kubelet created itself, [`check_usages`] on `spec.usages`.
//!
//! Decisions worth knowing:
//!
//! - Subject: kube reads only CN (user) and O (groups), but the signers copy
//!   the whole subject into the certificate. Kubelet never sets anything
//!   else, so any other subject attribute is refused rather than signed.
//! - Names: Go's parser takes the *last* CN; two CNs are refused here so no
//!   reader can disagree about the user. SANs are collected from every
//!   extension request attribute and duplicate extensions are refused, so we
//!   never check fewer names than the signer copies.
//! - SAN types other than DNS, IP, email and URI are refused outright:
//!   kubelet never asks for them.
//! - IPv4 SANs must be 4-byte; an IPv4-mapped IPv6 SAN is compared as IPv6
//!   and so does not match an allowed IPv4 address.
//! - Keys are checked in [`parse_csr`] before the signature, because ring
//!   cannot verify RSA under 2048 bits at all and the refusal should name the
//!   key, not claim a bad signature.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;

use sha2::{Digest, Sha256};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::extensions::{GeneralName, ParsedExtension, X509Extension};
use x509_parser::oid_registry::{self as oids, Oid};
use x509_parser::pem::Pem;
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::{SubjectPublicKeyInfo, X509Name};

/// Prefix of a node's user name (and of its certificate's CN).
pub const NODE_USER_PREFIX: &str = "system:node:";
/// The one organization (group) a node certificate carries.
pub const NODES_GROUP: &str = "system:nodes";
/// Signer of kubelet client certificates.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Signer of kubelet serving certificates.
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// Largest PEM input accepted. An RSA-8192 CSR with a few SANs is ~3 KiB;
/// the bound keeps hostile input cheap to refuse.
pub const MAX_CSR_PEM_BYTES: usize = 64 * 1024;

/// Smallest and largest RSA modulus accepted, in bits. The upper bound caps
/// verification cost (ring refuses larger moduli too).
pub const RSA_MIN_BITS: usize = 2048;
/// See [`RSA_MIN_BITS`].
pub const RSA_MAX_BITS: usize = 8192;

const USAGE_DIGITAL_SIGNATURE: &str = "digital signature";
const USAGE_KEY_ENCIPHERMENT: &str = "key encipherment";
const USAGE_CLIENT_AUTH: &str = "client auth";
const USAGE_SERVER_AUTH: &str = "server auth";

/// The public key of a CSR, as far as the rules care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    /// ECDSA on NIST P-256.
    EcdsaP256,
    /// ECDSA on NIST P-384.
    EcdsaP384,
    /// RSA with a modulus of `bits` bits (leading zeros not counted).
    Rsa {
        /// Modulus length in bits.
        bits: usize,
    },
    /// Anything else, described for error messages ("ed25519",
    /// "ecdsa secp256k1", ...).
    Other(String),
}

impl fmt::Display for KeyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyKind::EcdsaP256 => f.write_str("ecdsa P-256"),
            KeyKind::EcdsaP384 => f.write_str("ecdsa P-384"),
            KeyKind::Rsa { bits } => write!(f, "rsa {bits} bits"),
            KeyKind::Other(what) => f.write_str(what),
        }
    }
}

/// Which kubelet certificate a CSR is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Client certificate (signer [`CLIENT_SIGNER`]).
    Client,
    /// Serving certificate (signer [`SERVING_SIGNER`]).
    Serving,
}

impl Purpose {
    /// The extended usage this purpose requires ("client auth"/"server auth").
    fn auth_usage(self) -> &'static str {
        match self {
            Purpose::Client => USAGE_CLIENT_AUTH,
            Purpose::Serving => USAGE_SERVER_AUTH,
        }
    }

    /// The kube-controller-manager signer for this purpose.
    pub fn signer(self) -> &'static str {
        match self {
            Purpose::Client => CLIENT_SIGNER,
            Purpose::Serving => SERVING_SIGNER,
        }
    }
}

/// A CSR whose structure, key policy and self-signature have been checked;
/// the naming rules are still to be applied with [`check_client_csr`] or
/// [`check_serving_csr`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCsr {
    /// The subject CN, if there is exactly one (two CNs are refused by
    /// [`parse_csr`]).
    pub common_name: Option<String>,
    /// Every subject O, in order.
    pub organizations: Vec<String>,
    /// Whether the subject holds anything besides CN and O. Kube ignores
    /// such attributes but the signers copy them into the certificate;
    /// kubelet never sets them, so the checks refuse them.
    pub other_subject_fields: bool,
    /// DNS SANs, as requested.
    pub dns_names: Vec<String>,
    /// IP SANs.
    pub ip_addresses: Vec<IpAddr>,
    /// Email (rfc822Name) SANs.
    pub email_addresses: Vec<String>,
    /// URI SANs.
    pub uris: Vec<String>,
    /// The public key's kind.
    pub key: KeyKind,
    /// The SubjectPublicKeyInfo, DER.
    pub spki_der: Vec<u8>,
}

impl ParsedCsr {
    /// SHA-256 over the SubjectPublicKeyInfo DER: the identity of the key.
    pub fn public_key_sha256(&self) -> [u8; 32] {
        Sha256::digest(&self.spki_der).into()
    }

    /// Lowercase hex of [`Self::public_key_sha256`], as recorded on the
    /// NodeClaim to bind an instance to one key.
    pub fn public_key_fingerprint(&self) -> String {
        self.public_key_sha256()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn has_any_san(&self) -> bool {
        !(self.dns_names.is_empty()
            && self.ip_addresses.is_empty()
            && self.email_addresses.is_empty()
            && self.uris.is_empty())
    }
}

/// Why a CSR (or its usages) was refused. Messages name what was found and
/// what was expected; [`CsrError::reason`] gives the metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    /// The input is larger than [`MAX_CSR_PEM_BYTES`].
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

// ---------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------

/// Parses a PEM CSR and proves possession of its key.
///
/// Accepts exactly one PEM block labelled `CERTIFICATE REQUEST` (or the
/// legacy `NEW CERTIFICATE REQUEST`) holding exactly one DER CSR with no
/// trailing bytes. Refuses keys outside the policy (see [`check_key`]),
/// signature algorithms outside the allow-list, ambiguous subjects and SAN
/// types kubelet never uses, then verifies the self-signature with the
/// CSR's own key. Names are extracted but not judged against the node:
/// that is [`check_client_csr`] / [`check_serving_csr`].
pub fn parse_csr(pem: &[u8]) -> Result<ParsedCsr, CsrError> {
    let der = single_pem_block(pem)?;
    let (rest, req) = X509CertificationRequest::from_der(&der).map_err(unparsable)?;
    if !rest.is_empty() {
        return Err(CsrError::Unparsable {
            detail: format!("{} bytes after the CSR", rest.len()),
        });
    }
    let info = &req.certification_request_info;
    let key = key_kind(&info.subject_pki);
    check_key(&key)?;
    check_signature_algorithm(&req.signature_algorithm.algorithm)?;
    let subject = read_subject(&info.subject)?;
    let sans = read_sans(&req)?;
    // Last: it is the costly step, and with it last the fuzzer reaches the
    // name extraction above on inputs whose signature cannot verify.
    req.verify_signature().map_err(|_| CsrError::BadSignature)?;
    Ok(ParsedCsr {
        common_name: subject.common_name,
        organizations: subject.organizations,
        other_subject_fields: subject.other_fields,
        dns_names: sans.dns,
        ip_addresses: sans.ips,
        email_addresses: sans.emails,
        uris: sans.uris,
        key,
        spki_der: info.subject_pki.raw.to_vec(),
    })
}

fn unparsable(e: impl fmt::Display) -> CsrError {
    CsrError::Unparsable {
        detail: e.to_string(),
    }
}

/// Decodes the one PEM block and returns its DER.
fn single_pem_block(pem: &[u8]) -> Result<Vec<u8>, CsrError> {
    if pem.len() > MAX_CSR_PEM_BYTES {
        return Err(CsrError::TooLarge {
            len: pem.len(),
            max: MAX_CSR_PEM_BYTES,
        });
    }
    // Counted on the raw bytes, not via the PEM reader: the reader skips what
    // it cannot decode, and a second block that another PEM decoder might
    // pick must not hide there.
    match count(pem, b"-----BEGIN") {
        0 => return Err(CsrError::NoPemBlock),
        1 => {}
        found => return Err(CsrError::MultiplePemBlocks { found }),
    }
    let block = match Pem::iter_from_buffer(pem).next() {
        None => return Err(CsrError::NoPemBlock),
        Some(block) => block.map_err(unparsable)?,
    };
    if block.label != "CERTIFICATE REQUEST" && block.label != "NEW CERTIFICATE REQUEST" {
        return Err(CsrError::WrongPemLabel { found: block.label });
    }
    // The reader stops at any END line without checking its label; Go's
    // decoder insists on the matching one. Require exactly that one.
    let end = format!("-----END {}-----", block.label);
    if count(pem, b"-----END") != 1 || count(pem, end.as_bytes()) != 1 {
        return Err(CsrError::Unparsable {
            detail: format!("PEM block does not end with {end:?}"),
        });
    }
    Ok(block.contents)
}

/// Occurrences of `needle` in `haystack`.
fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

/// Classifies the SubjectPublicKeyInfo.
fn key_kind(spki: &SubjectPublicKeyInfo<'_>) -> KeyKind {
    let alg = &spki.algorithm.algorithm;
    if *alg == oids::OID_PKCS1_RSAENCRYPTION {
        return match spki.parsed() {
            Ok(PublicKey::RSA(rsa)) => KeyKind::Rsa {
                bits: bit_length(rsa.modulus),
            },
            _ => KeyKind::Other("rsa (unreadable modulus)".to_string()),
        };
    }
    if *alg == oids::OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok());
        return ec_key_kind(curve.as_ref());
    }
    if *alg == oids::OID_SIG_ED25519 {
        return KeyKind::Other("ed25519".to_string());
    }
    KeyKind::Other(format!("key algorithm {}", alg.to_id_string()))
}

fn ec_key_kind(curve: Option<&Oid<'_>>) -> KeyKind {
    let Some(curve) = curve else {
        return KeyKind::Other("ecdsa without a named curve".to_string());
    };
    if *curve == oids::OID_EC_P256 {
        return KeyKind::EcdsaP256;
    }
    if *curve == oids::OID_NIST_EC_P384 {
        return KeyKind::EcdsaP384;
    }
    let name = match curve.to_id_string().as_str() {
        "1.3.132.0.35" => "P-521".to_string(),
        "1.3.132.0.10" => "secp256k1".to_string(),
        other => format!("curve {other}"),
    };
    KeyKind::Other(format!("ecdsa {name}"))
}

/// Bit length of a big-endian unsigned integer (DER may add a zero byte).
fn bit_length(be: &[u8]) -> usize {
    let Some(first) = be.iter().position(|b| *b != 0) else {
        return 0;
    };
    let significant = &be[first..];
    // `first` is in range, so `significant` is non-empty.
    let top = significant.first().copied().unwrap_or(0);
    (significant.len() - 1) * 8 + (8 - top.leading_zeros() as usize)
}

/// The key policy: ECDSA P-256/P-384, or RSA of 2048..=8192 bits.
pub fn check_key(key: &KeyKind) -> Result<(), CsrError> {
    match key {
        KeyKind::EcdsaP256 | KeyKind::EcdsaP384 => Ok(()),
        KeyKind::Rsa { bits } if *bits < RSA_MIN_BITS => Err(CsrError::WeakKey { bits: *bits }),
        KeyKind::Rsa { bits } if *bits > RSA_MAX_BITS => {
            Err(CsrError::OversizedKey { bits: *bits })
        }
        KeyKind::Rsa { .. } => Ok(()),
        KeyKind::Other(found) => Err(CsrError::UnsupportedKey {
            found: found.clone(),
        }),
    }
}

/// What kubelet's Go signs with (SHA-256/384 ECDSA, PKCS#1 v1.5 RSA), plus
/// SHA-512 RSA; never SHA-1.
fn check_signature_algorithm(alg: &Oid<'_>) -> Result<(), CsrError> {
    let allowed = [
        oids::OID_SIG_ECDSA_WITH_SHA256,
        oids::OID_SIG_ECDSA_WITH_SHA384,
        oids::OID_PKCS1_SHA256WITHRSA,
        oids::OID_PKCS1_SHA384WITHRSA,
        oids::OID_PKCS1_SHA512WITHRSA,
    ];
    if allowed.contains(alg) {
        Ok(())
    } else {
        Err(CsrError::UnsupportedSignatureAlgorithm {
            found: alg.to_id_string(),
        })
    }
}

#[derive(Default)]
pub(crate) struct Subject {
    pub(crate) common_name: Option<String>,
    pub(crate) organizations: Vec<String>,
    pub(crate) other_fields: bool,
}

pub(crate) fn read_subject(name: &X509Name<'_>) -> Result<Subject, CsrError> {
    let mut subject = Subject::default();
    let mut common_names = Vec::new();
    for attr in name.iter_attributes() {
        let oid = attr.attr_type();
        let is_cn = *oid == oids::OID_X509_COMMON_NAME;
        let is_o = *oid == oids::OID_X509_ORGANIZATION_NAME;
        if !(is_cn || is_o) {
            subject.other_fields = true;
            continue;
        }
        let value = attr.as_str().map_err(|_| CsrError::UnreadableSubject {
            oid: oid.to_id_string(),
        })?;
        if is_cn {
            common_names.push(value.to_string());
        } else {
            subject.organizations.push(value.to_string());
        }
    }
    if common_names.len() > 1 {
        return Err(CsrError::MultipleCommonNames {
            found: common_names,
        });
    }
    subject.common_name = common_names.pop();
    Ok(subject)
}

#[derive(Default)]
pub(crate) struct Sans {
    pub(crate) dns: Vec<String>,
    pub(crate) ips: Vec<IpAddr>,
    pub(crate) emails: Vec<String>,
    pub(crate) uris: Vec<String>,
}

/// Collects SANs from every extension request attribute (not just the
/// first, which is all x509-parser's helper returns), refusing duplicates.
fn read_sans(req: &X509CertificationRequest<'_>) -> Result<Sans, CsrError> {
    let mut seen = HashSet::new();
    let mut sans = Sans::default();
    for attr in req.certification_request_info.iter_attributes() {
        let ParsedCriAttribute::ExtensionRequest(request) = attr.parsed_attribute() else {
            continue;
        };
        for ext in &request.extensions {
            if !seen.insert(ext.oid.to_id_string()) {
                return Err(CsrError::DuplicateExtension {
                    oid: ext.oid.to_id_string(),
                });
            }
            add_sans(ext, &mut sans)?;
        }
    }
    Ok(sans)
}

fn add_sans(ext: &X509Extension<'_>, sans: &mut Sans) -> Result<(), CsrError> {
    if ext.oid != oids::OID_X509_EXT_SUBJECT_ALT_NAME {
        // The signers take only names and the subject from a CSR; other
        // requested extensions never reach the certificate.
        return Ok(());
    }
    let ParsedExtension::SubjectAlternativeName(san) = ext.parsed_extension() else {
        return Err(CsrError::Unparsable {
            detail: "subjectAltName extension does not decode".to_string(),
        });
    };
    san.general_names
        .iter()
        .try_for_each(|name| add_general_name(name, sans))
}

pub(crate) fn add_general_name(name: &GeneralName<'_>, sans: &mut Sans) -> Result<(), CsrError> {
    match name {
        GeneralName::DNSName(dns) => sans.dns.push((*dns).to_string()),
        GeneralName::RFC822Name(email) => sans.emails.push((*email).to_string()),
        GeneralName::URI(uri) => sans.uris.push((*uri).to_string()),
        GeneralName::IPAddress(bytes) => sans.ips.push(ip_from_bytes(bytes)?),
        GeneralName::OtherName(..) => return Err(CsrError::UnsupportedSan { kind: "otherName" }),
        GeneralName::X400Address(_) => {
            return Err(CsrError::UnsupportedSan {
                kind: "x400Address",
            })
        }
        GeneralName::DirectoryName(_) => {
            return Err(CsrError::UnsupportedSan {
                kind: "directoryName",
            })
        }
        GeneralName::EDIPartyName(_) => {
            return Err(CsrError::UnsupportedSan {
                kind: "ediPartyName",
            })
        }
        GeneralName::RegisteredID(_) => {
            return Err(CsrError::UnsupportedSan {
                kind: "registeredID",
            })
        }
        GeneralName::Invalid(..) => {
            return Err(CsrError::Unparsable {
                detail: "a SAN does not decode".to_string(),
            })
        }
    }
    Ok(())
}

fn ip_from_bytes(bytes: &[u8]) -> Result<IpAddr, CsrError> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        return Ok(IpAddr::from(v4));
    }
    if let Ok(v6) = <[u8; 16]>::try_from(bytes) {
        return Ok(IpAddr::from(v6));
    }
    Err(CsrError::Unparsable {
        detail: format!("IP SAN of {} bytes", bytes.len()),
    })
}

// ---------------------------------------------------------------------------
// Rules
// ---------------------------------------------------------------------------

/// Checks a kubelet client CSR for `node_name`: CN exactly
/// `system:node:<node_name>`, O exactly `["system:nodes"]`, nothing else in
/// the subject, no SANs of any kind, and a key within [`check_key`].
pub fn check_client_csr(csr: &ParsedCsr, node_name: &str) -> Result<(), CsrError> {
    check_node_subject(csr, node_name)?;
    if csr.has_any_san() {
        return Err(CsrError::HasSans {
            dns: csr.dns_names.clone(),
            ips: csr.ip_addresses.clone(),
            emails: csr.email_addresses.clone(),
            uris: csr.uris.clone(),
        });
    }
    check_key(&csr.key)
}

/// Checks a kubelet serving CSR for `node_name`: the same subject and key
/// rules as [`check_client_csr`], at least one DNS or IP SAN, every DNS SAN
/// in `allowed_dns` (ASCII case-insensitive, never a wildcard), every IP SAN
/// in `allowed_ips`, and no email or URI SANs.
///
/// `allowed_dns`/`allowed_ips` must come from EC2 for this instance, never
/// from the request.
pub fn check_serving_csr(
    csr: &ParsedCsr,
    node_name: &str,
    allowed_dns: &[String],
    allowed_ips: &[IpAddr],
) -> Result<(), CsrError> {
    check_node_subject(csr, node_name)?;
    check_no_email_or_uri(csr)?;
    if csr.dns_names.is_empty() && csr.ip_addresses.is_empty() {
        return Err(CsrError::NoSans);
    }
    csr.dns_names
        .iter()
        .try_for_each(|dns| check_dns_san(dns, allowed_dns))?;
    csr.ip_addresses
        .iter()
        .try_for_each(|ip| check_ip_san(*ip, allowed_ips))?;
    check_key(&csr.key)
}

/// CN, O and "nothing else in the subject".
fn check_node_subject(csr: &ParsedCsr, node_name: &str) -> Result<(), CsrError> {
    if node_name.is_empty() {
        return Err(CsrError::EmptyNodeName);
    }
    let expected = format!("{NODE_USER_PREFIX}{node_name}");
    if csr.common_name.as_deref() != Some(expected.as_str()) {
        return Err(CsrError::BadCommonName {
            found: csr.common_name.clone(),
            expected,
        });
    }
    if csr.organizations != [NODES_GROUP] {
        return Err(CsrError::BadOrganizations {
            found: csr.organizations.clone(),
        });
    }
    if csr.other_subject_fields {
        return Err(CsrError::UnexpectedSubjectFields);
    }
    Ok(())
}

fn check_no_email_or_uri(csr: &ParsedCsr) -> Result<(), CsrError> {
    if let Some(email) = csr.email_addresses.first() {
        return Err(CsrError::ForbiddenSan {
            kind: "email",
            value: email.clone(),
        });
    }
    if let Some(uri) = csr.uris.first() {
        return Err(CsrError::ForbiddenSan {
            kind: "uri",
            value: uri.clone(),
        });
    }
    Ok(())
}

fn check_dns_san(dns: &str, allowed: &[String]) -> Result<(), CsrError> {
    // Refused before matching, so a '*' in the allow-list can never act as
    // a pattern either.
    if dns.contains('*') {
        return Err(CsrError::WildcardSan {
            found: dns.to_string(),
        });
    }
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(dns)) {
        return Ok(());
    }
    Err(CsrError::DnsSanNotAllowed {
        found: dns.to_string(),
        allowed: allowed.to_vec(),
    })
}

fn check_ip_san(ip: IpAddr, allowed: &[IpAddr]) -> Result<(), CsrError> {
    if allowed.contains(&ip) {
        return Ok(());
    }
    Err(CsrError::IpSanNotAllowed {
        found: ip,
        allowed: allowed.to_vec(),
    })
}

/// Checks `spec.usages` of a CSR object kubelet created itself (renewals).
///
/// The rule: `"digital signature"` and the purpose's `"client auth"` /
/// `"server auth"` are required; `"key encipherment"` is optional, except
/// for RSA keys where it is required; nothing else; no duplicates.
///
/// Why: kube-controller-manager up to 1.24 signs only exactly {digital
/// signature, key encipherment, client/server auth}; 1.25+ also signs the
/// set without key encipherment. Kubelet up to 1.26 always sends all three;
/// 1.27+ drops key encipherment for non-RSA keys only. So an RSA CSR
/// without it did not come from kubelet, and any other set would either not
/// be signed or grant more than a kubelet needs.
pub fn check_usages(usages: &[String], purpose: Purpose, key: &KeyKind) -> Result<(), CsrError> {
    let allowed = usages_for(purpose);
    let mut seen = HashSet::new();
    for usage in usages {
        if !allowed.contains(&usage.as_str()) {
            return Err(CsrError::UnexpectedUsage {
                unexpected: usage.clone(),
                found: usages.to_vec(),
                allowed: allowed.to_vec(),
            });
        }
        if !seen.insert(usage.as_str()) {
            return Err(CsrError::DuplicateUsage {
                duplicate: usage.clone(),
                found: usages.to_vec(),
            });
        }
    }
    let mut required = vec![USAGE_DIGITAL_SIGNATURE, purpose.auth_usage()];
    if matches!(key, KeyKind::Rsa { .. }) {
        required.push(USAGE_KEY_ENCIPHERMENT);
    }
    match required.into_iter().find(|r| !seen.contains(r)) {
        Some(missing) => Err(CsrError::MissingUsage {
            missing,
            found: usages.to_vec(),
        }),
        None => Ok(()),
    }
}

/// The usages the server puts on CSR objects it creates: all three, which
/// every kube-controller-manager version signs, whatever the key type.
pub fn usages_for(purpose: Purpose) -> [&'static str; 3] {
    [
        USAGE_DIGITAL_SIGNATURE,
        USAGE_KEY_ENCIPHERMENT,
        purpose.auth_usage(),
    ]
}

/// The node name in a node's user name: `"system:node:foo"` gives
/// `Some("foo")`; anything else, including an empty name, gives `None`.
pub fn node_name_from_username(username: &str) -> Option<&str> {
    username
        .strip_prefix(NODE_USER_PREFIX)
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use rcgen::string::Ia5String;
    use rcgen::{
        Attribute, CertificateParams, DistinguishedName, DnType, KeyPair, KeyUsagePurpose,
        OtherNameValue, PublicKeyData, SanType, SignatureAlgorithm, SigningKey,
    };
    use rsa::pkcs1::EncodeRsaPublicKey;
    use rsa::pkcs8::EncodePrivateKey;
    use rsa::signature::{SignatureEncoding, Signer};
    use std::net::{Ipv4Addr, Ipv6Addr};

    const NODE: &str = "ip-10-0-1-23.eu-west-1.compute.internal";
    const PUBLIC_DNS: &str = "ec2-3-4-5-6.eu-west-1.compute.amazonaws.com";
    const NODE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 1, 23));

    // --- builders -----------------------------------------------------------

    fn node_cn() -> String {
        format!("{NODE_USER_PREFIX}{NODE}")
    }

    /// Subject CN + O as kubelet writes it.
    fn node_subject() -> Vec<(DnType, String)> {
        vec![
            (DnType::CommonName, node_cn()),
            (DnType::OrganizationName, NODES_GROUP.to_string()),
        ]
    }

    fn params(subject: &[(DnType, String)], sans: Vec<SanType>) -> CertificateParams {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        for (ty, value) in subject {
            params.distinguished_name.push(ty.clone(), value.as_str());
        }
        params.subject_alt_names = sans;
        params
    }

    fn request(key: &impl SigningKey, params: &CertificateParams, attrs: Vec<Attribute>) -> String {
        let csr = params
            .serialize_request_with_attributes(key, attrs)
            .expect("serialize CSR");
        csr.pem().expect("CSR PEM")
    }

    fn p256() -> KeyPair {
        KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256 key")
    }

    /// A P-256 CSR with this subject and these SANs.
    fn csr_pem(subject: &[(DnType, String)], sans: Vec<SanType>) -> String {
        request(&p256(), &params(subject, sans), Vec::new())
    }

    fn parsed(subject: &[(DnType, String)], sans: Vec<SanType>) -> ParsedCsr {
        parse_csr(csr_pem(subject, sans).as_bytes()).expect("CSR parses")
    }

    fn dns(name: &str) -> SanType {
        SanType::DnsName(Ia5String::try_from(name).expect("IA5 DNS name"))
    }

    fn reason<T: fmt::Debug>(result: Result<T, CsrError>) -> &'static str {
        result.expect_err("must be refused").reason()
    }

    fn client_reason(subject: &[(DnType, String)], sans: Vec<SanType>) -> &'static str {
        reason(check_client_csr(&parsed(subject, sans), NODE))
    }

    fn allowed_dns() -> Vec<String> {
        vec![NODE.to_string(), PUBLIC_DNS.to_string()]
    }

    fn serving(sans: Vec<SanType>) -> Result<(), CsrError> {
        let csr = parsed(&node_subject(), sans);
        check_serving_csr(&csr, NODE, &allowed_dns(), &[NODE_IP])
    }

    fn to_pem(label: &str, der: &[u8]) -> String {
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    }

    fn der_of(pem: &str) -> Vec<u8> {
        single_pem_block(pem.as_bytes()).expect("one PEM block")
    }

    /// DER TLV with a definite length (short or long form).
    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        let len = content.len();
        if len < 0x80 {
            out.push(len as u8);
        } else {
            let bytes: Vec<u8> = len
                .to_be_bytes()
                .into_iter()
                .skip_while(|b| *b == 0)
                .collect();
            out.push(0x80 | bytes.len() as u8);
            out.extend(bytes);
        }
        out.extend_from_slice(content);
        out
    }

    /// An extensionRequest attribute value holding one SAN extension with
    /// one DNS name, built by hand (rcgen writes only one such attribute).
    fn extension_request_with_dns_san(name: &str) -> Attribute {
        let general_names = tlv(0x30, &tlv(0x82, name.as_bytes()));
        let san_oid = [0x06, 0x03, 0x55, 0x1d, 0x11];
        let extension = tlv(0x30, &[&san_oid[..], &tlv(0x04, &general_names)].concat());
        Attribute {
            oid: &[1, 2, 840, 113549, 1, 9, 14],
            values: tlv(0x31, &tlv(0x30, &extension)),
        }
    }

    /// An RSA key signing through the `rsa` crate, because ring refuses to
    /// sign with (or even load) RSA keys under 2048 bits.
    struct RsaSigner {
        key: rsa::RsaPrivateKey,
        public_pkcs1: Vec<u8>,
    }

    impl RsaSigner {
        fn generate(bits: usize) -> Self {
            let key = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), bits).expect("RSA key");
            let public_pkcs1 = key
                .to_public_key()
                .to_pkcs1_der()
                .expect("PKCS#1 public key")
                .as_bytes()
                .to_vec();
            RsaSigner { key, public_pkcs1 }
        }
    }

    impl PublicKeyData for RsaSigner {
        fn der_bytes(&self) -> &[u8] {
            &self.public_pkcs1
        }
        fn algorithm(&self) -> &'static SignatureAlgorithm {
            &rcgen::PKCS_RSA_SHA256
        }
    }

    impl SigningKey for RsaSigner {
        fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
            let signer = rsa::pkcs1v15::SigningKey::<Sha256>::new(self.key.clone());
            Ok(signer.sign(msg).to_vec())
        }
    }

    // --- keys ---------------------------------------------------------------

    #[test]
    fn client_p256_accepted_and_fingerprinted() {
        let key = p256();
        let pem = request(&key, &params(&node_subject(), Vec::new()), Vec::new());
        let csr = parse_csr(pem.as_bytes()).expect("parses");
        assert_eq!(csr.key, KeyKind::EcdsaP256);
        assert_eq!(csr.common_name.as_deref(), Some(node_cn().as_str()));
        assert_eq!(csr.organizations, [NODES_GROUP]);
        assert!(!csr.other_subject_fields);
        check_client_csr(&csr, NODE).expect("accepted");

        let spki = key.subject_public_key_info();
        assert_eq!(csr.spki_der, spki);
        let expected: [u8; 32] = Sha256::digest(&spki).into();
        assert_eq!(csr.public_key_sha256(), expected);
        let fingerprint = csr.public_key_fingerprint();
        assert_eq!(fingerprint.len(), 64);
        assert!(fingerprint
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
        assert_eq!(fingerprint[..2], format!("{:02x}", expected[0]));
    }

    /// Made by `openssl req` (O before CN, another DER encoder than rcgen).
    const OPENSSL_CLIENT_CSR: &str = "\
-----BEGIN CERTIFICATE REQUEST-----\n\
MIIBDzCBtwIBADBVMRUwEwYDVQQKDAxzeXN0ZW06bm9kZXMxPDA6BgNVBAMMM3N5\n\
c3RlbTpub2RlOmlwLTEwLTAtMS0yMy5ldS13ZXN0LTEuY29tcHV0ZS5pbnRlcm5h\n\
bDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABPOTXsvYTbExHCkhcT1hZF+Y00py\n\
hOURVQMSyRpN5cEOA0MJJDYKHJjqVIkEsSvwMDLbIP/yTS10aSUHCmbZgU2gADAK\n\
BggqhkjOPQQDAgNHADBEAiAHbQxeFS9d+CuH7uV0ZqV34nCasUhxMPe0rg+GNtd0\n\
RgIgZKKg5nvJOXi01gpHxSJwNbcs1mkVU35Qgg6dl92DWjg=\n\
-----END CERTIFICATE REQUEST-----\n\
";

    #[test]
    fn openssl_client_csr_accepted() {
        let csr = parse_csr(OPENSSL_CLIENT_CSR.as_bytes()).expect("parses");
        assert_eq!(csr.key, KeyKind::EcdsaP256);
        check_client_csr(&csr, NODE).expect("accepted");
        let other = "ip-10-0-1-24.eu-west-1.compute.internal";
        assert_eq!(reason(check_client_csr(&csr, other)), "csr_bad_common_name");
    }

    #[test]
    fn client_p384_accepted() {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).expect("P-384 key");
        let pem = request(&key, &params(&node_subject(), Vec::new()), Vec::new());
        let csr = parse_csr(pem.as_bytes()).expect("parses");
        assert_eq!(csr.key, KeyKind::EcdsaP384);
        check_client_csr(&csr, NODE).expect("accepted");
    }

    #[test]
    fn client_rsa_2048_accepted() {
        let rsa = RsaSigner::generate(2048);
        let pkcs8 = rsa.key.to_pkcs8_der().expect("PKCS#8");
        // Through ring, as a real signer would.
        let key = KeyPair::try_from(pkcs8.as_bytes()).expect("ring loads RSA-2048");
        let pem = request(&key, &params(&node_subject(), Vec::new()), Vec::new());
        let csr = parse_csr(pem.as_bytes()).expect("parses");
        assert_eq!(csr.key, KeyKind::Rsa { bits: 2048 });
        check_client_csr(&csr, NODE).expect("accepted");
    }

    #[test]
    fn rsa_1024_refused_as_weak() {
        let key = RsaSigner::generate(1024);
        let pem = request(&key, &params(&node_subject(), Vec::new()), Vec::new());
        let err = parse_csr(pem.as_bytes()).expect_err("refused");
        assert_eq!(err, CsrError::WeakKey { bits: 1024 });
        assert_eq!(err.reason(), "csr_weak_key");
    }

    #[test]
    fn ed25519_refused() {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("ed25519 key");
        let pem = request(&key, &params(&node_subject(), Vec::new()), Vec::new());
        let err = parse_csr(pem.as_bytes()).expect_err("refused");
        assert_eq!(
            err,
            CsrError::UnsupportedKey {
                found: "ed25519".to_string()
            }
        );
        assert_eq!(err.reason(), "csr_unsupported_key");
    }

    #[test]
    fn key_policy_bounds() {
        assert!(check_key(&KeyKind::Rsa { bits: 2048 }).is_ok());
        assert!(check_key(&KeyKind::Rsa { bits: 8192 }).is_ok());
        assert_eq!(
            reason(check_key(&KeyKind::Rsa { bits: 2047 })),
            "csr_weak_key"
        );
        assert_eq!(
            reason(check_key(&KeyKind::Rsa { bits: 8193 })),
            "csr_oversized_key"
        );
        let k1 = KeyKind::Other("ecdsa secp256k1".to_string());
        assert_eq!(reason(check_key(&k1)), "csr_unsupported_key");
    }

    #[test]
    fn checks_apply_key_policy_to_hand_built_csrs() {
        let mut csr = parsed(&node_subject(), Vec::new());
        csr.key = KeyKind::Rsa { bits: 1024 };
        assert_eq!(reason(check_client_csr(&csr, NODE)), "csr_weak_key");
        csr.dns_names = vec![NODE.to_string()];
        let serving = check_serving_csr(&csr, NODE, &allowed_dns(), &[]);
        assert_eq!(reason(serving), "csr_weak_key");
    }

    #[test]
    fn sha1_and_unknown_signature_algorithms_refused() {
        for oid in [
            oids::OID_PKCS1_SHA1WITHRSA,
            oids::OID_SHA1_WITH_RSA,
            oids::OID_PKCS1_RSASSAPSS,
        ] {
            assert_eq!(
                reason(check_signature_algorithm(&oid)),
                "csr_bad_signature_algorithm"
            );
        }
        assert!(check_signature_algorithm(&oids::OID_SIG_ECDSA_WITH_SHA256).is_ok());
    }

    #[test]
    fn bit_length_ignores_leading_zeros() {
        assert_eq!(bit_length(&[]), 0);
        assert_eq!(bit_length(&[0, 0]), 0);
        assert_eq!(bit_length(&[0, 0x80, 0]), 16);
        assert_eq!(bit_length(&[0x01, 0xff]), 9);
    }

    // --- subject ------------------------------------------------------------

    #[test]
    fn wrong_common_name_refused() {
        let subject = [
            (DnType::CommonName, "node-1".to_string()),
            (DnType::OrganizationName, NODES_GROUP.to_string()),
        ];
        let err = check_client_csr(&parsed(&subject, Vec::new()), NODE).expect_err("refused");
        assert_eq!(err.reason(), "csr_bad_common_name");
        let message = err.to_string();
        assert!(
            message.contains("\"node-1\"") && message.contains(&node_cn()),
            "{message}"
        );
    }

    #[test]
    fn common_name_of_another_node_refused() {
        let subject = [
            (
                DnType::CommonName,
                "system:node:ip-10-0-9-9.eu-west-1.compute.internal".to_string(),
            ),
            (DnType::OrganizationName, NODES_GROUP.to_string()),
        ];
        assert_eq!(client_reason(&subject, Vec::new()), "csr_bad_common_name");
    }

    #[test]
    fn common_name_prefix_of_node_refused() {
        // "system:node:ip-10-0-1-2" must not pass for node "ip-10-0-1-23...".
        let subject = [
            (
                DnType::CommonName,
                format!("{NODE_USER_PREFIX}{}", &NODE[..7]),
            ),
            (DnType::OrganizationName, NODES_GROUP.to_string()),
        ];
        assert_eq!(client_reason(&subject, Vec::new()), "csr_bad_common_name");
    }

    #[test]
    fn missing_common_name_refused() {
        let subject = [(DnType::OrganizationName, NODES_GROUP.to_string())];
        let csr = parsed(&subject, Vec::new());
        assert_eq!(csr.common_name, None);
        assert_eq!(reason(check_client_csr(&csr, NODE)), "csr_bad_common_name");
    }

    #[test]
    fn two_common_names_refused_at_parse() {
        let mut subject = node_subject();
        subject.push((
            DnType::CustomDnType(vec![2, 5, 4, 3]),
            "system:node:other".to_string(),
        ));
        let err = parse_csr(csr_pem(&subject, Vec::new()).as_bytes()).expect_err("refused");
        assert!(matches!(err, CsrError::MultipleCommonNames { ref found } if found.len() == 2));
        assert_eq!(err.reason(), "csr_bad_common_name");
    }

    #[test]
    fn empty_node_name_refused() {
        let subject = [
            (DnType::CommonName, NODE_USER_PREFIX.to_string()),
            (DnType::OrganizationName, NODES_GROUP.to_string()),
        ];
        let csr = parsed(&subject, Vec::new());
        assert_eq!(reason(check_client_csr(&csr, "")), "csr_bad_common_name");
    }

    #[test]
    fn missing_organization_refused() {
        let subject = [(DnType::CommonName, node_cn())];
        assert_eq!(client_reason(&subject, Vec::new()), "csr_bad_organization");
    }

    #[test]
    fn other_organization_refused() {
        let subject = [
            (DnType::CommonName, node_cn()),
            (DnType::OrganizationName, "system:masters".to_string()),
        ];
        assert_eq!(client_reason(&subject, Vec::new()), "csr_bad_organization");
    }

    #[test]
    fn extra_organization_refused() {
        let mut subject = node_subject();
        // rcgen keeps one value per DnType; the raw OID adds a second O.
        subject.push((
            DnType::CustomDnType(vec![2, 5, 4, 10]),
            "system:masters".to_string(),
        ));
        let csr = parsed(&subject, Vec::new());
        assert_eq!(csr.organizations, [NODES_GROUP, "system:masters"]);
        let err = check_client_csr(&csr, NODE).expect_err("refused");
        assert_eq!(err.reason(), "csr_bad_organization");
        assert!(err.to_string().contains("system:masters"));
    }

    #[test]
    fn other_subject_fields_refused() {
        let mut subject = node_subject();
        subject.push((DnType::OrganizationalUnitName, "ops".to_string()));
        let csr = parsed(&subject, Vec::new());
        assert!(csr.other_subject_fields);
        assert_eq!(
            reason(check_client_csr(&csr, NODE)),
            "csr_unexpected_subject_fields"
        );
    }

    // --- client SANs --------------------------------------------------------

    #[test]
    fn client_with_dns_san_refused() {
        assert_eq!(
            client_reason(&node_subject(), vec![dns(NODE)]),
            "csr_has_sans"
        );
    }

    #[test]
    fn client_with_ip_san_refused() {
        let sans = vec![SanType::IpAddress(NODE_IP)];
        assert_eq!(client_reason(&node_subject(), sans), "csr_has_sans");
    }

    #[test]
    fn client_with_email_san_refused() {
        let email = Ia5String::try_from("root@example.com").expect("IA5");
        let sans = vec![SanType::Rfc822Name(email)];
        assert_eq!(client_reason(&node_subject(), sans), "csr_has_sans");
    }

    #[test]
    fn client_with_uri_san_refused() {
        let uri = Ia5String::try_from("spiffe://cluster/ns/x").expect("IA5");
        let sans = vec![SanType::URI(uri)];
        assert_eq!(client_reason(&node_subject(), sans), "csr_has_sans");
    }

    #[test]
    fn other_name_san_refused_at_parse() {
        let value = OtherNameValue::Utf8String("admin".to_string());
        let sans = vec![SanType::OtherName((
            vec![1, 3, 6, 1, 4, 1, 311, 20, 2, 3],
            value,
        ))];
        let err = parse_csr(csr_pem(&node_subject(), sans).as_bytes()).expect_err("refused");
        assert_eq!(err, CsrError::UnsupportedSan { kind: "otherName" });
    }

    #[test]
    fn san_in_a_second_extension_request_is_seen() {
        // rcgen writes its own extensionRequest (key usage only); a second
        // one carries a SAN. x509-parser's helper reads only the first.
        let mut params = params(&node_subject(), Vec::new());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let attrs = vec![extension_request_with_dns_san("evil.example")];
        let csr = parse_csr(request(&p256(), &params, attrs).as_bytes()).expect("parses");
        assert_eq!(csr.dns_names, ["evil.example"]);
        assert_eq!(reason(check_client_csr(&csr, NODE)), "csr_has_sans");
    }

    #[test]
    fn duplicate_san_extension_refused() {
        let params = params(&node_subject(), vec![dns(NODE)]);
        let attrs = vec![extension_request_with_dns_san("evil.example")];
        let err = parse_csr(request(&p256(), &params, attrs).as_bytes()).expect_err("refused");
        assert_eq!(
            err,
            CsrError::DuplicateExtension {
                oid: "2.5.29.17".to_string()
            }
        );
    }

    // --- serving SANs -------------------------------------------------------

    #[test]
    fn serving_with_allowed_sans_accepted() {
        let upper = NODE.to_ascii_uppercase();
        serving(vec![
            dns(NODE),
            dns(&upper),
            dns(PUBLIC_DNS),
            SanType::IpAddress(NODE_IP),
        ])
        .expect("accepted");
        serving(vec![SanType::IpAddress(NODE_IP)]).expect("IP only accepted");
        serving(vec![dns(NODE)]).expect("DNS only accepted");
    }

    #[test]
    fn serving_dns_san_not_allowed_refused() {
        let err = serving(vec![dns(NODE), dns("kubernetes.default.svc")]).expect_err("refused");
        assert_eq!(err.reason(), "csr_san_not_allowed");
        assert!(
            matches!(err, CsrError::DnsSanNotAllowed { ref found, .. } if found == "kubernetes.default.svc")
        );
    }

    #[test]
    fn serving_ip_san_not_allowed_refused() {
        let other = IpAddr::V4(Ipv4Addr::new(10, 0, 1, 24));
        let err = serving(vec![dns(NODE), SanType::IpAddress(other)]).expect_err("refused");
        assert_eq!(
            err,
            CsrError::IpSanNotAllowed {
                found: other,
                allowed: vec![NODE_IP]
            }
        );
        assert_eq!(err.reason(), "csr_san_not_allowed");
    }

    #[test]
    fn serving_ipv4_mapped_ipv6_does_not_match_ipv4() {
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 1, 23).to_ipv6_mapped());
        assert_eq!(
            reason(serving(vec![SanType::IpAddress(mapped)])),
            "csr_san_not_allowed"
        );
        let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        assert_eq!(
            reason(serving(vec![SanType::IpAddress(v6)])),
            "csr_san_not_allowed"
        );
    }

    #[test]
    fn serving_wildcard_refused_even_if_listed() {
        let wildcard = "*.eu-west-1.compute.internal";
        let csr = parsed(&node_subject(), vec![dns(wildcard)]);
        let allowed = vec![wildcard.to_string()];
        let err = check_serving_csr(&csr, NODE, &allowed, &[]).expect_err("refused");
        assert_eq!(err.reason(), "csr_wildcard_san");
    }

    #[test]
    fn serving_without_sans_refused() {
        assert_eq!(reason(serving(Vec::new())), "csr_no_sans");
    }

    #[test]
    fn serving_with_email_or_uri_refused() {
        let email = SanType::Rfc822Name(Ia5String::try_from("a@b.c").expect("IA5"));
        assert_eq!(reason(serving(vec![dns(NODE), email])), "csr_forbidden_san");
        let uri = SanType::URI(Ia5String::try_from("https://x").expect("IA5"));
        assert_eq!(reason(serving(vec![dns(NODE), uri])), "csr_forbidden_san");
    }

    #[test]
    fn serving_subject_rules_apply() {
        let subject = [
            (DnType::CommonName, "system:node:other".to_string()),
            (DnType::OrganizationName, NODES_GROUP.to_string()),
        ];
        let csr = parsed(&subject, vec![dns(NODE)]);
        let err = check_serving_csr(&csr, NODE, &allowed_dns(), &[NODE_IP]).expect_err("refused");
        assert_eq!(err.reason(), "csr_bad_common_name");
    }

    // --- proof of possession and framing ------------------------------------

    #[test]
    fn tampered_signature_refused() {
        let mut der = der_of(&csr_pem(&node_subject(), Vec::new()));
        // The signature BIT STRING ends the CSR; its last byte is in `s`.
        if let Some(last) = der.last_mut() {
            *last ^= 0x01;
        }
        let err = parse_csr(to_pem("CERTIFICATE REQUEST", &der).as_bytes()).expect_err("refused");
        assert_eq!(err, CsrError::BadSignature);
        assert_eq!(err.reason(), "csr_bad_signature");
    }

    #[test]
    fn tampered_subject_refused() {
        let subject = [
            (DnType::CommonName, "system:node:aaaa".to_string()),
            (DnType::OrganizationName, NODES_GROUP.to_string()),
        ];
        let der = der_of(&csr_pem(&subject, Vec::new()));
        let at = der
            .windows(4)
            .position(|w| w == b"aaaa")
            .expect("CN in DER");
        let mut forged = der.clone();
        forged[at..at + 4].copy_from_slice(b"bbbb");
        let pem = to_pem("CERTIFICATE REQUEST", &forged);
        assert_eq!(parse_csr(pem.as_bytes()), Err(CsrError::BadSignature));
    }

    #[test]
    fn legacy_new_certificate_request_label_accepted() {
        let der = der_of(&csr_pem(&node_subject(), Vec::new()));
        let pem = to_pem("NEW CERTIFICATE REQUEST", &der);
        let csr = parse_csr(pem.as_bytes()).expect("parses");
        check_client_csr(&csr, NODE).expect("accepted");
    }

    #[test]
    fn garbage_refused() {
        assert_eq!(
            reason(parse_csr(b"\x00\xffnot a csr at all")),
            "csr_bad_pem"
        );
        let pem = "-----BEGIN CERTIFICATE REQUEST-----\nbm90IGEgY3Ny\n-----END CERTIFICATE REQUEST-----\n";
        assert_eq!(reason(parse_csr(pem.as_bytes())), "csr_unparsable");
        let pem = "-----BEGIN CERTIFICATE REQUEST-----\n!!!!\n-----END CERTIFICATE REQUEST-----\n";
        assert_eq!(reason(parse_csr(pem.as_bytes())), "csr_unparsable");
    }

    #[test]
    fn empty_refused() {
        assert_eq!(parse_csr(b""), Err(CsrError::NoPemBlock));
    }

    #[test]
    fn der_without_pem_refused() {
        let der = der_of(&csr_pem(&node_subject(), Vec::new()));
        assert_eq!(parse_csr(&der), Err(CsrError::NoPemBlock));
    }

    #[test]
    fn two_pem_blocks_refused() {
        let one = csr_pem(&node_subject(), Vec::new());
        let two = format!("{one}{}", csr_pem(&node_subject(), Vec::new()));
        assert_eq!(
            parse_csr(two.as_bytes()),
            Err(CsrError::MultiplePemBlocks { found: 2 })
        );
    }

    #[test]
    fn mismatched_end_line_refused() {
        let pem = csr_pem(&node_subject(), Vec::new());
        let bad = pem.replace(
            "-----END CERTIFICATE REQUEST-----",
            "-----END CERTIFICATE-----",
        );
        assert_eq!(reason(parse_csr(bad.as_bytes())), "csr_unparsable");
    }

    #[test]
    fn certificate_instead_of_csr_refused() {
        let key = p256();
        let cert = params(&node_subject(), Vec::new())
            .self_signed(&key)
            .expect("self-signed cert");
        let err = parse_csr(cert.pem().as_bytes()).expect_err("refused");
        assert_eq!(
            err,
            CsrError::WrongPemLabel {
                found: "CERTIFICATE".to_string()
            }
        );
        // And a certificate under a CSR label does not parse as one.
        let relabelled = to_pem("CERTIFICATE REQUEST", cert.der());
        assert_eq!(reason(parse_csr(relabelled.as_bytes())), "csr_unparsable");
    }

    #[test]
    fn trailing_der_bytes_refused() {
        let mut der = der_of(&csr_pem(&node_subject(), Vec::new()));
        der.extend_from_slice(&[0x05, 0x00]);
        let pem = to_pem("CERTIFICATE REQUEST", &der);
        let err = parse_csr(pem.as_bytes()).expect_err("refused");
        assert!(matches!(err, CsrError::Unparsable { ref detail } if detail.contains("2 bytes")));
    }

    #[test]
    fn oversized_input_refused() {
        let big = vec![b'A'; MAX_CSR_PEM_BYTES + 1];
        assert_eq!(reason(parse_csr(&big)), "csr_too_large");
    }

    // --- usages -------------------------------------------------------------

    fn strings(usages: &[&str]) -> Vec<String> {
        usages.iter().map(|u| u.to_string()).collect()
    }

    const P256: KeyKind = KeyKind::EcdsaP256;
    const RSA: KeyKind = KeyKind::Rsa { bits: 2048 };

    #[test]
    fn usages_exact_three_accepted() {
        for purpose in [Purpose::Client, Purpose::Serving] {
            let usages = strings(&usages_for(purpose));
            check_usages(&usages, purpose, &P256).expect("ecdsa");
            check_usages(&usages, purpose, &RSA).expect("rsa");
        }
        let reordered = strings(&["client auth", "key encipherment", "digital signature"]);
        check_usages(&reordered, Purpose::Client, &P256).expect("order is irrelevant");
    }

    #[test]
    fn usages_without_key_encipherment_accepted_for_ecdsa() {
        let client = strings(&["digital signature", "client auth"]);
        check_usages(&client, Purpose::Client, &P256).expect("client");
        let serving = strings(&["digital signature", "server auth"]);
        check_usages(&serving, Purpose::Serving, &KeyKind::EcdsaP384).expect("serving");
    }

    #[test]
    fn usages_without_key_encipherment_refused_for_rsa() {
        let usages = strings(&["digital signature", "client auth"]);
        let err = check_usages(&usages, Purpose::Client, &RSA).expect_err("refused");
        assert!(matches!(
            err,
            CsrError::MissingUsage {
                missing: "key encipherment",
                ..
            }
        ));
    }

    #[test]
    fn usages_missing_client_auth_refused() {
        let usages = strings(&["digital signature", "key encipherment"]);
        let err = check_usages(&usages, Purpose::Client, &P256).expect_err("refused");
        assert!(matches!(
            err,
            CsrError::MissingUsage {
                missing: "client auth",
                ..
            }
        ));
        assert_eq!(err.reason(), "csr_bad_usages");
        let usages = strings(&["key encipherment", "client auth"]);
        let err = check_usages(&usages, Purpose::Client, &P256).expect_err("refused");
        assert!(matches!(
            err,
            CsrError::MissingUsage {
                missing: "digital signature",
                ..
            }
        ));
    }

    #[test]
    fn usages_server_auth_on_client_refused() {
        let usages = strings(&["digital signature", "key encipherment", "server auth"]);
        let err = check_usages(&usages, Purpose::Client, &P256).expect_err("refused");
        assert!(
            matches!(err, CsrError::UnexpectedUsage { ref unexpected, .. } if unexpected == "server auth")
        );
        let both = strings(&["digital signature", "client auth", "server auth"]);
        assert_eq!(
            reason(check_usages(&both, Purpose::Serving, &P256)),
            "csr_bad_usages"
        );
    }

    #[test]
    fn usages_cert_sign_refused() {
        let usages = strings(&[
            "digital signature",
            "key encipherment",
            "client auth",
            "cert sign",
        ]);
        let err = check_usages(&usages, Purpose::Client, &P256).expect_err("refused");
        assert!(
            matches!(err, CsrError::UnexpectedUsage { ref unexpected, .. } if unexpected == "cert sign")
        );
    }

    #[test]
    fn usages_duplicates_refused() {
        let usages = strings(&["digital signature", "client auth", "client auth"]);
        let err = check_usages(&usages, Purpose::Client, &P256).expect_err("refused");
        assert!(
            matches!(err, CsrError::DuplicateUsage { ref duplicate, .. } if duplicate == "client auth")
        );
    }

    #[test]
    fn usages_empty_and_case_variants_refused() {
        assert_eq!(
            reason(check_usages(&[], Purpose::Client, &P256)),
            "csr_bad_usages"
        );
        let usages = strings(&["Digital Signature", "client auth"]);
        assert_eq!(
            reason(check_usages(&usages, Purpose::Client, &P256)),
            "csr_bad_usages"
        );
    }

    #[test]
    fn usages_for_each_purpose() {
        assert_eq!(
            usages_for(Purpose::Client),
            ["digital signature", "key encipherment", "client auth"]
        );
        assert_eq!(
            usages_for(Purpose::Serving),
            ["digital signature", "key encipherment", "server auth"]
        );
    }

    // --- names and labels ---------------------------------------------------

    #[test]
    fn node_names_from_user_names() {
        assert_eq!(node_name_from_username("system:node:foo"), Some("foo"));
        assert_eq!(node_name_from_username("system:node:"), None);
        assert_eq!(node_name_from_username("system:nodes"), None);
        assert_eq!(node_name_from_username("system:serviceaccount:x:y"), None);
        assert_eq!(node_name_from_username("SYSTEM:NODE:foo"), None);
    }

    #[test]
    fn reasons_are_snake_case_labels() {
        let samples = [
            CsrError::NoPemBlock,
            CsrError::BadSignature,
            CsrError::NoSans,
            CsrError::UnexpectedSubjectFields,
            CsrError::WeakKey { bits: 1 },
            CsrError::EmptyNodeName,
        ];
        for err in samples {
            let label = err.reason();
            assert!(label.starts_with("csr_"), "{label}");
            assert!(
                label.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{label}"
            );
        }
    }
}
