//! The replicas' one sealing key, and the MAC every seal made with it is.
//!
//! managedFields name who wrote a field, but any client may send
//! `fieldManager=autonode-server`, and a merge patch that writes a value
//! already there changes no owner: whoever could put that value there
//! first (a NodePool author, through Karpenter's copy of the template)
//! stays its co-owner. What autonode must be able to rely on therefore
//! carries a MAC under a key only the replicas hold: the rollout guard's
//! state on an EC2NodeClass (`controllers::nodeclass::rollout::seal`) and
//! autonode's marks on NodeClaims ([`crate::kube::marks`]). Each use has
//! its own purpose string at the head of what is MACed, and each seal
//! names the object's UID, so no seal opens for another use or object.

use base64::Engine;
use ring::hmac;
use std::path::{Path, PathBuf};

/// The fewest bytes a `--rollout-state-key-file` may hold.
pub const MIN_KEY_BYTES: usize = 32;
/// What the key is derived for, from `--rollout-state-key-file`. The
/// label predates the key's use for NodeClaim marks; it is kept so that
/// an upgrade does not make every sealed rollout state unreadable.
const FROM_KEY_FILE: &[u8] = b"autonode.dev/rollout state key, from --rollout-state-key-file, v1";
/// What the key is derived for, from `--tls-key` (a distinct label: the
/// derived key is no key of TLS's).
const FROM_TLS_KEY: &[u8] = b"autonode.dev/rollout state key, from --tls-key, v1";

/// The key that seals and opens what autonode relies on; shared by the
/// replicas.
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

    /// What a MAC is over: the purpose, the UID (length-prefixed, so UID
    /// and text cannot run into one another) and the text.
    fn message(purpose: &[u8], uid: &str, text: &str) -> Vec<u8> {
        let mut message = Vec::with_capacity(purpose.len() + 8 + uid.len() + text.len());
        message.extend_from_slice(purpose);
        message.extend_from_slice(&(uid.len() as u64).to_be_bytes());
        message.extend_from_slice(uid.as_bytes());
        message.extend_from_slice(text.as_bytes());
        message
    }

    fn hmac_key(&self) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &self.0)
    }

    /// The MAC (base64) of `text` for `purpose` on the object with `uid`.
    pub fn mac(&self, purpose: &[u8], uid: &str, text: &str) -> String {
        let tag = hmac::sign(&self.hmac_key(), &Self::message(purpose, uid, text));
        base64::engine::general_purpose::STANDARD.encode(tag.as_ref())
    }

    /// Whether `mac` is [`StateKey::mac`] of the same arguments, compared
    /// in constant time (the comparison tells nothing of the right MAC).
    pub fn opens(&self, purpose: &[u8], uid: &str, text: &str, mac: &str) -> bool {
        let Ok(mac) = base64::engine::general_purpose::STANDARD.decode(mac) else {
            return false;
        };
        hmac::verify(&self.hmac_key(), &Self::message(purpose, uid, text), &mac).is_ok()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, KeyError> {
    std::fs::read(path).map_err(|source| KeyError::Read {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mac_opens_only_for_its_purpose_object_text_and_key() {
        let key = StateKey::derive(&[1; 32], FROM_KEY_FILE);
        let mac = key.mac(b"p", "uid-1", "text");
        assert!(key.opens(b"p", "uid-1", "text", &mac));
        assert!(!key.opens(b"q", "uid-1", "text", &mac));
        assert!(!key.opens(b"p", "uid-2", "text", &mac));
        assert!(!key.opens(b"p", "uid-1", "text2", &mac));
        assert!(!key.opens(b"p", "uid-1", "text", "not base64!"));
        let other = StateKey::derive(&[2; 32], FROM_KEY_FILE);
        assert!(!other.opens(b"p", "uid-1", "text", &mac));
        // The UID's length is under the MAC: "uid-1" + "text" is not "uid-1t" + "ext".
        assert!(!key.opens(b"p", "uid-1t", "ext", &mac));
    }
}
