//! How the server's watches come back after the API server was away.
//!
//! kube-runtime's `default_backoff` grows to 30 s between attempts: after
//! a 20-second API server outage its next try can come 25 s after the API
//! server is back, and until then the NodeClaim cache is stale and joins
//! wait on CSR signatures they never hear about. The join path cannot wait
//! that long, so its watches retry from 0.5 s up to 4 s (with jitter, so
//! replicas do not reconnect in lockstep): a handful of requests more per
//! outage, against a control plane that is coming back anyway.

use autonode_shared::backoff as shared;
use kube::runtime::utils::Backoff;
use std::time::Duration;

/// First delay after a watch error.
pub const FIRST: Duration = Duration::from_millis(500);
/// Longest delay between attempts.
pub const MAX: Duration = Duration::from_secs(4);

/// The watches' policy: [`FIRST`] doubling to [`MAX`], up to a quarter of
/// each delay taken off so replicas spread out; no limit on tries.
pub const POLICY: shared::Backoff = shared::Backoff {
    initial: FIRST,
    factor: 2,
    cap: MAX,
    jitter: 0.25,
    attempts: None,
};

/// [`POLICY`]'s delays one after another, reset by any successful event.
#[derive(Debug, Clone, Default)]
pub struct WatchBackoff {
    /// Retries since the last reset.
    retries: u32,
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = POLICY.delay(self.retries, rand::random::<f64>());
        self.retries = self.retries.saturating_add(1);
        Some(delay)
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.retries = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_and_resets() {
        let mut backoff = WatchBackoff::default();
        let delays: Vec<Duration> = backoff.by_ref().take(8).collect();
        assert!(delays[0] <= FIRST && delays[0] >= FIRST.mul_f64(0.75));
        assert!(delays.iter().all(|d| *d <= MAX));
        assert!(delays[7] >= MAX.mul_f64(0.75), "{delays:?}");
        backoff.reset();
        assert!(backoff.next().is_some_and(|d| d <= FIRST));
    }
}
