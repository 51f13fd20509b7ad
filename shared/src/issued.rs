//! The certificate a signer issued, checked against the CSR that was judged.
//!
//! The join approves a CSR object and hands back whatever certificate
//! kube-controller-manager writes into it. The object is autonode's own (it
//! is found by the UID it was created with), but the certificate is still
//! compared with what was judged before it reaches a node: if anything
//! between the judgement and the signature went wrong (a substituted object,
//! a signer that copies other names, a bug of ours), the node gets nothing
//! rather than a credential for a key, name or address nobody checked.
//!
//! A certificate matches when it certifies the same public key (the
//! SubjectPublicKeyInfo, byte for byte), the same subject CN and Os, no
//! other subject attribute, and exactly the same SANs (as sets).

use crate::csr::{add_general_name, read_subject, ParsedCsr, Sans};
use std::collections::BTreeSet;
use x509_parser::certificate::X509Certificate;
use x509_parser::pem::Pem;
use x509_parser::prelude::FromDer;

/// Why an issued certificate is not the one that was judged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IssuedError {
    /// No PEM certificate, or one that does not parse.
    #[error("the issued certificate does not parse: {0}")]
    Unparsable(String),
    /// It certifies another public key.
    #[error("the issued certificate certifies another public key")]
    OtherKey,
    /// Its subject differs (CN, O, or an extra attribute).
    #[error("the issued certificate's subject {found} differs from the judged CSR's {judged}")]
    OtherSubject {
        /// What the certificate says.
        found: String,
        /// What was judged.
        judged: String,
    },
    /// Its SANs differ.
    #[error("the issued certificate names {found:?}, the judged CSR {judged:?}")]
    OtherNames {
        /// SANs in the certificate.
        found: Vec<String>,
        /// SANs in the judged CSR.
        judged: Vec<String>,
    },
}

/// Checks that `cert_pem` (the first certificate in it: kube-controller-
/// manager writes the leaf first) certifies exactly what `judged` asked for.
pub fn check(cert_pem: &str, judged: &ParsedCsr) -> Result<(), IssuedError> {
    let unparsable = |e: &dyn std::fmt::Display| IssuedError::Unparsable(e.to_string());
    let pem = Pem::iter_from_buffer(cert_pem.as_bytes())
        .next()
        .ok_or_else(|| IssuedError::Unparsable("no PEM block".into()))?
        .map_err(|e| unparsable(&e))?;
    if pem.label != "CERTIFICATE" {
        return Err(IssuedError::Unparsable(format!(
            "PEM block is {:?}",
            pem.label
        )));
    }
    let (_, cert) = X509Certificate::from_der(&pem.contents).map_err(|e| unparsable(&e))?;
    if cert.tbs_certificate.subject_pki.raw != judged.spki_der.as_slice() {
        return Err(IssuedError::OtherKey);
    }
    let subject = read_subject(cert.subject()).map_err(|e| unparsable(&e))?;
    let found = describe(subject.common_name.as_deref(), &subject.organizations);
    let wanted = describe(judged.common_name.as_deref(), &judged.organizations);
    if found != wanted || subject.other_fields || judged.other_subject_fields {
        return Err(IssuedError::OtherSubject {
            found: cert.subject().to_string(),
            judged: wanted,
        });
    }
    let mut sans = Sans::default();
    if let Some(ext) = cert
        .subject_alternative_name()
        .map_err(|e| unparsable(&e))?
    {
        for name in &ext.value.general_names {
            add_general_name(name, &mut sans).map_err(|e| unparsable(&e))?;
        }
    }
    let (found, judged) = (names(&sans), judged_names(judged));
    if found != judged {
        return Err(IssuedError::OtherNames {
            found: found.into_iter().collect(),
            judged: judged.into_iter().collect(),
        });
    }
    Ok(())
}

/// Whether two CSRs ask for the same thing: the same key, subject and
/// names (SANs as sets). A resumed agent signs its CSRs anew: the bytes
/// differ, what they ask must not.
pub fn same_ask(a: &ParsedCsr, b: &ParsedCsr) -> bool {
    a.spki_der == b.spki_der
        && describe(a.common_name.as_deref(), &a.organizations)
            == describe(b.common_name.as_deref(), &b.organizations)
        && a.other_subject_fields == b.other_subject_fields
        && judged_names(a) == judged_names(b)
}

fn describe(cn: Option<&str>, orgs: &[String]) -> String {
    format!("CN={} O={}", cn.unwrap_or("-"), orgs.join(","))
}

fn names(sans: &Sans) -> BTreeSet<String> {
    let dns = sans.dns.iter().map(|d| format!("DNS:{d}"));
    let ips = sans.ips.iter().map(|ip| format!("IP:{ip}"));
    let emails = sans.emails.iter().map(|e| format!("email:{e}"));
    let uris = sans.uris.iter().map(|u| format!("URI:{u}"));
    dns.chain(ips).chain(emails).chain(uris).collect()
}

fn judged_names(csr: &ParsedCsr) -> BTreeSet<String> {
    names(&Sans {
        dns: csr.dns_names.clone(),
        ips: csr.ip_addresses.clone(),
        emails: csr.email_addresses.clone(),
        uris: csr.uris.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csr::parse_csr;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};

    /// A CSR for `cn` with `sans`, and a CA-signed certificate for it.
    fn issue(key: &KeyPair, cn: &str, sans: Vec<SanType>) -> (ParsedCsr, CertificateParams) {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        dn.push(DnType::OrganizationName, "system:nodes");
        params.distinguished_name = dn;
        params.subject_alt_names = sans;
        let csr = params.serialize_request(key).unwrap();
        (parse_csr(csr.pem().unwrap().as_bytes()).unwrap(), params)
    }

    fn sign(params: &CertificateParams, key: &KeyPair) -> String {
        let mut ca = CertificateParams::default();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let issuer = rcgen::Issuer::new(ca, KeyPair::generate().unwrap());
        params.signed_by(key, &issuer).unwrap().pem()
    }

    fn ip(s: &str) -> SanType {
        SanType::IpAddress(s.parse().unwrap())
    }

    #[test]
    fn the_certificate_for_the_judged_csr_matches() {
        let key = KeyPair::generate().unwrap();
        let sans = vec![
            SanType::DnsName("ip-10-0-0-1.ec2.internal".try_into().unwrap()),
            ip("10.0.0.1"),
        ];
        let (judged, params) = issue(&key, "system:node:ip-10-0-0-1.ec2.internal", sans);
        assert_eq!(check(&sign(&params, &key), &judged), Ok(()));
    }

    #[test]
    fn another_key_subject_or_names_do_not() {
        let key = KeyPair::generate().unwrap();
        let node = "system:node:ip-10-0-0-1.ec2.internal";
        let (judged, _) = issue(&key, node, vec![ip("10.0.0.1")]);

        let other_key = KeyPair::generate().unwrap();
        let (_, same_names) = issue(&other_key, node, vec![ip("10.0.0.1")]);
        assert_eq!(
            check(&sign(&same_names, &other_key), &judged),
            Err(IssuedError::OtherKey)
        );

        let (_, victim) = issue(&key, "system:node:victim", vec![ip("10.0.0.1")]);
        assert!(matches!(
            check(&sign(&victim, &key), &judged),
            Err(IssuedError::OtherSubject { .. })
        ));

        let (_, more) = issue(&key, node, vec![ip("10.0.0.1"), ip("10.96.0.1")]);
        assert!(matches!(
            check(&sign(&more, &key), &judged),
            Err(IssuedError::OtherNames { .. })
        ));
    }

    #[test]
    fn a_csr_signed_anew_asks_the_same_and_another_key_or_name_does_not() {
        let key = KeyPair::generate().unwrap();
        let node = "system:node:n";
        let (first, _) = issue(&key, node, vec![ip("10.0.0.1")]);
        let (again, _) = issue(&key, node, vec![ip("10.0.0.1")]);
        assert!(same_ask(&first, &again));
        let (other_key, _) = issue(&KeyPair::generate().unwrap(), node, vec![ip("10.0.0.1")]);
        let (more, _) = issue(&key, node, vec![ip("10.0.0.1"), ip("10.0.0.2")]);
        assert!(!same_ask(&first, &other_key));
        assert!(!same_ask(&first, &more));
    }

    #[test]
    fn garbage_is_unparsable_not_a_panic() {
        let key = KeyPair::generate().unwrap();
        let (judged, _) = issue(&key, "system:node:n", vec![]);
        for bad in [
            "",
            "not pem",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        ] {
            assert!(
                matches!(check(bad, &judged), Err(IssuedError::Unparsable(_))),
                "{bad:?}"
            );
        }
    }
}
