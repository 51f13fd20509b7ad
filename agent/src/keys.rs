//! The kubelet's key pairs, generated on the node and never sent anywhere.
//!
//! ECDSA P-256, stored as PKCS#8 PEM with mode 0600 in the state directory,
//! written (atomically) before first use so a crash after the join cannot
//! leave the server bound to a key the node lost. A second run loads the
//! same keys: the server lets the same key resume a join.

use crate::fsutil::{self, FsError, Owner};
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
pub fn load_or_generate(path: &Path) -> Result<(KeyPair, bool), KeyError> {
    match std::fs::read_to_string(path) {
        Ok(pem) => load(path, &pem).map(|key| (key, false)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
                .map_err(|e| KeyError::Generate(e.to_string()))?;
            fsutil::write_atomic(
                path,
                key.serialize_pem().as_bytes(),
                0o600,
                Owner::default(),
            )?;
            Ok((key, true))
        }
        Err(source) => Err(FsError::Io {
            path: path.to_path_buf(),
            cause: source,
        }
        .into()),
    }
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
        let (first, new) = load_or_generate(&path).unwrap();
        assert!(new);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (second, new) = load_or_generate(&path).unwrap();
        assert!(!new);
        assert_eq!(first.public_key_raw(), second.public_key_raw());
    }

    #[test]
    fn corrupt_key_is_an_error_not_a_new_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("client.key");
        std::fs::write(&path, "garbage").unwrap();
        assert!(matches!(
            load_or_generate(&path),
            Err(KeyError::Corrupt { .. })
        ));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "garbage");
    }
}
