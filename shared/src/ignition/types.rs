//! The typed form of the supported Ignition subset.
//!
//! Field names follow the spec (camelCase in JSON). Everything optional is
//! `Option` or an empty `Vec`, and serialising omits what is unset, so a
//! parsed config written back is the config that was read (the server
//! merges parsed layers and serves the result).

use serde::{Deserialize, Serialize};

/// A parsed config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Config {
    #[serde(default)]
    pub ignition: Meta,
    #[serde(default, skip_serializing_if = "Passwd::is_empty")]
    pub passwd: Passwd,
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

/// `passwd`: users and groups to create or modify.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Passwd {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<User>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<Group>,
}

impl Passwd {
    pub fn is_empty(&self) -> bool {
        self.users.is_empty() && self.groups.is_empty()
    }
}

/// One `passwd.users` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct User {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_authorized_keys: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gecos: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_create_home: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_group: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_user_group: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_log_init: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub should_exist: Option<bool>,
}

/// One `passwd.groups` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub should_exist: Option<bool>,
}

/// `storage`: files, directories and links (one path namespace).
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
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.directories.is_empty() && self.links.is_empty()
    }
}

/// The owner (`user` or `group`) of a storage entry: a numeric id or a
/// name looked up on the node, never both (Ignition refuses both).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct OwnerId {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl OwnerId {
    /// Neither id nor name: the owner is left as created (root).
    pub fn is_unset(&self) -> bool {
        self.id.is_none() && self.name.is_none()
    }
}

/// One `storage.files` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct File {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overwrite: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    #[serde(default, skip_serializing_if = "OwnerId::is_unset")]
    pub user: OwnerId,
    #[serde(default, skip_serializing_if = "OwnerId::is_unset")]
    pub group: OwnerId,
    #[serde(default, skip_serializing_if = "Contents::is_empty")]
    pub contents: Contents,
}

/// A file's contents. `source: None` keeps an existing file's contents (or
/// creates it empty); `source: Some("")` means an empty file, as in
/// Ignition: with `overwrite: true` it replaces whatever is at the path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Contents {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    #[serde(default, skip_serializing_if = "Verification::is_empty")]
    pub verification: Verification,
}

impl Contents {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `sha256-<hex>` or `sha512-<hex>` over the (decompressed) contents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Verification {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
}

impl Verification {
    pub fn is_empty(&self) -> bool {
        self.hash.is_none()
    }
}

/// One `storage.directories` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Directory {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overwrite: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    #[serde(default, skip_serializing_if = "OwnerId::is_unset")]
    pub user: OwnerId,
    #[serde(default, skip_serializing_if = "OwnerId::is_unset")]
    pub group: OwnerId,
}

/// One `storage.links` entry (symbolic; hard links are refused).
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

/// `systemd`: units.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Systemd {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<Unit>,
}

impl Systemd {
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }
}

/// One `systemd.units` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Unit {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contents: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropins: Vec<Dropin>,
}

/// One drop-in of a unit (`<name>.d/<dropin name>`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Dropin {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contents: Option<String>,
}
