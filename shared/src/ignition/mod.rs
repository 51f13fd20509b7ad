//! The subset of Ignition spec v3 autonode supports: its types, parsing and
//! validation, shared so the server refuses at render time exactly what the
//! agent would refuse at apply time ([`parse`] is the one check both call).
//!
//! **Supported:** `ignition.version` 3.0.0–3.6.0; `passwd.users` and
//! `passwd.groups` (every field of the spec; `shouldExist` from 3.2.0);
//! `storage.files` (inline `data:` sources, gzip compression, sha256/sha512
//! verification, mode, owner by id or name, overwrite),
//! `storage.directories`, `storage.links` (symbolic); `systemd.units`
//! (contents, enabled, mask, drop-ins).
//!
//! **Not set is not asked for:** `null`, `{}` and `[]` anywhere mean "not
//! set", as Go-marshalled configs write them (`"passwd": {}`,
//! `"kernelArguments": {}`, `"ignition": {"config": {"replace":
//! {"verification": {}}}}`, `"storage": {"disks": []}`): accepted.
//!
//! **Refused, by the path that asks for it** (never ignored: the server
//! renders this config, and a node that silently skipped part of it would
//! be a node nobody asked for): `storage.disks`, `storage.filesystems`,
//! `storage.raid`, `storage.luks`, `kernelArguments`, `ignition.config`
//! merge/replace, `ignition.proxy`, `ignition.timeouts`,
//! `ignition.security.tls` CAs, `storage.files[].append`, remote sources
//! (`https:`, `s3:`, ...), `contents.httpHeaders`, hard links, and a field
//! used under a spec version older than the one that introduced it.
//!
//! **Checked**, where a node would fail or Ignition refuses (see
//! [`validate`]): data URLs (RFC 2397 syntax, base64, `%`-escapes),
//! compression, hashes (and that they match), paths (absolute, fully
//! simplified, one namespace for files, directories and links, none under
//! a link the same config makes), unit and
//! drop-in names, modes, owners, user and group names.
//!
//! **Empty sources.** `contents.source: ""` is an empty file, as in
//! Ignition: the applier writes zero bytes (and, with `overwrite: true`,
//! replaces whatever is at the path). An absent source keeps an existing
//! file's contents, or creates an empty file.
//!
//! The types also serialise, omitting what is unset, so the server can
//! merge parsed configs and write the result back as Ignition JSON.

mod data;
mod shape;
mod types;
mod validate;

pub use data::{data_url, decode, verify, MAX_FILE};
pub use types::*;
pub use validate::validate;

use serde_json::Value;

/// Why a config is refused. Every message starts with the JSON path of the
/// offending field (e.g. `storage.files[2].contents.source`).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("{0}: autonode does not support this Ignition feature; remove it from the config")]
    Unsupported(String),
    #[error("ignition.version: {0:?} is not a supported Ignition spec version (3.0.0 to 3.6.0)")]
    Version(String),
    #[error("{path}: needs Ignition spec 3.{since}.0 or newer, but the config says {version}")]
    TooNew {
        path: String,
        since: u32,
        version: String,
    },
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
    #[error("{path}: {reason}")]
    Source { path: String, reason: String },
    #[error("{path}: unknown compression {value:?} (only \"gzip\" or none)")]
    Compression { path: String, value: String },
    #[error("{path}: {reason}")]
    Hash { path: String, reason: String },
    #[error("{path}: {value:?} {reason}")]
    Path {
        path: String,
        value: String,
        reason: &'static str,
    },
    #[error("{path}: {what} {name:?} appears more than once (first at {first})")]
    Duplicate {
        path: String,
        what: &'static str,
        name: String,
        first: String,
    },
    #[error("{path}: {name:?} {reason}")]
    Name {
        path: String,
        name: String,
        reason: &'static str,
    },
    /// An entry under a link the same config makes: Ignition refuses it
    /// ("file path includes link in config"), as where it would land
    /// depends on the link's target, not on the path written.
    #[error("{path}: {value:?} is under {link} ({link_value:?}), a link this config makes; Ignition refuses a path through a link of the same config")]
    UnderLink {
        path: String,
        value: String,
        link: String,
        link_value: String,
    },
    #[error("{path}: mode {mode:#o} is out of range (at most 0o7777)")]
    Mode { path: String, mode: u32 },
    #[error("{path}: set either id or name, not both")]
    OwnerIdAndName { path: String },
    #[error("{path}: overwrite is true but there is no contents.source; Ignition refuses this (add a source, or drop overwrite)")]
    OverwriteWithoutSource { path: String },
    #[error("{path}: a masked unit cannot have contents (drop one of them)")]
    MaskWithContents { path: String },
}

/// The newest spec version supported: 3.6.0.
pub const MAX_MINOR: u32 = 6;

impl Meta {
    /// The minor version of a supported `3.<minor>.0`, else `None`. Strict:
    /// plain decimal digits without sign or leading zero, no pre-release.
    pub fn minor(&self) -> Option<u32> {
        let mut parts = self.version.split('.');
        let major_ok = parts.next() == Some("3");
        let minor = parts.next().filter(|m| is_canonical_number(m));
        let patch_ok = parts.next() == Some("0") && parts.next().is_none();
        let minor = minor.and_then(|m| m.parse::<u32>().ok())?;
        (major_ok && patch_ok && minor <= MAX_MINOR).then_some(minor)
    }
}

fn is_canonical_number(text: &str) -> bool {
    !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'))
}

/// Parses and checks a config: shape (what is supported, at which spec
/// version), types, then every rule of [`validate`]. The server calls this
/// at render time and the agent before applying, so both refuse alike.
pub fn parse(value: &Value) -> Result<Config, SpecError> {
    let version = value
        .pointer("/ignition/version")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let meta = Meta {
        version: version.to_string(),
    };
    let minor = meta.minor().ok_or(SpecError::Version(meta.version))?;
    shape::check(value, minor)?;
    let config = shape::typed(value)?;
    validate(&config)?;
    Ok(config)
}

#[cfg(test)]
mod tests;
