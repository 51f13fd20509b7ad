//! The rollout state's seal: an HMAC-SHA256 over the class's UID and the
//! state's exact bytes, carried with the state in the
//! [`super::ROLLOUT_ANNOTATION`].
//!
//! managedFields name who wrote a field, but any client may send
//! `fieldManager=autonode-server`: whoever may patch an EC2NodeClass could
//! write a state whose applied and last good values are theirs, and the
//! guard would then keep (hold, or revert to) them. The seal's key is known
//! to autonode-server's replicas only, so a state that opens under it was
//! written by autonode, for this class (its UID is under the MAC: a state
//! copied from another class, or from a deleted class of the same name,
//! does not open). What it cannot tell: an older state autonode itself
//! wrote for this same class, replayed (docs/design.md, threat model).

use super::{State, Values};
use base64::Engine;
use ring::hmac;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The fewest bytes a `--rollout-state-key-file` may hold.
pub const MIN_KEY_BYTES: usize = 32;
/// What the key is derived for, from `--rollout-state-key-file`.
const FROM_KEY_FILE: &[u8] = b"autonode.dev/rollout state key, from --rollout-state-key-file, v1";
/// What the key is derived for, from `--tls-key` (a distinct label: the
/// derived key is no key of TLS's).
const FROM_TLS_KEY: &[u8] = b"autonode.dev/rollout state key, from --tls-key, v1";
/// What the MAC is over, first: the seal's purpose and version.
const PURPOSE: &[u8] = b"autonode.dev/rollout state v1";

/// The key that seals and opens rollout states; shared by the replicas.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StateKey([u8; 32]);

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey(..)")
    }
}

/// Why no key could be had from a file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} holds {len} bytes; the rollout state key needs at least {MIN_KEY_BYTES} random bytes \
         (e.g. `head -c 32 /dev/urandom > key`, kept in a Secret all replicas mount)"
    )]
    Short { path: PathBuf, len: usize },
}

/// Why a sealed state does not open.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OpenError {
    #[error("not a sealed rollout state (written by an older autonode-server, or by hand)")]
    Unsealed,
    #[error("the class has no UID")]
    NoUid,
    #[error("its MAC does not match: not written by autonode-server for this class, or under another key (--rollout-state-key-file, or --tls-key without it)")]
    Forged,
    #[error("not valid rollout state: {0}")]
    Parse(String),
    #[error("AMI selector terms {0} are not [{{id: ami-<hex>}}]")]
    AmiTerms(String),
}

/// The annotation's JSON: the state's exact text and its MAC (base64).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sealed {
    state: String,
    mac: String,
}

impl StateKey {
    /// The key from `path` (a secret the replicas share, at least
    /// [`MIN_KEY_BYTES`] long).
    pub fn from_key_file(path: &Path) -> Result<Self, KeyError> {
        let bytes = read(path)?;
        if bytes.len() < MIN_KEY_BYTES {
            return Err(KeyError::Short {
                path: path.to_path_buf(),
                len: bytes.len(),
            });
        }
        Ok(Self::derive(&bytes, FROM_KEY_FILE))
    }

    /// The key derived from the `--tls-key` file's bytes, which every
    /// replica already shares. A new TLS key is a new state key.
    pub fn from_tls_key(path: &Path) -> Result<Self, KeyError> {
        Ok(Self::derive(&read(path)?, FROM_TLS_KEY))
    }

    /// HMAC-SHA256(secret, label): a key for this use only.
    fn derive(secret: &[u8], label: &[u8]) -> Self {
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), label);
        let mut key = [0; 32];
        key.copy_from_slice(tag.as_ref());
        Self(key)
    }

    /// What the MAC is over: purpose, the UID (length-prefixed, so UID and
    /// state text cannot run into one another) and the state's text.
    fn message(uid: &str, text: &str) -> Vec<u8> {
        let mut message = Vec::with_capacity(PURPOSE.len() + 8 + uid.len() + text.len());
        message.extend_from_slice(PURPOSE);
        message.extend_from_slice(&(uid.len() as u64).to_be_bytes());
        message.extend_from_slice(uid.as_bytes());
        message.extend_from_slice(text.as_bytes());
        message
    }

    fn hmac_key(&self) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &self.0)
    }

    /// The annotation text of `state` for the class with `uid`.
    pub fn seal(&self, uid: &str, state: &State) -> Result<String, serde_json::Error> {
        let text = serde_json::to_string(state)?;
        let mac = hmac::sign(&self.hmac_key(), &Self::message(uid, &text));
        serde_json::to_string(&Sealed {
            mac: base64::engine::general_purpose::STANDARD.encode(mac.as_ref()),
            state: text,
        })
    }

    /// The state sealed in `annotation` for the class with `uid`, when its
    /// MAC matches and its AMI terms are `[{id: ami-<hex>}]`.
    pub fn open(&self, uid: Option<&str>, annotation: &str) -> Result<State, OpenError> {
        let sealed: Sealed = serde_json::from_str(annotation).map_err(|_| OpenError::Unsealed)?;
        let uid = uid.filter(|u| !u.is_empty()).ok_or(OpenError::NoUid)?;
        let mac = base64::engine::general_purpose::STANDARD
            .decode(&sealed.mac)
            .map_err(|_| OpenError::Forged)?;
        // Constant time: the comparison tells nothing of the right MAC.
        hmac::verify(&self.hmac_key(), &Self::message(uid, &sealed.state), &mac)
            .map_err(|_| OpenError::Forged)?;
        let state: State =
            serde_json::from_str(&sealed.state).map_err(|e| OpenError::Parse(e.to_string()))?;
        let values = [Some(&state.applied), state.good.as_ref()]
            .into_iter()
            .chain([state.refused.as_ref().map(|r| &r.values)])
            .flatten();
        for v in values {
            check_ami_terms(v)?;
        }
        Ok(state)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, KeyError> {
    std::fs::read(path).map_err(|source| KeyError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Refuses AMI terms other than autonode's own shape: one `{id: ami-<hex>}`
/// per term (what `--ami-ids` renders), nothing that selects by tag or name.
fn check_ami_terms(values: &Values) -> Result<(), OpenError> {
    let Some(terms) = &values.ami_selector_terms else {
        return Ok(());
    };
    let ok = |term: &serde_json::Value| {
        let Some(object) = term.as_object().filter(|o| o.len() == 1) else {
            return false;
        };
        object
            .get("id")
            .and_then(|id| id.as_str())
            .and_then(|id| id.strip_prefix("ami-"))
            .is_some_and(|hex| !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    if terms.iter().all(ok) {
        Ok(())
    } else {
        Err(OpenError::AmiTerms(
            serde_json::Value::from(terms.clone()).to_string(),
        ))
    }
}
