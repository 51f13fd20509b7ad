//! Where the setup scripts (`tests/setup/*`) keep what they build and
//! install, for the harness to find: `$AUTONODE_CACHE`, or
//! `~/.cache/autonode`. One answer for every script and module.

use anyhow::{Context, Result};
use std::path::PathBuf;

/// The cache root the setup scripts fill.
pub fn root() -> Result<PathBuf> {
    Ok(match std::env::var_os("AUTONODE_CACHE") {
        Some(root) => PathBuf::from(root),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?)
            .join(".cache/autonode"),
    })
}
