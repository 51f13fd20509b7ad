//! The certificate chain: pinned root → regional → zonal → instance CA →
//! leaf, checked link by link.
//!
//! Two steps, so the failure says what is wrong: [`Chain::authenticate`]
//! checks everything that makes the chain authentic (pinned root, shapes,
//! issuer names, signatures, CA and leaf rules), any of which is
//! [`Failure::Untrusted`]; [`Chain::check_valid_at`] then checks each
//! certificate's dates at the chosen instant ([`Failure::Expired`]). The
//! caller checks the COSE signature between the two, so "expired" is only
//! ever said of a document that is authentic in every other way.
//!
//! [`Failure::Untrusted`]: super::Failure::Untrusted
//! [`Failure::Expired`]: super::Failure::Expired

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use ring::signature::{UnparsedPublicKey, ECDSA_P384_SHA384_ASN1};
use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::{
    OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_SIG_ECDSA_WITH_SHA384,
    OID_X509_EXT_BASIC_CONSTRAINTS, OID_X509_EXT_KEY_USAGE,
};
use x509_parser::prelude::FromDer;
use x509_parser::x509::X509Version;

use super::error::NitroError;

/// `AlgorithmIdentifier { ecdsa-with-SHA384 (1.2.840.10045.4.3.3) }`, no
/// parameters (RFC 5758 §3.2).
const ECDSA_WITH_SHA384_DER: [u8; 12] = [
    0x30, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03,
];

/// Appends a DER length (up to 65535: certificates here are at most 1024
/// bytes).
fn der_length(out: &mut Vec<u8>, len: usize) {
    match len {
        0..=0x7f => out.push(len as u8),
        0x80..=0xff => out.extend_from_slice(&[0x81, len as u8]),
        _ => {
            out.push(0x82);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
    }
}

/// One certificate of the chain, parsed.
struct Link<'a> {
    cert: X509Certificate<'a>,
    der: &'a [u8],
}

/// The signatures over the PKI's shared CAs (those with CAs under them:
/// AWS's regional and zonal CAs, which sign for every instance of a zone
/// for days) already verified, so that a fleet's documents cost three
/// P-384 checks each instead of five. A link is remembered only once its
/// parent was authenticated (the chain is walked from the pinned root
/// down, and stops at the first failure), so only links of the pinned
/// PKI are ever here; at most `cap`, the oldest forgotten first. What is
/// remembered is the bytes of both certificates: the name, CA and date
/// checks still run on every document.
#[derive(Debug, Default)]
pub struct Memo {
    cap: usize,
    seen: Mutex<VecDeque<[u8; 32]>>,
}

impl Memo {
    /// Remembers at most `cap` links (0: none, every signature checked).
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            seen: Mutex::default(),
        }
    }

    /// How many links it remembers now.
    pub fn len(&self) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether it remembers none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn key(parent: &[u8], child: &[u8]) -> [u8; 32] {
        let mut hash = Sha256::new();
        hash.update((parent.len() as u64).to_be_bytes());
        hash.update(parent);
        hash.update(child);
        hash.finalize().into()
    }

    fn knows(&self, key: &[u8; 32]) -> bool {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.contains(key)
    }

    fn remember(&self, key: [u8; 32]) {
        if self.cap == 0 {
            return;
        }
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() >= self.cap {
            seen.pop_front();
        }
        seen.push_back(key);
    }
}

impl<'a> Link<'a> {
    fn parse(index: usize, der: &'a [u8]) -> Result<Link<'a>, NitroError> {
        let (rest, cert) = X509Certificate::from_der(der)
            .map_err(|e| NitroError::chain(index, format!("not a DER certificate: {e}")))?;
        if !rest.is_empty() {
            return Err(NitroError::chain(index, "bytes after the certificate"));
        }
        if cert.version() != X509Version::V3 {
            return Err(NitroError::chain(index, "not an X.509 v3 certificate"));
        }
        let link = Link { cert, der };
        link.check_algorithms(index)?;
        Ok(link)
    }

    /// Signed with ecdsa-with-SHA384 (both copies of the algorithm), and a
    /// P-384 key.
    fn check_algorithms(&self, index: usize) -> Result<(), NitroError> {
        let inner = &self.cert.tbs_certificate.signature;
        if inner.algorithm != OID_SIG_ECDSA_WITH_SHA384 || inner.parameters.is_some() {
            return Err(NitroError::chain(
                index,
                "not signed with ecdsa-with-SHA384",
            ));
        }
        self.check_unsigned_tail(index)?;
        let spki = self.cert.public_key();
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok());
        if spki.algorithm.algorithm != OID_KEY_TYPE_EC_PUBLIC_KEY || curve != Some(OID_NIST_EC_P384)
        {
            return Err(NitroError::chain(index, "the key is not EC P-384"));
        }
        Ok(())
    }

    /// What follows the signed part is exactly the DER of ecdsa-with-SHA384
    /// and of a BIT STRING holding the signature. These bytes are covered by
    /// no signature, and the parser forgives some of their encodings (a
    /// wrong tag on the algorithm's OID); so they are compared byte for
    /// byte, and a certificate has one encoding only.
    fn check_unsigned_tail(&self, index: usize) -> Result<(), NitroError> {
        let signature = &self.cert.signature_value.data;
        let mut tail = ECDSA_WITH_SHA384_DER.to_vec();
        tail.push(0x03); // BIT STRING
        der_length(&mut tail, signature.len() + 1);
        tail.push(0x00); // no unused bits
        tail.extend_from_slice(signature);
        let raw = self.cert.as_raw();
        let exact = raw.len() > tail.len()
            && raw.ends_with(&tail)
            && raw[..raw.len() - tail.len()].ends_with(self.cert.tbs_certificate.as_ref());
        if exact {
            Ok(())
        } else {
            Err(NitroError::chain(
                index,
                "the signature algorithm or signature is not encoded as ecdsa-with-SHA384 DER",
            ))
        }
    }

    fn point(&self) -> &[u8] {
        &self.cert.public_key().subject_public_key.data
    }

    /// Issued and signed by `parent` (the root by itself); a shared CA's
    /// signature once verified is remembered in `memo`.
    fn check_issued_by(
        &self,
        index: usize,
        parent: &Link<'_>,
        memo: Option<&Memo>,
    ) -> Result<(), NitroError> {
        if self.cert.issuer().as_raw() != parent.cert.subject().as_raw() {
            return Err(NitroError::chain(
                index,
                "its issuer is not its parent's subject",
            ));
        }
        let Some(memo) = memo else {
            return self.check_signed_by(index, parent);
        };
        let key = Memo::key(parent.der, self.der);
        if !memo.knows(&key) {
            self.check_signed_by(index, parent)?;
            memo.remember(key);
        }
        Ok(())
    }

    /// Its signature verifies under `parent`'s key.
    fn check_signed_by(&self, index: usize, parent: &Link<'_>) -> Result<(), NitroError> {
        let signature = &self.cert.signature_value;
        if signature.unused_bits != 0 {
            return Err(NitroError::chain(index, "the signature is not whole bytes"));
        }
        UnparsedPublicKey::new(&ECDSA_P384_SHA384_ASN1, parent.point())
            .verify(self.cert.tbs_certificate.as_ref(), &signature.data)
            .map_err(|_| NitroError::chain(index, "its parent's signature does not verify"))
    }

    /// Only basicConstraints and keyUsage may be critical: a critical
    /// extension this check does not understand must refuse the certificate
    /// (RFC 5280 §4.2).
    fn check_critical(&self, index: usize) -> Result<(), NitroError> {
        let understood = [OID_X509_EXT_BASIC_CONSTRAINTS, OID_X509_EXT_KEY_USAGE];
        let unknown = self
            .cert
            .extensions()
            .iter()
            .any(|e| e.critical && !understood.contains(&e.oid));
        if unknown {
            return Err(NitroError::chain(index, "an unknown critical extension"));
        }
        Ok(())
    }

    /// A CA with `below` CA certificates under it before the leaf: critical
    /// basicConstraints CA=true whose pathLen allows them, and keyCertSign.
    fn check_ca(&self, index: usize, below: usize) -> Result<(), NitroError> {
        let constraints = self
            .cert
            .basic_constraints()
            .map_err(|e| NitroError::chain(index, format!("basicConstraints: {e}")))?;
        let Some(constraints) = constraints.filter(|c| c.critical && c.value.ca) else {
            return Err(NitroError::chain(
                index,
                "issues certificates but is not a CA (critical basicConstraints CA=true)",
            ));
        };
        if let Some(len) = constraints.value.path_len_constraint {
            if below > len as usize {
                return Err(NitroError::chain(index, format!("pathLen {len} exceeded")));
            }
        }
        match self.cert.key_usage() {
            Ok(Some(usage)) if usage.value.key_cert_sign() => Ok(()),
            _ => Err(NitroError::chain(index, "a CA without keyCertSign")),
        }
    }

    /// The leaf: not a CA, and digitalSignature.
    fn check_leaf(&self, index: usize) -> Result<(), NitroError> {
        match self.cert.basic_constraints() {
            Ok(None) => {}
            Ok(Some(c)) if !c.value.ca => {}
            _ => return Err(NitroError::chain(index, "the leaf is a CA")),
        }
        match self.cert.key_usage() {
            Ok(Some(usage)) if usage.value.digital_signature() => Ok(()),
            _ => Err(NitroError::chain(index, "the leaf lacks digitalSignature")),
        }
    }

    fn check_valid_at(&self, index: usize, at_ms: i128) -> Result<(), NitroError> {
        let validity = self.cert.validity();
        let not_before = validity.not_before.timestamp();
        let not_after = validity.not_after.timestamp();
        let valid = i128::from(not_before) * 1000 <= at_ms && at_ms <= i128::from(not_after) * 1000;
        if valid {
            Ok(())
        } else {
            Err(NitroError::NotValidAt {
                index,
                at_ms,
                not_before,
                not_after,
            })
        }
    }
}

/// An authentic chain: every link checked except the validity dates.
pub struct Chain<'a> {
    links: Vec<Link<'a>>,
}

impl<'a> Chain<'a> {
    /// Checks `root → cabundle[1..] → leaf` link by link, dates aside;
    /// the shared CAs' signatures are looked up in `memo` first.
    pub fn authenticate(
        root_der: &[u8],
        cabundle: &'a [Cow<'a, [u8]>],
        leaf: &'a [u8],
        memo: &Memo,
    ) -> Result<Chain<'a>, NitroError> {
        if cabundle.first().map(|c| &c[..]) != Some(root_der) {
            return Err(NitroError::NotPinnedRoot);
        }
        let ders = cabundle.iter().map(|c| &c[..]).chain(std::iter::once(leaf));
        let links = ders
            .enumerate()
            .map(|(index, der)| Link::parse(index, der))
            .collect::<Result<Vec<_>, _>>()?;
        let leaf_index = links.len() - 1;
        for (index, link) in links.iter().enumerate() {
            // The root is the pinned one, byte for byte, and its
            // self-signature was checked when it was pinned (`check_root`):
            // one P-384 verification less per document.
            if index > 0 {
                // Only a CA with CAs under it is shared between instances.
                let shared = index + 1 < leaf_index;
                let memo = shared.then_some(memo);
                link.check_issued_by(index, &links[index - 1], memo)?;
            }
            link.check_critical(index)?;
            if index == leaf_index {
                link.check_leaf(index)?;
            } else {
                link.check_ca(index, leaf_index - index - 1)?;
            }
        }
        Ok(Chain { links })
    }

    /// The leaf's key as an uncompressed SEC1 P-384 point.
    pub fn leaf_point(&self) -> &[u8] {
        // `authenticate` parsed at least the root and the leaf.
        self.links.last().map(Link::point).unwrap_or_default()
    }

    /// Every certificate is valid at `at`.
    pub fn check_valid_at(&self, at: SystemTime) -> Result<(), NitroError> {
        let at_ms = millis_since_epoch(at);
        self.links
            .iter()
            .enumerate()
            .try_for_each(|(index, link)| link.check_valid_at(index, at_ms))
    }
}

/// Milliseconds since the Unix epoch, negative before it.
fn millis_since_epoch(at: SystemTime) -> i128 {
    match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => after.as_millis() as i128,
        Err(before) => -(before.duration().as_millis() as i128),
    }
}

/// A root given by an operator must be what the chain's first link has to
/// be anyway: a self-signed P-384 CA; refused when loaded, not at each join.
pub(crate) fn check_root(der: &[u8]) -> Result<(), NitroError> {
    let link = Link::parse(0, der)?;
    link.check_issued_by(0, &link, None)?;
    link.check_ca(0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, CustomExtension, IsCa, KeyPair,
        KeyUsagePurpose, SignatureAlgorithm, PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384,
    };

    type Ca = CertifiedIssuer<'static, KeyPair>;

    fn params(cn: &str, is_ca: IsCa, usages: &[KeyUsagePurpose]) -> CertificateParams {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.is_ca = is_ca;
        params.key_usages = usages.to_vec();
        params
    }

    fn ca_params(cn: &str, path_len: Option<u8>) -> CertificateParams {
        let constraints = match path_len {
            Some(n) => BasicConstraints::Constrained(n),
            None => BasicConstraints::Unconstrained,
        };
        params(cn, IsCa::Ca(constraints), &[KeyUsagePurpose::KeyCertSign])
    }

    fn leaf_params() -> CertificateParams {
        params(
            "leaf",
            IsCa::ExplicitNoCa,
            &[KeyUsagePurpose::DigitalSignature],
        )
    }

    fn key(alg: &'static SignatureAlgorithm) -> KeyPair {
        KeyPair::generate_for(alg).unwrap()
    }

    fn root() -> Ca {
        CertifiedIssuer::self_signed(ca_params("root", None), key(&PKCS_ECDSA_P384_SHA384)).unwrap()
    }

    fn ca(params: CertificateParams, parent: &Ca) -> Ca {
        CertifiedIssuer::signed_by(params, key(&PKCS_ECDSA_P384_SHA384), parent).unwrap()
    }

    fn leaf(params: CertificateParams, parent: &Ca, alg: &'static SignatureAlgorithm) -> Vec<u8> {
        params.signed_by(&key(alg), parent).unwrap().der().to_vec()
    }

    /// Authenticates root → `cas` → `leaf` (the root pinned).
    fn check(root: &Ca, cas: &[&Ca], leaf: &[u8]) -> Result<(), NitroError> {
        check_with(root, cas, leaf, &Memo::new(0))
    }

    /// [`check`], remembering shared CAs' signatures in `memo`.
    fn check_with(root: &Ca, cas: &[&Ca], leaf: &[u8], memo: &Memo) -> Result<(), NitroError> {
        let bundle: Vec<Cow<'_, [u8]>> = std::iter::once(root)
            .chain(cas.iter().copied())
            .map(|c| Cow::Owned(c.der().to_vec()))
            .collect();
        Chain::authenticate(root.der(), &bundle, leaf, memo).map(|_| ())
    }

    #[test]
    fn only_the_shared_cas_authenticated_links_are_remembered() {
        let p384 = &PKCS_ECDSA_P384_SHA384;
        let root = root();
        let regional = ca(ca_params("regional", Some(2)), &root);
        let zonal = ca(ca_params("zonal", Some(1)), &regional);
        let memo = Memo::new(8);
        for instance in ["i-1", "i-2"] {
            let instance = ca(ca_params(instance, Some(0)), &zonal);
            let end = leaf(leaf_params(), &instance, p384);
            check_with(&root, &[&regional, &zonal, &instance], &end, &memo).unwrap();
        }
        // root → regional and regional → zonal; never an instance's links.
        assert_eq!(memo.len(), 2);

        // A zonal CA of another key under the same name is checked, not
        // taken for the remembered one, and nothing under it is kept.
        let forged_regional = ca(ca_params("regional", Some(2)), &self::root());
        let forged = ca(ca_params("zonal", Some(1)), &forged_regional);
        let instance = ca(ca_params("i-3", Some(0)), &forged);
        let end = leaf(leaf_params(), &instance, p384);
        let chain = [&regional, &forged, &instance];
        refused(
            check_with(&root, &chain, &end, &memo),
            2,
            "signature does not verify",
        );
        assert_eq!(memo.len(), 2);

        // Full, the oldest is forgotten; with no room, nothing is kept.
        let small = Memo::new(1);
        let instance = ca(ca_params("i-4", Some(0)), &zonal);
        let end = leaf(leaf_params(), &instance, p384);
        check_with(&root, &[&regional, &zonal, &instance], &end, &small).unwrap();
        assert_eq!(small.len(), 1);
        let none = Memo::new(0);
        check_with(&root, &[&regional, &zonal, &instance], &end, &none).unwrap();
        assert!(none.is_empty());
    }

    fn refused(result: Result<(), NitroError>, index: usize, why: &str) {
        match result {
            Err(NitroError::Chain { index: at, reason }) => {
                assert_eq!(at, index, "{reason}");
                assert!(reason.contains(why), "{reason}");
            }
            other => panic!("{other:?}, expected certificate {index}: {why}"),
        }
    }

    #[test]
    fn a_chain_of_aws_shape_is_authentic() {
        let root = root();
        let ca = ca(ca_params("instance", Some(0)), &root);
        let p384 = &PKCS_ECDSA_P384_SHA384;
        check(&root, &[&ca], &leaf(leaf_params(), &ca, p384)).unwrap();
    }

    #[test]
    fn each_link_rule_refuses_on_its_own() {
        let p384 = &PKCS_ECDSA_P384_SHA384;
        let root = root();
        let ca0 = ca(ca_params("instance", Some(0)), &root);
        let good_leaf = leaf(leaf_params(), &ca0, p384);
        // A CA signed by another key of the same name.
        let other = self::root();
        refused(
            check(&other, &[&ca0], &good_leaf),
            1,
            "signature does not verify",
        );
        // A CA with pathLen 0 may not have a CA under it.
        let below = ca(ca_params("below", Some(0)), &ca0);
        let deep_leaf = leaf(leaf_params(), &below, p384);
        refused(
            check(&root, &[&ca0, &below], &deep_leaf),
            1,
            "pathLen 0 exceeded",
        );
        // The links out of order: names no longer chain.
        refused(check(&root, &[&below, &ca0], &good_leaf), 1, "issuer");
        // An issuer without CA=true, or without keyCertSign.
        let no_ca = ca(
            params("not-a-ca", IsCa::NoCa, &[KeyUsagePurpose::KeyCertSign]),
            &root,
        );
        refused(
            check(&root, &[&no_ca], &leaf(leaf_params(), &no_ca, p384)),
            1,
            "not a CA",
        );
        let no_sign = ca(
            params(
                "no-sign",
                IsCa::Ca(BasicConstraints::Constrained(0)),
                &[KeyUsagePurpose::DigitalSignature],
            ),
            &root,
        );
        refused(
            check(&root, &[&no_sign], &leaf(leaf_params(), &no_sign, p384)),
            1,
            "keyCertSign",
        );
        // A leaf that is a CA, or cannot sign.
        let ca_leaf = leaf(ca_params("leaf", Some(0)), &ca0, p384);
        refused(check(&root, &[&ca0], &ca_leaf), 2, "the leaf is a CA");
        let mute = leaf(
            params(
                "leaf",
                IsCa::ExplicitNoCa,
                &[KeyUsagePurpose::KeyEncipherment],
            ),
            &ca0,
            p384,
        );
        refused(check(&root, &[&ca0], &mute), 2, "digitalSignature");
        // A critical extension nobody here understands.
        let mut strange = leaf_params();
        let mut ext =
            CustomExtension::from_oid_content(&[1, 3, 6, 1, 4, 1, 99999, 1], vec![0x05, 0x00]);
        ext.set_criticality(true);
        strange.custom_extensions = vec![ext];
        refused(
            check(&root, &[&ca0], &leaf(strange, &ca0, p384)),
            2,
            "critical extension",
        );
        // A P-256 leaf key.
        let p256 = leaf(leaf_params(), &ca0, &PKCS_ECDSA_P256_SHA256);
        refused(check(&root, &[&ca0], &p256), 2, "not EC P-384");
    }
}
