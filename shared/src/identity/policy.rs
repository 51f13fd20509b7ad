//! Who may join, and when: checks on a verified document.

use super::document::IdentityDocument;
use super::error::PolicyError;
use std::collections::BTreeSet;
use time::{Duration, OffsetDateTime};

/// Default allowance for `pendingTime` being ahead of our clock.
///
/// `pendingTime` is stamped by EC2's control plane and compared with the
/// server's clock; both are NTP-disciplined (Amazon Time Sync on EC2), so
/// real skew is well under a second. Five minutes is the customary
/// allowance (Kerberos's default) and harmless here: a future pendingTime
/// is a sanity check on our own clock, not a defence, since the document is
/// AWS-signed either way. It stays far below the maximum age.
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::minutes(5);

/// Default maximum age of `pendingTime`.
///
/// Karpenter deletes an instance whose node has not registered within 15
/// minutes of the NodeClaim's creation (hard-coded), and the instance's
/// pendingTime is after that creation, so a join later than this can never
/// succeed; refusing it shrinks the window in which a leaked document is
/// worth anything.
pub const DEFAULT_MAX_AGE: Duration = Duration::minutes(15);

/// Allow-lists and the time window. Empty allow-lists allow nothing: a
/// server that forgot to configure them refuses every node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// AWS accounts whose instances may join.
    pub accounts: BTreeSet<String>,
    /// Regions whose instances may join.
    pub regions: BTreeSet<String>,
    /// Oldest `pendingTime` accepted, as an age relative to now.
    pub max_age: Duration,
    /// How far `pendingTime` may be ahead of now.
    pub clock_skew: Duration,
}

impl Policy {
    /// A policy for these accounts and regions with the default window.
    pub fn new<A, R>(accounts: A, regions: R) -> Self
    where
        A: IntoIterator,
        A::Item: Into<String>,
        R: IntoIterator,
        R::Item: Into<String>,
    {
        Self {
            accounts: accounts.into_iter().map(Into::into).collect(),
            regions: regions.into_iter().map(Into::into).collect(),
            max_age: DEFAULT_MAX_AGE,
            clock_skew: DEFAULT_CLOCK_SKEW,
        }
    }

    /// Check `doc` at time `now` (passed in so tests and replays set it):
    /// its origin ([`Policy::check_origin`]), then the pendingTime window.
    pub fn check(&self, doc: &IdentityDocument, now: OffsetDateTime) -> Result<(), PolicyError> {
        self.check_origin(doc)?;
        self.check_time(doc.pending_time, now)
    }

    /// Whether `doc`'s instance is in an allowed account and region: the
    /// part of the policy that holds for the instance's whole life. A join
    /// also needs the time window ([`Policy::check`]); an agent's report
    /// needs only this, since a failure may be reported after the window.
    pub fn check_origin(&self, doc: &IdentityDocument) -> Result<(), PolicyError> {
        if !self.accounts.contains(&doc.account_id) {
            return Err(PolicyError::AccountNotAllowed(doc.account_id.clone()));
        }
        if !self.regions.contains(&doc.region) {
            return Err(PolicyError::RegionNotAllowed(doc.region.clone()));
        }
        Ok(())
    }

    fn check_time(&self, pending: OffsetDateTime, now: OffsetDateTime) -> Result<(), PolicyError> {
        if pending > now + self.clock_skew {
            return Err(PolicyError::PendingTimeInFuture {
                pending: rfc3339(pending),
                now: rfc3339(now),
                skew_s: self.clock_skew.whole_seconds(),
            });
        }
        if now - pending > self.max_age {
            return Err(PolicyError::TooOld {
                pending: rfc3339(pending),
                now: rfc3339(now),
                max_age_s: self.max_age.whole_seconds(),
            });
        }
        Ok(())
    }
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.to_string())
}
