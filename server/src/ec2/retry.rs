//! How often and how patiently to retry a transient EC2 failure, as data.

use autonode_shared::backoff::Backoff;
use std::time::Duration;

/// How an EC2 lookup is retried: its tries and the bounds of its pauses,
/// made into the shared [`Backoff`] (exponential, with jitter): attempt `n`
/// (0-based) that failed transiently is followed by a pause drawn from
/// `[d/2, d]`, where `d = min(cap, base * 2^n)`. Jitter keeps many replicas
/// that were throttled together from retrying together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LookupRetries {
    /// Tries in all, the first included; 1 means no retry.
    pub attempts: u32,
    pub base: Duration,
    pub cap: Duration,
}

impl Default for LookupRetries {
    /// Four tries over at most about 3.5 s: a join waits on this, and the
    /// agent retries the whole join anyway.
    fn default() -> Self {
        Self {
            attempts: 4,
            base: Duration::from_millis(250),
            cap: Duration::from_secs(2),
        }
    }
}

impl LookupRetries {
    /// These values as the shared policy: doubling, and up to half of each
    /// delay taken off at random.
    pub fn backoff(&self) -> Backoff {
        Backoff {
            initial: self.base,
            factor: 2,
            cap: self.cap,
            jitter: 0.5,
            attempts: Some(self.attempts),
        }
    }

    /// The longest pause after failed attempt `attempt` (0-based).
    pub fn max_delay(&self, attempt: u32) -> Duration {
        self.backoff().full(attempt)
    }

    /// The pause after failed attempt `attempt`, jittered.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.backoff().delay(attempt, rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let policy = LookupRetries {
            attempts: 10,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        };
        let ms = |n| policy.max_delay(n).as_millis();
        assert_eq!(
            [ms(0), ms(1), ms(2), ms(3), ms(4), ms(40)],
            [100, 200, 400, 800, 1000, 1000]
        );
        for n in 0..6 {
            let d = policy.delay(n);
            assert!(
                d >= policy.max_delay(n) / 2 && d <= policy.max_delay(n),
                "{d:?}"
            );
        }
    }

    #[test]
    fn zero_base_means_no_pause() {
        let policy = LookupRetries {
            attempts: 3,
            base: Duration::ZERO,
            cap: Duration::ZERO,
        };
        assert_eq!(policy.delay(2), Duration::ZERO);
    }
}
