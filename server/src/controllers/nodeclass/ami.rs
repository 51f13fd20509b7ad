//! `--ami-ids` as `amiSelectorTerms`: one `{id}` term per architecture.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use thiserror::Error;

/// Why `--ami-ids` is unusable.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AmiIdsError {
    #[error("AMI id entry {0:?}: expected <arch>=ami-<hex>, e.g. amd64=ami-0123456789abcdef0")]
    Entry(String),
    #[error("architecture {0:?} is given more than once")]
    Duplicate(String),
}

/// `amiSelectorTerms` from `arch=ami-…` entries: one `{id}` term per
/// architecture, ordered by architecture so equal settings give equal terms;
/// `None` when there are no entries.
pub fn ami_selector_terms(entries: &[String]) -> Result<Option<Vec<Value>>, AmiIdsError> {
    let mut by_arch = BTreeMap::new();
    for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let bad = || AmiIdsError::Entry(entry.to_string());
        let (arch, id) = entry.split_once('=').ok_or_else(bad)?;
        let hex = id.strip_prefix("ami-").ok_or_else(bad)?;
        if arch.is_empty() || hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        if by_arch.insert(arch.to_string(), id.to_string()).is_some() {
            return Err(AmiIdsError::Duplicate(arch.to_string()));
        }
    }
    Ok((!by_arch.is_empty()).then(|| {
        by_arch
            .into_values()
            .map(|id| json!({ "id": id }))
            .collect()
    }))
}
