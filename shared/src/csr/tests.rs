use super::parse::{bit_length, check_signature_algorithm, single_pem_block};
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
use sha2::{Digest, Sha256};
use std::fmt;
use std::net::IpAddr;
use std::net::{Ipv4Addr, Ipv6Addr};
use x509_parser::oid_registry as oids;

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
    let pem =
        "-----BEGIN CERTIFICATE REQUEST-----\nbm90IGEgY3Ny\n-----END CERTIFICATE REQUEST-----\n";
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
