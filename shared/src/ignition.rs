//! The subset of Ignition spec v3 autonode supports: its types, parsing and
//! validation, shared so the server refuses at render time exactly what the
//! agent would refuse at apply time.
//!
//! Supported: `ignition.version` (3.0.0–3.5.0), `storage.files` (inline
//! `data:` sources, gzip compression, sha256/sha512 verification, mode,
//! numeric owner ids, overwrite), `storage.directories`, `storage.links`
//! (symbolic) and `systemd.units` (contents, enabled, mask, dropins).
//!
//! Everything else is refused by its path (`passwd`, `storage.disks`,
//! `ignition.config.merge`, `storage.files[0].append`, user names, remote
//! sources, ...) rather than ignored: the server renders this config, and a
//! node that silently skipped part of it would be a node nobody asked for.
//!
//! The types also serialise, omitting what is unset, so the server can
//! merge parsed configs and write the result back as Ignition JSON.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why a config cannot be applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("Ignition config uses `{0}`, which autonode-agent does not support")]
    Unsupported(String),
    #[error("Ignition config version {0:?} is not supported (3.0.0 to 3.5.0)")]
    Version(String),
    #[error("Ignition config is invalid: {0}")]
    Invalid(String),
}

/// The shape of the supported subset: which keys may appear where.
enum Shape {
    Object(&'static [(&'static str, Shape)]),
    Array(&'static Shape),
    Leaf,
}

const OWNER: Shape = Shape::Object(&[("id", Shape::Leaf)]);
const FILE: Shape = Shape::Object(&[
    ("path", Shape::Leaf),
    ("overwrite", Shape::Leaf),
    ("mode", Shape::Leaf),
    ("user", OWNER),
    ("group", OWNER),
    (
        "contents",
        Shape::Object(&[
            ("source", Shape::Leaf),
            ("compression", Shape::Leaf),
            ("verification", Shape::Object(&[("hash", Shape::Leaf)])),
        ]),
    ),
]);
const DIRECTORY: Shape = Shape::Object(&[
    ("path", Shape::Leaf),
    ("overwrite", Shape::Leaf),
    ("mode", Shape::Leaf),
    ("user", OWNER),
    ("group", OWNER),
]);
const LINK: Shape = Shape::Object(&[
    ("path", Shape::Leaf),
    ("target", Shape::Leaf),
    ("hard", Shape::Leaf),
    ("overwrite", Shape::Leaf),
    ("user", OWNER),
    ("group", OWNER),
]);
const DROPIN: Shape = Shape::Object(&[("name", Shape::Leaf), ("contents", Shape::Leaf)]);
const UNIT: Shape = Shape::Object(&[
    ("name", Shape::Leaf),
    ("enabled", Shape::Leaf),
    ("mask", Shape::Leaf),
    ("contents", Shape::Leaf),
    ("dropins", Shape::Array(&DROPIN)),
]);
const CONFIG: Shape = Shape::Object(&[
    ("ignition", Shape::Object(&[("version", Shape::Leaf)])),
    (
        "storage",
        Shape::Object(&[
            ("files", Shape::Array(&FILE)),
            ("directories", Shape::Array(&DIRECTORY)),
            ("links", Shape::Array(&LINK)),
        ]),
    ),
    ("systemd", Shape::Object(&[("units", Shape::Array(&UNIT))])),
]);

/// Refuses any key outside the supported shape, naming its path. A key
/// set to `null` means "not set" in Ignition and is accepted.
fn check_shape(value: &Value, shape: &Shape, path: &str) -> Result<(), SpecError> {
    match (shape, value) {
        (Shape::Object(fields), Value::Object(map)) => {
            for (key, child) in map {
                let child_path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match fields.iter().find(|(name, _)| name == key) {
                    Some((_, child_shape)) => check_shape(child, child_shape, &child_path)?,
                    None if child.is_null() => {}
                    None => return Err(SpecError::Unsupported(child_path)),
                }
            }
            Ok(())
        }
        (Shape::Array(item), Value::Array(items)) => {
            for (i, child) in items.iter().enumerate() {
                check_shape(child, item, &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        // Type mismatches are left to the typed parse, which names them.
        _ => Ok(()),
    }
}

/// A parsed config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Config {
    #[serde(default)]
    pub ignition: Meta,
    #[serde(default, skip_serializing_if = "Storage::is_empty")]
    pub storage: Storage,
    #[serde(default, skip_serializing_if = "Systemd::is_empty")]
    pub systemd: Systemd,
}

/// The `ignition` section: only the spec version is supported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Meta {
    #[serde(default)]
    pub version: String,
}

impl Meta {
    /// The minor version of a supported `3.<minor>.0`, else `None`.
    pub fn minor(&self) -> Option<u32> {
        let mut parts = self.version.split('.');
        let major_ok = parts.next() == Some("3");
        let minor = parts.next().and_then(|minor| minor.parse::<u32>().ok());
        let patch_ok = parts.next() == Some("0") && parts.next().is_none();
        minor.filter(|m| major_ok && patch_ok && *m <= MAX_MINOR)
    }
}

/// The newest spec version supported: 3.5.0.
pub const MAX_MINOR: u32 = 5;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Storage {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<File>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub directories: Vec<Directory>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<Link>,
}

impl Storage {
    fn is_empty(&self) -> bool {
        self.files.is_empty() && self.directories.is_empty() && self.links.is_empty()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct OwnerId {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
}

impl OwnerId {
    fn is_unset(&self) -> bool {
        self.id.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct File {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overwrite: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    #[serde(default, skip_serializing_if = "OwnerId::is_unset")]
    pub user: OwnerId,
    #[serde(default, skip_serializing_if = "OwnerId::is_unset")]
    pub group: OwnerId,
    #[serde(default, skip_serializing_if = "Contents::is_empty")]
    pub contents: Contents,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Contents {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    #[serde(default, skip_serializing_if = "Verification::is_empty")]
    pub verification: Verification,
}

impl Contents {
    fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Verification {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
}

impl Verification {
    fn is_empty(&self) -> bool {
        self.hash.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Directory {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overwrite: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    #[serde(default, skip_serializing_if = "OwnerId::is_unset")]
    pub user: OwnerId,
    #[serde(default, skip_serializing_if = "OwnerId::is_unset")]
    pub group: OwnerId,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Link {
    pub path: String,
    pub target: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overwrite: Option<bool>,
    #[serde(default, skip_serializing_if = "OwnerId::is_unset")]
    pub user: OwnerId,
    #[serde(default, skip_serializing_if = "OwnerId::is_unset")]
    pub group: OwnerId,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Systemd {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<Unit>,
}

impl Systemd {
    fn is_empty(&self) -> bool {
        self.units.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Unit {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mask: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contents: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropins: Vec<Dropin>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Dropin {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contents: Option<String>,
}

/// Parses and checks a config: shape, version, and the values the applier
/// relies on (hard links, remote sources and unknown compressions are
/// refused here, before anything is written).
pub fn parse(value: &Value) -> Result<Config, SpecError> {
    check_shape(value, &CONFIG, "")?;
    check_version(value)?;
    let config: Config =
        serde_json::from_value(value.clone()).map_err(|e| SpecError::Invalid(e.to_string()))?;
    for (i, file) in config.storage.files.iter().enumerate() {
        check_contents(&file.contents, &format!("storage.files[{i}].contents"))?;
    }
    for (i, link) in config.storage.links.iter().enumerate() {
        if link.hard == Some(true) {
            return Err(SpecError::Unsupported(format!("storage.links[{i}].hard")));
        }
    }
    Ok(config)
}

fn check_version(value: &Value) -> Result<(), SpecError> {
    let version = value
        .pointer("/ignition/version")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let meta = Meta {
        version: version.to_string(),
    };
    match meta.minor() {
        Some(_) => Ok(()),
        None => Err(SpecError::Version(meta.version)),
    }
}

fn check_contents(contents: &Contents, path: &str) -> Result<(), SpecError> {
    if let Some(source) = &contents.source {
        if !source.starts_with("data:") {
            let scheme = source.split(':').next().unwrap_or_default();
            return Err(SpecError::Unsupported(format!(
                "{path}.source ({scheme}: sources; only data: URLs)"
            )));
        }
    }
    match contents.compression.as_deref() {
        None | Some("") | Some("gzip") => {}
        Some(other) => {
            return Err(SpecError::Unsupported(format!(
                "{path}.compression {other:?}"
            )))
        }
    }
    if let Some(hash) = &contents.verification.hash {
        if !(hash.starts_with("sha256-") || hash.starts_with("sha512-")) {
            return Err(SpecError::Unsupported(format!(
                "{path}.verification.hash {hash:?}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn butane_like_config_parses() {
        let config = parse(&json!({
            "ignition": {"version": "3.4.0"},
            "storage": {
                "files": [{"path": "/etc/x", "mode": 420, "contents": {"source": "data:,hi"}, "user": {"id": 0}}],
                "directories": [{"path": "/etc/d", "mode": 493}],
                "links": [{"path": "/etc/l", "target": "/etc/x"}]
            },
            "systemd": {"units": [{"name": "a.service", "enabled": true, "contents": "[Unit]\n",
                                    "dropins": [{"name": "10.conf", "contents": "[Service]\n"}]}]}
        }))
        .unwrap();
        assert_eq!(config.storage.files[0].mode, Some(420));
        assert_eq!(config.systemd.units[0].dropins.len(), 1);
    }

    #[test]
    fn unsupported_sections_are_named() {
        let cases = [
            (
                json!({"ignition": {"version": "3.4.0"}, "passwd": {"users": []}}),
                "passwd",
            ),
            (
                json!({"ignition": {"version": "3.4.0"}, "storage": {"disks": [{}]}}),
                "storage.disks",
            ),
            (
                json!({"ignition": {"version": "3.4.0", "config": {"merge": []}}}),
                "ignition.config",
            ),
            (
                json!({"ignition": {"version": "3.4.0"}, "storage": {"files": [{"path": "/x", "append": []}]}}),
                "storage.files[0].append",
            ),
            (
                json!({"ignition": {"version": "3.4.0"}, "storage": {"files": [{"path": "/x", "user": {"name": "core"}}]}}),
                "storage.files[0].user.name",
            ),
            (
                json!({"ignition": {"version": "3.4.0"}, "storage": {"files": [{"path": "/x", "contents": {"source": "https://e/x"}}]}}),
                "storage.files[0].contents.source (https",
            ),
            (
                json!({"ignition": {"version": "3.4.0"}, "storage": {"links": [{"path": "/x", "target": "/y", "hard": true}]}}),
                "storage.links[0].hard",
            ),
        ];
        for (config, named) in cases {
            let err = parse(&config).unwrap_err();
            assert!(err.to_string().contains(named), "{err} should name {named}");
        }
    }

    #[test]
    fn versions_and_nulls() {
        assert!(parse(&json!({"ignition": {"version": "3.0.0"}, "passwd": null})).is_ok());
        for version in ["2.3.0", "3.6.0", "3.5.0-experimental", ""] {
            assert_eq!(
                parse(&json!({"ignition": {"version": version}})),
                Err(SpecError::Version(version.into()))
            );
        }
        assert!(matches!(
            parse(
                &json!({"ignition": {"version": "3.1.0"}, "storage": {"files": [{"mode": 420}]}})
            ),
            Err(SpecError::Invalid(_))
        ));
    }

    #[test]
    fn serialising_a_parsed_config_gives_it_back() {
        let original = json!({
            "ignition": {"version": "3.2.0"},
            "storage": {
                "files": [{"path": "/etc/x", "mode": 420, "overwrite": true, "user": {"id": 0},
                           "contents": {"source": "data:;base64,aGk=", "compression": "gzip",
                                        "verification": {"hash": "sha256-00"}}},
                          {"path": "/etc/empty"}],
                "directories": [{"path": "/etc/d", "mode": 493, "group": {"id": 5}}],
                "links": [{"path": "/etc/l", "target": "/etc/x", "hard": false}]
            },
            "systemd": {"units": [{"name": "a.service", "enabled": true, "mask": false, "contents": "[Unit]\n",
                                    "dropins": [{"name": "10.conf", "contents": "[Service]\n"}]}]}
        });
        let config = parse(&original).unwrap();
        assert_eq!(config.ignition.version, "3.2.0");
        let written = serde_json::to_value(&config).unwrap();
        assert_eq!(
            written, original,
            "nothing unset is written, nothing set is lost"
        );
        assert_eq!(parse(&written).unwrap(), config);
        let empty =
            serde_json::to_value(parse(&json!({"ignition": {"version": "3.0.0"}})).unwrap());
        assert_eq!(empty.unwrap(), json!({"ignition": {"version": "3.0.0"}}));
    }
}
