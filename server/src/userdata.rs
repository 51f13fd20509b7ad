//! The agent's config as EC2NodeClass `spec.userData`, rendered from the
//! server's own settings.
//!
//! Karpenter hands an `amiFamily: Custom` class's userData to each instance
//! verbatim, and the agent reads it as its TOML config (see the agent's
//! `config` module): the join API's public URL, how to trust the join API's
//! CA, the cluster name and options. Nothing here is secret or rotates.
//!
//! **The output is byte-stable.** Karpenter hashes userData into the class's
//! drift hash: any byte that changes (key order, quoting, whitespace, PEM
//! line breaks) makes Karpenter replace *every* node of that class. So the
//! document is written by hand here, not by a TOML serializer whose quoting
//! choices may change between versions; the same settings always give the
//! same bytes, and inputs are normalised first (the CA is re-encoded from
//! its DER, the deadline is written in one canonical unit).
//!
//! **The CA is pinned by default** ([`CaForm::Pin`]): `server-ca-sha256` is
//! the SHA-256 of the CA certificate's DER. It is short (userData is limited
//! to 16 KiB) and stays valid across rotations of the serving certificate;
//! it only changes when the CA does. The join API must then present the CA
//! certificate in its chain. [`CaForm::Pem`] embeds the CA bundle instead,
//! for a CA that is not in the served chain.

use autonode_shared::agentconfig;
use std::fmt::Write as _;
use std::time::Duration;
use thiserror::Error;

/// Longest agent deadline: Karpenter's registration limit.
pub const MAX_DEADLINE: Duration = Duration::from_secs(900);

/// First line of every rendered document: what an operator sees in the
/// EC2 console or `kubectl get ec2nodeclass -o yaml`.
pub const HEADER: &str =
    "# autonode agent config, kept by autonode-server: edits here are reverted.\n";

/// Why the settings cannot be rendered.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RenderError {
    #[error("public URL {url:?}: {reason}")]
    PublicUrl { url: String, reason: &'static str },
    #[error("join CA: {0}")]
    Ca(String),
    #[error("cluster name {0:?}: expected 1-63 characters of a-z, 0-9, '-', '_' and '.'")]
    ClusterName(String),
    #[error("agent deadline must be between 1s and 15m (Karpenter's registration limit)")]
    Deadline,
}

/// How the agent is told to trust the join API's CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaForm {
    /// `server-ca-sha256`: the SHA-256 of the one CA certificate's DER.
    #[default]
    Pin,
    /// `server-ca`: the CA certificates as PEM.
    Pem,
}

/// What goes into the agent's config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// The join API's URL as nodes reach it (`https://host:port`).
    pub server_url: String,
    /// The CA certificates (DER) the join API's chain leads to.
    pub ca_ders: Vec<Vec<u8>>,
    pub ca_form: CaForm,
    pub cluster_name: String,
    /// The agent's overall deadline; the agent's default when `None`.
    pub deadline: Option<Duration>,
}

impl NodeConfig {
    /// Validated settings from a PEM CA bundle.
    pub fn new(
        server_url: &str,
        ca_pem: &str,
        ca_form: CaForm,
        cluster_name: &str,
        deadline: Option<Duration>,
    ) -> Result<Self, RenderError> {
        let config = Self {
            server_url: server_url.trim_end_matches('/').to_string(),
            ca_ders: parse_ca(ca_pem)?,
            ca_form,
            cluster_name: cluster_name.to_string(),
            deadline,
        };
        config.validate()?;
        Ok(config)
    }

    /// The agent's rules, checked here so a bad setting fails at the server
    /// instead of on every node.
    fn validate(&self) -> Result<(), RenderError> {
        validate_url(&self.server_url)?;
        validate_cluster_name(&self.cluster_name)?;
        if self.ca_form == CaForm::Pin && self.ca_ders.len() != 1 {
            return Err(RenderError::Ca(
                "a pin names one certificate; give one CA, or use the PEM form for a bundle".into(),
            ));
        }
        match self.deadline {
            Some(d) if d.as_secs() == 0 || d > MAX_DEADLINE => Err(RenderError::Deadline),
            _ => Ok(()),
        }
    }
}

/// The userData: the agent's config TOML, byte-stable for equal settings.
pub fn render(config: &NodeConfig) -> String {
    let mut out = String::from(HEADER);
    line(&mut out, "server-url", &basic_string(&config.server_url));
    match config.ca_form {
        CaForm::Pin => {
            let pin = config.ca_ders.first().map(|der| ca_pin(der));
            line(
                &mut out,
                "server-ca-sha256",
                &basic_string(&pin.unwrap_or_default()),
            );
        }
        CaForm::Pem => {
            let pem: String = config.ca_ders.iter().map(|der| pem_encode(der)).collect();
            line(&mut out, "server-ca", &format!("\"\"\"\n{pem}\"\"\""));
        }
    }
    line(
        &mut out,
        "cluster-name",
        &basic_string(&config.cluster_name),
    );
    if let Some(deadline) = config.deadline {
        out.push_str("\n[options]\n");
        line(
            &mut out,
            "deadline",
            &basic_string(&canonical_duration(deadline)),
        );
    }
    out
}

/// Lowercase hex SHA-256 of a certificate's DER: what `server-ca-sha256`
/// holds.
pub fn ca_pin(der: &[u8]) -> String {
    // The same digest the report proofs use for key fingerprints.
    autonode_shared::proof::fingerprint(der)
}

fn line(out: &mut String, key: &str, value: &str) {
    // Writing into a String cannot fail.
    let _ = writeln!(out, "{key} = {value}");
}

/// A TOML basic string, escaping what TOML requires (quote, backslash,
/// control characters) and nothing else.
fn basic_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whole hours, else whole minutes, else seconds: one spelling per value.
fn canonical_duration(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// PEM with 64-column lines, from the DER: the file's own line breaks and
/// comments never reach userData.
fn pem_encode(der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

fn parse_ca(pem: &str) -> Result<Vec<Vec<u8>>, RenderError> {
    agentconfig::parse_ca_pem(pem).map_err(RenderError::Ca)
}

fn validate_url(url: &str) -> Result<(), RenderError> {
    agentconfig::check_server_url(url)
        .map(|_| ())
        .map_err(|reason| RenderError::PublicUrl {
            url: url.to_string(),
            reason,
        })
}

fn validate_cluster_name(name: &str) -> Result<(), RenderError> {
    if agentconfig::is_valid_cluster_name(name) {
        Ok(())
    } else {
        Err(RenderError::ClusterName(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    fn config(ca: &str, form: CaForm) -> NodeConfig {
        let deadline = Some(Duration::from_secs(600));
        NodeConfig::new(
            "https://autonode.example.com:8443/",
            ca,
            form,
            "prod-1",
            deadline,
        )
        .unwrap()
    }

    #[test]
    fn pin_form_is_exact_and_stable() {
        let ca = ca_pem();
        let rendered = render(&config(&ca, CaForm::Pin));
        let pin = ca_pin(&parse_ca(&ca).unwrap()[0]);
        let expected = format!(
            "{HEADER}server-url = \"https://autonode.example.com:8443\"\n\
             server-ca-sha256 = \"{pin}\"\ncluster-name = \"prod-1\"\n\n\
             [options]\ndeadline = \"10m\"\n"
        );
        assert_eq!(rendered, expected);
        assert_eq!(pin.len(), 64);
        // Other whitespace in the CA file does not change a byte.
        let messy = format!("\n\n{}\r\n", ca.replace('\n', "\r\n"));
        assert_eq!(render(&config(&messy, CaForm::Pin)), rendered);
    }

    #[test]
    fn pem_form_embeds_the_bundle_and_options_are_optional() {
        let (a, b) = (ca_pem(), ca_pem());
        let mut both = config(&format!("{a}{b}"), CaForm::Pem);
        both.deadline = None;
        let rendered = render(&both);
        assert!(rendered.contains("server-ca = \"\"\"\n-----BEGIN CERTIFICATE-----\n"));
        assert_eq!(rendered.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(!rendered.contains("[options]"));
        assert!(rendered.lines().all(|l| l.len() <= 80), "{rendered}");
    }

    #[test]
    fn bad_settings_are_refused() {
        let ca = ca_pem();
        let new = |url: &str, ca: &str, form, name: &str, secs: Option<u64>| {
            NodeConfig::new(url, ca, form, name, secs.map(Duration::from_secs))
        };
        let ok = "https://a:1";
        assert!(matches!(
            new("http://a", &ca, CaForm::Pin, "c", None),
            Err(RenderError::PublicUrl { .. })
        ));
        assert!(matches!(
            new("https://u:p@a", &ca, CaForm::Pin, "c", None),
            Err(RenderError::PublicUrl { .. })
        ));
        assert!(matches!(
            new(ok, "nope", CaForm::Pin, "c", None),
            Err(RenderError::Ca(_))
        ));
        let two = format!("{ca}{}", ca_pem());
        assert!(matches!(
            new(ok, &two, CaForm::Pin, "c", None),
            Err(RenderError::Ca(_))
        ));
        assert!(matches!(
            new(ok, &ca, CaForm::Pin, "Prod", None),
            Err(RenderError::ClusterName(_))
        ));
        assert_eq!(
            new(ok, &ca, CaForm::Pin, "c", Some(901)),
            Err(RenderError::Deadline)
        );
        assert_eq!(
            new(ok, &ca, CaForm::Pin, "c", Some(0)),
            Err(RenderError::Deadline)
        );
    }

    #[test]
    fn strings_and_durations_have_one_spelling() {
        assert_eq!(basic_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000A\"");
        assert_eq!(canonical_duration(Duration::from_secs(90)), "90s");
        assert_eq!(canonical_duration(Duration::from_secs(600)), "10m");
        assert_eq!(canonical_duration(Duration::from_secs(3600)), "1h");
    }
}
