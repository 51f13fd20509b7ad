//! Per-node token buckets that pace the approver's real EC2 lookups.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Per-node token buckets for real EC2 lookups: `burst` at once, then one
/// per `period`. Bounded: at `capacity` nodes, buckets that have refilled
/// (indistinguishable from no bucket) are dropped; if none has, the new node
/// waits a period, as it would have to at worst anyway.
pub(super) struct Limiter {
    burst: f64,
    period: Duration,
    capacity: usize,
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// Tokens left, as of `at`.
#[derive(Clone, Copy)]
pub(super) struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// The bucket as of `now`, refilled at one token per `period`.
    fn refilled(self, now: Instant, burst: f64, period: Duration) -> Self {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() / period.as_secs_f64();
        Self {
            tokens: (self.tokens + earned).min(burst),
            at: now,
        }
    }
}

impl Limiter {
    pub(super) fn new(burst: u32, period: Duration, capacity: usize) -> Self {
        Self {
            burst: f64::from(burst.max(1)),
            // A zero period would divide by zero; it means "no limit" anyway.
            period: period.max(Duration::from_millis(1)),
            capacity,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a lookup from `node`'s budget, or says how long until one.
    pub(super) fn try_take(&self, node: &str, now: Instant) -> Result<(), Duration> {
        let (burst, period) = (self.burst, self.period);
        let mut buckets = self.lock();
        if !buckets.contains_key(node) && buckets.len() >= self.capacity {
            buckets.retain(|_, b| b.refilled(now, burst, period).tokens < burst);
            if buckets.len() >= self.capacity {
                return Err(period);
            }
        }
        let bucket = buckets.entry(node.to_string()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        *bucket = bucket.refilled(now, burst, period);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(period.mul_f64(1.0 - bucket.tokens))
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<String, Bucket>> {
        // Every change is one insert or retain: consistent after a panic.
        self.buckets.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
