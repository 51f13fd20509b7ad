//! Pinned certificates: AWS's, embedded, plus those an operator adds.
//!
//! Only the key, issuer name and serial number of a pinned certificate are
//! used. Its validity dates are deliberately NOT enforced: AWS keeps signing
//! identity documents with certificates after their notAfter, and a pinned
//! self-signed root has no one above it to revoke it anyway; pinning is the
//! trust decision. Nor is a certificate chain built: a pinned certificate is
//! trusted as is, and a certificate carried in a signature never is.

use super::aws_certs::AWS_RSA2048;
use super::error::{IdentityError, TrustError};
use super::pem;
use rasn::types::{Integer, Oid};
use rasn_cms::Certificate;
use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};
use rsa::pkcs1::DecodeRsaPublicKey;
use rsa::traits::PublicKeyParts;
use rsa::RsaPublicKey;
use std::path::Path;
use std::sync::OnceLock;

/// Smallest RSA modulus accepted for a pinned key, in bits.
const MIN_RSA_BITS: usize = 2048;
const RSA_ENCRYPTION: &Oid = Oid::const_new(&[1, 2, 840, 113549, 1, 1, 1]);

/// Which documents a pinned certificate may vouch for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Documents whose `region` is exactly this (AWS has one key per region).
    Region(String),
    /// Documents of any region: for an operator's own CA, e.g. a test cloud.
    AnyRegion,
}

impl Scope {
    /// The scope a certificate file's name gives: `<region>.pem` or
    /// `any.pem`. `None` for any other name, which is a configuration error.
    pub fn from_file_name(name: &str) -> Option<Self> {
        let stem = name.strip_suffix(".pem")?;
        if stem == "any" {
            return Some(Self::AnyRegion);
        }
        looks_like_region(stem).then(|| Self::Region(stem.to_owned()))
    }

    fn covers(&self, region: &str) -> bool {
        match self {
            Self::Region(r) => r == region,
            Self::AnyRegion => true,
        }
    }
}

/// `us-west-2`, `eusc-de-east-1`: lowercase words joined by '-', the last a
/// number. Enough to catch `ca.pem` or `cert.pem` given by mistake.
fn looks_like_region(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    let (Some(last), true) = (parts.last(), parts.len() >= 3) else {
        return false;
    };
    let words_ok = parts[..parts.len() - 1]
        .iter()
        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()));
    words_ok && !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit())
}

/// One pinned certificate, parsed once.
#[derive(Debug, Clone)]
pub(crate) struct Anchor {
    scope: Scope,
    issuer_der: Vec<u8>,
    serial: Integer,
    /// PKCS#1 RSAPublicKey DER, already validated (RSA, >= 2048 bits).
    key_pkcs1: Vec<u8>,
}

impl Anchor {
    fn from_der(scope: Scope, der: &[u8], source: &str) -> Result<Self, TrustError> {
        let cert: Certificate = rasn::der::decode(der).map_err(|e| TrustError::Certificate {
            source_name: source.to_owned(),
            reason: e.to_string(),
        })?;
        let tbs = &cert.tbs_certificate;
        let issuer_der = rasn::der::encode(&tbs.issuer).map_err(|e| TrustError::Certificate {
            source_name: source.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            scope,
            issuer_der,
            serial: tbs.serial_number.clone(),
            key_pkcs1: rsa_key(&cert, source)?,
        })
    }

    /// PKCS#1 v1.5 with SHA-256 over the DER signed attributes.
    ///
    /// ring, not `rsa`, does the public-key operation: measured on the real
    /// sample, `rsa` 0.9 verifies ~2-3k signatures/s on one core where
    /// ring (like openssl) does tens of thousands (see shared/IDENTITY.md).
    /// `rsa` still validates keys when they are pinned.
    fn verify(&self, signed_attrs_der: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &self.key_pkcs1)
            .verify(signed_attrs_der, signature)
            .is_ok()
    }
}

/// The certificate's RSA key as PKCS#1 DER, checked to parse and to be at
/// least [`MIN_RSA_BITS`] long.
fn rsa_key(cert: &Certificate, source: &str) -> Result<Vec<u8>, TrustError> {
    let key_err = |reason: String| TrustError::Key {
        source_name: source.to_owned(),
        reason,
    };
    let spki = &cert.tbs_certificate.subject_public_key_info;
    if *spki.algorithm.algorithm != *RSA_ENCRYPTION {
        return Err(key_err(format!("algorithm {}", spki.algorithm.algorithm)));
    }
    let der = spki.subject_public_key.as_raw_slice();
    let key = RsaPublicKey::from_pkcs1_der(der).map_err(|e| key_err(e.to_string()))?;
    let bits = key.size() * 8;
    if bits < MIN_RSA_BITS {
        return Err(key_err(format!("{bits} bits")));
    }
    Ok(der.to_vec())
}

/// AWS's 39 certificates, parsed on first use and then shared: parsing a
/// certificate costs far more than a verification, so never per verify.
fn aws_anchors() -> &'static [Anchor] {
    static AWS: OnceLock<Vec<Anchor>> = OnceLock::new();
    AWS.get_or_init(|| {
        // Embedded at build time and checked by a test to all parse, so a
        // failure here is impossible in a tested build; skipping rather than
        // panicking keeps the promise that nothing here panics.
        AWS_RSA2048
            .iter()
            .filter_map(|(region, text)| {
                anchors_from_pem(&Scope::Region((*region).to_owned()), text, region).ok()
            })
            .flatten()
            .collect()
    })
}

fn anchors_from_pem(scope: &Scope, text: &str, source: &str) -> Result<Vec<Anchor>, TrustError> {
    let pem_err = |reason: String| TrustError::Pem {
        source_name: source.to_owned(),
        reason,
    };
    let blocks = pem::blocks(text).map_err(pem_err)?;
    if blocks.is_empty() {
        return Err(pem_err("no PEM CERTIFICATE block".into()));
    }
    blocks
        .iter()
        .map(|b| match b.label.as_str() {
            "CERTIFICATE" => Anchor::from_der(scope.clone(), &b.der, source),
            other => Err(pem_err(format!("unexpected PEM block {other:?}"))),
        })
        .collect()
}

/// The certificates a signature may be verified against, and nothing else.
#[derive(Debug, Clone, Default)]
pub struct TrustStore {
    builtin: &'static [Anchor],
    added: Vec<Anchor>,
}

impl TrustStore {
    /// AWS's rsa2048 certificate for each of its 39 regions, each trusted
    /// for its own region only.
    pub fn aws() -> Self {
        Self {
            builtin: aws_anchors(),
            added: Vec::new(),
        }
    }

    /// No certificate at all: for an operator who trusts only their own.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Pin every certificate in `pem` (one or more `CERTIFICATE` blocks)
    /// for `scope`. Returns how many were added. Each must have an RSA key
    /// of at least 2048 bits.
    pub fn add_pem(&mut self, scope: Scope, pem: &str) -> Result<usize, TrustError> {
        self.add_pem_from(scope, pem, "<inline>")
    }

    fn add_pem_from(&mut self, scope: Scope, pem: &str, source: &str) -> Result<usize, TrustError> {
        let anchors = anchors_from_pem(&scope, pem, source)?;
        let n = anchors.len();
        self.added.extend(anchors);
        Ok(n)
    }

    /// Pin the certificates of one file, scoped by its name: `<region>.pem`
    /// or `any.pem` (see [`Scope::from_file_name`]).
    pub fn load_file(&mut self, path: &Path) -> Result<usize, TrustError> {
        let shown = path.display().to_string();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let scope =
            Scope::from_file_name(name).ok_or_else(|| TrustError::FileName(shown.clone()))?;
        let text = std::fs::read_to_string(path).map_err(|source| TrustError::Io {
            path: shown.clone(),
            source,
        })?;
        self.add_pem_from(scope, &text, &shown)
    }

    /// Pin every certificate file in `dir`, each scoped by its name.
    /// Hidden entries and subdirectories are skipped (a Kubernetes Secret
    /// mount keeps its real files in `..data/` behind symlinks); any other
    /// file not named `<region>.pem` or `any.pem` is an error rather than
    /// silently ignored. Returns how many certificates were added.
    pub fn load_dir(&mut self, dir: &Path) -> Result<usize, TrustError> {
        let io = |source| TrustError::Io {
            path: dir.display().to_string(),
            source,
        };
        let mut paths = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            let hidden = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_none_or(|n| n.starts_with('.'));
            if !hidden && !path.is_dir() {
                paths.push(path);
            }
        }
        paths.sort();
        paths.iter().map(|p| self.load_file(p)).sum()
    }

    /// How many certificates are pinned.
    pub fn len(&self) -> usize {
        self.builtin.len() + self.added.len()
    }

    /// Whether no certificate is pinned (every signature will be refused).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn for_region<'a>(&'a self, region: &'a str) -> impl Iterator<Item = &'a Anchor> + 'a {
        self.builtin
            .iter()
            .chain(self.added.iter())
            .filter(move |a| a.scope.covers(region))
    }

    /// Check `signature` with the certificate pinned for `region` whose
    /// issuer and serial are the signer's.
    pub(crate) fn verify(
        &self,
        region: &str,
        issuer_der: &[u8],
        serial: &Integer,
        signed_attrs_der: &[u8],
        signature: &[u8],
    ) -> Result<(), IdentityError> {
        let mut candidates = self.for_region(region).peekable();
        if candidates.peek().is_none() {
            return Err(IdentityError::NoPinnedCertificate(region.to_owned()));
        }
        let anchor = candidates
            .find(|a| a.issuer_der == issuer_der && a.serial == *serial)
            .ok_or_else(|| IdentityError::SignerNotPinned(region.to_owned()))?;
        if anchor.verify(signed_attrs_der, signature) {
            Ok(())
        } else {
            Err(IdentityError::BadSignature(region.to_owned()))
        }
    }
}

#[cfg(test)]
pub(crate) fn aws_anchor_count() -> usize {
    aws_anchors().len()
}

/// Verify with one specific AWS region's key, bypassing the issuer/serial
/// match, so tests can show the RSA check itself fails with a wrong key.
#[cfg(test)]
pub(crate) fn verify_with_aws_key(region: &str, signed_attrs_der: &[u8], signature: &[u8]) -> bool {
    aws_anchors()
        .iter()
        .filter(|a| a.scope.covers(region) && matches!(a.scope, Scope::Region(_)))
        .any(|a| a.verify(signed_attrs_der, signature))
}
