//! The kubelet's key pairs, generated on the node and never sent anywhere.
//!
//! ECDSA P-256, stored as PKCS#8 PEM with mode 0600 in the state directory.
//! Keys are written with [`Durability::Deferred`]; the caller makes them
//! durable (and records the keys phase) before first use, so a crash after
//! the join cannot leave the server bound to a key the node lost. A second
//! run loads the same keys: the server lets the same key resume a join.

use crate::fsutil::{self, Durability, FsError, Owner};
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256};
use std::path::Path;

/// Why a key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{path}: not a usable private key ({reason}); remove it to start over with a new key, which the server will refuse for an instance that already joined")]
    Corrupt { path: String, reason: String },
    #[error("{path}: key is not ECDSA P-256")]
    WrongAlgorithm { path: String },
    #[error("generating a key: {0}")]
    Generate(String),
}

/// Loads the key at `path`, or generates and stores one first.
/// Returns the key and whether it is new.
///
/// `never_used`: no earlier run got as far as using a key (its keys phase
/// was never recorded). Then an unreadable key file is what a power cut
/// leaves of a key that was never synced, and it is replaced; otherwise it
/// is an error, because the server is bound to the key that was there.
pub fn load_or_generate(path: &Path, never_used: bool) -> Result<(KeyPair, bool), KeyError> {
    match std::fs::read_to_string(path) {
        Ok(pem) => match load(path, &pem) {
            Err(KeyError::Corrupt { reason, .. }) if never_used => {
                log::warn!(
                    "{}: unreadable ({reason}) and never used; replacing it",
                    path.display()
                );
                generate(path)
            }
            loaded => loaded.map(|key| (key, false)),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => generate(path),
        Err(source) => Err(FsError::Io {
            path: path.to_path_buf(),
            cause: source,
        }
        .into()),
    }
}

fn generate(path: &Path) -> Result<(KeyPair, bool), KeyError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
        .map_err(|e| KeyError::Generate(e.to_string()))?;
    let pem = key.serialize_pem();
    fsutil::write_with(
        path,
        pem.as_bytes(),
        0o600,
        Owner::default(),
        Durability::Deferred,
    )?;
    Ok((key, true))
}

fn load(path: &Path, pem: &str) -> Result<KeyPair, KeyError> {
    let key = KeyPair::from_pem(pem).map_err(|e| KeyError::Corrupt {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    if key.algorithm() != &PKCS_ECDSA_P256_SHA256 {
        return Err(KeyError::WrongAlgorithm {
            path: path.display().to_string(),
        });
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn generated_once_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("client.key");
        let (first, new) = load_or_generate(&path, true).unwrap();
        assert!(new);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (second, new) = load_or_generate(&path, false).unwrap();
        assert!(!new);
        assert_eq!(first.public_key_raw(), second.public_key_raw());
    }

    #[test]
    fn corrupt_key_is_an_error_not_a_new_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("client.key");
        std::fs::write(&path, "garbage").unwrap();
        assert!(matches!(
            load_or_generate(&path, false),
            Err(KeyError::Corrupt { .. })
        ));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "garbage");
    }

    #[test]
    fn a_torn_key_that_was_never_used_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("client.key");
        // What a power cut before the sync leaves: an empty file.
        std::fs::write(&path, "").unwrap();
        let (key, new) = load_or_generate(&path, true).unwrap();
        assert!(new);
        let stored = std::fs::read_to_string(&path).unwrap();
        assert_eq!(stored, key.serialize_pem());
    }
}
