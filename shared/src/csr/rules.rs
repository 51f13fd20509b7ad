//! The naming rules: what a kubelet client or serving CSR may ask for, with
//! names the server took from EC2 and the NodeClaim (never from the request).

use std::net::IpAddr;

use super::{check_key, CsrError, ParsedCsr, NODES_GROUP, NODE_USER_PREFIX};

// ---------------------------------------------------------------------------
// Rules
// ---------------------------------------------------------------------------

/// Checks a kubelet client CSR for `node_name`: CN exactly
/// `system:node:<node_name>`, O exactly `["system:nodes"]`, nothing else in
/// the subject, no SANs of any kind, and a key within [`check_key`].
pub fn check_client_csr(csr: &ParsedCsr, node_name: &str) -> Result<(), CsrError> {
    check_node_subject(csr, node_name)?;
    if csr.has_any_san() {
        return Err(CsrError::HasSans {
            dns: csr.dns_names.clone(),
            ips: csr.ip_addresses.clone(),
            emails: csr.email_addresses.clone(),
            uris: csr.uris.clone(),
        });
    }
    check_key(&csr.key)
}

/// Checks a kubelet serving CSR for `node_name`: the same subject and key
/// rules as [`check_client_csr`], at least one DNS or IP SAN, every DNS SAN
/// in `allowed_dns` (ASCII case-insensitive, never a wildcard), every IP SAN
/// in `allowed_ips`, and no email or URI SANs.
///
/// `allowed_dns`/`allowed_ips` must come from EC2 for this instance, never
/// from the request.
pub fn check_serving_csr(
    csr: &ParsedCsr,
    node_name: &str,
    allowed_dns: &[String],
    allowed_ips: &[IpAddr],
) -> Result<(), CsrError> {
    check_node_subject(csr, node_name)?;
    check_no_email_or_uri(csr)?;
    if csr.dns_names.is_empty() && csr.ip_addresses.is_empty() {
        return Err(CsrError::NoSans);
    }
    csr.dns_names
        .iter()
        .try_for_each(|dns| check_dns_san(dns, allowed_dns))?;
    csr.ip_addresses
        .iter()
        .try_for_each(|ip| check_ip_san(*ip, allowed_ips))?;
    check_key(&csr.key)
}

/// CN, O and "nothing else in the subject".
fn check_node_subject(csr: &ParsedCsr, node_name: &str) -> Result<(), CsrError> {
    if node_name.is_empty() {
        return Err(CsrError::EmptyNodeName);
    }
    let expected = format!("{NODE_USER_PREFIX}{node_name}");
    if csr.common_name.as_deref() != Some(expected.as_str()) {
        return Err(CsrError::BadCommonName {
            found: csr.common_name.clone(),
            expected,
        });
    }
    if csr.organizations != [NODES_GROUP] {
        return Err(CsrError::BadOrganizations {
            found: csr.organizations.clone(),
        });
    }
    if csr.other_subject_fields {
        return Err(CsrError::UnexpectedSubjectFields);
    }
    Ok(())
}

fn check_no_email_or_uri(csr: &ParsedCsr) -> Result<(), CsrError> {
    if let Some(email) = csr.email_addresses.first() {
        return Err(CsrError::ForbiddenSan {
            kind: "email",
            value: email.clone(),
        });
    }
    if let Some(uri) = csr.uris.first() {
        return Err(CsrError::ForbiddenSan {
            kind: "uri",
            value: uri.clone(),
        });
    }
    Ok(())
}

fn check_dns_san(dns: &str, allowed: &[String]) -> Result<(), CsrError> {
    // Refused before matching, so a '*' in the allow-list can never act as
    // a pattern either.
    if dns.contains('*') {
        return Err(CsrError::WildcardSan {
            found: dns.to_string(),
        });
    }
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(dns)) {
        return Ok(());
    }
    Err(CsrError::DnsSanNotAllowed {
        found: dns.to_string(),
        allowed: allowed.to_vec(),
    })
}

fn check_ip_san(ip: IpAddr, allowed: &[IpAddr]) -> Result<(), CsrError> {
    if allowed.contains(&ip) {
        return Ok(());
    }
    Err(CsrError::IpSanNotAllowed {
        found: ip,
        allowed: allowed.to_vec(),
    })
}

/// The node name in a node's user name: `"system:node:foo"` gives
/// `Some("foo")`; anything else, including an empty name, gives `None`.
pub fn node_name_from_username(username: &str) -> Option<&str> {
    username
        .strip_prefix(NODE_USER_PREFIX)
        .filter(|name| !name.is_empty())
}
