//! The verifier's behaviour on real AWS signatures, forgeries and every
//! refusal. Helpers are in `testutil.rs`.

use super::aws_certs::AWS_RSA2048;
use super::testutil::*;
use super::*;
use time::macros::datetime;
use time::Duration;

fn aws() -> TrustStore {
    TrustStore::aws()
}

fn err(input: &[u8], trust: &TrustStore) -> IdentityError {
    verify(input, trust).unwrap_err()
}

/// A store trusting only the test CA, for any region.
fn test_ca_store() -> TrustStore {
    let mut store = TrustStore::empty();
    store.add_pem(Scope::AnyRegion, &test_ca().pem).unwrap();
    store
}

fn now_doc(region: &str) -> Vec<u8> {
    doc(region, "123456789012", datetime!(2026-01-01 12:00 UTC))
}

// ---- real AWS samples ----------------------------------------------------

#[test]
fn every_real_sample_parses_as_served() {
    for text in [SAMPLE_B64, SAMPLE_PEM] {
        let parsed = ParsedSignature::from_text(text.as_bytes()).unwrap();
        assert_eq!(parsed.content(), SAMPLE_DOC.as_bytes());
    }
}

#[test]
fn real_sample_verifies_with_us_west_2() {
    for text in [SAMPLE_B64, SAMPLE_PEM] {
        let verified = verify(text.as_bytes(), &aws()).unwrap();
        assert_eq!(verified.content_bytes(), SAMPLE_DOC.as_bytes());
        let d = verified.document();
        assert_eq!(d.account_id, "278576220453");
        assert_eq!(d.region, "us-west-2");
        assert_eq!(d.availability_zone, "us-west-2a");
        assert_eq!(d.instance_id, "i-078517ca8a70a1dde");
        assert_eq!(d.image_id, "ami-0fa9e1f64142cde17");
        assert_eq!(d.instance_type, "t2.medium");
        assert_eq!(d.architecture, "x86_64");
        assert_eq!(d.version, "2017-09-30");
        assert_eq!(d.pending_time, sample_pending_time());
        assert_eq!(d.private_ip, Some("10.0.0.209".parse().unwrap()));
        assert_eq!(d.kernel_id, None);
    }
}

#[test]
fn real_sample_verifies_with_only_us_west_2_pinned() {
    let mut store = TrustStore::empty();
    store
        .add_pem(Scope::Region("us-west-2".into()), US_WEST_2_PEM)
        .unwrap();
    assert!(verify(SAMPLE_B64.as_bytes(), &store).is_ok());
}

/// For each other region X: a store holding only X's certificate, looked up
/// for us-west-2, refuses the sample (signer is not X's certificate), and
/// X's key itself does not verify the signature, while us-west-2's does.
#[test]
fn real_sample_is_refused_with_each_of_the_other_38_certificates() {
    let parsed = ParsedSignature::from_text(SAMPLE_B64.as_bytes()).unwrap();
    let (attrs, sig) = (parsed.signed_attrs_der(), parsed.signature());
    assert!(trust::verify_with_aws_key("us-west-2", attrs, sig));
    let mut others = 0;
    for (region, pem) in AWS_RSA2048.iter().filter(|(r, _)| *r != "us-west-2") {
        let mut store = TrustStore::empty();
        store
            .add_pem(Scope::Region("us-west-2".into()), pem)
            .unwrap();
        assert_eq!(
            err(SAMPLE_B64.as_bytes(), &store),
            IdentityError::SignerNotPinned("us-west-2".into()),
            "{region}"
        );
        assert!(!trust::verify_with_aws_key(region, attrs, sig), "{region}");
        others += 1;
    }
    assert_eq!(others, 38);
}

#[test]
fn real_sample_with_another_regions_store_has_no_pinned_cert() {
    let mut store = TrustStore::empty();
    let (_, pem) = AWS_RSA2048.iter().find(|(r, _)| *r == "us-east-1").unwrap();
    store
        .add_pem(Scope::Region("us-east-1".into()), pem)
        .unwrap();
    assert_eq!(
        err(SAMPLE_B64.as_bytes(), &store),
        IdentityError::NoPinnedCertificate("us-west-2".into())
    );
}

#[test]
fn real_sample_with_one_content_byte_changed_is_refused() {
    let mut ber = sample_ber();
    let at = ber
        .windows(19)
        .position(|w| w == b"i-078517ca8a70a1dde")
        .unwrap();
    ber[at + 18] = b'f';
    assert_eq!(
        err(b64_lines(&ber).as_bytes(), &aws()),
        IdentityError::MessageDigestMismatch
    );
}

#[test]
fn real_sample_with_signature_byte_changed_is_refused() {
    let mut ber = sample_ber();
    let last_sig_byte = ber.len() - 7; // before the three EOC pairs
    ber[last_sig_byte] ^= 1;
    assert_eq!(
        err(b64_lines(&ber).as_bytes(), &aws()),
        IdentityError::BadSignature("us-west-2".into())
    );
}

#[test]
fn truncated_signatures_are_refused_without_panicking() {
    let ber = sample_ber();
    for len in 0..ber.len() {
        assert!(ParsedSignature::from_ber(&ber[..len]).is_err(), "{len}");
    }
    let text = SAMPLE_B64.trim();
    let cut = &text[..text.len() / 2];
    let e = err(cut.as_bytes(), &aws());
    assert!(
        matches!(e, IdentityError::NotBase64(_) | IdentityError::NotCms(_)),
        "{e:?}"
    );
    let cut_on_quantum = &text[..1000];
    assert!(matches!(
        err(cut_on_quantum.as_bytes(), &aws()),
        IdentityError::NotCms(_)
    ));
}

#[test]
fn trailing_bytes_are_refused() {
    let mut ber = sample_ber();
    ber.push(0);
    assert!(matches!(
        err(b64_lines(&ber).as_bytes(), &aws()),
        IdentityError::NotCms(_)
    ));
}

#[test]
fn garbage_is_refused() {
    assert!(matches!(
        err(b"hello, world!", &aws()),
        IdentityError::NotBase64(_)
    ));
    assert!(matches!(
        err(&[0xff, 0xfe, 0x00], &aws()),
        IdentityError::NotBase64(_)
    ));
    let random_ish: Vec<u8> = (0..600u32).map(|i| (i * 7919 % 251) as u8).collect();
    assert!(matches!(
        err(b64_lines(&random_ish).as_bytes(), &aws()),
        IdentityError::NotCms(_)
    ));
    assert!(matches!(
        err(
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            &aws()
        ),
        IdentityError::NotBase64(_)
    ));
}

#[test]
fn empty_input_is_refused() {
    assert_eq!(err(b"", &aws()), IdentityError::Empty);
    assert_eq!(err(b" \n\t\n", &aws()), IdentityError::Empty);
}

// ---- the other IMDS forms --------------------------------------------------

#[test]
fn dsa_pkcs7_form_is_refused_by_name() {
    assert_eq!(
        err(DSA_PKCS7_B64.as_bytes(), &aws()),
        IdentityError::DsaPkcs7Form
    );
    let mut signer = Signer::aws_shaped(&test_ca().cert);
    signer.digest = oids::SHA1;
    let sig = signer.sign_b64(&now_doc("us-west-2"));
    assert_eq!(err(sig.as_bytes(), &aws()), IdentityError::DsaPkcs7Form);
}

#[test]
fn rsa1024_signature_form_is_refused_by_name() {
    assert_eq!(
        err(RSA1024_SIGNATURE_B64.as_bytes(), &aws()),
        IdentityError::Rsa1024SignatureForm
    );
}

// ---- forgeries ---------------------------------------------------------------

/// A self-made certificate with AWS's us-west-2 subject, issuer and serial,
/// carried in the signature: refused outright; and without carrying it, the
/// pinned key (not the forger's) is used, so the signature fails.
#[test]
fn self_made_cert_with_aws_name_is_refused() {
    let forged = forged_us_west_2_cert();
    let content = SAMPLE_DOC.as_bytes();
    let mut signer = Signer::aws_shaped(&forged);
    signer.signature_alg = oids::SHA256_WITH_RSA;
    signer.certificates = Some(vec![forged.clone()]);
    assert_eq!(
        err(signer.sign_b64(content).as_bytes(), &aws()),
        IdentityError::CarriesCertificates
    );
    signer.certificates = None;
    assert_eq!(
        err(signer.sign_b64(content).as_bytes(), &aws()),
        IdentityError::BadSignature("us-west-2".into())
    );
}

#[test]
fn self_made_cert_with_aws_name_but_other_serial_is_not_pinned() {
    let mut forged = forged_us_west_2_cert();
    forged.tbs_certificate.serial_number = rasn::types::Integer::from(42);
    let signer = Signer::aws_shaped(&forged);
    assert_eq!(
        err(signer.sign_b64(SAMPLE_DOC.as_bytes()).as_bytes(), &aws()),
        IdentityError::SignerNotPinned("us-west-2".into())
    );
}

// ---- an operator's CA (the fake cloud's path) --------------------------------

#[test]
fn operator_ca_signature_verifies_for_any_region() {
    let signer = Signer::aws_shaped(&test_ca().cert);
    let mut store = TrustStore::aws();
    store.add_pem(Scope::AnyRegion, &test_ca().pem).unwrap();
    for region in ["us-east-1", "eu-west-3", "xx-test-1"] {
        let content = now_doc(region);
        let verified = verify(signer.sign_b64(&content).as_bytes(), &store).unwrap();
        assert_eq!(verified.content_bytes(), content.as_slice());
        assert_eq!(verified.document().region, region);
        assert_eq!(verified.document().availability_zone, format!("{region}a"));
    }
    // AWS's own still verifies beside it.
    assert!(verify(SAMPLE_B64.as_bytes(), &store).is_ok());
}

#[test]
fn operator_ca_also_verifies_der_pem_armoured_and_sha256_with_rsa() {
    let mut signer = Signer::aws_shaped(&test_ca().cert);
    signer.signature_alg = oids::SHA256_WITH_RSA;
    let der = signer.sign(&now_doc("us-east-1"));
    let pem = format!(
        "-----BEGIN PKCS7-----\n{}\n-----END PKCS7-----\n",
        b64_lines(&der)
    );
    assert!(verify(pem.as_bytes(), &test_ca_store()).is_ok());
    let parsed = ParsedSignature::from_ber(&der).unwrap();
    assert!(verify_parsed(parsed, &test_ca_store()).is_ok());
}

#[test]
fn operator_ca_scoped_to_a_region_covers_only_that_region() {
    let signer = Signer::aws_shaped(&test_ca().cert);
    let mut store = TrustStore::empty();
    store
        .add_pem(Scope::Region("us-east-1".into()), &test_ca().pem)
        .unwrap();
    assert!(verify(signer.sign_b64(&now_doc("us-east-1")).as_bytes(), &store).is_ok());
    assert_eq!(
        err(signer.sign_b64(&now_doc("us-east-2")).as_bytes(), &store),
        IdentityError::NoPinnedCertificate("us-east-2".into())
    );
}

#[test]
fn valid_signature_for_a_region_without_pinned_cert_is_refused() {
    let signer = Signer::aws_shaped(&test_ca().cert);
    let sig = signer.sign_b64(&now_doc("xx-nowhere-1"));
    assert_eq!(
        err(sig.as_bytes(), &aws()),
        IdentityError::NoPinnedCertificate("xx-nowhere-1".into())
    );
}

#[test]
fn operator_certs_load_from_a_directory_by_file_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("us-east-1.pem"), &test_ca().pem).unwrap();
    std::fs::create_dir(dir.path().join("..data")).unwrap();
    let mut store = TrustStore::empty();
    assert_eq!(store.load_dir(dir.path()).unwrap(), 1);
    let signer = Signer::aws_shaped(&test_ca().cert);
    assert!(verify(signer.sign_b64(&now_doc("us-east-1")).as_bytes(), &store).is_ok());

    std::fs::write(dir.path().join("ca.pem"), &test_ca().pem).unwrap();
    let e = TrustStore::empty().load_dir(dir.path()).unwrap_err();
    assert!(matches!(e, TrustError::FileName(_)), "{e}");
}

#[test]
fn any_pem_file_is_trusted_for_every_region() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("any.pem");
    std::fs::write(&path, &test_ca().pem).unwrap();
    let mut store = TrustStore::empty();
    assert_eq!(store.load_file(&path).unwrap(), 1);
    let signer = Signer::aws_shaped(&test_ca().cert);
    assert!(verify(signer.sign_b64(&now_doc("ap-east-2")).as_bytes(), &store).is_ok());
}

// ---- shape refusals ---------------------------------------------------------

/// One change to an otherwise AWS-shaped signature.
type Change = Box<dyn FnOnce(&mut Signer)>;

fn shaped_err(change: Change) -> IdentityError {
    let mut signer = Signer::aws_shaped(&test_ca().cert);
    change(&mut signer);
    err(
        signer.sign_b64(&now_doc("us-east-1")).as_bytes(),
        &test_ca_store(),
    )
}

#[test]
fn shape_refusals_each_have_their_variant() {
    use IdentityError as E;
    let sha512 = rasn::types::Oid::const_new(&[2, 16, 840, 1, 101, 3, 4, 2, 3]);
    let ecdsa = rasn::types::Oid::const_new(&[1, 2, 840, 10045, 4, 3, 2]);
    let cases: Vec<(Change, E)> = vec![
        (Box::new(|s| s.detached = true), E::NoContent),
        (Box::new(|s| s.signers = 2), E::SignerCount(2)),
        (Box::new(|s| s.signers = 0), E::SignerCount(0)),
        (
            Box::new(move |s| s.digest = sha512),
            E::UnsupportedDigest(sha512.to_string()),
        ),
        (
            Box::new(move |s| s.signature_alg = ecdsa),
            E::UnsupportedSignatureAlgorithm(ecdsa.to_string()),
        ),
        (
            Box::new(|s| s.content_type_attr = None),
            E::BadContentTypeAttribute,
        ),
        (
            Box::new(|s| s.content_type_attr = Some(oids::SIGNED_DATA)),
            E::ContentTypeAttributeMismatch(oids::SIGNED_DATA.to_string()),
        ),
        (
            Box::new(|s| s.with_digest_attr = false),
            E::BadMessageDigestAttribute,
        ),
        (
            Box::new(|s| s.certificates = Some(vec![test_ca().cert.clone()])),
            E::CarriesCertificates,
        ),
    ];
    for (change, want) in cases {
        assert_eq!(shaped_err(change), want);
    }
}

#[test]
fn content_that_is_not_a_document_is_refused_after_verification() {
    let signer = Signer::aws_shaped(&test_ca().cert);
    let no_region = signer.sign_b64(br#"{"accountId":"1"}"#);
    assert!(matches!(
        err(no_region.as_bytes(), &test_ca_store()),
        IdentityError::NoRegion(_)
    ));
    let partial = signer.sign_b64(br#"{"region":"us-east-1"}"#);
    assert!(matches!(
        err(partial.as_bytes(), &test_ca_store()),
        IdentityError::BadDocument(_)
    ));
}

#[test]
fn every_refusal_has_its_own_label_and_message() {
    use IdentityError as E;
    let all = [
        E::Empty,
        E::NotBase64(String::new()),
        E::Rsa1024SignatureForm,
        E::NotCms(String::new()),
        E::NotSignedData(String::new()),
        E::DsaPkcs7Form,
        E::CarriesCertificates,
        E::CarriesRevocationInfo,
        E::ContentNotData(String::new()),
        E::NoContent,
        E::SignerCount(0),
        E::SignerNotIssuerSerial,
        E::UnsupportedDigest(String::new()),
        E::UnsupportedSignatureAlgorithm(String::new()),
        E::UnexpectedAlgorithmParameters(String::new()),
        E::NoSignedAttributes,
        E::BadContentTypeAttribute,
        E::ContentTypeAttributeMismatch(String::new()),
        E::BadMessageDigestAttribute,
        E::MessageDigestMismatch,
        E::NoRegion(String::new()),
        E::NoPinnedCertificate(String::new()),
        E::SignerNotPinned(String::new()),
        E::BadSignature(String::new()),
        E::BadDocument(String::new()),
    ];
    let labels: std::collections::BTreeSet<_> = all.iter().map(E::label).collect();
    let messages: std::collections::BTreeSet<_> = all.iter().map(E::to_string).collect();
    assert_eq!(labels.len(), all.len());
    assert_eq!(messages.len(), all.len());
}

// ---- trust store ---------------------------------------------------------------

#[test]
fn all_39_aws_certificates_are_embedded_and_parse() {
    assert_eq!(AWS_RSA2048.len(), 39);
    assert_eq!(trust::aws_anchor_count(), 39);
    assert_eq!(TrustStore::aws().len(), 39);
    assert!(TrustStore::empty().is_empty());
}

#[test]
fn scope_comes_from_the_file_name() {
    let region = |r: &str| Some(Scope::Region(r.into()));
    assert_eq!(Scope::from_file_name("us-west-2.pem"), region("us-west-2"));
    assert_eq!(
        Scope::from_file_name("eusc-de-east-1.pem"),
        region("eusc-de-east-1")
    );
    assert_eq!(Scope::from_file_name("any.pem"), Some(Scope::AnyRegion));
    for bad in [
        "ca.pem",
        "us-west-2.crt",
        "US-WEST-2.pem",
        "us-west-x.pem",
        "-.pem",
        "a--1.pem",
    ] {
        assert_eq!(Scope::from_file_name(bad), None, "{bad}");
    }
}

#[test]
fn add_pem_refuses_what_is_not_an_rsa_2048_certificate() {
    let mut store = TrustStore::empty();
    let refuse =
        |store: &mut TrustStore, pem: &str| store.add_pem(Scope::AnyRegion, pem).unwrap_err();
    assert!(matches!(
        refuse(&mut store, "no pem here"),
        TrustError::Pem { .. }
    ));
    let key_block = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
    assert!(matches!(
        refuse(&mut store, key_block),
        TrustError::Pem { .. }
    ));
    let not_cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    assert!(matches!(
        refuse(&mut store, not_cert),
        TrustError::Certificate { .. }
    ));
    let ec = rcgen::generate_simple_self_signed(vec!["x".into()]).unwrap();
    assert!(matches!(
        refuse(&mut store, &ec.cert.pem()),
        TrustError::Key { .. }
    ));
    assert!(store.is_empty());
}

// ---- policy -------------------------------------------------------------------

fn sample_doc() -> IdentityDocument {
    verify(SAMPLE_B64.as_bytes(), &aws())
        .unwrap()
        .into_document()
}

fn sample_policy() -> Policy {
    Policy::new(["278576220453"], ["us-west-2"])
}

#[test]
fn policy_accepts_inside_the_window() {
    let doc = sample_doc();
    let pending = sample_pending_time();
    for now in [
        pending,
        pending + Duration::minutes(15),
        pending - Duration::minutes(5),
    ] {
        assert_eq!(sample_policy().check(&doc, now), Ok(()), "{now}");
    }
}

#[test]
fn policy_refuses_a_document_older_than_the_window() {
    let now = sample_pending_time() + DEFAULT_MAX_AGE + Duration::seconds(1);
    let e = sample_policy().check(&sample_doc(), now).unwrap_err();
    assert!(
        matches!(e, PolicyError::TooOld { max_age_s: 900, .. }),
        "{e}"
    );
    let mut longer = sample_policy();
    longer.max_age = Duration::hours(1);
    assert_eq!(longer.check(&sample_doc(), now), Ok(()));
}

#[test]
fn policy_refuses_a_document_from_the_future() {
    let now = sample_pending_time() - DEFAULT_CLOCK_SKEW - Duration::seconds(1);
    let e = sample_policy().check(&sample_doc(), now).unwrap_err();
    assert!(
        matches!(e, PolicyError::PendingTimeInFuture { skew_s: 300, .. }),
        "{e}"
    );
    let mut strict = sample_policy();
    strict.clock_skew = Duration::ZERO;
    let just_before = sample_pending_time() - Duration::seconds(1);
    assert!(strict.check(&sample_doc(), just_before).is_err());
}

#[test]
fn policy_refuses_an_account_not_allowed() {
    let policy = Policy::new(["111111111111"], ["us-west-2"]);
    assert_eq!(
        policy.check(&sample_doc(), sample_pending_time()),
        Err(PolicyError::AccountNotAllowed("278576220453".into()))
    );
}

#[test]
fn policy_refuses_a_region_not_allowed() {
    let policy = Policy::new(["278576220453"], ["us-east-1", "eu-west-1"]);
    assert_eq!(
        policy.check(&sample_doc(), sample_pending_time()),
        Err(PolicyError::RegionNotAllowed("us-west-2".into()))
    );
}

/// The origin check is the allow-lists alone: a document long past the
/// join window still has its origin judged (an agent's report), and one
/// from elsewhere is refused with the join's own errors.
#[test]
fn the_origin_check_ignores_the_window_but_not_the_allow_lists() {
    let policy = sample_policy();
    let mut old = sample_doc();
    old.pending_time -= time::Duration::days(30);
    assert_eq!(policy.check_origin(&old), Ok(()));
    assert!(policy.check(&old, sample_pending_time()).is_err());
    let mut elsewhere = sample_doc();
    elsewhere.region = "eu-west-1".into();
    assert_eq!(
        policy.check_origin(&elsewhere),
        Err(PolicyError::RegionNotAllowed("eu-west-1".into()))
    );
    let mut foreign = sample_doc();
    foreign.account_id = "111111111111".into();
    assert_eq!(
        policy.check_origin(&foreign),
        Err(PolicyError::AccountNotAllowed("111111111111".into()))
    );
}

#[test]
fn empty_policy_allows_nothing() {
    let none: [&str; 0] = [];
    let policy = Policy::new(none, none);
    assert!(policy.check(&sample_doc(), sample_pending_time()).is_err());
}
