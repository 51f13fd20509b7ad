//! The agent's configuration: a TOML document from userData, overridden by
//! a local file (for AMI builders) and then by flags.
//!
//! The document's type, [`Document`], is shared with the server, which
//! renders it into every EC2NodeClass (see
//! [`autonode_shared::agentconfig`], which shows its keys). Nothing in it
//! is secret: userData is readable by every process on the instance and
//! hashed by Karpenter. Unknown keys are an error naming the key, so a typo
//! never silently falls back to a default.
//!
//! This module parses and validates documents; [`load`] reads the three
//! layers and yields the run's [`Settings`].

mod load;

pub use load::{load, Flags, LoadError, Node, Settings};

use crate::imds::{self, EndpointMode};
use crate::proxy::ProxySettings;
use crate::trust::ServerTrust;
use autonode_shared::agentconfig;
use hyper::Uri;
use std::path::PathBuf;
use std::time::Duration;

/// Where AMI builders may put a config that overrides userData.
pub const LOCAL_FILE: &str = agentconfig::LOCAL_FILE;
/// The deadline's default and bound, shared with the server's rendering.
pub use autonode_shared::contract::{DEFAULT_DEADLINE, MAX_DEADLINE};
/// Default directory for the agent's keys and state.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/autonode";

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("{0} is not set (put it in the userData config, in {LOCAL_FILE}, or pass a flag)")]
    Missing(&'static str),
    /// Nothing for the agent in userData, and the local file and flags are
    /// not enough: say what userData holds and where the config can go.
    #[error(
        "{key} is not set. {found}. The config can go in a MIME part of type {} or {}, \
         in the whole userData as TOML, in {LOCAL_FILE}, or in flags",
        crate::userdata::CONTENT_TYPE,
        crate::userdata::TEXT_CONTENT_TYPE
    )]
    NotInUserData {
        key: &'static str,
        found: crate::userdata::Found,
    },
    #[error("server-url {url:?}: {reason}")]
    ServerUrl { url: String, reason: &'static str },
    #[error("server-ca: {0}")]
    ServerCa(String),
    #[error("server-ca-sha256: expected 64 hex digits (sha256 of the CA certificate's DER)")]
    ServerCaPin,
    #[error("set either server-ca or server-ca-sha256, not both")]
    BothTrusts,
    #[error("deadline {value:?}: {source}")]
    Deadline {
        value: String,
        #[source]
        source: agentconfig::DeadlineError,
    },
    #[error("cluster-name {0:?}: expected 1-63 characters of a-z, 0-9, '-', '_' and '.'")]
    ClusterName(String),
    #[error(transparent)]
    UserData(#[from] crate::userdata::UserDataError),
    #[error(transparent)]
    Proxy(#[from] crate::proxy::ProxyError),
    #[error(transparent)]
    ImdsEndpoint(#[from] crate::imds::ImdsError),
}

/// One config document as written, layered userData < local file < flags:
/// the type the server renders userData from (see [`agentconfig`]).
pub use agentconfig::{Document, Options};

/// Parses a TOML document; `origin` names it in errors.
pub fn parse_document(text: &str, origin: &str) -> Result<Document, ConfigError> {
    Document::parse(text).map_err(|e| ConfigError::Parse {
        origin: origin.to_string(),
        message: e.to_string().trim_end().to_string(),
    })
}

/// Parses the config out of raw userData (any accepted form); an empty
/// document when userData holds no agent config.
pub fn document_from_user_data(raw: &[u8]) -> Result<Document, ConfigError> {
    match UserDataDocument::read(raw)? {
        UserDataDocument::Config(doc) => Ok(doc),
        UserDataDocument::Elsewhere(_) => Ok(Document::default()),
    }
}

/// Refuses the keys userData cannot set: `imds-endpoint-mode` decides how
/// userData itself is read, so only the local file, a flag or the
/// environment can set it.
pub fn refuse_in_user_data(doc: &Document) -> Result<(), ConfigError> {
    if doc.options.imds_endpoint_mode.is_some() {
        return Err(ConfigError::Parse {
            origin: "userData".into(),
            message: format!(
                "[options] imds-endpoint-mode cannot be set here: userData is read from \
                 IMDS, so the endpoint is chosen first; set it in {LOCAL_FILE} (baked into \
                 the AMI), with --imds-endpoint-mode, or with {}",
                imds::ENDPOINT_MODE_ENV
            ),
        });
    }
    Ok(())
}

/// What userData holds for the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserDataDocument {
    /// The agent's config (maybe partial), parsed.
    Config(Document),
    /// No agent config: what userData holds instead.
    Elsewhere(crate::userdata::Found),
}

impl UserDataDocument {
    /// Reads raw userData. A userData plainly meant for the agent (its MIME
    /// part, or TOML with its keys) that is invalid is an error; one that
    /// holds something else is [`UserDataDocument::Elsewhere`].
    pub fn read(raw: &[u8]) -> Result<Self, ConfigError> {
        match crate::userdata::extract(raw)? {
            crate::userdata::Extracted::Config(text) => {
                let doc = parse_document(&text, "userData")?;
                Ok(Self::Config(doc))
            }
            crate::userdata::Extracted::Elsewhere(found) => Ok(Self::Elsewhere(found)),
        }
    }

    /// The agent's document, if userData held one.
    pub fn document(&self) -> Option<&Document> {
        match self {
            Self::Config(doc) => Some(doc),
            Self::Elsewhere(_) => None,
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub server_url: Uri,
    pub server_trust: ServerTrust,
    pub cluster_name: String,
    pub deadline: Duration,
    pub state_dir: PathBuf,
    /// How the server is reached: the config's keys, else the environment.
    pub proxy: ProxySettings,
    /// From the local file (userData may not set it).
    pub imds_endpoint_mode: Option<EndpointMode>,
}

impl Config {
    /// Validates a layered document.
    pub fn resolve(doc: Document) -> Result<Self, ConfigError> {
        let url = doc.server_url.ok_or(ConfigError::Missing("server-url"))?;
        let server_trust = match (doc.server_ca, doc.server_ca_sha256) {
            (Some(_), Some(_)) => return Err(ConfigError::BothTrusts),
            (Some(pem), None) => ServerTrust::Ca(parse_ca(&pem)?),
            (None, Some(pin)) => ServerTrust::Sha256Pin(parse_pin(&pin)?),
            (None, None) => return Err(ConfigError::Missing("server-ca or server-ca-sha256")),
        };
        let cluster_name = doc
            .cluster_name
            .ok_or(ConfigError::Missing("cluster-name"))?;
        validate_cluster_name(&cluster_name)?;
        let deadline = match doc.options.deadline {
            Some(value) => parse_deadline(&value)?,
            None => DEFAULT_DEADLINE,
        };
        let proxy = ProxySettings::from_process_env(
            doc.options.https_proxy.as_deref(),
            doc.options.no_proxy.as_deref(),
        )?;
        let imds_endpoint_mode = doc
            .options
            .imds_endpoint_mode
            .as_deref()
            .map(|mode| EndpointMode::parse(mode, imds::MODE_KEY))
            .transpose()?;
        Ok(Config {
            server_url: parse_server_url(&url)?,
            server_trust,
            cluster_name,
            deadline,
            state_dir: PathBuf::from(
                doc.options
                    .state_dir
                    .as_deref()
                    .unwrap_or(DEFAULT_STATE_DIR),
            ),
            proxy,
            imds_endpoint_mode,
        })
    }
}

impl Config {
    /// Layers userData under `upper` (the local file over flags' base) and
    /// validates. A userData without agent config is ignored when `upper`
    /// is complete (returned, to be logged); when `upper` is not, the error
    /// says what userData holds instead.
    pub fn resolve_layers(
        user_data: UserDataDocument,
        upper: Document,
    ) -> Result<(Self, Option<crate::userdata::Found>), ConfigError> {
        match user_data {
            UserDataDocument::Config(doc) => Ok((Self::resolve(doc.overlay(upper))?, None)),
            UserDataDocument::Elsewhere(found) => match Self::resolve(upper) {
                Ok(config) => Ok((config, Some(found))),
                Err(ConfigError::Missing(key)) => Err(ConfigError::NotInUserData { key, found }),
                Err(other) => Err(other),
            },
        }
    }
}

fn parse_server_url(url: &str) -> Result<Uri, ConfigError> {
    agentconfig::check_server_url(url).map_err(|reason| ConfigError::ServerUrl {
        url: url.to_string(),
        reason,
    })
}

fn parse_ca(pem: &str) -> Result<Vec<Vec<u8>>, ConfigError> {
    agentconfig::parse_ca_pem(pem).map_err(ConfigError::ServerCa)
}

/// Accepts plain hex, optionally with `sha256:` in front or `:` between
/// bytes (as `openssl x509 -fingerprint -sha256` prints it).
pub fn parse_pin(pin: &str) -> Result<[u8; 32], ConfigError> {
    let hex: String = pin
        .trim()
        .trim_start_matches("sha256:")
        .chars()
        .filter(|c| *c != ':')
        .collect();
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(ConfigError::ServerCaPin);
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte =
            u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| ConfigError::ServerCaPin)?;
    }
    Ok(out)
}

fn validate_cluster_name(name: &str) -> Result<(), ConfigError> {
    if agentconfig::is_valid_cluster_name(name) {
        Ok(())
    } else {
        Err(ConfigError::ClusterName(name.to_string()))
    }
}

/// `"90s"`, `"10m"`, `"1h"` or a number of seconds, at most
/// [`MAX_DEADLINE`]: the rule the server renders by
/// ([`agentconfig::parse_deadline`]).
pub fn parse_deadline(value: &str) -> Result<Duration, ConfigError> {
    agentconfig::parse_deadline(value).map_err(|source| ConfigError::Deadline {
        value: value.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIN: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn doc(text: &str) -> Document {
        parse_document(text, "test").unwrap()
    }

    #[test]
    fn full_document_resolves() {
        let config = Config::resolve(doc(&format!(
            "server-url = \"https://10.1.2.3:8443\"\nserver-ca-sha256 = \"{PIN}\"\ncluster-name = \"prod-1\"\n\
             [options]\ndeadline = \"5m\"\nstate-dir = \"/tmp/s\"\n"
        )))
        .unwrap();
        assert_eq!(config.server_url.host(), Some("10.1.2.3"));
        assert_eq!(config.deadline, Duration::from_secs(300));
        assert_eq!(config.state_dir, PathBuf::from("/tmp/s"));
        assert!(matches!(config.server_trust, ServerTrust::Sha256Pin(p) if p[1] == 0x11));
    }

    #[test]
    fn unknown_key_is_named() {
        let err = parse_document(
            "server-url = \"https://x\"\ntoken = \"s3cret\"\n",
            "userData",
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("userData") && text.contains("token"),
            "{text}"
        );
        let err = parse_document("[options]\ndeadlin = \"5m\"\n", "userData").unwrap_err();
        assert!(err.to_string().contains("deadlin"), "{err}");
    }

    #[test]
    fn layers_override_key_by_key() {
        let user_data = doc(&format!(
            "server-url = \"https://a\"\nserver-ca-sha256 = \"{PIN}\"\ncluster-name = \"c\"\n"
        ));
        let local = doc("server-url = \"https://b\"\nserver-ca = \"pem\"\n");
        let merged = user_data.overlay(local);
        assert_eq!(merged.server_url.as_deref(), Some("https://b"));
        assert_eq!(merged.server_ca.as_deref(), Some("pem"));
        assert_eq!(merged.server_ca_sha256, None);
        assert_eq!(merged.cluster_name.as_deref(), Some("c"));
    }

    #[test]
    fn invalid_values_are_refused() {
        let base = |extra: &str| {
            Config::resolve(doc(&format!(
                "cluster-name = \"c\"\nserver-ca-sha256 = \"{PIN}\"\n{extra}"
            )))
        };
        assert!(matches!(base(""), Err(ConfigError::Missing("server-url"))));
        assert!(matches!(
            base("server-url = \"http://x\""),
            Err(ConfigError::ServerUrl { .. })
        ));
        assert!(matches!(
            base("server-url = \"https://u:p@x\""),
            Err(ConfigError::ServerUrl { .. })
        ));
        let err = base("server-url = \"https://x\"\n[options]\ndeadline = \"20m\"").unwrap_err();
        assert!(err.to_string().contains("15m"), "{err}");
        let err = Config::resolve(doc(
            "server-url = \"https://x\"\ncluster-name = \"c\"\nserver-ca-sha256 = \"ab\"\n",
        ));
        assert!(matches!(err, Err(ConfigError::ServerCaPin)));
        let err = Config::resolve(doc(
            "server-url = \"https://x\"\ncluster-name = \"c\"\nserver-ca = \"nope\"\n",
        ));
        assert!(matches!(err, Err(ConfigError::ServerCa(_))));
    }

    fn complete() -> Document {
        doc(&format!(
            "server-url = \"https://10.0.0.1\"\nserver-ca-sha256 = \"{PIN}\"\ncluster-name = \"c\"\n"
        ))
    }

    #[test]
    fn user_data_without_our_config_is_ignored_when_the_rest_is_complete() {
        for raw in [
            &b"echo hello from a script without #!\n"[..],
            b"[settings.kubernetes]\napi-server = \"https://x\"\n",
            b"#cloud-config\nruncmd: [true]\n",
            br#"{"ignition": {"version": "3.4.0"}}"#,
            b"",
        ] {
            let read = UserDataDocument::read(raw).unwrap();
            let (config, ignored) = Config::resolve_layers(read, complete()).unwrap();
            assert_eq!(config.cluster_name, "c");
            assert!(ignored.is_some(), "{raw:?}");
        }
    }

    #[test]
    fn missing_config_says_what_user_data_holds_and_where_config_goes() {
        let raw = "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=b\n\n\
            --b\nContent-Type: text/x-shellscript\n\n#!/bin/sh\n--b\n\
            Content-Type: text/cloud-config\n\n#cloud-config\n--b--\n";
        let read = UserDataDocument::read(raw.as_bytes()).unwrap();
        let err = Config::resolve_layers(read, Document::default()).unwrap_err();
        let text = err.to_string();
        for needle in [
            "server-url is not set",
            "userData: 2 MIME parts: text/x-shellscript, text/cloud-config",
            "application/x-autonode-config or text/x-autonode-config",
            "whole userData as TOML",
            LOCAL_FILE,
            "flags",
        ] {
            assert!(text.contains(needle), "{needle:?} not in {text}");
        }
        let read = UserDataDocument::read(b"").unwrap();
        let err = Config::resolve_layers(read, Document::default()).unwrap_err();
        assert!(err.to_string().contains("userData: empty"), "{err}");
    }

    #[test]
    fn user_data_meant_for_us_is_layered_and_its_errors_are_hard() {
        let read = UserDataDocument::read(b"cluster-name = \"from-user-data\"\n").unwrap();
        let mut upper = complete();
        upper.cluster_name = None;
        let (config, ignored) = Config::resolve_layers(read, upper.clone()).unwrap();
        assert_eq!(
            (config.cluster_name.as_str(), ignored),
            ("from-user-data", None)
        );
        // Complete locally or not, a broken config of ours is an error.
        for raw in [
            &b"server-url = \"https://x\"\ntoken = \"t\"\n"[..],
            b"server-url = \"https://x\n",
        ] {
            let err = UserDataDocument::read(raw).unwrap_err();
            assert!(err.to_string().starts_with("userData: "), "{err}");
        }
        // A part of ours that leaves a key unset is the plain Missing.
        let read = UserDataDocument::read(b"cluster-name = \"c\"\n").unwrap();
        let err = Config::resolve_layers(read, Document::default()).unwrap_err();
        assert!(matches!(err, ConfigError::Missing("server-url")), "{err}");
    }

    #[test]
    fn network_options_layer_and_resolve() {
        let base = format!(
            "server-url = \"https://join.example:8443\"\nserver-ca-sha256 = \"{PIN}\"\n\
             cluster-name = \"c\"\n[options]\n"
        );
        let user_data = doc(&format!(
            "{base}https-proxy = \"http://a:1\"\nno-proxy = \"x\"\n"
        ));
        let local = doc("[options]\nhttps-proxy = \"http://b:2\"\nimds-endpoint-mode = \"ipv6\"\n");
        let config = Config::resolve(user_data.overlay(local)).unwrap();
        assert_eq!(config.imds_endpoint_mode, Some(EndpointMode::Ipv6));
        let crate::proxy::Route::Proxy(proxy) = config.proxy.route("join.example") else {
            panic!("expected the local file's proxy");
        };
        assert_eq!(proxy.address(), "b:2");
        // userData's no-proxy still applies.
        assert_ne!(config.proxy.route("x"), config.proxy.route("join.example"));

        let err = Config::resolve(doc(&format!("{base}https-proxy = \"ftp://p\"\n")));
        let text = err.unwrap_err().to_string();
        assert!(text.contains("[options] https-proxy"), "{text}");
        let err = Config::resolve(doc(&format!("{base}imds-endpoint-mode = \"v6\"\n")));
        let text = err.unwrap_err().to_string();
        assert!(
            text.contains("imds-endpoint-mode") && text.contains("IPv6"),
            "{text}"
        );
    }

    #[test]
    fn user_data_cannot_choose_the_imds_endpoint() {
        let user_data = doc("[options]\nimds-endpoint-mode = \"IPv6\"\n");
        let text = refuse_in_user_data(&user_data).unwrap_err().to_string();
        assert!(
            text.contains("userData") && text.contains(LOCAL_FILE),
            "{text}"
        );
        assert!(refuse_in_user_data(&doc("[options]\nhttps-proxy = \"http://p:1\"\n")).is_ok());
    }

    /// The userData the server renders (its pinned outputs, every form)
    /// parses here and resolves to the values it was rendered from.
    #[test]
    fn the_servers_rendered_documents_resolve() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../server/testdata/userdata");
        let cas: Vec<Vec<u8>> = ["ca-a.pem", "ca-b.pem"]
            .iter()
            .flat_map(|name| {
                let pem = std::fs::read_to_string(format!("{dir}/{name}")).unwrap();
                agentconfig::parse_ca_pem(&pem).unwrap()
            })
            .collect();
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let raw = std::fs::read(&path).unwrap();
            let document = match path.extension().and_then(|e| e.to_str()) {
                Some("toml") => document_from_user_data(&raw).unwrap(),
                // The Ignition form is not ours: it writes the TOML form
                // to LOCAL_FILE, which the server's tests check.
                _ => continue,
            };
            let text = String::from_utf8(raw).unwrap();
            assert_eq!(parse_document(&text, "t").unwrap(), document);
            let config = Config::resolve(document.clone()).unwrap();
            assert_eq!(
                Some(config.cluster_name.as_str()),
                document.cluster_name.as_deref()
            );
            let deadline = document.options.deadline.as_deref().map(parse_deadline);
            let deadline = deadline.transpose().unwrap().unwrap_or(DEFAULT_DEADLINE);
            assert_eq!(config.deadline, deadline);
            // Trusted: the test CAs the server was given, and nothing else.
            match config.server_trust {
                ServerTrust::Ca(ders) => assert!(ders.iter().all(|der| cas.contains(der))),
                ServerTrust::Sha256Pin(pin) => {
                    assert!(cas
                        .iter()
                        .any(
                            |der| parse_pin(&autonode_shared::proof::fingerprint(der)).unwrap()
                                == pin
                        ))
                }
            }
            seen += 1;
        }
        assert_eq!(seen, 8, "the server's pinned outputs");
    }

    #[test]
    fn deadlines_and_pins_parse() {
        assert_eq!(parse_deadline("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_deadline("10m").unwrap(), Duration::from_secs(600));
        assert!(parse_deadline("0s").is_err());
        assert!(parse_deadline("5d").is_err());
        let colons: String = PIN
            .as_bytes()
            .chunks(2)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect::<Vec<_>>()
            .join(":");
        assert_eq!(
            parse_pin(&format!("sha256:{colons}")).unwrap(),
            parse_pin(PIN).unwrap()
        );
    }
}
