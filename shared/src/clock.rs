//! The one wall clock, for the agent and the server alike.
//!
//! Wall time is read through a [`Clock`] and nowhere else, with the `time`
//! library (the one the identity document's `pendingTime` and the
//! certificates are parsed with). Elapsed time (timeouts, retries, token
//! buckets) is `Instant`, which is not a clock of this kind.
//!
//! A [`Clock`] is a plain function, so a test injects one that reads a
//! fixed or shifted time (a `pendingTime` in the future, a certificate
//! already expired) without the code under test knowing. The server adds
//! the crossing to Kubernetes' timestamps in its `primitives::clock`.

use time::OffsetDateTime;

/// Where "now" comes from: the system's clock, or a test's.
#[derive(Debug, Clone, Copy)]
pub struct Clock(fn() -> OffsetDateTime);

impl Clock {
    /// The system's clock, in UTC.
    pub const SYSTEM: Clock = Clock(OffsetDateTime::now_utc);

    /// A clock that reads `now` (a test's fixed or shifted time).
    pub const fn reading(now: fn() -> OffsetDateTime) -> Self {
        Clock(now)
    }

    /// Now.
    pub fn now(self) -> OffsetDateTime {
        (self.0)()
    }

    /// Now, in whole Unix seconds.
    pub fn unix(self) -> i64 {
        self.now().unix_timestamp()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::SYSTEM
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn an_injected_clock_is_the_one_read() {
        let clock = Clock::reading(|| datetime!(2030-01-01 00:00:00 UTC));
        assert_eq!(clock.unix(), 1_893_456_000);
    }
}
