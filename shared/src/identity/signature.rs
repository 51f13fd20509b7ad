//! From the text IMDS serves to the pieces a verifier needs.
//!
//! Decoding is also where the shape is enforced: everything AWS's
//! signatures never contain (carried certificates, several signers, other
//! algorithms) is refused here, before any key is looked at.

use super::error::IdentityError;
use super::pem;
use rasn::types::{Any, Integer, ObjectIdentifier, OctetString, Oid};
use rasn_cms::{
    AlgorithmIdentifier, Attribute, ContentInfo, SignedData, SignerIdentifier, SignerInfo,
};

/// Object identifiers of the shape we accept (and of the forms we name).
pub mod oids {
    use rasn::types::Oid;
    /// id-signedData, the outer content type.
    pub const SIGNED_DATA: &Oid = Oid::const_new(&[1, 2, 840, 113549, 1, 7, 2]);
    /// id-data, the type of the encapsulated document.
    pub const DATA: &Oid = Oid::const_new(&[1, 2, 840, 113549, 1, 7, 1]);
    /// The signed content-type attribute.
    pub const ATTR_CONTENT_TYPE: &Oid = Oid::const_new(&[1, 2, 840, 113549, 1, 9, 3]);
    /// The signed message-digest attribute.
    pub const ATTR_MESSAGE_DIGEST: &Oid = Oid::const_new(&[1, 2, 840, 113549, 1, 9, 4]);
    /// SHA-256, the only digest accepted.
    pub const SHA256: &Oid = Oid::const_new(&[2, 16, 840, 1, 101, 3, 4, 2, 1]);
    /// rsaEncryption: PKCS#1 v1.5 with the digest named by the signer.
    pub const RSA_ENCRYPTION: &Oid = Oid::const_new(&[1, 2, 840, 113549, 1, 1, 1]);
    /// sha256WithRSAEncryption.
    pub const SHA256_WITH_RSA: &Oid = Oid::const_new(&[1, 2, 840, 113549, 1, 1, 11]);
    /// SHA-1: the `pkcs7` form's digest.
    pub const SHA1: &Oid = Oid::const_new(&[1, 3, 14, 3, 2, 26]);
    /// id-dsa: the `pkcs7` form's signature algorithm.
    pub const DSA: &Oid = Oid::const_new(&[1, 2, 840, 10040, 4, 1]);
    /// id-dsa-with-sha1: also seen for the `pkcs7` form.
    pub const DSA_WITH_SHA1: &Oid = Oid::const_new(&[1, 2, 840, 10040, 4, 3]);
}

/// Length of the bare RSA-1024 signature IMDS serves at `.../signature`.
const RSA1024_SIGNATURE_LEN: usize = 128;
/// Length of a SHA-256 digest.
const SHA256_LEN: usize = 32;

/// A decoded `rsa2048` signature whose shape is AWS's. Nothing in it is
/// verified yet: the content is untrusted until [`super::verify`] says so.
#[derive(Debug, Clone)]
pub struct ParsedSignature {
    content: Vec<u8>,
    issuer_der: Vec<u8>,
    serial: Integer,
    message_digest: Vec<u8>,
    signed_attrs_der: Vec<u8>,
    signature: Vec<u8>,
}

impl ParsedSignature {
    /// Decode the text IMDS serves at `/latest/dynamic/instance-identity/rsa2048`:
    /// base64 in 76-column lines, or the same inside `PKCS7`/`CMS` PEM armour.
    pub fn from_text(input: &[u8]) -> Result<Self, IdentityError> {
        let ber = decode_text(input)?;
        if ber.len() == RSA1024_SIGNATURE_LEN {
            return Err(IdentityError::Rsa1024SignatureForm);
        }
        Self::from_ber(&ber)
    }

    /// Decode BER (or DER) `ContentInfo` bytes. AWS emits BER with
    /// indefinite lengths and a constructed OCTET STRING, so this is BER.
    pub fn from_ber(ber: &[u8]) -> Result<Self, IdentityError> {
        let signed = decode_signed_data(ber)?;
        check_outer_shape(&signed)?;
        let content = content_of(&signed)?;
        let signer = single_signer(&signed)?;
        Self::from_signer(content, signer)
    }

    fn from_signer(content: Vec<u8>, signer: &SignerInfo) -> Result<Self, IdentityError> {
        let SignerIdentifier::IssuerAndSerialNumber(id) = &signer.sid else {
            return Err(IdentityError::SignerNotIssuerSerial);
        };
        check_digest_algorithm(&signer.digest_algorithm)?;
        check_signature_algorithm(&signer.signature_algorithm)?;
        let attrs = signer
            .signed_attrs
            .as_ref()
            .ok_or(IdentityError::NoSignedAttributes)?;
        check_content_type_attr(attrs.to_vec())?;
        let message_digest = message_digest_attr(attrs.to_vec())?;
        Ok(Self {
            content,
            issuer_der: der(&id.issuer)?,
            serial: id.serial_number.clone(),
            message_digest,
            // RFC 5652 §5.4: the signature covers the DER encoding of the
            // attributes as a SET OF (tag 0x31), not the [0] IMPLICIT bytes
            // as they appear in the message.
            signed_attrs_der: der(attrs)?,
            signature: signer.signature.to_vec(),
        })
    }

    /// The encapsulated content: the identity document, still unverified.
    pub fn content(&self) -> &[u8] {
        &self.content
    }

    pub(crate) fn issuer_der(&self) -> &[u8] {
        &self.issuer_der
    }

    pub(crate) fn serial(&self) -> &Integer {
        &self.serial
    }

    pub(crate) fn message_digest(&self) -> &[u8] {
        &self.message_digest
    }

    pub(crate) fn signed_attrs_der(&self) -> &[u8] {
        &self.signed_attrs_der
    }

    pub(crate) fn signature(&self) -> &[u8] {
        &self.signature
    }
}

/// Base64 or PEM text to bytes.
fn decode_text(input: &[u8]) -> Result<Vec<u8>, IdentityError> {
    let text = std::str::from_utf8(input)
        .map_err(|_| IdentityError::NotBase64("not UTF-8 text".into()))?
        .trim();
    if text.is_empty() {
        return Err(IdentityError::Empty);
    }
    if !text.starts_with("-----BEGIN ") {
        return pem::decode_base64_lines(text).map_err(IdentityError::NotBase64);
    }
    let mut blocks = pem::blocks(text).map_err(IdentityError::NotBase64)?;
    match (blocks.pop(), blocks.is_empty()) {
        (Some(block), true) if block.label == "PKCS7" || block.label == "CMS" => Ok(block.der),
        (Some(block), true) => Err(IdentityError::NotBase64(format!(
            "PEM label {:?}, expected PKCS7",
            block.label
        ))),
        _ => Err(IdentityError::NotBase64(
            "expected exactly one PEM block".into(),
        )),
    }
}

/// ContentInfo → SignedData, refusing trailing bytes at either level.
fn decode_signed_data(ber: &[u8]) -> Result<SignedData, IdentityError> {
    let info: ContentInfo = decode_all(ber)?;
    if *info.content_type != *oids::SIGNED_DATA {
        return Err(IdentityError::NotSignedData(info.content_type.to_string()));
    }
    decode_all(info.content.as_bytes())
}

fn decode_all<T: rasn::Decode>(ber: &[u8]) -> Result<T, IdentityError> {
    let (value, rest) = rasn::ber::decode_with_remainder::<T>(ber)
        .map_err(|e| IdentityError::NotCms(e.to_string()))?;
    if !rest.is_empty() {
        return Err(IdentityError::NotCms(format!(
            "{} trailing bytes",
            rest.len()
        )));
    }
    Ok(value)
}

/// Everything about the SignedData except its one signer.
fn check_outer_shape(signed: &SignedData) -> Result<(), IdentityError> {
    // Name the `pkcs7` form before anything else fails on it.
    if is_dsa_form(signed) {
        return Err(IdentityError::DsaPkcs7Form);
    }
    // A carried certificate is attacker-chosen; AWS sends none, so a
    // signature that has one is not AWS's. Refuse rather than ignore.
    if signed.certificates.is_some() {
        return Err(IdentityError::CarriesCertificates);
    }
    if signed.crls.is_some() {
        return Err(IdentityError::CarriesRevocationInfo);
    }
    signed
        .digest_algorithms
        .to_vec()
        .into_iter()
        .try_for_each(check_digest_algorithm)
}

fn is_dsa_form(signed: &SignedData) -> bool {
    let dsa_digest = signed
        .digest_algorithms
        .to_vec()
        .iter()
        .any(|alg| *alg.algorithm == *oids::SHA1);
    let dsa_signer = signed.signer_infos.to_vec().iter().any(|s| {
        let alg: &Oid = &s.signature_algorithm.algorithm;
        *alg == *oids::DSA
            || *alg == *oids::DSA_WITH_SHA1
            || *s.digest_algorithm.algorithm == *oids::SHA1
    });
    dsa_digest || dsa_signer
}

fn content_of(signed: &SignedData) -> Result<Vec<u8>, IdentityError> {
    let encap = &signed.encap_content_info;
    if *encap.content_type != *oids::DATA {
        return Err(IdentityError::ContentNotData(
            encap.content_type.to_string(),
        ));
    }
    encap
        .content
        .as_ref()
        .map(|c| c.to_vec())
        .ok_or(IdentityError::NoContent)
}

fn single_signer(signed: &SignedData) -> Result<&SignerInfo, IdentityError> {
    match signed.signer_infos.to_vec().as_slice() {
        [one] => Ok(one),
        many => Err(IdentityError::SignerCount(many.len())),
    }
}

fn check_digest_algorithm(alg: &AlgorithmIdentifier) -> Result<(), IdentityError> {
    if *alg.algorithm != *oids::SHA256 {
        return Err(IdentityError::UnsupportedDigest(alg.algorithm.to_string()));
    }
    check_null_params(alg)
}

fn check_signature_algorithm(alg: &AlgorithmIdentifier) -> Result<(), IdentityError> {
    // AWS's real signatures name sha256WithRSAEncryption here; CMS signers
    // (openssl cms, Go's pkcs7) often name plain rsaEncryption with the
    // digest given separately. Both mean PKCS#1 v1.5 over SHA-256 here,
    // since the digest algorithm has already been required to be SHA-256.
    let oid: &Oid = &alg.algorithm;
    if *oid != *oids::RSA_ENCRYPTION && *oid != *oids::SHA256_WITH_RSA {
        return Err(IdentityError::UnsupportedSignatureAlgorithm(
            oid.to_string(),
        ));
    }
    check_null_params(alg)
}

fn check_null_params(alg: &AlgorithmIdentifier) -> Result<(), IdentityError> {
    const DER_NULL: &[u8] = &[0x05, 0x00];
    match &alg.parameters {
        None => Ok(()),
        Some(p) if p.as_bytes() == DER_NULL => Ok(()),
        Some(_) => Err(IdentityError::UnexpectedAlgorithmParameters(
            alg.algorithm.to_string(),
        )),
    }
}

/// The single value of the single attribute of type `oid`, if there is
/// exactly one of each (RFC 5652 §11: both attributes are single-valued).
fn single_value<'a>(attrs: &[&'a Attribute], oid: &Oid) -> Option<&'a Any> {
    let mut matching = attrs.iter().filter(|a| *a.r#type == *oid);
    let attr = matching.next()?;
    if matching.next().is_some() {
        return None;
    }
    match attr.values.to_vec().as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

fn check_content_type_attr(attrs: Vec<&Attribute>) -> Result<(), IdentityError> {
    let value = single_value(&attrs, oids::ATTR_CONTENT_TYPE)
        .ok_or(IdentityError::BadContentTypeAttribute)?;
    let oid: ObjectIdentifier =
        decode_all(value.as_bytes()).map_err(|_| IdentityError::BadContentTypeAttribute)?;
    if *oid != *oids::DATA {
        return Err(IdentityError::ContentTypeAttributeMismatch(oid.to_string()));
    }
    Ok(())
}

fn message_digest_attr(attrs: Vec<&Attribute>) -> Result<Vec<u8>, IdentityError> {
    let value = single_value(&attrs, oids::ATTR_MESSAGE_DIGEST)
        .ok_or(IdentityError::BadMessageDigestAttribute)?;
    let digest: OctetString =
        decode_all(value.as_bytes()).map_err(|_| IdentityError::BadMessageDigestAttribute)?;
    if digest.len() != SHA256_LEN {
        return Err(IdentityError::BadMessageDigestAttribute);
    }
    Ok(digest.to_vec())
}

/// DER re-encoding of a decoded value. Cannot fail for values the decoder
/// produced, but the encoder's error is still mapped rather than unwrapped.
fn der<T: rasn::Encode>(value: &T) -> Result<Vec<u8>, IdentityError> {
    rasn::der::encode(value).map_err(|e| IdentityError::NotCms(e.to_string()))
}
