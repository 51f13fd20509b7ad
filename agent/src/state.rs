//! What earlier runs of the agent achieved, so a second run either
//! verifies and exits, or resumes where a crash left off with the same keys.
//!
//! The state directory holds `client.key` and `serving.key` (0600),
//! `join-response.json` (0600: the server's answer, so a crash after the
//! join resumes without asking again) and `state.json` (the last phase that
//! completed).

use crate::fsutil::{self, Durability, FsError, Owner};
use autonode_shared::protocol::{JoinResponse, Phase};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Why the state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

/// `state.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// The last phase that completed.
    pub completed: Option<Phase>,
    pub node_name: Option<String>,
    pub agent_version: String,
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    pub fn new(dir: PathBuf) -> Self {
        StateDir { dir }
    }

    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    pub fn serving_key(&self) -> PathBuf {
        self.dir.join("serving.key")
    }

    fn state_file(&self) -> PathBuf {
        self.dir.join("state.json")
    }

    fn response_file(&self) -> PathBuf {
        self.dir.join("join-response.json")
    }

    /// The state, or the empty state before the first run. A state file a
    /// power cut left unreadable counts as empty: every phase is redone,
    /// and redoing one is harmless.
    pub fn load(&self) -> Result<State, StateError> {
        match read_json(&self.state_file()) {
            Err(StateError::Corrupt { path, reason }) => {
                log::warn!("{}: unreadable ({reason}); starting over", path.display());
                Ok(State::default())
            }
            other => other.map(Option::unwrap_or_default),
        }
    }

    /// Records that `phase` completed, after making what it wrote durable:
    /// `written` names a path on each filesystem the phase wrote to with
    /// [`Durability::Deferred`] (the state directory is always synced). The
    /// record itself is deferred too: lost in a power cut, it only makes
    /// the next run redo the phase.
    pub fn record(
        &self,
        phase: Phase,
        node_name: Option<&str>,
        written: &[&Path],
    ) -> Result<(), StateError> {
        let mut paths = written.to_vec();
        paths.push(&self.dir);
        fsutil::sync_filesystems(&paths)?;
        let state = State {
            completed: Some(phase),
            node_name: node_name.map(str::to_string),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
        };
        write_json(&self.state_file(), &state, 0o644)
    }

    /// Makes the last record durable.
    pub fn flush(&self) -> Result<(), StateError> {
        Ok(fsutil::sync_filesystems(&[&self.dir])?)
    }

    /// The saved join answer, if any.
    pub fn load_response(&self) -> Result<Option<JoinResponse>, StateError> {
        read_json(&self.response_file())
    }

    pub fn save_response(&self, response: &JoinResponse) -> Result<(), StateError> {
        write_json(&self.response_file(), response, 0o600)
    }
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, StateError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StateError::Corrupt {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FsError::Io {
            path: path.to_path_buf(),
            cause: source,
        }
        .into()),
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T, mode: u32) -> Result<(), StateError> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| StateError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    fsutil::write_with(path, &bytes, mode, Owner::default(), Durability::Deferred)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path().join("s"));
        assert_eq!(state.load().unwrap(), State::default());
        state.record(Phase::Join, Some("n"), &[]).unwrap();
        let loaded = state.load().unwrap();
        assert_eq!(loaded.completed, Some(Phase::Join));
        assert_eq!(loaded.node_name.as_deref(), Some("n"));
        assert_eq!(state.load_response().unwrap(), None);
    }

    #[test]
    fn a_torn_state_file_means_starting_over() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path().to_path_buf());
        state.record(Phase::Apply, Some("n"), &[]).unwrap();
        // What a power cut before the sync may leave: empty, or cut short.
        for torn in ["", "{\"completed\": \"app"] {
            std::fs::write(dir.path().join("state.json"), torn).unwrap();
            assert_eq!(state.load().unwrap(), State::default());
        }
    }
}
