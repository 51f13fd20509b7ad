//! The kubelet's certificate signing requests.
//!
//! Both carry the subject the Kubernetes signers require
//! (CN `system:node:<name>`, O `system:nodes`); the client CSR has no SANs,
//! the serving CSR names the node's DNS name and IPs. The server checks all
//! of it against EC2 and creates the CSR objects with the right usages.

use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use std::net::IpAddr;

/// Why a CSR could not be built.
#[derive(Debug, thiserror::Error)]
#[error("building the {which} CSR: {reason}")]
pub struct CsrError {
    which: &'static str,
    reason: String,
}

fn node_subject(node_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "system:nodes");
    dn.push(DnType::CommonName, format!("system:node:{node_name}"));
    dn
}

/// PEM CSR for the kubelet's client certificate.
pub fn client_csr(key: &KeyPair, node_name: &str) -> Result<String, CsrError> {
    let err = |e: rcgen::Error| CsrError {
        which: "client",
        reason: e.to_string(),
    };
    let mut params = CertificateParams::default();
    params.distinguished_name = node_subject(node_name);
    params
        .serialize_request(key)
        .and_then(|csr| csr.pem())
        .map_err(err)
}

/// PEM CSR for the kubelet's serving certificate.
pub fn serving_csr(key: &KeyPair, node_name: &str, ips: &[IpAddr]) -> Result<String, CsrError> {
    let err = |reason: String| CsrError {
        which: "serving",
        reason,
    };
    let mut params = CertificateParams::default();
    params.distinguished_name = node_subject(node_name);
    let dns = node_name
        .to_string()
        .try_into()
        .map_err(|e: rcgen::Error| err(e.to_string()))?;
    params.subject_alt_names = std::iter::once(SanType::DnsName(dns))
        .chain(ips.iter().map(|ip| SanType::IpAddress(*ip)))
        .collect();
    params
        .serialize_request(key)
        .and_then(|csr| csr.pem())
        .map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::*;

    fn parse(pem: &str) -> Vec<u8> {
        rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
            .map(|der: rustls::pki_types::CertificateSigningRequestDer| der.as_ref().to_vec())
            .unwrap()
    }

    #[test]
    fn client_csr_subject_and_no_sans() {
        let key = KeyPair::generate().unwrap();
        let der = parse(&client_csr(&key, "ip-10-0-0-1.ec2.internal").unwrap());
        let (_, csr) = X509CertificationRequest::from_der(&der).unwrap();
        let subject = csr.certification_request_info.subject.to_string();
        assert!(
            subject.contains("CN=system:node:ip-10-0-0-1.ec2.internal"),
            "{subject}"
        );
        assert!(subject.contains("O=system:nodes"), "{subject}");
        assert!(csr
            .requested_extensions()
            .is_none_or(|mut e| e.next().is_none()));
        csr.verify_signature().unwrap();
    }

    #[test]
    fn the_servers_own_rules_accept_both() {
        use autonode_shared::csr::{check_client_csr, check_serving_csr, parse_csr};
        let name = "ip-10-0-0-1.ec2.internal";
        let ips: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap()];
        let key = KeyPair::generate().unwrap();
        let client = parse_csr(client_csr(&key, name).unwrap().as_bytes()).unwrap();
        check_client_csr(&client, name).unwrap();
        let serving = parse_csr(serving_csr(&key, name, &ips).unwrap().as_bytes()).unwrap();
        check_serving_csr(&serving, name, &[name.to_string()], &ips).unwrap();
    }

    #[test]
    fn serving_csr_has_dns_and_ips() {
        let key = KeyPair::generate().unwrap();
        let ips = ["10.0.0.1".parse().unwrap(), "2600::1".parse().unwrap()];
        let der = parse(&serving_csr(&key, "ip-10-0-0-1.ec2.internal", &ips).unwrap());
        let (_, csr) = X509CertificationRequest::from_der(&der).unwrap();
        let sans: Vec<String> = csr
            .requested_extensions()
            .into_iter()
            .flatten()
            .filter_map(|e| match e {
                ParsedExtension::SubjectAlternativeName(san) => Some(
                    san.general_names
                        .iter()
                        .map(|n| n.to_string())
                        .collect::<Vec<_>>(),
                ),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(sans.len(), 3, "{sans:?}");
        assert!(sans[0].contains("ip-10-0-0-1.ec2.internal"), "{sans:?}");
    }
}
