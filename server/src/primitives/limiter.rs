//! The one token bucket, and the per-key limiter made of them: the
//! renewal approver's EC2 lookups per node, the join's per instance, signed
//! agent reports per instance, Event writes per object and refused
//! documents per source address are each limited by one.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How fast a [`Bucket`] fills: `burst` tokens at most, one more every
/// `period`.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    burst: f64,
    period: Duration,
}

impl Rate {
    /// `burst` at once (at least one), then one per `period`.
    pub fn new(burst: u32, period: Duration) -> Self {
        Self {
            burst: f64::from(burst.max(1)),
            // A zero period would divide by zero; it means "no limit" anyway.
            period: period.max(Duration::from_millis(1)),
        }
    }
}

/// The one token bucket: tokens left as of `at`, earned continuously, so a
/// part of a period already waited counts toward the next token.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A bucket holding its whole burst: the same as no bucket.
    pub fn full(rate: Rate, now: Instant) -> Self {
        Self {
            tokens: rate.burst,
            at: now,
        }
    }

    /// Takes one token, or says how long until the next.
    pub fn take(&mut self, rate: Rate, now: Instant) -> Result<(), Duration> {
        *self = self.refilled(rate, now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(rate.period.mul_f64(1.0 - self.tokens))
        }
    }

    /// Takes one token even when there is none: for what has already
    /// happened (a refusal answered), which later callers pay for by
    /// waiting ([`Bucket::ready_in`]). The debt is the caller's to bound
    /// (by how many may be charged before anyone waits).
    pub fn charge(&mut self, rate: Rate, now: Instant) {
        *self = self.refilled(rate, now);
        self.tokens -= 1.0;
    }

    /// How long until the bucket holds a token again; `None` if it does
    /// now. Takes nothing.
    pub fn ready_in(self, rate: Rate, now: Instant) -> Option<Duration> {
        let tokens = self.refilled(rate, now).tokens;
        (tokens < 1.0).then(|| rate.period.mul_f64(1.0 - tokens))
    }

    /// Whether the bucket has refilled by `now`, so forgetting it loses
    /// nothing.
    pub fn is_full(self, rate: Rate, now: Instant) -> bool {
        self.refilled(rate, now).tokens >= rate.burst
    }

    /// The bucket as of `now`, refilled at one token per period.
    fn refilled(self, rate: Rate, now: Instant) -> Self {
        let waited = now.saturating_duration_since(self.at).as_secs_f64();
        Self {
            tokens: (self.tokens + waited / rate.period.as_secs_f64()).min(rate.burst),
            at: now,
        }
    }
}

/// Warn lines about refused requests one reason may take at once, past
/// which they are one per [`REFUSAL_LINE_PERIOD`]: any network client can
/// send a join or a report that is refused, and each refusal was a warn
/// line of up to ~1 KiB. Every refusal is still counted
/// (`autonode_joins_total`, `autonode_agent_reports_refused_total`) and
/// logged at debug.
pub const REFUSAL_LINE_BURST: u32 = 5;

/// One more warn line per refusal reason per this long.
pub const REFUSAL_LINE_PERIOD: Duration = Duration::from_secs(60);

/// Keys a [`refusal_line_limiter`] tracks: one API's refusal reasons, and
/// "unavailable", with room to spare.
const REFUSAL_LINE_KEYS: usize = 64;

/// The warn lines' limiter, one per API (joins, reports), keyed by reason.
pub fn refusal_line_limiter() -> Limiter {
    Limiter::new(REFUSAL_LINE_BURST, REFUSAL_LINE_PERIOD, REFUSAL_LINE_KEYS)
}

/// Per-key token buckets: `burst` at once, then one per `period`. Bounded:
/// at `capacity` keys, buckets that have refilled (indistinguishable from no
/// bucket) are dropped; if none has, the new key waits a period, as it would
/// have to at worst anyway.
pub struct Limiter<K = String> {
    rate: Rate,
    capacity: usize,
    buckets: Mutex<HashMap<K, Bucket>>,
}

impl<K: Hash + Eq> Limiter<K> {
    pub fn new(burst: u32, period: Duration, capacity: usize) -> Self {
        Self {
            rate: Rate::new(burst, period),
            capacity,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one from `key`'s budget, or says how long until one.
    pub fn try_take<Q>(&self, key: &Q, now: Instant) -> Result<(), Duration>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let rate = self.rate;
        let mut buckets = self.lock();
        if !self.has_room(&mut buckets, key, now) {
            return Err(rate.period);
        }
        buckets
            .entry(key.to_owned())
            .or_insert_with(|| Bucket::full(rate, now))
            .take(rate, now)
    }

    /// Charges `key` one ([`Bucket::charge`]). At capacity with no bucket
    /// refilled, a new key goes uncharged: what the limiter guards is then
    /// guarded by the caps beside it, and no key already held is lost.
    pub fn charge<Q>(&self, key: &Q, now: Instant)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let rate = self.rate;
        let mut buckets = self.lock();
        if self.has_room(&mut buckets, key, now) {
            buckets
                .entry(key.to_owned())
                .or_insert_with(|| Bucket::full(rate, now))
                .charge(rate, now);
        }
    }

    /// How long until `key` has a token again ([`Bucket::ready_in`]);
    /// `None` for a key with one, or none charged.
    pub fn ready_in<Q>(&self, key: &Q, now: Instant) -> Option<Duration>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let bucket = *self.lock().get(key)?;
        bucket.ready_in(self.rate, now)
    }

    /// Whether `key` has a bucket or may have one: at capacity, refilled
    /// buckets make room.
    fn has_room<Q>(&self, buckets: &mut HashMap<K, Bucket>, key: &Q, now: Instant) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if buckets.contains_key(key) || buckets.len() < self.capacity {
            return true;
        }
        let rate = self.rate;
        buckets.retain(|_, b| !b.is_full(rate, now));
        buckets.len() < self.capacity
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, Bucket>> {
        // Every change is one insert or retain: consistent after a panic.
        self.buckets.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_reason_has_its_own_budget_of_warn_lines() {
        let lines = refusal_line_limiter();
        let t0 = Instant::now();
        for _ in 0..REFUSAL_LINE_BURST {
            assert!(lines.try_take("identity", t0).is_ok());
        }
        assert!(lines.try_take("identity", t0).is_err(), "past its burst");
        assert!(lines.try_take("wrong_key", t0).is_ok(), "another reason");
        let later = t0 + REFUSAL_LINE_PERIOD;
        assert!(lines.try_take("identity", later).is_ok());
        assert!(lines.try_take("identity", later).is_err());
    }

    #[test]
    fn the_limiter_allows_a_burst_then_one_per_period() {
        let limiter = Limiter::new(3, Duration::from_secs(30), 10);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(limiter.try_take("a", t0).is_ok());
        }
        assert_eq!(limiter.try_take("a", t0), Err(Duration::from_secs(30)));
        // Other nodes have their own budget.
        assert!(limiter.try_take("b", t0).is_ok());
        // Half a period earns half a token: not enough, wait the rest.
        let half = t0 + Duration::from_secs(15);
        assert_eq!(limiter.try_take("a", half), Err(Duration::from_secs(15)));
        let later = t0 + Duration::from_secs(30);
        assert!(limiter.try_take("a", later).is_ok());
        assert!(limiter.try_take("a", later).is_err());
        // Idle for long, the budget is the burst again, never more.
        let much_later = later + Duration::from_secs(3600);
        for _ in 0..3 {
            assert!(limiter.try_take("a", much_later).is_ok());
        }
        assert!(limiter.try_take("a", much_later).is_err());
    }

    /// A charge is taken even from an empty bucket, and the bucket says
    /// when it has a token again without taking it: every charge past the
    /// budget is paid by a period's wait.
    #[test]
    fn charges_run_into_debt_that_waiting_pays() {
        let limiter: Limiter<u8> = Limiter::new(2, Duration::from_secs(1), 10);
        let t0 = Instant::now();
        assert_eq!(limiter.ready_in(&1, t0), None, "never charged");
        limiter.charge(&1, t0);
        assert_eq!(limiter.ready_in(&1, t0), None, "one token left");
        for _ in 0..4 {
            limiter.charge(&1, t0);
        }
        // Two tokens, five charges: a debt of three, four periods from a
        // token.
        assert_eq!(limiter.ready_in(&1, t0), Some(Duration::from_secs(4)));
        let later = t0 + Duration::from_secs(3);
        assert_eq!(limiter.ready_in(&1, later), Some(Duration::from_secs(1)));
        assert_eq!(limiter.ready_in(&1, later + Duration::from_secs(1)), None);
        assert_eq!(limiter.ready_in(&2, t0), None, "another key");
    }

    /// Charges stay within the capacity: a new key past it goes uncharged
    /// until a bucket has refilled, and keys held keep their debt.
    #[test]
    fn charges_past_the_capacity_lose_no_key_held() {
        let limiter: Limiter<u8> = Limiter::new(1, Duration::from_secs(1), 1);
        let t0 = Instant::now();
        limiter.charge(&1, t0);
        limiter.charge(&2, t0);
        assert_eq!(limiter.lock().len(), 1);
        assert_eq!(limiter.ready_in(&2, t0), None, "not held, not charged");
        assert!(limiter.ready_in(&1, t0).is_some(), "its debt kept");
        let t1 = t0 + Duration::from_secs(1);
        limiter.charge(&2, t1);
        assert!(limiter.ready_in(&2, t1).is_some(), "room once 1 refilled");
        assert_eq!(limiter.lock().len(), 1);
    }

    #[test]
    fn the_limiter_forgets_idle_nodes_and_stays_bounded() {
        let limiter = Limiter::new(1, Duration::from_secs(30), 2);
        let t0 = Instant::now();
        assert!(limiter.try_take("a", t0).is_ok());
        assert!(limiter.try_take("b", t0).is_ok());
        // Full, and nobody idle: a third node waits.
        assert!(limiter.try_take("c", t0).is_err());
        assert_eq!(limiter.lock().len(), 2);
        // Once a and b have refilled, they make room.
        let t1 = t0 + Duration::from_secs(30);
        assert!(limiter.try_take("c", t1).is_ok());
        assert_eq!(limiter.lock().len(), 1);
    }
}
