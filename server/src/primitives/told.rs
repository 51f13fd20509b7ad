//! Standing conditions told once: a warning about something that stays true
//! (a node over its CSR cap, a CSR left pending for the same reason) is
//! worth one line when it starts or changes, not one per look.
//!
//! A controller that looks again every 30 s at what it left alone logged a
//! warning each time: one node with many pending CSRs cost the leader a line
//! per CSR per look, for as long as they stayed. [`Told`] remembers, per
//! key, the note last told; [`Told::first`] says whether this one is new.

use crate::primitives::bounded::Bounded;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long what was told is remembered unasked: a day. A condition that
/// stays true is looked at far more often (every resync, every join), so
/// only what is over is forgotten this way.
pub const TOLD_TTL: Duration = Duration::from_secs(24 * 3600);

/// The note last told per key, for at most `capacity` keys (the one
/// [`Bounded`] map: past it the least recently asked are forgotten, and
/// told once more, as after a restart), so whoever picks the keys cannot
/// grow it without bound.
pub struct Told {
    told: Mutex<Bounded<String, String>>,
}

impl Told {
    pub fn new(capacity: usize) -> Self {
        Self {
            told: Mutex::new(Bounded::new(TOLD_TTL, capacity)),
        }
    }

    /// Whether `note` is not what was last told for `key` (and so is to be
    /// told now); remembers it as told.
    pub fn first(&self, key: &str, note: &str) -> bool {
        let mut told = self.told.lock().unwrap_or_else(PoisonError::into_inner);
        let last = told.get_or_insert_with(key.to_string(), Instant::now(), String::new);
        if last == note {
            return false;
        }
        note.clone_into(last);
        true
    }

    /// The condition for `key` no longer holds: the next one is told.
    pub fn clear(&self, key: &str) {
        let mut told = self.told.lock().unwrap_or_else(PoisonError::into_inner);
        told.remove(&key.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standing_note_is_told_once_and_again_after_it_changes_or_clears() {
        let told = Told::new(10);
        assert!(told.first("n1", "over cap"));
        assert!(!told.first("n1", "over cap"));
        assert!(told.first("n2", "over cap"), "another key is told");
        assert!(told.first("n1", "no node"), "a new note is told");
        told.clear("n1");
        assert!(told.first("n1", "no node"));
    }

    #[test]
    fn past_its_capacity_it_forgets_rather_than_grows() {
        let told = Told::new(2);
        assert!(told.first("a", "x"));
        assert!(told.first("b", "x"));
        assert!(told.first("c", "x"));
        assert!(
            told.first("a", "x"),
            "the least recently told is forgotten, so told again"
        );
    }
}
