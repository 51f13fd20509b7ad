//! A test CA that plays AWS's role in signing instance identity documents.
//!
//! [`TestCa::rsa2048`] produces the `rsa2048` form IMDS serves at
//! `/latest/dynamic/instance-identity/rsa2048`, shaped the way AWS's is (see
//! the real sample in `shared/data/aws-iid/samples/`), because the verifier
//! must accept exactly what AWS emits and nothing tidier:
//!
//! - BER with indefinite lengths for ContentInfo, SignedData,
//!   EncapsulatedContentInfo and its `[0]`, and the eContent as a
//!   *constructed* OCTET STRING holding primitive chunks (a strict DER parser
//!   refuses this, as it refuses AWS's own signatures);
//! - SignedData version 1, digestAlgorithms {sha256}, no certificates, no
//!   CRLs, one SignerInfo (version 1, issuerAndSerialNumber of the CA);
//! - signed attributes contentType (id-data), signingTime (UTCTime),
//!   CMSAlgorithmProtection (sha256 / sha256WithRSAEncryption) and
//!   messageDigest, DER-sorted as a SET;
//! - signatureAlgorithm sha256WithRSAEncryption (what AWS puts there, rather
//!   than plain rsaEncryption), the signature RSA PKCS#1 v1.5 with SHA-256
//!   over the DER of the signed attributes re-tagged as a SET (0x31);
//! - served as base64 in 76-column lines, no PEM armour, no final newline.
//!
//! The CA certificate mirrors AWS's regional certificates: a self-signed
//! X.509 v3 RSA-2048 root with keyUsage digitalSignature, subject and
//! authority key identifiers and a critical basicConstraints CA:TRUE,
//! pathlen:0. Everything is written with the small DER writer below, so the
//! issuer name in the SignerInfo is byte for byte the certificate's subject.

use base64::Engine as _;
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::EncodePublicKey as _;
use rsa::signature::{SignatureEncoding as _, Signer as _};
use rsa::RsaPrivateKey;
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;

/// Why the test CA could not be made or could not sign.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    #[error("RSA key generation failed: {0}")]
    KeyGen(#[from] rsa::Error),
    #[error("encoding the public key failed: {0}")]
    PublicKey(#[from] rsa::pkcs8::spki::Error),
    #[error("RSA signing failed: {0}")]
    Sign(#[from] rsa::signature::Error),
}

/// The subject (and issuer) of the test CA: AWS's attribute types and string
/// types, with an organisation that cannot be mistaken for AWS's.
const SUBJECT: &[(&[u8], &str)] = &[
    (oid::COUNTRY, "US"),
    (oid::STATE, "Washington State"),
    (oid::LOCALITY, "Seattle"),
    (oid::ORGANIZATION, "autonode fake cloud test CA"),
];

/// A self-signed RSA-2048 CA that signs identity documents like AWS does.
pub struct TestCa {
    signing_key: SigningKey<Sha256>,
    cert_der: Vec<u8>,
    /// DER of the certificate's subject Name (also its issuer).
    name_der: Vec<u8>,
    /// DER of the certificate's serial number INTEGER.
    serial_der: Vec<u8>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the private key.
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl TestCa {
    /// Generates a fresh RSA-2048 key and its self-signed certificate.
    pub fn generate() -> Result<Self, SignerError> {
        let mut rng = rand::thread_rng();
        let key = RsaPrivateKey::new(&mut rng, 2048)?;
        let spki = key.to_public_key().to_public_key_der()?;
        let signing_key = SigningKey::<Sha256>::new(key);
        let serial_der = der::integer(&rand::random::<[u8; 8]>());
        let name_der = der::name(SUBJECT);
        let tbs = tbs_certificate(&serial_der, &name_der, spki.as_bytes());
        let signature = signing_key.try_sign(&tbs)?.to_vec();
        let cert_der = der::seq(&[&tbs, &sha256_with_rsa(), &der::bit_string(&signature)]);
        Ok(Self {
            signing_key,
            cert_der,
            name_der,
            serial_der,
        })
    }

    /// The CA certificate as PEM, for the server's trust store.
    pub fn ca_pem(&self) -> String {
        autonode_shared::pem::certificate(&self.cert_der)
    }

    /// The CA certificate as DER.
    pub fn ca_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The PKCS#7 SignedData (BER, AWS's shape) over `content`.
    pub fn sign_pkcs7(
        &self,
        content: &[u8],
        signing_time: OffsetDateTime,
    ) -> Result<Vec<u8>, SignerError> {
        let signer_info = self.signer_info(content, signing_time)?;
        let signed_data = der::indefinite(
            der::SEQUENCE,
            &[
                &der::integer(&[1]),
                &der::set(&[&sha256()]),
                &encapsulated_content(content),
                &der::set(&[&signer_info]),
            ],
        );
        let explicit = der::indefinite(der::CONTEXT_0, &[&signed_data]);
        Ok(der::indefinite(
            der::SEQUENCE,
            &[&der::oid(oid::SIGNED_DATA), &explicit],
        ))
    }

    /// The `rsa2048` form exactly as IMDS serves it: base64 of
    /// [`Self::sign_pkcs7`] in 76-column lines, no armour, no final newline.
    pub fn rsa2048(
        &self,
        document: &[u8],
        signing_time: OffsetDateTime,
    ) -> Result<String, SignerError> {
        let ber = self.sign_pkcs7(document, signing_time)?;
        Ok(wrap(
            &base64::engine::general_purpose::STANDARD.encode(ber),
            76,
        ))
    }

    fn signer_info(
        &self,
        content: &[u8],
        signing_time: OffsetDateTime,
    ) -> Result<Vec<u8>, SignerError> {
        let attrs = signed_attributes(content, signing_time);
        // The signature covers the attributes encoded as a SET (0x31), while
        // the SignerInfo carries them under the IMPLICIT [0] tag.
        let signature = self
            .signing_key
            .try_sign(&der::set_of(der::SET, &attrs))?
            .to_vec();
        let issuer_and_serial = der::seq(&[&self.name_der, &self.serial_der]);
        Ok(der::seq(&[
            &der::integer(&[1]),
            &issuer_and_serial,
            &sha256(),
            &der::set_of(der::CONTEXT_0_CONSTRUCTED, &attrs),
            &sha256_with_rsa(),
            &der::tlv(der::OCTET_STRING, &signature),
        ]))
    }
}

/// The encapsulated content as AWS writes it: everything indefinite, the
/// document inside a constructed OCTET STRING in primitive chunks of at most
/// 1000 bytes (identity documents fit in one).
fn encapsulated_content(content: &[u8]) -> Vec<u8> {
    let chunks: Vec<Vec<u8>> = content
        .chunks(1000)
        .map(|c| der::tlv(der::OCTET_STRING, c))
        .collect();
    let chunk_refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    let octets = der::indefinite(der::OCTET_STRING_CONSTRUCTED, &chunk_refs);
    let explicit = der::indefinite(der::CONTEXT_0, &[&octets]);
    der::indefinite(der::SEQUENCE, &[&der::oid(oid::DATA), &explicit])
}

/// The four signed attributes AWS includes, each as a DER Attribute.
fn signed_attributes(content: &[u8], signing_time: OffsetDateTime) -> Vec<Vec<u8>> {
    let attribute =
        |kind: &[u8], value: Vec<u8>| der::seq(&[&der::oid(kind), &der::set(&[&value])]);
    let protection = der::seq(&[
        &sha256(),
        &der::tlv(der::CONTEXT_1_CONSTRUCTED, &sha256_with_rsa_body()),
    ]);
    vec![
        attribute(oid::CONTENT_TYPE, der::oid(oid::DATA)),
        attribute(oid::SIGNING_TIME, der::utc_time(signing_time)),
        attribute(oid::CMS_ALGORITHM_PROTECTION, protection),
        attribute(
            oid::MESSAGE_DIGEST,
            der::tlv(der::OCTET_STRING, &Sha256::digest(content)),
        ),
    ]
}

fn tbs_certificate(serial_der: &[u8], name_der: &[u8], spki: &[u8]) -> Vec<u8> {
    let now = OffsetDateTime::now_utc();
    // Like AWS's: valid from the past until far in the future (2195).
    let validity = der::seq(&[
        &der::utc_time(now - time::Duration::days(1)),
        &der::tlv(der::GENERALIZED_TIME, b"21950117090132Z"),
    ]);
    let version = der::tlv(der::CONTEXT_0_CONSTRUCTED, &der::integer(&[2]));
    der::seq(&[
        &version,
        serial_der,
        &sha256_with_rsa(),
        name_der,
        &validity,
        name_der,
        spki,
        &der::tlv(
            der::CONTEXT_3_CONSTRUCTED,
            &extensions(spki, name_der, serial_der),
        ),
    ])
}

/// keyUsage, subjectKeyIdentifier, authorityKeyIdentifier and a critical
/// basicConstraints, in AWS's order.
fn extensions(spki: &[u8], name_der: &[u8], serial_der: &[u8]) -> Vec<u8> {
    let key_id = key_identifier(spki);
    // digitalSignature only: one used bit, seven unused.
    let key_usage = der::tlv(der::BIT_STRING, &[0x07, 0x80]);
    let ski = der::tlv(der::OCTET_STRING, &key_id);
    let directory_name = der::tlv(der::CONTEXT_4_CONSTRUCTED, name_der);
    let serial_content = &serial_der[2..];
    let aki = der::seq(&[
        &der::tlv(der::CONTEXT_0, &key_id),
        &der::tlv(der::CONTEXT_1_CONSTRUCTED, &directory_name),
        &der::tlv(der::CONTEXT_2, serial_content),
    ]);
    let basic = der::seq(&[&der::tlv(der::BOOLEAN, &[0xff]), &der::integer(&[0])]);
    der::seq(&[
        &extension(oid::KEY_USAGE, false, &key_usage),
        &extension(oid::SUBJECT_KEY_ID, false, &ski),
        &extension(oid::AUTHORITY_KEY_ID, false, &aki),
        &extension(oid::BASIC_CONSTRAINTS, true, &basic),
    ])
}

fn extension(kind: &[u8], critical: bool, value: &[u8]) -> Vec<u8> {
    let oid = der::oid(kind);
    let wrapped = der::tlv(der::OCTET_STRING, value);
    if critical {
        der::seq(&[&oid, &der::tlv(der::BOOLEAN, &[0xff]), &wrapped])
    } else {
        der::seq(&[&oid, &wrapped])
    }
}

/// RFC 7093 method 1: the leftmost 160 bits of the SHA-256 of the
/// subjectPublicKey BIT STRING's value.
fn key_identifier(spki: &[u8]) -> Vec<u8> {
    // SPKI = SEQ { AlgorithmIdentifier, BIT STRING }: the key is its tail,
    // 270 bytes for RSA-2048 (unused-bits byte + the RSAPublicKey DER).
    let key = &spki[spki.len().saturating_sub(270)..];
    Sha256::digest(key)[..20].to_vec()
}

fn sha256() -> Vec<u8> {
    der::seq(&[&der::oid(oid::SHA256), &der::tlv(der::NULL, &[])])
}

fn sha256_with_rsa_body() -> Vec<u8> {
    [der::oid(oid::SHA256_WITH_RSA), der::tlv(der::NULL, &[])].concat()
}

fn sha256_with_rsa() -> Vec<u8> {
    der::tlv(der::SEQUENCE, &sha256_with_rsa_body())
}

/// Splits `text` into lines of `width` characters joined by `\n`.
fn wrap(text: &str, width: usize) -> String {
    text.as_bytes()
        .chunks(width)
        .map(|line| std::str::from_utf8(line).expect("base64 is ASCII"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// DER content octets of the object identifiers used here.
mod oid {
    pub const DATA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x01];
    pub const SIGNED_DATA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x02];
    pub const SHA256: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01];
    pub const SHA256_WITH_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b];
    pub const CONTENT_TYPE: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x03];
    pub const MESSAGE_DIGEST: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x04];
    pub const SIGNING_TIME: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x05];
    pub const CMS_ALGORITHM_PROTECTION: &[u8] =
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x34];
    pub const COUNTRY: &[u8] = &[0x55, 0x04, 0x06];
    pub const STATE: &[u8] = &[0x55, 0x04, 0x08];
    pub const LOCALITY: &[u8] = &[0x55, 0x04, 0x07];
    pub const ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];
    pub const KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x0f];
    pub const SUBJECT_KEY_ID: &[u8] = &[0x55, 0x1d, 0x0e];
    pub const AUTHORITY_KEY_ID: &[u8] = &[0x55, 0x1d, 0x23];
    pub const BASIC_CONSTRAINTS: &[u8] = &[0x55, 0x1d, 0x13];
}

/// A minimal DER (and BER indefinite-length) writer: just what a
/// certificate and a SignedData need.
mod der {
    use time::{OffsetDateTime, UtcOffset};

    pub const BOOLEAN: u8 = 0x01;
    pub const INTEGER: u8 = 0x02;
    pub const BIT_STRING: u8 = 0x03;
    pub const OCTET_STRING: u8 = 0x04;
    pub const NULL: u8 = 0x05;
    pub const OID: u8 = 0x06;
    pub const PRINTABLE_STRING: u8 = 0x13;
    pub const UTC_TIME: u8 = 0x17;
    pub const GENERALIZED_TIME: u8 = 0x18;
    pub const OCTET_STRING_CONSTRUCTED: u8 = 0x24;
    pub const SEQUENCE: u8 = 0x30;
    pub const SET: u8 = 0x31;
    pub const CONTEXT_0: u8 = 0x80;
    pub const CONTEXT_2: u8 = 0x82;
    pub const CONTEXT_0_CONSTRUCTED: u8 = 0xa0;
    pub const CONTEXT_1_CONSTRUCTED: u8 = 0xa1;
    pub const CONTEXT_3_CONSTRUCTED: u8 = 0xa3;
    pub const CONTEXT_4_CONSTRUCTED: u8 = 0xa4;

    /// Definite-length TLV.
    pub fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        out.extend(length(content.len()));
        out.extend_from_slice(content);
        out
    }

    fn length(len: usize) -> Vec<u8> {
        if len < 0x80 {
            return vec![len as u8];
        }
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        let mut out = vec![0x80 | bytes.len() as u8];
        out.extend(bytes);
        out
    }

    /// BER constructed element with indefinite length, closed by
    /// end-of-contents. `tag` is given as its primitive/definite form; the
    /// constructed bit is set here.
    pub fn indefinite(tag: u8, parts: &[&[u8]]) -> Vec<u8> {
        let mut out = vec![tag | 0x20, 0x80];
        for part in parts {
            out.extend_from_slice(part);
        }
        out.extend([0, 0]);
        out
    }

    pub fn seq(parts: &[&[u8]]) -> Vec<u8> {
        tlv(SEQUENCE, &parts.concat())
    }

    /// A SET whose elements are given in order (a single element here).
    pub fn set(parts: &[&[u8]]) -> Vec<u8> {
        tlv(SET, &parts.concat())
    }

    /// A DER SET OF under `tag`: elements sorted by their encodings.
    pub fn set_of(tag: u8, elements: &[Vec<u8>]) -> Vec<u8> {
        let mut sorted: Vec<&Vec<u8>> = elements.iter().collect();
        sorted.sort();
        let content: Vec<u8> = sorted.into_iter().flatten().copied().collect();
        tlv(tag, &content)
    }

    pub fn oid(content: &[u8]) -> Vec<u8> {
        tlv(OID, content)
    }

    /// A non-negative INTEGER from big-endian magnitude bytes.
    pub fn integer(magnitude: &[u8]) -> Vec<u8> {
        let trimmed: Vec<u8> = magnitude.iter().copied().skip_while(|b| *b == 0).collect();
        let mut content = match trimmed.first() {
            None => vec![0],
            Some(b) if b & 0x80 != 0 => vec![0],
            Some(_) => vec![],
        };
        content.extend(trimmed);
        tlv(INTEGER, &content)
    }

    pub fn bit_string(bytes: &[u8]) -> Vec<u8> {
        tlv(BIT_STRING, &[&[0u8][..], bytes].concat())
    }

    /// YYMMDDHHMMSSZ, as AWS's signingTime is written.
    pub fn utc_time(t: OffsetDateTime) -> Vec<u8> {
        let t = t.to_offset(UtcOffset::UTC);
        let text = format!(
            "{:02}{:02}{:02}{:02}{:02}{:02}Z",
            t.year().rem_euclid(100),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        );
        tlv(UTC_TIME, text.as_bytes())
    }

    /// An X.500 Name of single-valued RDNs with PrintableString values.
    pub fn name(attributes: &[(&[u8], &str)]) -> Vec<u8> {
        let rdns: Vec<Vec<u8>> = attributes
            .iter()
            .map(|(kind, value)| {
                let atv = seq(&[&oid(kind), &tlv(PRINTABLE_STRING, value.as_bytes())]);
                set(&[&atv])
            })
            .collect();
        let refs: Vec<&[u8]> = rdns.iter().map(Vec::as_slice).collect();
        seq(&refs)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::{Arc, OnceLock};

    /// One CA for all unit tests: RSA key generation is the slow part.
    pub(crate) fn shared_ca() -> Arc<TestCa> {
        static CA: OnceLock<Arc<TestCa>> = OnceLock::new();
        Arc::clone(CA.get_or_init(|| Arc::new(TestCa::generate().expect("generate test CA"))))
    }

    fn sample_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/aws-iid")
    }

    fn sample_document() -> Vec<u8> {
        std::fs::read(sample_dir().join("samples/real-us-west-2-2021/document.json"))
            .expect("read the real sample document")
    }

    fn signing_time() -> OffsetDateTime {
        time::macros::datetime!(2021-09-03 21:25:47 UTC)
    }

    fn openssl(args: &[&str], input: Option<&[u8]>) -> (bool, Vec<u8>, String) {
        use std::io::Write as _;
        let mut child = Command::new("openssl")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run openssl");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(input.unwrap_or_default())
            .expect("write stdin");
        drop(stdin);
        let out = child.wait_with_output().expect("openssl output");
        (
            out.status.success(),
            out.stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn pkcs7_pem(rsa2048: &str) -> String {
        format!("-----BEGIN PKCS7-----\n{rsa2048}\n-----END PKCS7-----\n")
    }

    /// `openssl <smime|cms> -verify`, trusting only `cert` (never a
    /// certificate inside the signature), without chain checks.
    fn openssl_verify(tool: &str, rsa2048: &str, cert: &Path) -> (bool, Vec<u8>, String) {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("rsa2048.pem");
        std::fs::write(&input, pkcs7_pem(rsa2048)).expect("write signature");
        let args = [
            tool,
            "-verify",
            "-nointern",
            "-noverify",
            "-inform",
            "PEM",
            "-in",
            input.to_str().expect("utf-8 path"),
            "-certfile",
            cert.to_str().expect("utf-8 path"),
        ];
        openssl(&args, None)
    }

    fn write_ca(ca: &TestCa) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, ca.ca_pem()).expect("write ca.pem");
        (dir, path)
    }

    #[test]
    fn openssl_verifies_the_signature_and_returns_the_document() {
        let ca = shared_ca();
        let document = sample_document();
        let rsa2048 = ca.rsa2048(&document, signing_time()).expect("sign");
        let (_dir, ca_pem) = write_ca(&ca);
        for tool in ["smime", "cms"] {
            let (ok, out, err) = openssl_verify(tool, &rsa2048, &ca_pem);
            assert!(ok, "openssl {tool} refused our signature: {err}");
            assert_eq!(out, document, "openssl {tool} content differs");
        }
    }

    #[test]
    fn openssl_refuses_other_certificates_and_tampering() {
        let ca = shared_ca();
        let document = sample_document();
        let rsa2048 = ca.rsa2048(&document, signing_time()).expect("sign");
        let aws = sample_dir().join("rsa2048/us-west-2.pem");
        let (ok, _, _) = openssl_verify("smime", &rsa2048, &aws);
        assert!(
            !ok,
            "AWS's certificate must not verify the test CA's signature"
        );

        let mut ber = ca.sign_pkcs7(&document, signing_time()).expect("sign");
        let at = ber
            .windows(12)
            .position(|w| w == b"278576220453")
            .expect("account id");
        ber[at] = b'9';
        let tampered = wrap(&base64::engine::general_purpose::STANDARD.encode(&ber), 76);
        let (_dir, ca_pem) = write_ca(&ca);
        let (ok, _, _) = openssl_verify("smime", &tampered, &ca_pem);
        assert!(!ok, "a tampered document must not verify");
    }

    #[test]
    fn served_like_imds_base64_76_columns_without_armour() {
        let rsa2048 = shared_ca()
            .rsa2048(&sample_document(), signing_time())
            .expect("sign");
        let lines: Vec<&str> = rsa2048.split('\n').collect();
        assert!(lines.len() > 2);
        assert!(lines[..lines.len() - 1].iter().all(|l| l.len() == 76));
        assert!(!rsa2048.ends_with('\n') && !rsa2048.contains("-----"));
        // AWS's begins the same way: BER, indefinite lengths from the top.
        assert!(rsa2048.starts_with(
            "MIAGCSqGSIb3DQEHAqCAMIACAQExDzANBglghkgBZQMEAgEFADCABgkqhkiG9w0BBwGggCSABIIB"
        ));
    }

    /// `openssl asn1parse` reduced to shape: depth, constructed or not,
    /// indefinite or not, type, and object identifiers; no lengths, values
    /// or offsets.
    fn outline(ber: &[u8]) -> Vec<String> {
        let (ok, out, err) = openssl(&["asn1parse", "-inform", "DER", "-i"], Some(ber));
        assert!(ok, "asn1parse failed: {err}");
        String::from_utf8_lossy(&out)
            .lines()
            .filter_map(|line| {
                let (_, rest) = line.split_once(":d=")?;
                let depth = rest.split_whitespace().next()?;
                let indefinite = rest.contains("l=inf");
                let (kind, item) = rest
                    .split_once("prim:")
                    .map(|(_, i)| ("prim", i))
                    .or_else(|| rest.split_once("cons:").map(|(_, i)| ("cons", i)))?;
                let (name, value) = item.trim().split_once(':').unwrap_or((item.trim(), ""));
                let value = if name.trim() == "OBJECT" {
                    value.trim()
                } else {
                    ""
                };
                Some(format!(
                    "{depth} {kind} inf={indefinite} {} {value}",
                    name.trim()
                ))
            })
            .collect()
    }

    #[test]
    fn structure_matches_the_real_aws_signature() {
        let real_b64 =
            std::fs::read_to_string(sample_dir().join("samples/real-us-west-2-2021/rsa2048.b64"))
                .expect("read real signature");
        let real = base64::engine::general_purpose::STANDARD
            .decode(real_b64.replace('\n', ""))
            .expect("decode real signature");
        let ours = shared_ca()
            .sign_pkcs7(&sample_document(), signing_time())
            .expect("sign");
        let (real, ours) = (outline(&real), outline(&ours));
        assert!(ours.iter().any(|l| l.contains("inf=true")));
        assert_eq!(ours, real, "our PKCS#7 differs in shape from AWS's");
    }

    #[test]
    fn certificate_is_shaped_like_aws_regional_certificates() {
        let ca = shared_ca();
        let (ok, out, err) = openssl(&["x509", "-noout", "-text"], Some(ca.ca_pem().as_bytes()));
        assert!(ok, "openssl cannot read the CA certificate: {err}");
        let text = String::from_utf8_lossy(&out);
        for expected in [
            "Version: 3 (0x2)",
            "Signature Algorithm: sha256WithRSAEncryption",
            "Public-Key: (2048 bit)",
            "Digital Signature",
            "X509v3 Subject Key Identifier",
            "X509v3 Authority Key Identifier",
            "X509v3 Basic Constraints: critical",
            "CA:TRUE, pathlen:0",
            "Not After : Jan 17 09:01:32 2195 GMT",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
        // AWS's own certificates fail `openssl verify -check_ss_sig` (key
        // usage lacks keyCertSign), so check the self-signature directly:
        // RSA SHA-256 over the TBSCertificate, with the certificate's key.
        let (_dir, path) = write_ca(&ca);
        let der = ca.ca_der();
        let tbs_len = usize::from(u16::from_be_bytes([der[6], der[7]])) + 4;
        let dir = path.parent().expect("temp dir");
        std::fs::write(dir.join("tbs.der"), &der[4..4 + tbs_len]).expect("write tbs");
        std::fs::write(dir.join("sig.bin"), &der[der.len() - 256..]).expect("write sig");
        let (ok, pubkey, err) = openssl(
            &[
                "x509",
                "-noout",
                "-pubkey",
                "-in",
                path.to_str().expect("utf-8"),
            ],
            None,
        );
        assert!(ok, "{err}");
        std::fs::write(dir.join("pub.pem"), pubkey).expect("write pubkey");
        let arg = |name: &str| dir.join(name).to_str().expect("utf-8").to_string();
        let (public, signature, tbs) = (arg("pub.pem"), arg("sig.bin"), arg("tbs.der"));
        let args = [
            "dgst",
            "-sha256",
            "-verify",
            &public,
            "-signature",
            &signature,
            &tbs,
        ];
        let (ok, _, err) = openssl(&args, None);
        assert!(ok, "self-signature does not verify: {err}");
    }
}
