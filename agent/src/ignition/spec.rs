//! Parsing the subset of Ignition spec v3 the agent applies.
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

use serde::Deserialize;
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Config {
    #[serde(default)]
    pub storage: Storage,
    #[serde(default)]
    pub systemd: Systemd,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Storage {
    #[serde(default)]
    pub files: Vec<File>,
    #[serde(default)]
    pub directories: Vec<Directory>,
    #[serde(default)]
    pub links: Vec<Link>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct OwnerId {
    pub id: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct File {
    pub path: String,
    #[serde(default)]
    pub overwrite: Option<bool>,
    pub mode: Option<u32>,
    #[serde(default)]
    pub user: OwnerId,
    #[serde(default)]
    pub group: OwnerId,
    #[serde(default)]
    pub contents: Contents,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Contents {
    pub source: Option<String>,
    pub compression: Option<String>,
    #[serde(default)]
    pub verification: Verification,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Verification {
    pub hash: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Directory {
    pub path: String,
    #[serde(default)]
    pub overwrite: Option<bool>,
    pub mode: Option<u32>,
    #[serde(default)]
    pub user: OwnerId,
    #[serde(default)]
    pub group: OwnerId,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Link {
    pub path: String,
    pub target: String,
    #[serde(default)]
    pub hard: Option<bool>,
    #[serde(default)]
    pub overwrite: Option<bool>,
    #[serde(default)]
    pub user: OwnerId,
    #[serde(default)]
    pub group: OwnerId,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Systemd {
    #[serde(default)]
    pub units: Vec<Unit>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Unit {
    pub name: String,
    pub enabled: Option<bool>,
    pub mask: Option<bool>,
    pub contents: Option<String>,
    #[serde(default)]
    pub dropins: Vec<Dropin>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Dropin {
    pub name: String,
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
    let mut parts = version.split('.');
    let supported = parts.next() == Some("3")
        && parts
            .next()
            .and_then(|minor| minor.parse::<u32>().ok())
            .is_some_and(|minor| minor <= 5)
        && parts.next() == Some("0")
        && parts.next().is_none();
    if supported {
        Ok(())
    } else {
        Err(SpecError::Version(version.to_string()))
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
}
