//! From PEM to a [`ParsedCsr`]: one block, one DER request, the key
//! policy, the subject and SANs read strictly, and the self-signature.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;

use super::{CsrError, MAX_CSR_PEM_BYTES, RSA_MAX_BITS, RSA_MIN_BITS};

use sha2::{Digest, Sha256};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::extensions::{GeneralName, ParsedExtension, X509Extension};
use x509_parser::oid_registry::{self as oids, Oid};
use x509_parser::pem::Pem;
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::{SubjectPublicKeyInfo, X509Name};

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

/// A CSR whose structure, key policy and self-signature have been checked;
/// the naming rules are still to be applied with [`check_client_csr`](super::check_client_csr) or
/// [`check_serving_csr`](super::check_serving_csr).
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

    pub(super) fn has_any_san(&self) -> bool {
        !(self.dns_names.is_empty()
            && self.ip_addresses.is_empty()
            && self.email_addresses.is_empty()
            && self.uris.is_empty())
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
/// that is [`check_client_csr`](super::check_client_csr) / [`check_serving_csr`](super::check_serving_csr).
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
pub(super) fn single_pem_block(pem: &[u8]) -> Result<Vec<u8>, CsrError> {
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
pub(super) fn bit_length(be: &[u8]) -> usize {
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
pub(super) fn check_signature_algorithm(alg: &Oid<'_>) -> Result<(), CsrError> {
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
