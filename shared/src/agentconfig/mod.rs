//! The agent's config document and the rules its values must follow,
//! shared by the agent (which parses the document from userData) and the
//! server (which renders it into every EC2NodeClass): one type is the
//! contract, and a value the server writes is one the agent accepts,
//! checked by the same code.
//!
//! ```toml
//! server-url = "https://join.example.com:8443"
//! server-ca-sha256 = "3f1c…"          # or: server-ca = """-----BEGIN CERTIFICATE-----…"""
//! cluster-name = "prod-eu-1"
//! [options]
//! deadline = "10m"                      # "90s", "10m", or seconds; at most 15m
//! state-dir = "/var/lib/autonode"
//! https-proxy = "http://proxy:3128"
//! no-proxy = ".internal,10.0.0.0/8"
//! imds-endpoint-mode = "IPv6"           # the agent's local file only
//! ```
//!
//! [`Document`] is the document as written; [`Document::to_toml`] writes it
//! byte-stably (Karpenter hashes userData, so a byte that changes replaces
//! every node of a class) and [`Document::parse`] reads it back.

mod document;

pub use document::{Document, DocumentError, Options};

use crate::contract::MAX_DEADLINE;
use http::Uri;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use std::time::Duration;

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

/// Why an agent deadline is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DeadlineError {
    #[error("expected e.g. \"90s\", \"10m\" or \"1h\"")]
    Syntax,
    #[error("unit must be s, m or h")]
    Unit,
    #[error("must be positive")]
    Zero,
    #[error("must be at most 15m, Karpenter's registration limit")]
    TooLong,
}

/// A deadline as the document writes it: `"90s"`, `"10m"`, `"1h"` or a
/// number of seconds, within [`check_deadline`]'s range. What the agent
/// reads; the server's [`deadline_text`] always parses back to its value.
pub fn parse_deadline(value: &str) -> Result<Duration, DeadlineError> {
    let trimmed = value.trim();
    let (number, unit) = match trimmed.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => trimmed.split_at(i),
        None => (trimmed, "s"),
    };
    let number: u64 = number.parse().map_err(|_| DeadlineError::Syntax)?;
    let seconds = match unit {
        "s" => number,
        "m" => number.saturating_mul(60),
        "h" => number.saturating_mul(3600),
        _ => return Err(DeadlineError::Unit),
    };
    check_deadline(Duration::from_secs(seconds))
}

/// A deadline's range: positive and at most [`MAX_DEADLINE`] (Karpenter
/// deletes an instance that has not registered by then). The server checks
/// a deadline with this before it renders one, the agent when it parses.
pub fn check_deadline(deadline: Duration) -> Result<Duration, DeadlineError> {
    if deadline.is_zero() {
        return Err(DeadlineError::Zero);
    }
    if deadline > MAX_DEADLINE {
        return Err(DeadlineError::TooLong);
    }
    Ok(deadline)
}

/// A deadline's one spelling in the document (Karpenter hashes userData, so
/// one value must always give the same bytes): whole hours, else whole
/// minutes, else seconds.
pub fn deadline_text(deadline: Duration) -> String {
    match deadline.as_secs() {
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
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
mod tests;
