//! The COSE_Sign1 envelope (RFC 9052 §4.2) as AWS's Nitro signer writes it.
//!
//! `[protected: bstr, unprotected: {}, payload: bstr, signature: bstr]`,
//! optionally inside tag 18. Only one algorithm is accepted, ES384, named in
//! the protected header as exactly `{1: -35}`; the unprotected header must
//! be empty because nothing in it is signed (a verifier that read it could
//! be steered by bytes anyone can change). The signature is P-384 r‖s.

use std::borrow::Cow;

use ring::signature::{UnparsedPublicKey, ECDSA_P384_SHA384_FIXED};

use super::cbor::{self, Value};
use super::error::NitroError;

/// The COSE tag of a COSE_Sign1 (RFC 9052 §2).
pub const TAG_SIGN1: u64 = 18;
/// COSE's algorithm label (1) and ES384's value (-35 = `Neg(34)`).
const ALG_LABEL: u64 = 1;
const ES384: u64 = 34;
/// A P-384 signature as r‖s.
pub const SIGNATURE_BYTES: usize = 96;

/// The parts of a COSE_Sign1 that the signature check needs, as received.
#[derive(Debug)]
pub struct Sign1<'a> {
    /// The protected header's bytes (the bstr's content), as signed.
    pub protected: Cow<'a, [u8]>,
    /// The payload's bytes, as signed: never a re-encoding.
    pub payload: Cow<'a, [u8]>,
    /// r‖s.
    pub signature: [u8; SIGNATURE_BYTES],
}

impl<'a> Sign1<'a> {
    /// Reads the envelope, refusing any other shape or algorithm.
    pub fn parse(bytes: &'a [u8]) -> Result<Sign1<'a>, NitroError> {
        let outer = cbor::decode(bytes).map_err(|source| NitroError::Cbor {
            what: "the document",
            source,
        })?;
        let outer = match outer {
            Value::Tag(TAG_SIGN1, inner) => *inner,
            Value::Tag(..) => return Err(NitroError::Cose("tagged, but not with tag 18")),
            untagged => untagged,
        };
        let Value::Array(parts) = outer else {
            return Err(NitroError::Cose("not an array"));
        };
        let [protected, unprotected, payload, signature]: [Value<'a>; 4] = parts
            .try_into()
            .map_err(|_| NitroError::Cose("not 4 elements"))?;
        let Value::Bytes(protected) = protected else {
            return Err(NitroError::Cose(
                "the protected header is not a byte string",
            ));
        };
        check_protected(&protected)?;
        match unprotected.as_map() {
            Some([]) => {}
            Some(_) => return Err(NitroError::Cose("the unprotected header is not empty")),
            None => return Err(NitroError::Cose("the unprotected header is not a map")),
        }
        let Value::Bytes(payload) = payload else {
            return Err(NitroError::Cose("the payload is not a byte string"));
        };
        let signature = signature
            .as_bytes()
            .and_then(|s| <[u8; SIGNATURE_BYTES]>::try_from(s).ok())
            .ok_or(NitroError::Cose("the signature is not 96 bytes of r‖s"))?;
        Ok(Sign1 {
            protected,
            payload,
            signature,
        })
    }

    /// What was signed (see [`sig_structure`]), from the bytes received.
    pub fn sig_structure(&self) -> Vec<u8> {
        sig_structure(&self.protected, &self.payload)
    }

    /// Checks the signature with a P-384 public key (an uncompressed SEC1
    /// point, as in the leaf certificate).
    pub fn verify(&self, leaf_point: &[u8]) -> Result<(), NitroError> {
        UnparsedPublicKey::new(&ECDSA_P384_SHA384_FIXED, leaf_point)
            .verify(&self.sig_structure(), &self.signature)
            .map_err(|_| NitroError::BadSignature)
    }
}

/// The protected header AWS writes, `{1: -35}`, as bytes.
pub const PROTECTED_ES384: [u8; 4] = [0xa1, 0x01, 0x38, 0x22];

/// The bytes a COSE_Sign1 signature covers:
/// `["Signature1", protected, h'', payload]` (RFC 9052 §4.4), with no
/// external data. Also what a signer (a test PKI) signs.
pub fn sig_structure(protected: &[u8], payload: &[u8]) -> Vec<u8> {
    const CONTEXT: &[u8] = b"Signature1";
    let mut out = Vec::with_capacity(payload.len() + protected.len() + 32);
    cbor::encode_head(&mut out, 4, 4);
    cbor::encode_head(&mut out, 3, CONTEXT.len() as u64);
    out.extend_from_slice(CONTEXT);
    cbor::encode_head(&mut out, 2, protected.len() as u64);
    out.extend_from_slice(protected);
    cbor::encode_head(&mut out, 2, 0);
    cbor::encode_head(&mut out, 2, payload.len() as u64);
    out.extend_from_slice(payload);
    out
}

/// The protected header must decode to exactly `{1: -35}`.
fn check_protected(protected: &[u8]) -> Result<(), NitroError> {
    let header = cbor::decode(protected).map_err(|source| NitroError::Cbor {
        what: "the protected header",
        source,
    })?;
    match header.as_map() {
        Some([(Value::Uint(ALG_LABEL), Value::Neg(ES384))]) => Ok(()),
        _ => Err(NitroError::Cose(
            "the protected header is not exactly {1: -35} (ES384)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A COSE_Sign1 with the given protected header and unprotected map
    /// bytes, a 1-byte payload and a zero signature.
    fn envelope(protected: &[u8], unprotected: &[u8]) -> Vec<u8> {
        let mut out = vec![0x84];
        cbor::encode_head(&mut out, 2, protected.len() as u64);
        out.extend_from_slice(protected);
        out.extend_from_slice(unprotected);
        out.extend_from_slice(&[0x41, 0x00, 0x58, 96]);
        out.extend_from_slice(&[0; 96]);
        out
    }

    const ES384_HEADER: &[u8] = &PROTECTED_ES384;

    #[test]
    fn the_shape_aws_sends_parses_tagged_or_not() {
        let plain = envelope(ES384_HEADER, &[0xa0]);
        let sign1 = Sign1::parse(&plain).unwrap();
        assert_eq!(&*sign1.payload, &[0x00]);
        let mut tagged = vec![0xd2];
        tagged.extend_from_slice(&plain);
        assert!(Sign1::parse(&tagged).is_ok());
        let mut other_tag = vec![0xd1];
        other_tag.extend_from_slice(&plain);
        assert!(Sign1::parse(&other_tag).is_err());
    }

    #[test]
    fn only_es384_alone_in_the_protected_header() {
        for header in [
            &[0xa1, 0x01, 0x26][..],                   // ES256
            &[0xa2, 0x01, 0x38, 0x22, 0x04, 0x40][..], // ES384 and a kid
            &[0xa0][..],
            &[][..],
        ] {
            let err = Sign1::parse(&envelope(header, &[0xa0])).unwrap_err();
            assert_eq!(
                err.kind(),
                super::super::Failure::Malformed,
                "{header:02x?}"
            );
        }
    }

    #[test]
    fn the_unprotected_header_must_be_an_empty_map() {
        for unprotected in [&[0xa1, 0x04, 0x41, 0x00][..], &[0xf6][..]] {
            assert!(Sign1::parse(&envelope(ES384_HEADER, unprotected)).is_err());
        }
    }

    #[test]
    fn the_sig_structure_is_rfc_9052s() {
        let doc = envelope(ES384_HEADER, &[0xa0]);
        let built = Sign1::parse(&doc).unwrap().sig_structure();
        let mut want = vec![0x84, 0x6a];
        want.extend_from_slice(b"Signature1");
        want.extend_from_slice(&[0x44, 0xa1, 0x01, 0x38, 0x22, 0x40, 0x41, 0x00]);
        assert_eq!(built, want);
    }
}
