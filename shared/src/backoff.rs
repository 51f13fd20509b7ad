//! One backoff policy, as data: how long to wait before each retry.
//!
//! The agent (its join, IMDS and reports), the server's EC2 lookups and
//! the server's watches all retry with capped exponential backoff and
//! jitter. Each keeps its own values and its own loop (a deadline, a count
//! of tries, a reset on success); the arithmetic is this one function, so
//! the sites cannot drift apart in how a delay grows or what jitter means.
//!
//! Pure: the randomness is passed in, as a number in [0, 1), so tests can
//! pin it and the agent can draw it without a random-number crate.

use std::time::Duration;

/// Capped exponential backoff with jitter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The delay before the first retry.
    pub initial: Duration,
    /// How much each delay grows over the one before.
    pub factor: u32,
    /// The longest delay.
    pub cap: Duration,
    /// The fraction (0..=1) of each delay that is random: a delay is
    /// shortened by up to this much, so that many clients that failed
    /// together (a fleet booting, replicas throttled at once) do not retry
    /// in lockstep. Never lengthened: the cap stays a cap.
    pub jitter: f64,
    /// Tries in all, the first included (1: no retry); `None`: no limit
    /// but the site's own (a deadline, or none).
    pub attempts: Option<u32>,
}

impl Backoff {
    /// The delay before retry `retry` (0: the first retry) without jitter:
    /// `initial · factor^retry`, at most `cap`.
    pub fn full(&self, retry: u32) -> Duration {
        let growth = self.factor.checked_pow(retry).unwrap_or(u32::MAX);
        self.initial.saturating_mul(growth).min(self.cap)
    }

    /// The delay before retry `retry` (0: the first retry), `random` in
    /// [0, 1) choosing how much of the [`Backoff::jitter`] to take off.
    /// Out-of-range inputs are clamped (NaN counts as 0), never a panic.
    pub fn delay(&self, retry: u32, random: f64) -> Duration {
        let unit = |x: f64| if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) };
        self.full(retry)
            .mul_f64(1.0 - unit(self.jitter) * unit(random))
    }

    /// Whether a try numbered `tries` (from 1) may be followed by another.
    pub fn may_retry_after(&self, tries: u32) -> bool {
        self.attempts.is_none_or(|max| tries < max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Backoff = Backoff {
        initial: Duration::from_millis(100),
        factor: 2,
        cap: Duration::from_secs(1),
        jitter: 0.5,
        attempts: Some(3),
    };

    #[test]
    fn delays_grow_by_the_factor_up_to_the_cap() {
        let ms: Vec<u128> = (0..6).map(|n| POLICY.full(n).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(POLICY.full(u32::MAX), POLICY.cap);
        let triple = Backoff {
            factor: 3,
            ..POLICY
        };
        assert_eq!(triple.full(2), Duration::from_millis(900));
        let flat = Backoff {
            factor: 1,
            ..POLICY
        };
        assert_eq!(flat.full(40), POLICY.initial);
        let zero = Backoff {
            initial: Duration::ZERO,
            ..POLICY
        };
        assert_eq!(zero.delay(5, 0.3), Duration::ZERO);
    }

    #[test]
    fn jitter_only_shortens_by_at_most_its_fraction() {
        assert_eq!(POLICY.delay(2, 0.0), Duration::from_millis(400));
        assert_eq!(POLICY.delay(2, 0.5), Duration::from_millis(300));
        assert_eq!(POLICY.delay(2, 1.0), Duration::from_millis(200));
        for random in [-1.0, 2.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let delay = POLICY.delay(2, random);
            assert!(delay <= POLICY.full(2) && delay >= POLICY.full(2) / 2);
        }
        let wild = Backoff {
            jitter: f64::NAN,
            ..POLICY
        };
        assert_eq!(wild.delay(0, 0.9), POLICY.initial);
        let all = Backoff {
            jitter: 7.0,
            ..POLICY
        };
        assert_eq!(all.delay(0, 1.0), Duration::ZERO);
    }

    #[test]
    fn attempts_count_every_try() {
        assert!(POLICY.may_retry_after(1));
        assert!(POLICY.may_retry_after(2));
        assert!(!POLICY.may_retry_after(3));
        let once = Backoff {
            attempts: Some(1),
            ..POLICY
        };
        assert!(!once.may_retry_after(1));
        let unlimited = Backoff {
            attempts: None,
            ..POLICY
        };
        assert!(unlimited.may_retry_after(u32::MAX));
    }
}
