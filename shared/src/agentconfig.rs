//! The rules an agent config's values must follow, shared by the agent
//! (which reads the config from userData) and the server (which renders it
//! into every EC2NodeClass): a value the server writes is one the agent
//! accepts, checked by the same code.

use http::Uri;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// Where the agent reads its local config: what AMI builders may put there
/// to override userData, and where an Ignition-form userData (written by the
/// OS's own Ignition at first boot) puts the config the server renders.
pub const LOCAL_FILE: &str = "/etc/autonode/agent.toml";

/// The server URL: `https://`, a host, no credentials, no query.
pub fn check_server_url(url: &str) -> Result<Uri, &'static str> {
    let uri: Uri = url.parse().map_err(|_| "not a URL")?;
    if uri.scheme_str() != Some("https") {
        return Err("must start with https://");
    }
    let authority = uri.authority().ok_or("has no host")?;
    if authority.as_str().contains('@') {
        // userData is readable by every process on the instance.
        return Err("must not carry credentials");
    }
    if uri.query().is_some() {
        return Err("must not have a query");
    }
    Ok(uri)
}

/// A cluster name: 1-63 characters of a-z, 0-9, `-`, `_` and `.`.
pub fn is_valid_cluster_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

/// The DER certificates of a PEM bundle; at least one.
pub fn parse_ca_pem(pem: &str) -> Result<Vec<Vec<u8>>, String> {
    let certs: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("bad PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no CERTIFICATE block".into());
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_plain_https() {
        assert!(check_server_url("https://join.example.com:8443").is_ok());
        assert_eq!(
            check_server_url("http://join.example.com"),
            Err("must start with https://")
        );
        assert_eq!(
            check_server_url("https://u:p@join.example.com"),
            Err("must not carry credentials")
        );
        assert_eq!(
            check_server_url("https://join.example.com/?x=1"),
            Err("must not have a query")
        );
        assert_eq!(check_server_url("not a url"), Err("not a URL"));
    }

    #[test]
    fn cluster_names_are_dns_like() {
        assert!(is_valid_cluster_name("prod-eu-1.a_b"));
        assert!(!is_valid_cluster_name(""));
        assert!(!is_valid_cluster_name("Prod"));
        assert!(!is_valid_cluster_name(&"a".repeat(64)));
    }

    #[test]
    fn a_ca_bundle_needs_a_certificate() {
        assert_eq!(
            parse_ca_pem("nothing here"),
            Err("no CERTIFICATE block".into())
        );
    }
}
