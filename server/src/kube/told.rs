//! Standing conditions told once: a warning about something that stays true
//! (a node over its CSR cap, a CSR left pending for the same reason) is
//! worth one line when it starts or changes, not one per look.
//!
//! A controller that looks again every 30 s at what it left alone logged a
//! warning each time: one node with many pending CSRs cost the leader a line
//! per CSR per look, for as long as they stayed. [`Told`] remembers, per
//! key, the note last told; [`Told::first`] says whether this one is new.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// The note last told per key, for at most `capacity` keys: past it, all
/// are forgotten (each is told once more, which is what a restart does
/// anyway), so whoever picks the keys cannot grow it without bound.
pub struct Told {
    told: Mutex<HashMap<String, String>>,
    capacity: usize,
}

impl Told {
    pub fn new(capacity: usize) -> Self {
        Self {
            told: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    /// Whether `note` is not what was last told for `key` (and so is to be
    /// told now); remembers it as told.
    pub fn first(&self, key: &str, note: &str) -> bool {
        let mut told = self.told.lock().unwrap_or_else(PoisonError::into_inner);
        if told.get(key).is_some_and(|last| last == note) {
            return false;
        }
        if !told.contains_key(key) && told.len() >= self.capacity {
            told.clear();
        }
        told.insert(key.to_string(), note.to_string());
        true
    }

    /// The condition for `key` no longer holds: the next one is told.
    pub fn clear(&self, key: &str) {
        let mut told = self.told.lock().unwrap_or_else(PoisonError::into_inner);
        told.remove(key);
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
        assert!(told.first("a", "x"), "forgotten, so told again");
    }
}
