//! What each replica remembers of the signed reports it accepted, so that
//! none is accepted twice, and the quota that keeps one instance's flood of
//! signed reports to its own slots.

use super::refusal::{ReportError, ReportRefusal};
use super::REPORT_WINDOW;
use crate::primitives::limiter::Limiter;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Signed reports one instance may send at once before the quota holds it
/// to one per [`QUOTA_PERIOD`]. An agent sends a few per boot (each phase,
/// retrying ones from the third failure then once a minute, a final one).
pub const QUOTA_BURST: u32 = 10;

/// One more signed report per instance per this long, past [`QUOTA_BURST`].
pub const QUOTA_PERIOD: Duration = Duration::from_secs(30);

/// Instances whose quota is tracked at once (idle ones are forgotten: a
/// full bucket is no bucket). Only instances with a bound key get one.
pub(super) const QUOTA_INSTANCES: usize = 20_000;

/// Most reports [`Replays`] remembers for one instance. Within the time a
/// report is remembered ([`REPORT_WINDOW`] + [`FUTURE_SKEW`](super::FUTURE_SKEW), 360 s) the
/// quota lets an instance send at most [`QUOTA_BURST`] + 360 / 30 = 22, so an
/// honest agent never meets this; it bounds what one instance can hold
/// even if the quota were raised.
pub const REPLAY_SLOTS_PER_INSTANCE: usize = 32;

/// Most signed reports [`Replays`] remembers at once. An agent sends a
/// handful per boot; 100k within six minutes, at most
/// [`REPLAY_SLOTS_PER_INSTANCE`] from any one instance, takes thousands of
/// machines reporting at their quota together, far beyond any real fleet,
/// and costs ~10 MB. Past it, new signed reports are answered "unavailable"
/// (retried) rather than accepted unremembered.
pub const REPLAY_CAPACITY: usize = 100_000;

/// [`Replays`] is full: a signed report is turned away until entries expire.
#[derive(Debug, Error)]
#[error("replay set full")]
struct ReplaysFull;

/// The signed reports this replica accepted whose timestamps are still in
/// the window: a report is refused when it is already here.
///
/// Replica-local and in memory, on purpose: sharing it would put a write
/// to the API server (or another store) on every report. The residual: a
/// captured report replayed to *another* replica (or to this one after a
/// restart) within [`REPORT_WINDOW`] is accepted again. That replay can
/// only repeat what the node's own key already said about its own
/// NodeClaim: a duplicate Event, or a second delete of a NodeClaim already
/// deleted (a no-op: the delete is conditional on its uid). It cannot speak
/// for another machine, nor outlive the window.
///
/// Fair across instances: each may hold at most
/// [`REPLAY_SLOTS_PER_INSTANCE`] reports, and past that only its own reports
/// are refused (429); nothing one instance sends evicts or crowds out
/// another's. The quota that keeps an instance well under its slots lives
/// here too, so each replica has one of each.
pub struct Replays {
    seen: Mutex<Seen>,
    /// Signed reports per instance ([`QUOTA_BURST`], [`QUOTA_PERIOD`]).
    quota: Limiter,
}

impl std::fmt::Debug for Replays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replays").finish_non_exhaustive()
    }
}

impl Default for Replays {
    fn default() -> Self {
        Self::with_capacity(REPLAY_CAPACITY)
    }
}

impl Replays {
    /// A set holding at most `capacity` reports.
    pub fn with_capacity(capacity: usize) -> Self {
        Replays {
            seen: Mutex::new(Seen {
                expiry: HashMap::new(),
                by_expiry: BTreeSet::new(),
                per_instance: HashMap::new(),
                capacity,
            }),
            quota: Limiter::new(QUOTA_BURST, QUOTA_PERIOD, QUOTA_INSTANCES),
        }
    }

    /// Remembers `instance`'s report with `digest`, written at `timestamp`,
    /// unless it is already remembered (a replay), the instance holds all
    /// its slots, or the set is full.
    pub(super) fn admit(
        &self,
        instance: &str,
        digest: [u8; 32],
        timestamp: i64,
        now: i64,
    ) -> Result<(), ReportError> {
        // The lock guards plain data with no invariant a panic could break
        // halfway, so a poisoned lock is still good to use.
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.prune(now);
        if seen.expiry.contains_key(&digest) {
            return Err(ReportRefusal::Replayed.into());
        }
        let held = seen.per_instance.get(instance).copied().unwrap_or(0);
        if held >= REPLAY_SLOTS_PER_INSTANCE {
            // Its own slots free as its own reports leave the window.
            let oldest = seen
                .expiry
                .values()
                .filter(|(_, who)| who.as_str() == instance)
                .map(|(expires, _)| *expires)
                .min()
                .unwrap_or(now);
            return Err(ReportError::TooMany {
                instance_id: instance.to_string(),
                retry_after: Duration::from_secs(
                    u64::try_from(oldest.saturating_sub(now)).unwrap_or(0) + 1,
                ),
            });
        }
        if seen.expiry.len() >= seen.capacity {
            // Accepting it unremembered would let it be replayed; refusing
            // for good would lose an honest report. The agent retries.
            tracing::warn!(
                capacity = seen.capacity,
                "replay set full: signed reports are turned away until entries expire"
            );
            return Err(ReportError::unavailable(ReplaysFull));
        }
        // Past this, the window refuses the report on its own.
        let expires = timestamp.saturating_add(REPORT_WINDOW);
        seen.expiry.insert(digest, (expires, instance.to_string()));
        seen.by_expiry.insert((expires, digest));
        *seen.per_instance.entry(instance.to_string()).or_insert(0) += 1;
        Ok(())
    }

    /// Holds the report remembered by `digest` (none for an unsigned one)
    /// until its handling completes; forgotten if it does not.
    pub fn hold(&self, digest: Option<[u8; 32]>) -> Admitted<'_> {
        Admitted {
            replays: self,
            digest,
        }
    }

    /// Takes one of `instance`'s quota of signed reports, or says when the
    /// next is accepted.
    pub(super) fn take_quota(&self, instance: &str, now: Instant) -> Result<(), ReportError> {
        self.quota
            .try_take(instance, now)
            .map_err(|retry_after| ReportError::TooMany {
                instance_id: instance.to_string(),
                retry_after,
            })
    }

    /// Forgets a report whose handling failed, so its retry is accepted.
    fn forget(&self, digest: &[u8; 32]) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.remove(digest);
    }

    /// How many reports are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.expiry.len()
    }
}

/// [`Replays`]' data: each digest with the second after which its report
/// is outside the window and the instance that sent it, the same ordered by
/// that second for pruning, and how many each instance holds.
#[derive(Debug)]
struct Seen {
    expiry: HashMap<[u8; 32], (i64, String)>,
    by_expiry: BTreeSet<(i64, [u8; 32])>,
    per_instance: HashMap<String, usize>,
    capacity: usize,
}

impl Seen {
    /// Drops the reports the window alone now refuses.
    fn prune(&mut self, now: i64) {
        while let Some(&(expires, digest)) = self.by_expiry.first() {
            if expires >= now {
                break;
            }
            self.remove(&digest);
        }
    }

    /// Forgets one report, and its slot in its instance's count.
    fn remove(&mut self, digest: &[u8; 32]) {
        let Some((expires, instance)) = self.expiry.remove(digest) else {
            return;
        };
        self.by_expiry.remove(&(expires, *digest));
        if let Some(held) = self.per_instance.get_mut(&instance) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                self.per_instance.remove(&instance);
            }
        }
    }
}

/// Forgets an admitted report unless its handling completes: a failure, or
/// a request dropped halfway (the agent's try timed out and the connection
/// closed), must not make the agent's retry of the same bytes a "replay".
#[must_use = "dropped, it forgets the report at once"]
pub struct Admitted<'a> {
    replays: &'a Replays,
    digest: Option<[u8; 32]>,
}

impl Admitted<'_> {
    /// The report's handling completed: it stays remembered.
    pub fn keep(mut self) {
        self.digest = None;
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let Some(digest) = self.digest.take() {
            self.replays.forget(&digest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::authenticate::within_window;

    const NOW: i64 = 1_700_000_000;

    fn digest(n: u8) -> [u8; 32] {
        [n; 32]
    }

    #[test]
    fn a_report_is_accepted_once() {
        let replays = Replays::default();
        replays.admit("i-1", digest(1), NOW, NOW).unwrap();
        let again = replays.admit("i-1", digest(1), NOW, NOW + 10).unwrap_err();
        assert!(matches!(
            again,
            ReportError::Refused(ReportRefusal::Replayed)
        ));
        replays.admit("i-1", digest(2), NOW, NOW + 10).unwrap();
    }

    #[test]
    fn a_report_is_remembered_until_the_window_refuses_it() {
        let replays = Replays::default();
        replays.admit("i-1", digest(1), NOW, NOW).unwrap();
        // While the timestamp is in the window, so is the digest.
        let last = NOW + REPORT_WINDOW;
        assert!(within_window(NOW, last).is_ok());
        assert!(replays.admit("i-1", digest(1), NOW, last).is_err());
        // One second later the window refuses it, and the set forgets it.
        assert!(within_window(NOW, last + 1).is_err());
        replays.admit("i-1", digest(2), last + 1, last + 1).unwrap();
        assert_eq!(replays.len(), 1);
    }

    #[test]
    fn a_full_set_turns_reports_away_until_entries_expire() {
        let replays = Replays::with_capacity(2);
        replays.admit("i-1", digest(1), NOW, NOW).unwrap();
        replays.admit("i-1", digest(2), NOW + 5, NOW).unwrap();
        let full = replays.admit("i-1", digest(3), NOW, NOW).unwrap_err();
        assert!(matches!(full, ReportError::Unavailable(_)), "{full}");
        // The first expires; the second is still there.
        replays
            .admit("i-1", digest(3), NOW, NOW + REPORT_WINDOW + 1)
            .unwrap();
        assert_eq!(replays.len(), 2);
        assert!(replays
            .admit("i-1", digest(2), NOW + 5, NOW + REPORT_WINDOW + 1)
            .is_err());
    }

    #[test]
    fn a_report_whose_handling_did_not_finish_may_be_sent_again() {
        let replays = Replays::default();
        replays.admit("i-1", digest(1), NOW, NOW).unwrap();
        // Failed or dropped: the guard is still armed.
        drop(replays.hold(Some(digest(1))));
        assert_eq!(replays.len(), 0);
        replays.admit("i-1", digest(1), NOW, NOW + 1).unwrap();
        // Done: kept, remembered.
        replays.hold(Some(digest(1))).keep();
        assert!(replays.admit("i-1", digest(1), NOW, NOW + 2).is_err());
    }

    #[test]
    fn an_instance_past_its_slots_is_refused_and_others_are_not() {
        let replays = Replays::default();
        for n in 0..REPLAY_SLOTS_PER_INSTANCE {
            let mut digest = [0; 32];
            digest[..2].copy_from_slice(&[u8::try_from(n).unwrap(), 0xf1]);
            replays.admit("i-flood", digest, NOW, NOW).unwrap();
        }
        let over = replays
            .admit("i-flood", digest(0xee), NOW, NOW)
            .unwrap_err();
        match over {
            ReportError::TooMany {
                instance_id,
                retry_after,
            } => {
                assert_eq!(instance_id, "i-flood");
                assert_eq!(
                    retry_after.as_secs(),
                    u64::try_from(REPORT_WINDOW).unwrap() + 1
                );
            }
            other => panic!("{other}"),
        }
        replays.admit("i-other", digest(0xee), NOW, NOW).unwrap();
        // Its own reports leave the window, and free its own slots.
        replays
            .admit("i-flood", digest(0xed), NOW, NOW + REPORT_WINDOW + 1)
            .unwrap();
    }

    #[test]
    fn the_quota_holds_an_instance_to_its_burst_then_one_per_period() {
        let replays = Replays::default();
        let t0 = Instant::now();
        for _ in 0..QUOTA_BURST {
            replays.quota.try_take("i-1", t0).unwrap();
        }
        assert_eq!(replays.quota.try_take("i-1", t0), Err(QUOTA_PERIOD));
        assert!(replays.quota.try_take("i-2", t0).is_ok());
    }

    #[test]
    fn the_default_capacity_is_the_documented_bound() {
        let replays = Replays::default();
        let seen = replays.seen.lock().unwrap();
        assert_eq!(seen.capacity, REPLAY_CAPACITY);
    }
}
