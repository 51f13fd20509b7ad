//! Test helpers: the real samples, throwaway keys, and an AWS-shaped signer.

use super::signature::oids;
use base64::Engine as _;
use rand::{rngs::StdRng, SeedableRng};
use rasn::types::{Any, Integer, ObjectIdentifier, OctetString, Oid, SetOf};
use rasn_cms::{
    AlgorithmIdentifier, Attribute, Certificate, CertificateChoices, ContentInfo,
    EncapsulatedContentInfo, IssuerAndSerialNumber, Name, SignedData, SignerIdentifier, SignerInfo,
};
use rsa::pkcs1::EncodeRsaPublicKey;
use rsa::pkcs8::{EncodePrivateKey, LineEnding};
use rsa::{Pkcs1v15Sign, RsaPrivateKey};
use sha2::{Digest, Sha256};
use std::sync::OnceLock;
use time::OffsetDateTime;

pub const SAMPLE_B64: &str =
    include_str!("../../data/aws-iid/samples/real-us-west-2-2021/rsa2048.b64");
pub const SAMPLE_PEM: &str =
    include_str!("../../data/aws-iid/samples/real-us-west-2-2021/rsa2048.pem");
pub const SAMPLE_DOC: &str =
    include_str!("../../data/aws-iid/samples/real-us-west-2-2021/document.json");
pub const US_WEST_2_PEM: &str = include_str!("../../data/aws-iid/rsa2048/us-west-2.pem");
pub const DSA_PKCS7_B64: &str = include_str!("testdata/dsa-sha1-pkcs7.b64");
pub const RSA1024_SIGNATURE_B64: &str = include_str!("testdata/rsa1024-signature.b64");

/// The real sample's pendingTime (2021-09-03T21:25:44Z).
pub fn sample_pending_time() -> OffsetDateTime {
    time::macros::datetime!(2021-09-03 21:25:44 UTC)
}

pub fn sample_ber() -> Vec<u8> {
    let compact: String = SAMPLE_B64.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .unwrap()
}

/// Base64 in 76-column lines, as IMDS serves it.
pub fn b64_lines(der: &[u8]) -> String {
    let flat = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = flat
        .as_bytes()
        .chunks(76)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    lines.join("\n")
}

/// A throwaway RSA-2048 key, generated once per test process.
pub fn key() -> &'static RsaPrivateKey {
    static KEY: OnceLock<RsaPrivateKey> = OnceLock::new();
    KEY.get_or_init(|| RsaPrivateKey::new(&mut StdRng::seed_from_u64(7), 2048).unwrap())
}

/// A self-signed RSA-2048 test CA made with rcgen, as the fake cloud would.
pub struct TestCa {
    pub pem: String,
    pub cert: Certificate,
}

pub fn test_ca() -> &'static TestCa {
    static CA: OnceLock<TestCa> = OnceLock::new();
    CA.get_or_init(|| {
        let pkcs8 = key().to_pkcs8_pem(LineEnding::LF).unwrap();
        let kp = rcgen::KeyPair::from_pem_and_sign_algo(&pkcs8, &rcgen::PKCS_RSA_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "autonode test cloud CA");
        let cert = params.self_signed(&kp).unwrap();
        TestCa {
            pem: cert.pem(),
            cert: rasn::der::decode(cert.der()).unwrap(),
        }
    })
}

/// AWS's us-west-2 certificate with its key swapped for [`key`] and
/// re-signed: same subject, issuer and serial as the pinned one. What a
/// forger embeds in a signature hoping to be trusted.
pub fn forged_us_west_2_cert() -> Certificate {
    let block = &super::pem::blocks(US_WEST_2_PEM).unwrap()[0];
    let mut cert: Certificate = rasn::der::decode(&block.der).unwrap();
    let pkcs1 = key().to_public_key().to_pkcs1_der().unwrap();
    cert.tbs_certificate
        .subject_public_key_info
        .subject_public_key = rasn::types::BitString::from_slice(pkcs1.as_bytes());
    let tbs = rasn::der::encode(&cert.tbs_certificate).unwrap();
    let sig = key()
        .sign(Pkcs1v15Sign::new::<Sha256>(), &Sha256::digest(&tbs))
        .unwrap();
    cert.signature_value = rasn::types::BitString::from_vec(sig);
    cert
}

pub fn name_and_serial(cert: &Certificate) -> (Name, Integer) {
    (
        cert.tbs_certificate.issuer.clone(),
        cert.tbs_certificate.serial_number.clone(),
    )
}

/// A document like AWS's, for `region`/`account`, pending at `pending`.
pub fn doc(region: &str, account: &str, pending: OffsetDateTime) -> Vec<u8> {
    let pending = pending
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    serde_json::to_vec_pretty(&serde_json::json!({
        "accountId": account, "architecture": "x86_64",
        "availabilityZone": format!("{region}a"), "billingProducts": null,
        "devpayProductCodes": null, "marketplaceProductCodes": null,
        "imageId": "ami-0123456789abcdef0", "instanceId": "i-0123456789abcdef0",
        "instanceType": "m5.large", "kernelId": null, "pendingTime": pending,
        "privateIp": "10.1.2.3", "ramdiskId": null, "region": region,
        "version": "2017-09-30", "someFutureField": {"x": 1}
    }))
    .unwrap()
}

fn oid(o: &Oid) -> ObjectIdentifier {
    o.to_owned()
}

fn alg(o: &Oid) -> AlgorithmIdentifier {
    AlgorithmIdentifier {
        algorithm: oid(o),
        parameters: Some(Any::new(vec![0x05, 0x00])),
    }
}

fn attr(o: &Oid, value_der: Vec<u8>) -> Attribute {
    Attribute {
        r#type: oid(o),
        values: SetOf::from(vec![Any::new(value_der)]),
    }
}

/// Knobs for an AWS-shaped signature; [`Signer::aws_shaped`] is the shape
/// AWS emits (one signer, sha256, signed content-type and message-digest,
/// no certificates), the other fields let tests break one thing at a time.
pub struct Signer {
    pub issuer: Name,
    pub serial: Integer,
    pub certificates: Option<Vec<Certificate>>,
    pub digest: &'static Oid,
    pub signature_alg: &'static Oid,
    pub content_type_attr: Option<&'static Oid>,
    pub with_digest_attr: bool,
    pub detached: bool,
    pub signers: usize,
}

impl Signer {
    pub fn aws_shaped(cert: &Certificate) -> Self {
        let (issuer, serial) = name_and_serial(cert);
        Self {
            issuer,
            serial,
            certificates: None,
            digest: oids::SHA256,
            signature_alg: oids::RSA_ENCRYPTION,
            content_type_attr: Some(oids::DATA),
            with_digest_attr: true,
            detached: false,
            signers: 1,
        }
    }

    fn signer_info(&self, content: &[u8]) -> SignerInfo {
        let mut attrs = Vec::new();
        if let Some(ct) = self.content_type_attr {
            attrs.push(attr(
                oids::ATTR_CONTENT_TYPE,
                rasn::der::encode(&oid(ct)).unwrap(),
            ));
        }
        if self.with_digest_attr {
            let md = OctetString::from(Sha256::digest(content).to_vec());
            attrs.push(attr(
                oids::ATTR_MESSAGE_DIGEST,
                rasn::der::encode(&md).unwrap(),
            ));
        }
        let attrs = SetOf::from(attrs);
        let attrs_der = rasn::der::encode(&attrs).unwrap();
        let sig = key()
            .sign(Pkcs1v15Sign::new::<Sha256>(), &Sha256::digest(&attrs_der))
            .unwrap();
        SignerInfo {
            version: Integer::from(1),
            sid: SignerIdentifier::IssuerAndSerialNumber(IssuerAndSerialNumber {
                issuer: self.issuer.clone(),
                serial_number: self.serial.clone(),
            }),
            digest_algorithm: alg(self.digest),
            signed_attrs: Some(attrs),
            signature_algorithm: alg(self.signature_alg),
            signature: OctetString::from(sig),
            unsigned_attrs: None,
        }
    }

    /// DER `ContentInfo` signing `content` with [`key`].
    pub fn sign(&self, content: &[u8]) -> Vec<u8> {
        let one = self.signer_info(content);
        let signed = SignedData {
            version: Integer::from(1),
            digest_algorithms: SetOf::from(vec![alg(self.digest)]),
            encap_content_info: EncapsulatedContentInfo {
                content_type: oid(oids::DATA),
                content: (!self.detached).then(|| OctetString::from(content.to_vec())),
            },
            certificates: self.certificates.as_ref().map(|certs| {
                SetOf::from(
                    certs
                        .iter()
                        .map(|c| CertificateChoices::Certificate(Box::new(c.clone())))
                        .collect::<Vec<_>>(),
                )
            }),
            crls: None,
            signer_infos: SetOf::from(
                (0..self.signers)
                    .map(|i| SignerInfo {
                        version: Integer::from(1 + i),
                        ..one.clone()
                    })
                    .collect::<Vec<_>>(),
            ),
        };
        let info = ContentInfo {
            content_type: oid(oids::SIGNED_DATA),
            content: Any::new(rasn::der::encode(&signed).unwrap()),
        };
        rasn::der::encode(&info).unwrap()
    }

    /// The same, as IMDS would serve it.
    pub fn sign_b64(&self, content: &[u8]) -> String {
        b64_lines(&self.sign(content))
    }
}
