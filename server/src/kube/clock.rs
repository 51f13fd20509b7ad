//! The server's one wall clock.
//!
//! Wall time is read here and nowhere else, with the `time` library (the
//! one the identity document's `pendingTime` and the certificates are
//! parsed with). Kubernetes objects carry their timestamps as
//! `k8s_openapi`'s `Time`, a `jiff` timestamp: [`to_k8s`] and
//! [`from_k8s`] are the only crossings, so the rest of the server does its
//! arithmetic in one library. Elapsed time (timeouts, token buckets) is
//! `std::time::Instant`, which is not a clock of this kind.
//!
//! A [`Clock`] is a plain function, so tests inject one that reads a fixed
//! or shifted time (a `pendingTime` in the future, a report from the past)
//! without the server's code knowing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
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

    /// Now, as `k8s_openapi` counts time (full precision: a Lease's
    /// `MicroTime`, a unique Event name).
    pub fn stamp(self) -> Timestamp {
        to_k8s(self.now()).0
    }

    /// Now, as a Kubernetes timestamp in whole seconds (what the API
    /// server stores of a `Time` anyway, so a value written and read back
    /// compares equal).
    pub fn k8s(self) -> Time {
        to_k8s(self.now().replace_nanosecond(0).unwrap_or(self.now()))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::SYSTEM
    }
}

/// `at` as a Kubernetes timestamp.
pub fn to_k8s(at: OffsetDateTime) -> Time {
    // Every year from -9999 to 9999 fits both; the epoch stands in for
    // the impossible rest rather than a panic.
    Time(Timestamp::from_nanosecond(at.unix_timestamp_nanos()).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// A Kubernetes timestamp as `time` holds it (whole seconds, as the API
/// server stores them).
pub fn from_k8s(at: &Time) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(at.0.as_second()).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn a_time_crosses_to_kubernetes_and_back_unchanged() {
        let at = datetime!(2026-11-27 08:15:30 UTC);
        let k8s = to_k8s(at);
        assert_eq!(k8s.0.to_string(), "2026-11-27T08:15:30Z");
        assert_eq!(from_k8s(&k8s), at);
    }

    #[test]
    fn an_injected_clock_is_the_one_read() {
        let clock = Clock::reading(|| datetime!(2030-01-01 00:00:00 UTC));
        assert_eq!(clock.unix(), 1_893_456_000);
        assert_eq!(clock.k8s().0.as_second(), 1_893_456_000);
    }
}
