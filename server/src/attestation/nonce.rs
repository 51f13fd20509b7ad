//! The challenge's nonces: made by any replica, accepted by every replica
//! (sealed under the replicas' one key, [`StateKey`], not stored where
//! they were made), for [`LIFETIME`], once each on a replica.
//!
//! A nonce is `version ‖ made-at (Unix seconds, big-endian) ‖ 16 random
//! bytes ‖ HMAC-SHA256` of the first three under the sealing key, with its
//! own purpose label, so no other seal of autonode's opens as a nonce and
//! no nonce as another seal. A server under another key (another cluster,
//! a test's) makes nonces this one refuses.
//!
//! What "once" means across replicas: each replica remembers the nonces it
//! accepted until they expire ([`Nonces::redeem`]), in a bounded map. A
//! document replayed to another replica within the lifetime still carries
//! `user_data` binding it to the keys of the CSRs it was made for, whose
//! private halves the replayer does not hold (a CSR is signed by its key),
//! so what it could win is certificates it cannot use (docs/design.md).

use super::hex;
use crate::kube::seal::StateKey;
use crate::primitives::bounded::Bounded;
use base64::Engine;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a nonce is good for after it is made: the agent's challenge,
/// its NitroTPM's answer (well under a second on EC2) and the join's wait
/// for a permit (`--join-queue-wait`, 30 s at most by default) fit with
/// room to spare; an agent whose join is answered "retry" asks again.
pub const LIFETIME: Duration = Duration::from_secs(120);
/// Clock difference between replicas tolerated for a nonce made "in the
/// future" by another replica.
const SKEW: Duration = Duration::from_secs(30);
/// The nonces a replica remembers as used: more than a burst of joins
/// can redeem in a [`LIFETIME`] (each redemption needs a join that passed
/// admission). Past it the oldest are forgotten first.
const REMEMBERED: usize = 65_536;
/// What the MAC is over, first.
const PURPOSE: &[u8] = b"autonode attestation nonce v1";
const VERSION: u8 = 1;
const RANDOM: usize = 16;
const BODY: usize = 1 + 8 + RANDOM;
/// A nonce's length in bytes (57: under the 64 a NitroTPM document's
/// `nonce` field holds in every real one seen).
pub const NONCE_BYTES: usize = BODY + 32;

/// Why a nonce is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NonceError {
    #[error("the nonce was not made by this server's replicas (malformed, forged, or sealed under another key)")]
    Unknown,
    #[error("the nonce expired {0}s ago (nonces last {lifetime}s)", lifetime = LIFETIME.as_secs())]
    Expired(u64),
    #[error("the nonce was already used for a join")]
    Replayed,
}

/// A nonce that opened: when it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redeemed {
    pub made: SystemTime,
}

/// Makes and redeems nonces.
pub struct Nonces {
    key: StateKey,
    used: Mutex<Bounded<[u8; RANDOM], ()>>,
}

impl Nonces {
    /// Nonces sealed under `key` (the replicas' sealing key).
    pub fn new(key: StateKey) -> Self {
        Self {
            key,
            used: Mutex::new(Bounded::new(LIFETIME + SKEW, REMEMBERED)),
        }
    }

    /// A fresh nonce, made at `now`.
    pub fn make(&self, now: SystemTime) -> Vec<u8> {
        let secs = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let mut nonce = Vec::with_capacity(NONCE_BYTES);
        nonce.push(VERSION);
        nonce.extend_from_slice(&secs.to_be_bytes());
        nonce.extend_from_slice(&rand::random::<[u8; RANDOM]>());
        nonce.extend_from_slice(&self.tag(&nonce));
        nonce
    }

    /// Accepts `nonce` once, at `now`: it must be this server's, unexpired
    /// and not used on this replica before.
    pub fn redeem(&self, nonce: &[u8], now: SystemTime) -> Result<Redeemed, NonceError> {
        let made = self.open(nonce)?;
        let age = now.duration_since(made).unwrap_or_default();
        if made > now + SKEW {
            return Err(NonceError::Unknown);
        }
        if age > LIFETIME {
            return Err(NonceError::Expired((age - LIFETIME).as_secs()));
        }
        let mut random = [0; RANDOM];
        random.copy_from_slice(&nonce[9..BODY]);
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        let seen = Instant::now();
        if used.get_mut(&random, seen).is_some() {
            return Err(NonceError::Replayed);
        }
        used.insert(random, seen, ());
        Ok(Redeemed { made })
    }

    /// When `nonce` was made, if it is one of ours.
    fn open(&self, nonce: &[u8]) -> Result<SystemTime, NonceError> {
        if nonce.len() != NONCE_BYTES || nonce[0] != VERSION {
            return Err(NonceError::Unknown);
        }
        let (body, tag) = nonce.split_at(BODY);
        let tag = base64::engine::general_purpose::STANDARD.encode(tag);
        if !self.key.opens(PURPOSE, "", &hex(body), &tag) {
            return Err(NonceError::Unknown);
        }
        let mut secs = [0; 8];
        secs.copy_from_slice(&body[1..9]);
        Ok(UNIX_EPOCH + Duration::from_secs(u64::from_be_bytes(secs)))
    }

    /// The MAC of a nonce's body (the seal's API MACs text: the body's hex).
    fn tag(&self, body: &[u8]) -> Vec<u8> {
        let mac = self.key.mac(PURPOSE, "", &hex(body));
        base64::engine::general_purpose::STANDARD
            .decode(mac)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> StateKey {
        StateKey::for_tests([byte; 32])
    }

    #[test]
    fn a_nonce_opens_once_on_any_replica_until_it_expires() {
        let now = SystemTime::now();
        let (one, two) = (Nonces::new(key(1)), Nonces::new(key(1)));
        let nonce = one.make(now);
        assert_eq!(nonce.len(), NONCE_BYTES);
        assert!(two.redeem(&nonce, now + Duration::from_secs(5)).is_ok());
        assert_eq!(two.redeem(&nonce, now), Err(NonceError::Replayed));
        let late = now + LIFETIME + Duration::from_secs(3);
        assert_eq!(
            one.redeem(&one.make(now), late),
            Err(NonceError::Expired(3))
        );
    }

    #[test]
    fn a_nonce_of_another_key_or_changed_in_any_byte_is_unknown() {
        let now = SystemTime::now();
        let ours = Nonces::new(key(1));
        let theirs = Nonces::new(key(2)).make(now);
        assert_eq!(ours.redeem(&theirs, now), Err(NonceError::Unknown));
        let nonce = ours.make(now);
        for at in 0..nonce.len() {
            let mut changed = nonce.clone();
            changed[at] ^= 0x01;
            assert_eq!(
                ours.redeem(&changed, now),
                Err(NonceError::Unknown),
                "byte {at}"
            );
        }
        assert_eq!(ours.redeem(&nonce[..56], now), Err(NonceError::Unknown));
        assert!(ours.redeem(&nonce, now).is_ok(), "the original still opens");
    }

    #[test]
    fn a_nonce_from_the_future_is_unknown() {
        let now = SystemTime::now();
        let ours = Nonces::new(key(1));
        let ahead = ours.make(now + SKEW + Duration::from_secs(5));
        assert_eq!(ours.redeem(&ahead, now), Err(NonceError::Unknown));
    }
}
