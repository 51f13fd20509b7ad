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
//!
//! The key is a ring: one current key, which makes every seal, and up to
//! [`MAX_PREVIOUS`] earlier ones (`--previous-seal-key-file`), under which
//! seals still open. A key changes without voiding what was sealed before
//! (a seal is made again under the current key whenever autonode next
//! writes what it seals), and an upgrade from a key derived from the TLS
//! key keeps every seal (that TLS key, as a previous key).

use base64::Engine;
use ring::hmac;
use std::path::{Path, PathBuf};

/// The fewest bytes a `--seal-key-file` may hold.
pub const MIN_KEY_BYTES: usize = 32;
/// The most earlier keys a ring opens seals with: each
/// `--previous-seal-key-file` is two (see [`StateKey::with_previous_file`]).
pub const MAX_PREVIOUS: usize = 8;
/// What the key is derived for, from `--seal-key-file` (once named
/// `--rollout-state-key-file`). The label predates the key's use for
/// NodeClaim marks and the flag's new name; it is kept so that the same
/// file gives the same key under either name.
const FROM_KEY_FILE: &[u8] = b"autonode.dev/rollout state key, from --rollout-state-key-file, v1";
/// What the key is derived for, from `--tls-key` (a distinct label: the
/// derived key is no key of TLS's).
const FROM_TLS_KEY: &[u8] = b"autonode.dev/rollout state key, from --tls-key, v1";

/// The key that seals and opens what autonode relies on; shared by the
/// replicas. A ring: seals are made under the current key and open under
/// it or any of the previous ones.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StateKey {
    current: [u8; 32],
    previous: [Option<[u8; 32]>; MAX_PREVIOUS],
}

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
        "{path} holds {len} bytes; the sealing key needs at least {MIN_KEY_BYTES} random bytes \
         (e.g. `head -c 32 /dev/urandom > key`, kept in a Secret all replicas mount)"
    )]
    Short { path: PathBuf, len: usize },
    #[error("{path}: more than {} previous sealing keys", MAX_PREVIOUS / 2)]
    TooMany { path: PathBuf },
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

    /// This ring with the key in `path` added as a previous one: seals made
    /// under it open, none is made. The file is taken both ways a key has
    /// been had from a file, so it may be an earlier `--seal-key-file` or
    /// the `--tls-key` file of a server that derived its key from that.
    pub fn with_previous_file(self, path: &Path) -> Result<Self, KeyError> {
        let bytes = read(path)?;
        let mut ring = self.with_previous(Self::derive(&bytes, FROM_TLS_KEY).current);
        if bytes.len() >= MIN_KEY_BYTES {
            ring = ring.and_then(|r| r.with_previous(Self::derive(&bytes, FROM_KEY_FILE).current));
        }
        ring.ok_or_else(|| KeyError::TooMany {
            path: path.to_path_buf(),
        })
    }

    /// This ring with `key` among the previous keys; `None` when full.
    fn with_previous(mut self, key: [u8; 32]) -> Option<Self> {
        let free = self.previous.iter_mut().find(|k| k.is_none())?;
        *free = Some(key);
        Some(self)
    }

    /// A key from `secret`, for other modules' unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(secret: [u8; 32]) -> Self {
        Self::derive(&secret, FROM_KEY_FILE)
    }

    /// How many previous keys the ring holds.
    pub fn previous_keys(&self) -> usize {
        self.previous.iter().flatten().count()
    }

    /// HMAC-SHA256(secret, label): a key for this use only.
    fn derive(secret: &[u8], label: &[u8]) -> Self {
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), label);
        let mut current = [0; 32];
        current.copy_from_slice(tag.as_ref());
        Self {
            current,
            previous: [None; MAX_PREVIOUS],
        }
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

    /// The MAC (base64) of `text` for `purpose` on the object with `uid`,
    /// under the current key.
    pub fn mac(&self, purpose: &[u8], uid: &str, text: &str) -> String {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.current);
        let tag = hmac::sign(&key, &Self::message(purpose, uid, text));
        base64::engine::general_purpose::STANDARD.encode(tag.as_ref())
    }

    /// Whether `mac` is [`StateKey::mac`] of the same arguments under the
    /// current key or a previous one, compared in constant time (the
    /// comparison tells nothing of the right MAC).
    pub fn opens(&self, purpose: &[u8], uid: &str, text: &str, mac: &str) -> bool {
        let Ok(mac) = base64::engine::general_purpose::STANDARD.decode(mac) else {
            return false;
        };
        let message = Self::message(purpose, uid, text);
        let previous = self.previous.iter().flatten();
        std::iter::once(&self.current).chain(previous).any(|key| {
            let key = hmac::Key::new(hmac::HMAC_SHA256, key);
            hmac::verify(&key, &message, &mac).is_ok()
        })
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

    fn file(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_previous_key_opens_its_seals_and_seals_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let tls = file(
            &dir,
            "tls.key",
            b"-----BEGIN PRIVATE KEY-----\nan older server's TLS key\n",
        );
        let old_file = file(&dir, "old.key", &[3; 32]);
        let new_file = file(&dir, "seal.key", &[4; 32]);
        // An older server's seals: derived from its TLS key, or an earlier key file.
        let by_tls = StateKey::from_tls_key(&tls).unwrap().mac(b"p", "u", "t");
        let by_file = StateKey::from_key_file(&old_file)
            .unwrap()
            .mac(b"p", "u", "t");
        let current = StateKey::from_key_file(&new_file).unwrap();
        assert!(!current.opens(b"p", "u", "t", &by_tls));
        let ring = current
            .with_previous_file(&tls)
            .and_then(|r| r.with_previous_file(&old_file))
            .unwrap();
        // Each file both ways: which way a file's seals were made is not known.
        assert_eq!(ring.previous_keys(), 4);
        assert!(ring.opens(b"p", "u", "t", &by_tls));
        assert!(ring.opens(b"p", "u", "t", &by_file));
        assert!(!ring.opens(b"p", "u2", "t", &by_tls));
        // Seals are made under the current key only.
        assert_eq!(ring.mac(b"p", "u", "t"), current.mac(b"p", "u", "t"));
    }

    #[test]
    fn the_ring_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut ring = StateKey::derive(&[1; 32], FROM_KEY_FILE);
        for n in 0..MAX_PREVIOUS / 2 {
            ring = ring
                .with_previous_file(&file(&dir, &format!("k{n}"), &[n as u8; 32]))
                .unwrap();
        }
        assert_eq!(ring.previous_keys(), MAX_PREVIOUS);
        let more = ring.with_previous_file(&file(&dir, "more", &[9; 32]));
        assert!(matches!(more, Err(KeyError::TooMany { .. })));
    }
}
