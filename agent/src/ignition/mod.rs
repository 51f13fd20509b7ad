//! Applying the node's Ignition (spec v3) config, as Butane produces it.
//!
//! [`spec`] parses and refuses what is not supported, by name; [`apply`]
//! writes storage entries and [`units`] systemd units under a [`Root`].
//! Order: directories, files, links (each sorted by path, so parents come
//! first), then units. Everything is idempotent.

pub mod apply;
pub mod spec;
pub mod units;

use crate::fsutil::{FsError, Root};

/// Why the config could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum IgnitionError {
    #[error(transparent)]
    Spec(#[from] spec::SpecError),
    #[error("{path}: {reason}")]
    Source { path: String, reason: String },
    #[error("{path}: {reason}")]
    Conflict { path: String, reason: String },
    #[error("unit {name}: {reason}")]
    Unit { name: String, reason: String },
    #[error(transparent)]
    Fs(#[from] FsError),
}

impl IgnitionError {
    /// Whether the config itself is at fault (the server sent something the
    /// agent refuses), as opposed to the node's filesystem.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, IgnitionError::Fs(_))
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

/// Parses `config` and applies it under `root`.
pub fn apply(root: &Root, config: &serde_json::Value) -> Result<Applied, IgnitionError> {
    let config = spec::parse(config)?;
    let mut applied = Applied::default();
    let mut directories: Vec<_> = config.storage.directories.iter().collect();
    directories.sort_by(|a, b| a.path.cmp(&b.path));
    for dir in directories {
        applied.changed += usize::from(apply::directory(root, dir)?);
    }
    let mut files: Vec<_> = config.storage.files.iter().collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    for file in files {
        applied.changed += usize::from(apply::file(root, file)?);
    }
    for link in &config.storage.links {
        applied.changed += usize::from(apply::link(root, link)?);
    }
    for unit in &config.systemd.units {
        applied.changed += usize::from(units::apply(root, unit)?);
        if unit.enabled == Some(true) && unit.mask != Some(true) {
            applied.enabled_units.push(unit.name.clone());
        }
    }
    Ok(applied)
}
