//! Figures the tests write for people and CI to read: JSON objects in
//! `target/bench/`, one file per family of tests, each test merging its own
//! keys in.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// Merges `entries` into the JSON object in `target/bench/<file>`, keeping
/// the keys other tests wrote. Tests run as parallel processes: the read,
/// merge and write happen under an exclusive lock on `<file>.lock`, and
/// the file is replaced by a rename, so a reader never sees half of it.
pub fn merge(file: &str, entries: serde_json::Map<String, serde_json::Value>) -> Result<PathBuf> {
    let dir = repo_root().join("target/bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(file);
    let lock_path = dir.join(format!("{file}.lock"));
    let lock = std::fs::File::create(&lock_path)
        .with_context(|| format!("creating {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    let mut all: serde_json::Map<String, serde_json::Value> = std::fs::read(&path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default();
    all.extend(entries);
    let partial = dir.join(format!("{file}.partial"));
    std::fs::write(&partial, serde_json::to_string_pretty(&all)? + "\n")
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The repository's root (the tests crate's parent).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}
