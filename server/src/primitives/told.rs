//! Standing conditions told once: a warning about something that stays true
//! (a node over its CSR cap, a CSR left pending for the same reason, a
//! class whose Ignition config is broken) is worth one line when it starts
//! or changes, not one per look.
//!
//! A controller that looks again every 30 s at what it left alone logged a
//! warning each time: one node with many pending CSRs cost the leader a line
//! per CSR per look, for as long as they stayed. [`Told`] remembers, per
//! key, the note last told; [`Told::first`] says whether this one is new.
//! Made with [`Told::again_after`], a note still true is told once more
//! after that long (what operators are waiting on, told again while it
//! lasts).

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
    told: Mutex<Bounded<String, Last>>,
    /// Told again after this long, when set, though it did not change.
    again_after: Option<Duration>,
}

/// What was last told for a key, and when.
struct Last {
    note: String,
    at: Instant,
}

impl Told {
    /// Told once per change.
    pub fn new(capacity: usize) -> Self {
        Self {
            told: Mutex::new(Bounded::new(TOLD_TTL, capacity)),
            again_after: None,
        }
    }

    /// Told once per change, and again each `interval` while it lasts.
    pub fn again_after(interval: Duration, capacity: usize) -> Self {
        Self {
            again_after: Some(interval),
            ..Self::new(capacity)
        }
    }

    /// Whether `note` is not what was last told for `key` (and so is to be
    /// told now); remembers it as told.
    pub fn first(&self, key: &str, note: &str) -> bool {
        self.first_at(key, note, Instant::now())
    }

    fn first_at(&self, key: &str, note: &str, now: Instant) -> bool {
        let mut told = self.told.lock().unwrap_or_else(PoisonError::into_inner);
        let key = key.to_string();
        if let Some(last) = told.get_mut(&key, now) {
            let stale = self
                .again_after
                .is_some_and(|interval| now.saturating_duration_since(last.at) >= interval);
            if last.note == note && !stale {
                return false;
            }
            note.clone_into(&mut last.note);
            last.at = now;
            return true;
        }
        let last = Last {
            note: note.to_string(),
            at: now,
        };
        told.insert(key, now, last);
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

    #[test]
    fn made_to_tell_again_a_note_still_true_is_told_once_per_interval() {
        let told = Told::again_after(Duration::from_secs(60), 10);
        let t0 = Instant::now();
        assert!(told.first_at("class/a", "", t0));
        assert!(!told.first_at("class/a", "", t0 + Duration::from_secs(59)));
        assert!(told.first_at("class/b", "", t0), "another key is told");
        assert!(told.first_at("class/a", "", t0 + Duration::from_secs(60)));
        assert!(!told.first_at("class/a", "", t0 + Duration::from_secs(61)));
        let plain = Told::new(10);
        assert!(plain.first_at("k", "x", t0));
        assert!(
            !plain.first_at("k", "x", t0 + TOLD_TTL / 2),
            "once per change"
        );
    }
}
