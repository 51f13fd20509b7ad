//! Applying the node's Ignition (spec v3) config, as Ignition's files
//! stage does, so that a node joined by the agent looks as if Ignition had
//! run (tests compare the two trees; see tests/src/oracles/ignition.rs).
//!
//! [`autonode_shared::ignition`] (the spec's types and rules, shared with
//! the server, which refuses at render time by the same rules) parses and
//! refuses what is not supported, by name; then
//! `preflight` refuses what conflicts with the node as it is, before
//! anything is written. Then, in Ignition's order:
//! 1. [`passwd`]: groups, then users (`groupadd`/`useradd`/`usermod`,
//!    `groupdel`/`userdel` for `shouldExist: false`), each user's SSH keys;
//! 2. [`apply`](mod@apply): directories, files, links (each sorted by path, so parents
//!    come first), owners by name resolved by [`owners`] against the
//!    node's own `/etc/passwd` and `/etc/group`, as just written;
//! 3. [`units`]: every unit's file, drop-ins and mask, then enablement
//!    (links as `systemctl enable`/`preset` makes them: `Also=`, aliases,
//!    templates as their `DefaultInstance=`, instances).
//!
//! Semantics worth knowing: `contents.source: ""` is an empty file (with
//! `overwrite`, it replaces what is there); an absent source keeps an
//! existing file's contents. Everything is idempotent: a second run
//! changes nothing, and where Ignition would fail on an already-applied
//! node (an existing group, a file with `overwrite: false`) the agent
//! accepts what is exactly as asked and refuses anything else.

pub mod apply;
pub mod owners;
pub mod passwd;
pub mod units;

use crate::fsutil::{FsError, Root};
use autonode_shared::ignition::{self, parse, Config, MAX_MINOR};

/// Why the config could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum IgnitionError {
    #[error(transparent)]
    Spec(#[from] ignition::SpecError),
    #[error("{path}: {reason}")]
    Source { path: String, reason: String },
    #[error("{path}: {reason}")]
    Conflict { path: String, reason: String },
    #[error("unit {name}: {reason}")]
    Unit { name: String, reason: String },
    /// An owner given by name that the node does not have.
    #[error("{path}: {reason}")]
    Owner { path: String, reason: String },
    #[error("passwd entry {name:?}: {reason}")]
    Passwd { name: String, reason: String },
    /// A user's SSH keys cannot be written as Ignition writes them (as the
    /// user): the home, or a directory on the way to the keys, is missing
    /// and not the user's to create, or is someone else's. The node's
    /// state is at fault, not the config.
    #[error("user {user:?}: cannot write its SSH keys: {reason}")]
    Home { user: String, reason: String },
    /// `useradd` and friends failed; their stderr says why.
    #[error("{command} failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error(transparent)]
    Fs(#[from] FsError),
}

impl IgnitionError {
    /// Whether the config itself is at fault (the server sent something the
    /// agent refuses), as opposed to the node's filesystem.
    pub fn is_refusal(&self) -> bool {
        // A shadow tool's failure depends on the node's databases (a lock,
        // a clash with the image's users), not on the config alone.
        !matches!(
            self,
            IgnitionError::Fs(_) | IgnitionError::Command { .. } | IgnitionError::Home { .. }
        )
    }
}

/// What applying did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Entries that changed something on disk.
    pub changed: usize,
    /// Units the config enabled (and not masked), to start after a
    /// daemon-reload.
    pub enabled_units: Vec<String>,
}

/// The refusals that depend on the node (conflicts with what is there,
/// owner names, gid clashes), found before anything is written, so a
/// refused config leaves the node as it was. The apply checks again, as
/// entries it writes can change what later ones meet.
fn preflight(root: &Root, config: &Config) -> Result<(), IgnitionError> {
    passwd::preflight(root, &config.passwd)?;
    apply::preflight(root, &config.storage)?;
    owners::preflight(root, config)
}

/// Parses `config` and applies it under `root`, in the order of the
/// module doc (after `preflight`).
pub fn apply(root: &Root, config: &serde_json::Value) -> Result<Applied, IgnitionError> {
    let config = parse(config)?;
    // The parse refused any version but 3.0.0–3.6.0.
    let minor = config.ignition.minor().unwrap_or(MAX_MINOR);
    preflight(root, &config)?;
    let mut applied = Applied {
        changed: passwd::apply(root, &config.passwd)?,
        ..Applied::default()
    };
    let mut directories: Vec<_> = config.storage.directories.iter().collect();
    directories.sort_by(|a, b| a.path.cmp(&b.path));
    for dir in directories {
        applied.changed += usize::from(apply::directory(root, dir, minor)?);
    }
    let mut files: Vec<_> = config.storage.files.iter().collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    for file in files {
        applied.changed += usize::from(apply::file(root, file, minor)?);
    }
    for link in &config.storage.links {
        applied.changed += usize::from(apply::link(root, link)?);
    }
    for unit in &config.systemd.units {
        applied.changed += usize::from(units::write(root, unit)?);
    }
    for unit in &config.systemd.units {
        let enabled = units::enablement(root, unit)?;
        applied.changed += usize::from(enabled.changed);
        // Concrete names only: a template is started as its instance, or
        // not at all (`systemctl start x@.service` fails).
        applied.enabled_units.extend(enabled.start);
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every path under `dir`, to compare a root before and after.
    fn tree(dir: &std::path::Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut dirs = vec![dir.to_path_buf()];
        while let Some(d) = dirs.pop() {
            for entry in std::fs::read_dir(&d).unwrap().flatten() {
                let path = entry.path();
                let text = std::fs::read(&path).unwrap_or_default();
                out.push(format!("{} {text:?}", path.display()));
                if path.is_dir() {
                    dirs.push(path);
                }
            }
        }
        out.sort();
        out
    }

    /// Refusals that depend on the node come before any write: the
    /// directory (applied before files) is not made either.
    #[test]
    fn a_refused_config_leaves_the_root_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        std::fs::write(etc.join("existing"), "old\n").unwrap();
        std::fs::write(etc.join("passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        std::fs::write(etc.join("group"), "root:x:0:\n").unwrap();
        let root = Root::new(dir.path());
        let before = tree(dir.path());
        let new_dir = json!({"path": "/etc/new"});
        let refused = [
            json!({"files": [{"path": "/etc/existing", "contents": {"source": "data:,new"}}],
                   "directories": [new_dir]}),
            json!({"files": [{"path": "/etc/x", "user": {"name": "nobody-here"}}],
                   "directories": [new_dir]}),
            json!({"links": [{"path": "/etc/existing", "target": "/etc/passwd"}],
                   "directories": [new_dir]}),
        ];
        for storage in refused {
            let config = json!({"ignition": {"version": "3.3.0"}, "storage": storage});
            let err = apply(&root, &config).unwrap_err();
            assert!(err.is_refusal(), "{err}");
            assert_eq!(tree(dir.path()), before, "{config} changed the root");
        }
        // A file created under a directory the config replaces is left to
        // the apply, which sees the directory first.
        let nested = json!({"ignition": {"version": "3.3.0"}, "storage": {
            "directories": [{"path": "/etc/existing", "overwrite": true}],
            "files": [{"path": "/etc/existing/f", "contents": {"source": "data:,x"}}]}});
        assert!(apply(&root, &nested).is_ok());
    }
}
