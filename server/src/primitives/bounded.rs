//! The one bounded map: every in-memory record the server keeps about
//! things others choose (Events and their correlation, what was told once,
//! EC2 answers) has an upper size, so no client can grow the server's
//! memory by naming new objects. Entries unused for a while are forgotten,
//! and when the map is full the least recently used are dropped first.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A map of at most `cap` entries that forgets entries unused for `ttl`,
/// and the least recently used ones when full.
pub struct Bounded<K, V> {
    entries: HashMap<K, (V, Instant)>,
    ttl: Duration,
    cap: usize,
}

impl<K: Hash + Eq, V> Bounded<K, V> {
    /// Empty, holding at most `cap` entries, each for `ttl` after its last use.
    pub fn new(ttl: Duration, cap: usize) -> Self {
        Self {
            entries: HashMap::new(),
            ttl,
            cap,
        }
    }

    /// The live entry for `key`, now used.
    pub fn get_mut(&mut self, key: &K, now: Instant) -> Option<&mut V> {
        let ttl = self.ttl;
        if self
            .entries
            .get(key)
            .is_some_and(|(_, used)| now.saturating_duration_since(*used) > ttl)
        {
            self.entries.remove(key);
        }
        let (value, used) = self.entries.get_mut(key)?;
        *used = now;
        Some(value)
    }

    /// The entry for `key`, made by `make` if there is none, now used.
    pub fn get_or_insert_with(&mut self, key: K, now: Instant, make: impl FnOnce() -> V) -> &mut V {
        self.make_room(&key, now);
        let (value, used) = self.entries.entry(key).or_insert_with(|| (make(), now));
        *used = now;
        value
    }

    /// `value` for `key`, in place of what was there, now used.
    pub fn insert(&mut self, key: K, now: Instant, value: V) {
        self.make_room(&key, now);
        self.entries.insert(key, (value, now));
    }

    /// Room for `key` if it is not held: evicts when full.
    fn make_room(&mut self, key: &K, now: Instant) {
        if self.get_mut(key, now).is_none() && self.entries.len() >= self.cap {
            self.evict(now);
        }
    }

    /// Forgets expired entries, then if still full the least recently
    /// used eighth: one sort pays for that many inserts.
    fn evict(&mut self, now: Instant) {
        let ttl = self.ttl;
        self.entries
            .retain(|_, (_, used)| now.saturating_duration_since(*used) <= ttl);
        if self.entries.len() < self.cap || self.entries.is_empty() {
            return;
        }
        let mut times: Vec<Instant> = self.entries.values().map(|(_, used)| *used).collect();
        let victims = (self.cap / 8).max(1);
        let (_, cutoff, _) = times.select_nth_unstable(victims - 1);
        let cutoff = *cutoff;
        self.entries.retain(|_, (_, used)| *used > cutoff);
    }

    /// Forgets `key`.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        self.entries.remove(key).map(|(value, _)| value)
    }

    /// Every value held, live or not yet evicted (for a summary of all).
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.values().map(|(value, _)| value)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many entries are held, live or not yet evicted.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_map_drops_the_least_recently_used_and_expired_entries() {
        let now = Instant::now();
        let mut map = Bounded::new(Duration::from_secs(10), 8);
        for i in 0..8 {
            map.get_or_insert_with(i, now + Duration::from_millis(i), || i);
        }
        map.get_mut(&0, now + Duration::from_millis(9));
        map.get_or_insert_with(8, now + Duration::from_millis(10), || 8);
        assert!(map.len() <= 8);
        assert!(
            map.get_mut(&0, now + Duration::from_millis(11)).is_some(),
            "recently used"
        );
        assert!(
            map.get_mut(&1, now + Duration::from_millis(11)).is_none(),
            "least recently used"
        );
        assert!(
            map.get_mut(&8, now + Duration::from_secs(30)).is_none(),
            "expired"
        );
    }
}
