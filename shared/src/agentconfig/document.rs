//! The agent's config document as written: the server builds one and
//! writes it with [`Document::to_toml`], the agent parses it with
//! [`Document::parse`]. The writer is ours, not a TOML serializer's: its
//! bytes must never change for equal values (Karpenter hashes userData into
//! a class's drift hash), and a serializer may change its quoting or layout
//! between versions.

use serde::Deserialize;
use std::fmt::Write as _;
use thiserror::Error;

/// One config document: every key optional, so documents can be layered
/// (the agent's userData < local file < flags). Values are kept as written
/// (a deadline is `"10m"`, not a duration): validating them is the reader's
/// job, with the rules of [`super`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Document {
    pub server_url: Option<String>,
    /// Inline PEM of the CA that signs the server's certificate.
    pub server_ca: Option<String>,
    /// Hex sha256 of the CA certificate's DER; the server presents the CA
    /// in its chain.
    pub server_ca_sha256: Option<String>,
    pub cluster_name: Option<String>,
    #[serde(default)]
    pub options: Options,
}

/// The `[options]` table: each has a default on the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Options {
    pub deadline: Option<String>,
    pub state_dir: Option<String>,
    /// Wins over `HTTPS_PROXY`; `""` means no proxy.
    pub https_proxy: Option<String>,
    /// Wins over `NO_PROXY`.
    pub no_proxy: Option<String>,
    /// `IPv4` or `IPv6`; chooses how userData itself is read, so the agent
    /// refuses it in userData.
    pub imds_endpoint_mode: Option<String>,
}

/// A document that is not TOML, or has a key this [`Document`] lacks (a
/// typo must never fall back to a default silently): the parser's message,
/// which names the key and its line.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct DocumentError(#[from] toml::de::Error);

impl Document {
    /// Parses a TOML document.
    pub fn parse(text: &str) -> Result<Self, DocumentError> {
        Ok(toml::from_str(text)?)
    }

    /// `upper` wins key by key. The two trust keys are one setting: an
    /// upper layer that sets either replaces both.
    pub fn overlay(self, upper: Document) -> Document {
        let upper_sets_trust = upper.server_ca.is_some() || upper.server_ca_sha256.is_some();
        let (server_ca, server_ca_sha256) = if upper_sets_trust {
            (upper.server_ca, upper.server_ca_sha256)
        } else {
            (self.server_ca, self.server_ca_sha256)
        };
        let (lower, upper_options) = (self.options, upper.options);
        Document {
            server_url: upper.server_url.or(self.server_url),
            server_ca,
            server_ca_sha256,
            cluster_name: upper.cluster_name.or(self.cluster_name),
            options: Options {
                deadline: upper_options.deadline.or(lower.deadline),
                state_dir: upper_options.state_dir.or(lower.state_dir),
                https_proxy: upper_options.https_proxy.or(lower.https_proxy),
                no_proxy: upper_options.no_proxy.or(lower.no_proxy),
                imds_endpoint_mode: upper_options
                    .imds_endpoint_mode
                    .or(lower.imds_endpoint_mode),
            },
        }
    }

    /// The document as TOML, one spelling per value: keys in the struct's
    /// order, unset keys left out, `[options]` only when an option is set
    /// (after a blank line), strings as basic strings (`string`).
    /// [`Document::parse`] gives back an equal document.
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        let top = [
            ("server-url", &self.server_url),
            ("server-ca", &self.server_ca),
            ("server-ca-sha256", &self.server_ca_sha256),
            ("cluster-name", &self.cluster_name),
        ];
        write_keys(&mut out, &top);
        let o = &self.options;
        let options = [
            ("deadline", &o.deadline),
            ("state-dir", &o.state_dir),
            ("https-proxy", &o.https_proxy),
            ("no-proxy", &o.no_proxy),
            ("imds-endpoint-mode", &o.imds_endpoint_mode),
        ];
        if options.iter().any(|(_, value)| value.is_some()) {
            out.push_str("\n[options]\n");
            write_keys(&mut out, &options);
        }
        out
    }
}

/// `key = value` lines for the keys that are set, in the order given.
fn write_keys(out: &mut String, keys: &[(&str, &Option<String>)]) {
    for (key, value) in keys {
        if let Some(value) = value {
            // Writing into a String cannot fail.
            let _ = writeln!(out, "{key} = {}", string(value));
        }
    }
}

/// A TOML basic string escaping what TOML requires (quote, backslash,
/// control characters) and nothing else. A value with line breaks (a PEM
/// bundle) is a multi-line basic string whose text starts on the next line,
/// so it reads in userData as the file it came from; TOML drops that first
/// line break when parsing.
pub(super) fn string(value: &str) -> String {
    let multi_line = value.contains('\n');
    let (open, close) = if multi_line {
        ("\"\"\"\n", "\"\"\"")
    } else {
        ("\"", "\"")
    };
    let mut out = String::with_capacity(value.len() + 8);
    out.push_str(open);
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' if multi_line => out.push('\n'),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push_str(close);
    out
}
