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
//! settings become the agent's own document type
//! ([`agentconfig::Document`], the one the agent parses), written by its
//! own writer rather than a TOML serializer whose quoting choices may change
//! between versions; the same settings always give the same bytes, and
//! inputs are normalised first (the CA is re-encoded from its DER, the
//! deadline is written in one canonical unit, [`agentconfig::deadline_text`],
//! and checked by the agent's own rule). The tests pin the bytes of
//! `render-userdata`'s outputs (`server/testdata/userdata/`).
//!
//! **The CA is pinned by default** ([`CaForm::Pin`]): `server-ca-sha256` is
//! the SHA-256 of the CA certificate's DER. It is short (userData is limited
//! to 16 KiB) and stays valid across rotations of the serving certificate;
//! it only changes when the CA does. The join API must then present the CA
//! certificate in its chain. [`CaForm::Pem`] embeds the CA bundle instead,
//! for a CA that is not in the served chain.
//!
//! **Two formats** ([`Format`]). The TOML document is the userData of AMIs
//! that leave userData to autonode. On Ignition-first AMIs (Flatcar, Fedora
//! CoreOS, RHCOS) the OS's own Ignition consumes userData at first boot and
//! would refuse TOML, failing the boot; for those, [`render_ignition`] wraps
//! the very same TOML bytes in an Ignition config that writes them to the
//! agent's local config file ([`agentconfig::LOCAL_FILE`]). A class chooses
//! with the annotation [`FORMAT_ANNOTATION`]; TOML when it is absent.

use autonode_shared::agentconfig::{self, Document, Options};
use autonode_shared::pem;
use serde_json::Value;
use std::time::Duration;
use thiserror::Error;

/// First line of every rendered document: what an operator sees in the
/// EC2 console or `kubectl get ec2nodeclass -o yaml`.
pub const HEADER: &str =
    "# autonode agent config, kept by autonode-server: edits here are reverted.\n";

/// Defined with every other `autonode.dev/*` name in [`crate::kube::marks`].
pub use crate::kube::marks::FORMAT_ANNOTATION;

/// The Ignition spec version of [`render_ignition`]'s config: the lowest of
/// spec 3, because every Ignition that reads spec 3 reads 3.0.0 (newer ones
/// translate it up), while an older Ignition refuses a version newer than
/// its own (RHCOS 4.6 reads at most 3.1.0), and Flatcar, Fedora CoreOS and
/// RHCOS images stay in use for years. 3.0.0 has all this config needs: one
/// file with inline contents, a mode and `overwrite`. Spec 2 is no option:
/// Fedora CoreOS and RHCOS 4.6+ refuse it.
pub const IGNITION_VERSION: &str = "3.0.0";

/// The local config file's mode: world-readable, as userData is (nothing in
/// it is secret), written by root only.
pub const LOCAL_FILE_MODE: u32 = 0o644;

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
    Deadline(#[source] agentconfig::DeadlineError),
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

/// The form userData takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Format {
    /// The agent's config TOML itself ([`render`]).
    #[default]
    Toml,
    /// An Ignition config writing that TOML to the agent's local config
    /// file ([`render_ignition`]).
    Ignition,
}

/// A [`FORMAT_ANNOTATION`] value that names no [`Format`].
#[derive(Debug, Error, PartialEq, Eq)]
#[error("userData format {0:?} is unknown: expected \"toml\" or \"ignition\"")]
pub struct UnknownFormat(pub String);

impl Format {
    /// Every format, in a fixed order.
    pub const ALL: [Format; 2] = [Format::Toml, Format::Ignition];

    /// The format's name, as the annotation and `--format` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Toml => "toml",
            Format::Ignition => "ignition",
        }
    }

    /// The format named `value`, spelled exactly as [`Format::as_str`]
    /// does: a near miss (`Ignition`, ` toml`) is refused rather than
    /// guessed, since a wrong guess replaces every node of the class.
    pub fn parse(value: &str) -> Result<Self, UnknownFormat> {
        Self::ALL
            .into_iter()
            .find(|format| format.as_str() == value)
            .ok_or_else(|| UnknownFormat(value.to_string()))
    }
}

/// The userData in every [`Format`], rendered once from the same settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub toml: String,
    pub ignition: String,
}

impl Rendered {
    /// Both forms of `config`'s userData.
    pub fn new(config: &UserDataSettings) -> Self {
        let toml = render(config);
        let ignition = ignition_writing(&toml);
        Self { toml, ignition }
    }

    /// The userData in `format`.
    pub fn get(&self, format: Format) -> &str {
        match format {
            Format::Toml => &self.toml,
            Format::Ignition => &self.ignition,
        }
    }
}

/// What goes into the agent's config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserDataSettings {
    /// The join API's URL as nodes reach it (`https://host:port`).
    pub server_url: String,
    /// The CA certificates (DER) the join API's chain leads to.
    pub ca_ders: Vec<Vec<u8>>,
    pub ca_form: CaForm,
    pub cluster_name: String,
    /// The agent's overall deadline; the agent's default when `None`.
    pub deadline: Option<Duration>,
}

impl UserDataSettings {
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
            Some(d) => agentconfig::check_deadline(d)
                .map(|_| ())
                .map_err(RenderError::Deadline),
            None => Ok(()),
        }
    }

    /// The agent's config document these settings make: the value
    /// [`render`] writes, and the agent parses back.
    pub fn document(&self) -> Document {
        let (server_ca, server_ca_sha256) = match self.ca_form {
            // validate() allows exactly one CA in this form.
            CaForm::Pin => {
                let pin = self.ca_ders.first().map(|der| ca_pin(der));
                (None, Some(pin.unwrap_or_default()))
            }
            CaForm::Pem => (Some(pem::bundle(&self.ca_ders)), None),
        };
        Document {
            server_url: Some(self.server_url.clone()),
            server_ca,
            server_ca_sha256,
            cluster_name: Some(self.cluster_name.clone()),
            options: Options {
                deadline: self.deadline.map(agentconfig::deadline_text),
                ..Options::default()
            },
        }
    }
}

/// The userData: the agent's config TOML, byte-stable for equal settings.
pub fn render(config: &UserDataSettings) -> String {
    format!("{HEADER}{}", config.document().to_toml())
}

/// The userData in `format`.
pub fn render_as(config: &UserDataSettings, format: Format) -> String {
    match format {
        Format::Toml => render(config),
        Format::Ignition => render_ignition(config),
    }
}

/// The userData as an Ignition config (spec [`IGNITION_VERSION`]) that
/// writes exactly [`render`]'s bytes to [`agentconfig::LOCAL_FILE`], mode
/// [`LOCAL_FILE_MODE`]; byte-stable like [`render`].
pub fn render_ignition(config: &UserDataSettings) -> String {
    ignition_writing(&render(config))
}

/// The Ignition config writing `toml` to the local config file, as compact
/// JSON written by hand so its bytes never depend on a serializer's key
/// order: keys in a fixed order, the contents as a base64 `data:` URL
/// (one spelling per content, unlike percent-encoding's choices).
///
/// `overwrite` is true: Ignition runs once, at first boot, so the only
/// file it can meet there is one baked into the image, and spec 3 fails the
/// boot on an existing file it may not overwrite. The class's config, which
/// the operator chose, wins over the image's.
fn ignition_writing(toml: &str) -> String {
    use base64::Engine as _;
    let data = base64::engine::general_purpose::STANDARD.encode(toml);
    // serde_json's Display of a string value is its JSON literal, escaped.
    let path = Value::from(agentconfig::LOCAL_FILE);
    format!(
        "{{\"ignition\":{{\"version\":\"{IGNITION_VERSION}\"}},\
         \"storage\":{{\"files\":[{{\"path\":{path},\
         \"contents\":{{\"source\":\"data:;base64,{data}\"}},\
         \"mode\":{LOCAL_FILE_MODE},\"overwrite\":true}}]}}}}\n"
    )
}

/// Lowercase hex SHA-256 of a certificate's DER: what `server-ca-sha256`
/// holds.
pub fn ca_pin(der: &[u8]) -> String {
    // The same digest the report proofs use for key fingerprints.
    autonode_shared::proof::fingerprint(der)
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

    fn config(ca: &str, form: CaForm) -> UserDataSettings {
        let deadline = Some(Duration::from_secs(600));
        UserDataSettings::new(
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
            UserDataSettings::new(url, ca, form, name, secs.map(Duration::from_secs))
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
            Err(RenderError::Deadline(agentconfig::DeadlineError::TooLong))
        );
        assert_eq!(
            new(ok, &ca, CaForm::Pin, "c", Some(0)),
            Err(RenderError::Deadline(agentconfig::DeadlineError::Zero))
        );
    }

    /// The file an Ignition config writes: (path, decoded contents, mode,
    /// overwrite), by a reading independent of how it was written.
    fn ignition_file(ignition: &str) -> (String, String, u64, bool) {
        use base64::Engine as _;
        let doc: serde_json::Value = serde_json::from_str(ignition).unwrap();
        assert_eq!(doc["ignition"]["version"], "3.0.0");
        let files = doc["storage"]["files"].as_array().unwrap();
        assert_eq!(files.len(), 1, "{ignition}");
        let file = &files[0];
        let source = file["contents"]["source"].as_str().unwrap();
        let data = source.strip_prefix("data:;base64,").unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap();
        (
            file["path"].as_str().unwrap().to_string(),
            String::from_utf8(bytes).unwrap(),
            file["mode"].as_u64().unwrap(),
            file["overwrite"].as_bool().unwrap(),
        )
    }

    #[test]
    fn the_ignition_form_writes_exactly_the_toml_form() {
        let ca = ca_pem();
        for form in [CaForm::Pin, CaForm::Pem] {
            let config = config(&ca, form);
            let ignition = render_ignition(&config);
            let (path, contents, mode, overwrite) = ignition_file(&ignition);
            assert_eq!(path, "/etc/autonode/agent.toml");
            assert_eq!(path, agentconfig::LOCAL_FILE);
            assert_eq!(contents, render(&config), "byte-identical to the TOML form");
            assert_eq!(mode, 0o644);
            assert!(overwrite);
            // Only the file: no users, units or remote configs.
            let doc: serde_json::Value = serde_json::from_str(&ignition).unwrap();
            let keys: Vec<&String> = doc.as_object().unwrap().keys().collect();
            assert_eq!(keys, ["ignition", "storage"]);
            assert_eq!(doc["ignition"].as_object().unwrap().len(), 1);
            assert_eq!(doc["storage"].as_object().unwrap().len(), 1);
        }
    }

    #[test]
    fn the_ignition_form_is_byte_stable() {
        let ca = ca_pem();
        let rendered = render_ignition(&config(&ca, CaForm::Pin));
        let messy = format!("\n{}\r\n", ca.replace('\n', "\r\n"));
        assert_eq!(render_ignition(&config(&messy, CaForm::Pin)), rendered);
        // Keys in a fixed order, compact, one trailing newline.
        let data = rendered
            .split("data:;base64,")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap();
        let expected = format!(
            "{{\"ignition\":{{\"version\":\"3.0.0\"}},\"storage\":{{\"files\":[{{\
             \"path\":\"/etc/autonode/agent.toml\",\"contents\":{{\"source\":\
             \"data:;base64,{data}\"}},\"mode\":420,\"overwrite\":true}}]}}}}\n"
        );
        assert_eq!(rendered, expected);
        // A setting that changes the TOML changes the Ignition form too.
        let mut other = config(&ca, CaForm::Pin);
        other.deadline = None;
        assert_ne!(render_ignition(&other), rendered);
    }

    #[test]
    fn formats_have_one_spelling_each() {
        for format in Format::ALL {
            assert_eq!(Format::parse(format.as_str()), Ok(format));
        }
        assert_eq!(Format::default(), Format::Toml);
        for bad in ["", "Ignition", " toml", "json", "ignition\n"] {
            let err = Format::parse(bad).unwrap_err();
            assert_eq!(err, UnknownFormat(bad.to_string()));
            assert!(
                err.to_string().contains("\"toml\" or \"ignition\""),
                "{err}"
            );
        }
        let config = config(&ca_pem(), CaForm::Pin);
        let both = Rendered::new(&config);
        assert_eq!(both.get(Format::Toml), render(&config));
        assert_eq!(both.get(Format::Ignition), render_ignition(&config));
        assert_eq!(render_as(&config, Format::Ignition), both.ignition);
        assert_eq!(render_as(&config, Format::Toml), both.toml);
    }

    /// One `render-userdata` run: (files' name, --public-url, --join-ca-file,
    /// --join-ca-form, --cluster-name, --agent-deadline).
    type Golden = (
        &'static str,
        &'static str,
        &'static str,
        CaForm,
        &'static str,
        Option<u64>,
    );

    /// The flag combinations whose outputs were captured from
    /// `autonode-server render-userdata` (both formats) before the render
    /// moved onto the shared document type, in `server/testdata/userdata/`.
    const GOLDEN: [Golden; 8] = [
        (
            "pin-default",
            "https://autonode.example.com:8443",
            "ca-a",
            CaForm::Pin,
            "prod-1",
            None,
        ),
        (
            "pin-10m",
            "https://autonode.example.com:8443/",
            "ca-a",
            CaForm::Pin,
            "prod-1",
            Some(600),
        ),
        (
            "pin-90s",
            "https://10.1.2.3",
            "ca-b",
            CaForm::Pin,
            "a.b_c-9",
            Some(90),
        ),
        (
            "pin-14m-ipv6",
            "https://[fd00::1]:443",
            "ca-a",
            CaForm::Pin,
            "x",
            Some(840),
        ),
        (
            "pin-2m",
            "https://join.example.com",
            "ca-b",
            CaForm::Pin,
            "z",
            Some(120),
        ),
        (
            "pem-one",
            "https://autonode.example.com:8443",
            "ca-a",
            CaForm::Pem,
            "prod-1",
            None,
        ),
        (
            "pem-bundle-61s",
            "https://join.internal/path",
            "bundle",
            CaForm::Pem,
            "prod-eu-1",
            Some(61),
        ),
        (
            "pem-bundle-15m",
            "https://join.internal:9443",
            "bundle",
            CaForm::Pem,
            "c",
            Some(900),
        ),
    ];

    fn testdata(name: &str) -> String {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/userdata");
        std::fs::read_to_string(format!("{dir}/{name}")).unwrap()
    }

    fn golden_config(golden: &Golden) -> UserDataSettings {
        let (_, url, ca, form, name, secs) = *golden;
        let ca = testdata(&format!("{ca}.pem"));
        UserDataSettings::new(url, &ca, form, name, secs.map(Duration::from_secs)).unwrap()
    }

    #[test]
    fn every_form_renders_the_bytes_it_always_did() {
        for golden in &GOLDEN {
            let config = golden_config(golden);
            let name = golden.0;
            assert_eq!(render(&config), testdata(&format!("{name}.toml")), "{name}");
            let ignition = render_as(&config, Format::Ignition);
            assert_eq!(ignition, testdata(&format!("{name}.ign")), "{name}");
        }
    }

    #[test]
    fn what_the_server_renders_the_agent_parses_to_the_same_values() {
        for golden in &GOLDEN {
            let config = golden_config(golden);
            let document = config.document();
            let parsed = Document::parse(&render(&config)).unwrap();
            assert_eq!(parsed, document, "{}", golden.0);
            let (_, contents, _, _) = ignition_file(&render_ignition(&config));
            assert_eq!(Document::parse(&contents).unwrap(), document);
            // The values are the settings, as the agent's rules read them.
            let url = document.server_url.as_deref().unwrap();
            assert!(agentconfig::check_server_url(url).is_ok());
            assert_eq!(url, config.server_url);
            assert_eq!(document.cluster_name.as_deref(), Some(golden.4));
            match config.ca_form {
                CaForm::Pin => {
                    assert_eq!(document.server_ca_sha256, Some(ca_pin(&config.ca_ders[0])))
                }
                CaForm::Pem => assert_eq!(
                    agentconfig::parse_ca_pem(document.server_ca.as_deref().unwrap()),
                    Ok(config.ca_ders.clone())
                ),
            }
            let deadline = golden
                .5
                .map(|secs| agentconfig::deadline_text(Duration::from_secs(secs)));
            assert_eq!(document.options.deadline, deadline);
            assert_eq!(
                document.options,
                Options {
                    deadline,
                    ..Options::default()
                }
            );
        }
    }
}
