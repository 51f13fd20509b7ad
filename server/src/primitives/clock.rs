//! The server's side of the one wall clock ([`autonode_shared::clock`]).
//!
//! Kubernetes objects carry their timestamps as
//! `k8s_openapi`'s `Time`, a `jiff` timestamp: [`to_k8s`] and
//! [`from_k8s`] are the only crossings, so the rest of the server does its
//! arithmetic in one library.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use time::OffsetDateTime;

pub use autonode_shared::clock::Clock;

/// The crossings of [`Clock`]'s "now" into Kubernetes' timestamps.
pub trait KubeTime {
    /// Now, as `k8s_openapi` counts time (full precision: a Lease's
    /// `MicroTime`, a unique Event name).
    fn stamp(self) -> Timestamp;

    /// Now, as a Kubernetes timestamp in whole seconds (what the API
    /// server stores of a `Time` anyway, so a value written and read back
    /// compares equal).
    fn k8s(self) -> Time;
}

impl KubeTime for Clock {
    fn stamp(self) -> Timestamp {
        to_k8s(self.now()).0
    }

    fn k8s(self) -> Time {
        let now = self.now();
        to_k8s(now.replace_nanosecond(0).unwrap_or(now))
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
