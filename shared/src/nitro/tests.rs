//! The verifier against real AWS-signed documents (testdata/, see
//! testdata/PROVENANCE.md), and against each way of changing them.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::cbor::{self, Value};
use super::cose::Sign1;
use super::document::Payload;
use super::*;

/// What each real document is known to say (facts from its provenance,
/// cross-checked with an independent verifier).
struct Fixture {
    file: &'static str,
    bytes: &'static [u8],
    sha256: &'static str,
    module_id: &'static str,
    kind: Kind,
    timestamp_ms: u64,
    nonce_len: Option<usize>,
    user_data_len: Option<usize>,
    public_key_len: Option<usize>,
    /// The payload is an indefinite-length map (0xbf … 0xff).
    indefinite: bool,
}

macro_rules! fixture {
    ($file:literal, $sha:literal, $module:literal, $kind:expr, $ts:literal, $nonce:expr, $user:expr, $key:expr, $indef:literal) => {
        Fixture {
            file: $file,
            bytes: include_bytes!(concat!("testdata/", $file)),
            sha256: $sha,
            module_id: $module,
            kind: $kind,
            timestamp_ms: $ts,
            nonce_len: $nonce,
            user_data_len: $user,
            public_key_len: $key,
            indefinite: $indef,
        }
    };
}

const FIXTURES: [Fixture; 10] = [
    fixture!(
        "nitrotpm-biomodel-2026-08-13.cbor",
        "dd6d8af26c8d574996f50b2c610adc37cfaa62f8bbf4d9b651496210af1867c2",
        "i-000fa553dad58a9f1-tpm0000000000000000",
        Kind::NitroTpm,
        1786642608432,
        Some(64),
        None,
        Some(91),
        true
    ),
    fixture!(
        "nitrotpm-vaportpm-2026-02-03.cbor",
        "8df530572d54b37331c3113be6e7e450f4e49dd5630212ee6ca45583fb09ebd2",
        "i-01cfb383223e42522-tpm0000000000000000",
        Kind::NitroTpm,
        1770113522437,
        Some(32),
        None,
        Some(65),
        true
    ),
    fixture!(
        "enclave-suisentinel-2025-07-18.cbor",
        "1f21a367506bdaf441b784200b4c3cf6936da1b0bd236c5c7a116cd54e0dbf6b",
        "i-0a9f2a8b8dd31c7c8-enc019802a541b75725",
        Kind::Enclave,
        1752827858990,
        None,
        None,
        Some(32),
        true
    ),
    fixture!(
        "enclave-blocky-2024-09-07.cbor",
        "72ffd835a669cad29f11314fb4185bd89eaed2762e30dc25282c663606ee30ee",
        "i-0a22e5c5f24d22174-enc0191cceb4289903f",
        Kind::Enclave,
        1725719859545,
        Some(1024),
        Some(1024),
        Some(1024),
        false
    ),
    fixture!(
        "enclave-blocky-debug-2024-09-07.cbor",
        "f67dfb87bcae0916bf4b4b6a35572e590ec6f8dd49323dda4727e6fcc39a62ec",
        "i-0a22e5c5f24d22174-enc0191ccebaf8feaba",
        Kind::Enclave,
        1725719886508,
        Some(1024),
        Some(1024),
        Some(1024),
        false
    ),
    fixture!(
        "enclave-evervault-debug-2023-09-18.cbor",
        "6f80ac250af2f06f1e423051f64a8b29926cc474a728d0bf1f7a4d21074ec9e5",
        "i-0918f6c55e3b61d89-enc018aa8b8e2285d13",
        Kind::Enclave,
        1695049410860,
        Some(256),
        Some(91),
        None,
        false
    ),
    fixture!(
        "enclave-evervault-san-2023-01-18.cbor",
        "061b9b75a3a61582487466b3de241994a649a792a17a9c2354f65b8c3506f161",
        "i-0ec0e572c8263d8ff-enc0185c4fd382eeb25",
        Kind::Enclave,
        1674047239280,
        Some(256),
        Some(120),
        None,
        false
    ),
    fixture!(
        "enclave-evervault-san-debug-2023-01-18.cbor",
        "97f51a5d393c89de57ea05537d57eb54b4c5f18a1a9c02e91145b1780c9d89c0",
        "i-06e1ffc9a8410edb1-enc0185c56e099c2d54",
        Kind::Enclave,
        1674054632312,
        Some(256),
        Some(120),
        None,
        false
    ),
    fixture!(
        "enclave-evervault-2022-10-13.cbor",
        "a72552688ab6de06b9039ebda2bd5ae9285860ec886f841da94351681dfb3eb6",
        "i-020b6af9246d90e92-enc0183d09086c24190",
        Kind::Enclave,
        1665651482136,
        Some(256),
        None,
        None,
        false
    ),
    fixture!(
        "enclave-evervault-debug-2022-10-12.cbor",
        "46591b92f9abefaace22a6d7ea4ca9c7007dfdbe788fbe8634b230ec2043a789",
        "i-03ad7cdb817437eeb-enc0183cc7569b3f6e1",
        Kind::Enclave,
        1665582606081,
        None,
        Some(13),
        Some(19),
        false
    ),
];

const AWS_ROOT_G1_SHA256: &str = "641a0321a3e244efe456463195d606317ed7cdcc3c1756e09893f3c68f79bb5b";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn kind_of(bytes: &[u8], root: &Root, at: At) -> Failure {
    match verify(bytes, root, at) {
        Ok(doc) => panic!("accepted: {}", doc.module_id),
        Err(e) => e.kind(),
    }
}

/// Where `part` lies inside `whole` (both borrowed from the same bytes).
fn range_in(whole: &[u8], part: &[u8]) -> std::ops::Range<usize> {
    let start = part.as_ptr() as usize - whole.as_ptr() as usize;
    assert!(start + part.len() <= whole.len());
    start..start + part.len()
}

/// The byte ranges, in the document, of the payload, the signature, the
/// leaf certificate and each cabundle certificate.
struct Layout {
    payload: std::ops::Range<usize>,
    signature: std::ops::Range<usize>,
    certificate: std::ops::Range<usize>,
    cabundle: Vec<std::ops::Range<usize>>,
}

impl Layout {
    /// Each certificate's range: the cabundle's, root first, then the leaf's.
    fn certificates(&self) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        self.cabundle
            .iter()
            .cloned()
            .chain([self.certificate.clone()])
    }
}

/// Flips each byte at `positions` of `f` in turn; each must fail with `want`.
fn assert_each_flip(f: &Fixture, positions: impl IntoIterator<Item = usize>, want: Failure) {
    let root = Root::aws();
    for at in positions {
        let kind = kind_of(&flipped(f.bytes, at), &root, At::DocumentTime);
        assert_eq!(kind, want, "{} byte {at}", f.file);
    }
}

fn layout(bytes: &[u8]) -> Layout {
    let sign1 = Sign1::parse(bytes).unwrap();
    let Cow::Borrowed(payload) = sign1.payload else {
        panic!("the payload is one chunk")
    };
    let parsed = Payload::parse(payload).unwrap();
    let borrowed = |c: &Cow<'_, [u8]>| match c {
        Cow::Borrowed(b) => range_in(bytes, b),
        Cow::Owned(_) => panic!("certificates are one chunk"),
    };
    Layout {
        payload: range_in(bytes, payload),
        signature: bytes.len() - 96..bytes.len(),
        certificate: borrowed(&parsed.certificate),
        cabundle: parsed.cabundle.iter().map(borrowed).collect(),
    }
}

/// A COSE_Sign1 built from its parts (definite lengths, untagged).
fn envelope(protected: &[u8], unprotected: &[u8], payload: &[u8], signature: &[u8]) -> Vec<u8> {
    let mut out = vec![0x84];
    cbor::encode_head(&mut out, 2, protected.len() as u64);
    out.extend_from_slice(protected);
    out.extend_from_slice(unprotected);
    cbor::encode_head(&mut out, 2, payload.len() as u64);
    out.extend_from_slice(payload);
    cbor::encode_head(&mut out, 2, signature.len() as u64);
    out.extend_from_slice(signature);
    out
}

fn parts(bytes: &[u8]) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let sign1 = Sign1::parse(bytes).unwrap();
    (
        sign1.protected.to_vec(),
        sign1.payload.to_vec(),
        sign1.signature.to_vec(),
    )
}

fn leaf_validity(bytes: &[u8]) -> (i64, i64) {
    let (_, payload, _) = parts(bytes);
    let parsed = Payload::parse(&payload).unwrap();
    let (_, leaf) = X509Certificate::from_der(&parsed.certificate).unwrap();
    (
        leaf.validity().not_before.timestamp(),
        leaf.validity().not_after.timestamp(),
    )
}

fn at_unix(seconds: i64) -> At {
    At::Instant(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds as u64))
}

#[test]
fn the_test_documents_are_the_files_their_provenance_names() {
    for f in &FIXTURES {
        assert_eq!(hex(&Sha256::digest(f.bytes)), f.sha256, "{}", f.file);
    }
    let provenance = include_str!("testdata/PROVENANCE.md");
    for f in &FIXTURES {
        assert!(provenance.contains(f.file), "{} is credited", f.file);
        assert!(
            provenance.contains(f.sha256),
            "{}'s digest is recorded",
            f.file
        );
    }
}

#[test]
fn the_compiled_in_root_is_aws_nitro_root_g1() {
    let root = Root::aws();
    assert_eq!(hex(&Sha256::digest(root.der())), AWS_ROOT_G1_SHA256);
    let (_, cert) = X509Certificate::from_der(root.der()).unwrap();
    assert_eq!(
        cert.subject().to_string(),
        "C=US, O=Amazon, OU=AWS, CN=aws.nitro-enclaves"
    );
}

#[test]
fn a_root_must_be_one_self_signed_p384_ca_certificate() {
    let pem = std::str::from_utf8(include_bytes!("aws-nitro-root-g1.pem")).unwrap();
    assert!(Root::from_pem(pem.as_bytes()).is_ok());
    let two = format!("{pem}\n{pem}\n");
    assert!(Root::from_pem(two.as_bytes()).is_err());
    assert!(Root::from_pem(b"").is_err());
    // A P-256 self-signed CA is not a Nitro root.
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let p256 = params.self_signed(&key).unwrap();
    let err = Root::from_pem(p256.pem().as_bytes()).unwrap_err();
    assert_eq!(err.kind(), Failure::Malformed);
    // AWS's root with its self-signature broken (the last byte of r or s).
    let mut broken = Root::aws().der().to_vec();
    *broken.last_mut().unwrap() ^= 0x01;
    assert!(Root::from_der(broken).is_err());
}

#[test]
fn every_real_document_verifies_at_its_own_timestamp() {
    let root = Root::aws();
    for f in &FIXTURES {
        let doc =
            verify(f.bytes, &root, At::DocumentTime).unwrap_or_else(|e| panic!("{}: {e}", f.file));
        assert_eq!(doc.module_id, f.module_id, "{}", f.file);
        assert_eq!(doc.kind, f.kind, "{}", f.file);
        assert_eq!(doc.timestamp_ms(), f.timestamp_ms, "{}", f.file);
        assert_eq!(doc.nonce.as_ref().map(Vec::len), f.nonce_len, "{}", f.file);
        assert_eq!(
            doc.user_data.as_ref().map(Vec::len),
            f.user_data_len,
            "{}",
            f.file
        );
        assert_eq!(
            doc.public_key.as_ref().map(Vec::len),
            f.public_key_len,
            "{}",
            f.file
        );
        let (pcr_count, instance_len) = match f.kind {
            Kind::NitroTpm => (24, f.module_id.len() - "-tpm0000000000000000".len()),
            Kind::Enclave => (16, f.module_id.len() - "-enc0000000000000000".len()),
        };
        assert_eq!(doc.pcrs.len(), pcr_count, "{}", f.file);
        assert_eq!(doc.instance_id(), Some(&f.module_id[..instance_len]));
        let (_, payload, _) = parts(f.bytes);
        assert_eq!(payload[0] == 0xbf, f.indefinite, "{}", f.file);
        // The same instant, given explicitly.
        let at = At::Instant(doc.timestamp);
        assert!(verify(f.bytes, &root, at).is_ok(), "{}", f.file);
    }
}

#[test]
fn nitrotpm_documents_carry_the_tpms_reset_values() {
    // PCR17-22 read all-ones on every NitroTPM seen; a parser that misplaced
    // map entries would not find them there.
    for f in FIXTURES.iter().filter(|f| f.kind == Kind::NitroTpm) {
        let doc = verify(f.bytes, &Root::aws(), At::DocumentTime).unwrap();
        for index in 17..=22 {
            assert_eq!(doc.pcrs[&index], [0xff; 48], "{} PCR{index}", f.file);
        }
        assert_eq!(doc.pcrs[&23], [0; 48], "{}", f.file);
    }
}

#[test]
fn outside_the_certificates_validity_is_expired() {
    let root = Root::aws();
    for f in &FIXTURES {
        let (not_before, not_after) = leaf_validity(f.bytes);
        let now = At::Instant(SystemTime::now());
        assert_eq!(kind_of(f.bytes, &root, now), Failure::Expired, "{}", f.file);
        assert_eq!(
            kind_of(f.bytes, &root, at_unix(not_after + 1)),
            Failure::Expired,
            "{}",
            f.file
        );
        assert_eq!(
            kind_of(f.bytes, &root, at_unix(not_before - 10)),
            Failure::Expired,
            "{}",
            f.file
        );
        // The edges themselves are inside.
        assert!(
            verify(f.bytes, &root, at_unix(not_after)).is_ok(),
            "{}",
            f.file
        );
        assert!(
            verify(f.bytes, &root, at_unix(not_before)).is_ok(),
            "{}",
            f.file
        );
    }
}

/// A P-384 root with AWS's exact subject name: what a forger would make.
fn impostor_root_pem() -> String {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::CountryName, "US");
    name.push(rcgen::DnType::OrganizationName, "Amazon");
    name.push(rcgen::DnType::OrganizationalUnitName, "AWS");
    name.push(rcgen::DnType::CommonName, "aws.nitro-enclaves");
    params.distinguished_name = name;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    params.self_signed(&key).unwrap().pem()
}

#[test]
fn against_another_root_every_document_is_untrusted() {
    let impostor = Root::from_pem(impostor_root_pem().as_bytes()).unwrap();
    for f in &FIXTURES {
        let err = verify(f.bytes, &impostor, At::DocumentTime).unwrap_err();
        assert_eq!(err, NitroError::NotPinnedRoot, "{}", f.file);
        assert_eq!(err.kind(), Failure::Untrusted);
    }
}

fn flipped(bytes: &[u8], at: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out[at] ^= 0x01;
    out
}

/// A stride through `range` starting at `offset % every`: each document
/// gets another offset, so together they reach different residues. Every
/// verification costs six P-384 signature checks, so flipping every byte of
/// every document (~55,000) would take minutes; the strides keep each test
/// to a few hundred verifications, and the bytes no signature covers are
/// flipped one by one (see below).
fn positions(
    range: std::ops::Range<usize>,
    every: usize,
    offset: usize,
) -> impl Iterator<Item = usize> {
    let start = range.start + offset % every;
    (start..range.end).step_by(every)
}

/// The stride for a document: denser on the NitroTPM ones, which are what
/// autonode verifies.
fn stride(f: &Fixture, nitrotpm: usize, enclave: usize) -> usize {
    match f.kind {
        Kind::NitroTpm => nitrotpm,
        Kind::Enclave => enclave,
    }
}

#[test]
fn a_flipped_signature_byte_fails_the_signature() {
    for (n, f) in FIXTURES.iter().enumerate() {
        let signature = layout(f.bytes).signature;
        assert_each_flip(
            f,
            positions(signature, stride(f, 1, 7), n),
            Failure::Signature,
        );
    }
}

#[test]
fn a_flipped_certificate_byte_makes_the_chain_untrusted() {
    for (n, f) in FIXTURES.iter().enumerate() {
        for range in layout(f.bytes).certificates() {
            assert_each_flip(
                f,
                positions(range, stride(f, 13, 59), n),
                Failure::Untrusted,
            );
        }
    }
}

#[test]
fn every_byte_no_certificate_signature_covers_is_checked() {
    // The outer header, signature algorithm and signature of each
    // certificate are outside what its issuer signed: flip each one.
    for f in FIXTURES.iter().filter(|f| f.kind == Kind::NitroTpm) {
        for range in layout(f.bytes).certificates() {
            let der = &f.bytes[range.clone()];
            let (_, cert) = X509Certificate::from_der(der).unwrap();
            let tbs = range_in(der, cert.tbs_certificate.as_ref());
            let unsigned = (0..tbs.start).chain(tbs.end..der.len());
            assert_each_flip(f, unsigned.map(|i| range.start + i), Failure::Untrusted);
        }
    }
}

#[test]
fn a_flipped_payload_byte_is_refused() {
    let root = Root::aws();
    for (n, f) in FIXTURES.iter().enumerate() {
        let layout = layout(f.bytes);
        let in_a_certificate = |at: usize| {
            layout.certificate.contains(&at) || layout.cabundle.iter().any(|r| r.contains(&at))
        };
        let mut signature_failures = 0;
        for at in positions(layout.payload.clone(), stride(f, 11, 97), n) {
            let kind = kind_of(&flipped(f.bytes, at), &root, At::DocumentTime);
            if in_a_certificate(at) {
                assert_eq!(kind, Failure::Untrusted, "{} byte {at}", f.file);
            } else {
                // Structure bytes break the shape; value bytes the signature.
                assert!(
                    matches!(kind, Failure::Malformed | Failure::Signature),
                    "{} byte {at}: {kind:?}",
                    f.file
                );
                signature_failures += usize::from(kind == Failure::Signature);
            }
        }
        assert!(signature_failures > 0, "{}", f.file);
    }
}

#[test]
fn every_byte_of_the_nitrotpm_fields_autonode_reads_is_signed() {
    // module_id, nonce, public_key and every PCR of a NitroTPM document:
    // each byte flipped fails the signature (and nothing else).
    for f in FIXTURES.iter().filter(|f| f.kind == Kind::NitroTpm) {
        let (_, payload, _) = parts(f.bytes);
        let payload_at = range_in(f.bytes, &Sign1::parse(f.bytes).unwrap().payload).start;
        let value = cbor::decode(&payload).unwrap();
        let mut ranges = Vec::new();
        for (key, field) in value.as_map().unwrap() {
            match (key.as_text().unwrap(), field) {
                ("module_id", Value::Text(t)) => ranges.push(range_in(&payload, t.as_bytes())),
                ("nonce" | "public_key", Value::Bytes(b)) => ranges.push(range_in(&payload, b)),
                ("nitrotpm_pcrs", Value::Map(pcrs)) => {
                    for (_, pcr) in pcrs {
                        ranges.push(range_in(&payload, pcr.as_bytes().unwrap()));
                    }
                }
                _ => {}
            }
        }
        // Every third byte of each field.
        let bytes = ranges.into_iter().flat_map(|r| positions(r, 3, 0));
        assert_each_flip(f, bytes.map(|at| payload_at + at), Failure::Signature);
    }
}

const ES384: &[u8] = &super::cose::PROTECTED_ES384;

#[test]
fn the_envelope_must_be_exactly_what_aws_sends() {
    let root = Root::aws();
    for f in &FIXTURES {
        let (protected, payload, signature) = parts(f.bytes);
        assert_eq!(protected, ES384, "{}", f.file);
        // Rebuilt from its parts, the document is the same bytes.
        assert_eq!(envelope(&protected, &[0xa0], &payload, &signature), f.bytes);
        let es256 = envelope(&[0xa1, 0x01, 0x26], &[0xa0], &payload, &signature);
        assert_eq!(kind_of(&es256, &root, At::DocumentTime), Failure::Malformed);
        // Unsigned bytes in the unprotected header: refused although the
        // signature would still verify.
        let kid = envelope(&protected, &[0xa1, 0x04, 0x41, 0x00], &payload, &signature);
        assert_eq!(kind_of(&kid, &root, At::DocumentTime), Failure::Malformed);
        let mut trailing = f.bytes.to_vec();
        trailing.push(0x00);
        assert_eq!(
            kind_of(&trailing, &root, At::DocumentTime),
            Failure::Malformed
        );
        let short = &f.bytes[..f.bytes.len() - 1];
        assert_eq!(kind_of(short, &root, At::DocumentTime), Failure::Malformed);
        let mut tagged = vec![0xd2];
        tagged.extend_from_slice(f.bytes);
        assert!(
            verify(&tagged, &root, At::DocumentTime).is_ok(),
            "{}",
            f.file
        );
    }
}

#[test]
fn a_duplicate_key_is_refused_before_the_signature() {
    let root = Root::aws();
    for f in &FIXTURES {
        let (protected, payload, signature) = parts(f.bytes);
        // A second "nonce": null, added at the end of the payload map.
        let extra = [&[0x65][..], b"nonce", &[0xf6]].concat();
        let mut doubled = payload.clone();
        if f.indefinite {
            doubled.pop();
            doubled.extend_from_slice(&extra);
            doubled.push(0xff);
        } else {
            assert_eq!(doubled[0], 0xa9, "{}", f.file);
            doubled[0] = 0xaa;
            doubled.extend_from_slice(&extra);
        }
        let doc = envelope(&protected, &[0xa0], &doubled, &signature);
        let err = verify(&doc, &root, At::DocumentTime).unwrap_err();
        assert!(
            matches!(
                err,
                NitroError::Cbor {
                    source: cbor::CborError::DuplicateKey(_),
                    ..
                }
            ),
            "{}: {err}",
            f.file
        );
    }
}

#[test]
fn the_signature_covers_the_payload_as_sent_not_a_re_encoding() {
    let root = Root::aws();
    for f in &FIXTURES {
        let (protected, payload, signature) = parts(f.bytes);
        let value: ciborium::Value = ciborium::from_reader(&payload[..]).unwrap();
        let mut definite = Vec::new();
        ciborium::into_writer(&value, &mut definite).unwrap();
        let doc = envelope(&protected, &[0xa0], &definite, &signature);
        if f.indefinite {
            // The same content, other bytes: the signature no longer holds.
            assert_ne!(definite, payload, "{}", f.file);
            assert_eq!(
                kind_of(&doc, &root, At::DocumentTime),
                Failure::Signature,
                "{}",
                f.file
            );
        } else {
            assert_eq!(definite, payload, "{}", f.file);
            assert!(verify(&doc, &root, At::DocumentTime).is_ok(), "{}", f.file);
        }
    }
}

#[test]
fn too_large_is_refused_before_parsing() {
    let big = vec![0u8; MAX_DOCUMENT_BYTES + 1];
    let err = verify(&big, &Root::aws(), At::DocumentTime).unwrap_err();
    assert_eq!(err, NitroError::TooLarge(MAX_DOCUMENT_BYTES + 1));
    assert!(FIXTURES.iter().all(|f| f.bytes.len() <= MAX_DOCUMENT_BYTES));
}

/// Our reader's value as ciborium's, to compare the two decoders.
fn to_ciborium(value: &Value<'_>) -> ciborium::Value {
    use ciborium::Value as C;
    match value {
        Value::Uint(n) => C::Integer((*n).into()),
        Value::Neg(n) => C::Integer((-1 - i128::from(*n)).try_into().unwrap()),
        Value::Bytes(b) => C::Bytes(b.to_vec()),
        Value::Text(t) => C::Text(t.to_string()),
        Value::Array(items) => C::Array(items.iter().map(to_ciborium).collect()),
        Value::Map(entries) => C::Map(
            entries
                .iter()
                .map(|(k, v)| (to_ciborium(k), to_ciborium(v)))
                .collect(),
        ),
        Value::Tag(tag, inner) => C::Tag(*tag, Box::new(to_ciborium(inner))),
        Value::Bool(b) => C::Bool(*b),
        Value::Null => C::Null,
        Value::Undefined => unreachable!("no undefined in a document"),
    }
}

#[test]
fn our_reader_and_ciborium_decode_each_real_document_alike() {
    for f in &FIXTURES {
        let ours = cbor::decode(f.bytes).unwrap();
        let theirs: ciborium::Value = ciborium::from_reader(f.bytes).unwrap();
        assert_eq!(to_ciborium(&ours), theirs, "{}", f.file);
        let (protected, payload, _) = parts(f.bytes);
        for inner in [&protected, &payload] {
            let ours = cbor::decode(inner).unwrap();
            let theirs: ciborium::Value = ciborium::from_reader(&inner[..]).unwrap();
            assert_eq!(to_ciborium(&ours), theirs, "{}", f.file);
        }
    }
}

/// A payload map as ciborium holds it, for editing.
type Entries = Vec<(ciborium::Value, ciborium::Value)>;

#[test]
fn payload_rules_refuse_what_aws_never_sends() {
    let (_, payload, _) = parts(FIXTURES[1].bytes);
    let value: ciborium::Value = ciborium::from_reader(&payload[..]).unwrap();
    let ciborium::Value::Map(entries) = value else {
        panic!()
    };
    let with = |edit: &dyn Fn(&mut Entries)| {
        let mut entries = entries.clone();
        edit(&mut entries);
        let mut out = Vec::new();
        ciborium::into_writer(&ciborium::Value::Map(entries), &mut out).unwrap();
        Payload::parse(&out).map(|_| ()).map_err(|e| e.to_string())
    };
    let set = |key: &'static str, v: ciborium::Value| {
        move |e: &mut Entries| {
            for (k, old) in e.iter_mut() {
                if k.as_text() == Some(key) {
                    *old = v.clone();
                }
            }
        }
    };
    use ciborium::Value as C;
    assert!(with(&|_| {}).is_ok());
    for (what, result) in [
        (
            "digest SHA256",
            with(&set("digest", C::Text("SHA256".into()))),
        ),
        ("timestamp 0", with(&set("timestamp", C::Integer(0.into())))),
        (
            "module_id bytes",
            with(&set("module_id", C::Bytes(b"i-0".to_vec()))),
        ),
        (
            "empty module_id",
            with(&set("module_id", C::Text(String::new()))),
        ),
        ("nonce 1025", with(&set("nonce", C::Bytes(vec![0; 1025])))),
        ("nonce text", with(&set("nonce", C::Text("x".into())))),
        (
            "public_key empty",
            with(&set("public_key", C::Bytes(Vec::new()))),
        ),
        (
            "empty cabundle",
            with(&set("cabundle", C::Array(Vec::new()))),
        ),
        (
            "pcr 24",
            with(&set(
                "nitrotpm_pcrs",
                C::Map(vec![(C::Integer(24.into()), C::Bytes(vec![0; 48]))]),
            )),
        ),
        (
            "pcr 47 bytes",
            with(&set(
                "nitrotpm_pcrs",
                C::Map(vec![(C::Integer(0.into()), C::Bytes(vec![0; 47]))]),
            )),
        ),
        (
            "both pcr maps",
            with(&|e| {
                e.push((
                    C::Text("pcrs".into()),
                    C::Map(vec![(C::Integer(0.into()), C::Bytes(vec![0; 48]))]),
                ))
            }),
        ),
        (
            "no pcr map",
            with(&|e| e.retain(|(k, _)| k.as_text() != Some("nitrotpm_pcrs"))),
        ),
        (
            "unknown key",
            with(&|e| e.push((C::Text("extra".into()), C::Null))),
        ),
        (
            "integer key",
            with(&|e| e.push((C::Integer(1.into()), C::Null))),
        ),
        (
            "no certificate",
            with(&|e| e.retain(|(k, _)| k.as_text() != Some("certificate"))),
        ),
    ] {
        assert!(result.is_err(), "{what} accepted");
    }
    // Absent optional fields are accepted like null ones.
    assert!(with(&|e| e.retain(|(k, _)| k.as_text() != Some("user_data"))).is_ok());
    // An enclave's map may reach index 31; a NitroTPM's stops at 23.
    let enclave = with(&|e| {
        e.retain(|(k, _)| k.as_text() != Some("nitrotpm_pcrs"));
        e.push((
            C::Text("pcrs".into()),
            C::Map(vec![(C::Integer(31.into()), C::Bytes(vec![0; 48]))]),
        ));
    });
    assert!(enclave.is_ok());
}

#[test]
fn random_mutations_never_panic_and_never_verify() {
    use rand::{Rng as _, SeedableRng as _};
    // A fixed seed: the same inputs every run, so a failure reproduces.
    let mut rng = rand::rngs::StdRng::seed_from_u64(50);
    let root = Root::aws();
    for f in &FIXTURES {
        for round in 0..2000 {
            let mut bytes = f.bytes.to_vec();
            for _ in 0..rng.gen_range(1..=4) {
                let at = rng.gen_range(0..bytes.len());
                match rng.gen_range(0..4) {
                    0 => bytes[at] = rng.gen(),
                    1 => bytes.truncate(at.max(1)),
                    2 => bytes.insert(at, rng.gen()),
                    _ => {
                        bytes.remove(at);
                    }
                }
            }
            // The parsers alone on every input (cheap), the whole verifier
            // on some (each costs five signature checks when it gets far).
            if let Ok(sign1) = Sign1::parse(&bytes) {
                let _ = Payload::parse(&sign1.payload);
            }
            if round % 100 == 0 && bytes != f.bytes {
                assert!(
                    verify(&bytes, &root, At::DocumentTime).is_err(),
                    "{}",
                    f.file
                );
            }
        }
    }
}
