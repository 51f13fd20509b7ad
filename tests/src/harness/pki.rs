//! Throwaway certificate authorities for a test run.
//!
//! Each control plane gets its own CA: it signs the apiserver's serving
//! certificate, every client certificate the tests use, and (through
//! kube-controller-manager's csrsigning controller) the kubelet
//! certificates autonode asks for. Nothing here outlives the test.

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::net::IpAddr;
use time::{Duration, OffsetDateTime};

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct CertPair {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A self-signed CA that can issue client and serving certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pair: CertPair,
}

impl Ca {
    /// A new CA with the given common name, valid for a day.
    pub fn new(common_name: &str) -> Result<Self> {
        let key = KeyPair::generate().context("generating CA key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name, None);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params);
        let cert = params.self_signed(&key).context("self-signing CA")?;
        let pair = CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        Ok(Self {
            issuer: Issuer::new(params, key),
            pair,
        })
    }

    /// The CA's own certificate and key (kube-controller-manager signs with them).
    pub fn pair(&self) -> &CertPair {
        &self.pair
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.pair.cert_pem
    }

    /// A client certificate for `user`, in `group` if given (CN and O, as
    /// Kubernetes reads them).
    pub fn client(&self, user: &str, group: Option<&str>) -> Result<CertPair> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(user, group);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.issue(params)
    }

    /// A serving certificate for the given DNS names and IP addresses.
    pub fn server(&self, dns: &[&str], ips: &[IpAddr]) -> Result<CertPair> {
        let key = KeyPair::generate().context("generating key")?;
        self.server_with(dns, ips, key)
    }

    /// Like [`Ca::server`], with an RSA key of `bits` (cert-manager issues
    /// 2048 by default, 4096 when asked): each TLS handshake's signature
    /// then costs the server what it costs in those deployments.
    pub fn server_rsa(&self, dns: &[&str], ips: &[IpAddr], bits: usize) -> Result<CertPair> {
        use rsa::pkcs8::EncodePrivateKey as _;
        let rsa = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), bits)
            .context("generating an RSA key")?;
        let pem = rsa
            .to_pkcs8_pem(rsa::pkcs8::LineEnding::LF)
            .context("encoding the RSA key")?;
        let key = KeyPair::from_pem_and_sign_algo(&pem, &rcgen::PKCS_RSA_SHA256)
            .context("loading the RSA key")?;
        self.server_with(dns, ips, key)
    }

    fn server_with(&self, dns: &[&str], ips: &[IpAddr], key: KeyPair) -> Result<CertPair> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(dns.first().copied().unwrap_or("server"), None);
        params.subject_alt_names = dns
            .iter()
            .map(|d| Ok(SanType::DnsName((*d).try_into()?)))
            .chain(ips.iter().map(|ip| Ok(SanType::IpAddress(*ip))))
            .collect::<Result<_, rcgen::Error>>()
            .context("building SANs")?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.issue_for(params, key)
    }

    fn issue(&self, params: CertificateParams) -> Result<CertPair> {
        let key = KeyPair::generate().context("generating key")?;
        self.issue_for(params, key)
    }

    fn issue_for(&self, mut params: CertificateParams, key: KeyPair) -> Result<CertPair> {
        validity(&mut params);
        let cert = params
            .signed_by(&key, &self.issuer)
            .context("signing certificate")?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

// rcgen keeps one value per attribute type, so one organisation at most.
fn name(common_name: &str, organisation: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organisation {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}

// Backdated a little: the apiserver and this process share a clock, but
// a certificate "not yet valid" by a second is a confusing failure.
fn validity(params: &mut CertificateParams) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + Duration::days(1);
}
