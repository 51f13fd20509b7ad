//! Progress reports from agents, turned into Events, metrics and, for a
//! definite failure, the NodeClaim's deletion.
//!
//! Deleting the NodeClaim of a machine whose agent gave up makes Karpenter
//! replace it now instead of after its 15-minute registration timeout. Only
//! a report the server can trust may do that. The identity document alone
//! is not enough: any process on the instance can read it, forever. So:
//!
//! - Before the instance is bound to a client key (its first join), a
//!   report cannot be checked against anything: it is shown as an Event
//!   and logged, and a fatal one changes nothing (see [`Trust::Unverified`]).
//! - Once bound, a report must be signed with the bound key, carry a
//!   timestamp within [`REPORT_WINDOW`] of the server's clock, and not be
//!   one this replica has already accepted ([`Replays`]). Only such a
//!   report may delete the NodeClaim (or, with deletion off, mark it
//!   failed).

use crate::kube::binding::{self, Unreadable};
use crate::kube::events::Events;
use crate::kube::karpenter::{aws_provider_id, NodeClaim};
use crate::kube::metrics::{Metrics, PhaseLabels, ReportRefusalLabels};
use crate::kube::nodeclaim::{FindError, NodeClaims, SelectError};
use autonode_shared::identity::{self, IdentityError, Policy, PolicyError, TrustStore};
use autonode_shared::proof::{self, ProofError};
use autonode_shared::protocol::{Outcome, ReportRequest};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use thiserror::Error;
use time::OffsetDateTime;

/// How far a signed report's `timestamp` may be from the server's clock,
/// either way, in seconds.
///
/// The window is what lets the server forget: a report older than this is
/// refused on its timestamp, so [`Replays`] need only remember the reports
/// it accepted within the last two windows. Five minutes (Kerberos's
/// default skew too) is wide enough for an agent whose clock has not synced
/// yet on a freshly booted machine plus a report's own retries (10 s), and
/// narrow enough that a captured report is useless soon after and the set
/// stays small.
pub const REPORT_WINDOW: i64 = 300;

/// Most signed reports [`Replays`] remembers at once. An agent sends a
/// handful per boot; 100k within ten minutes is ~170 reports a second, far
/// beyond any real fleet, and costs ~10 MB. Past it, new signed reports are
/// answered "unavailable" (retried) rather than accepted unremembered.
pub const REPLAY_CAPACITY: usize = 100_000;

/// What report handling needs.
pub struct ReportContext {
    pub trust: TrustStore,
    pub policy: Policy,
    pub claims: NodeClaims,
    pub events: Events,
    pub metrics: Metrics,
    /// Delete the NodeClaim when an agent reports a fatal failure.
    pub delete_on_fatal: bool,
    /// Injected so tests can set the time.
    pub clock: fn() -> OffsetDateTime,
    /// Signed reports this replica accepted within the window.
    pub replays: Replays,
}

#[derive(Debug, Error)]
pub enum ReportError {
    #[error("report refused: {0}")]
    Refused(#[from] ReportRefusal),
    /// Something on our side is unavailable; the agent retries (503).
    #[error("temporarily unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl ReportError {
    /// A report that cannot be handled now, for `why`.
    fn unavailable(why: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Unavailable(why.into())
    }
}

impl From<FindError> for ReportError {
    fn from(e: FindError) -> Self {
        match e {
            FindError::Select(e) => ReportRefusal::NodeClaim(e).into(),
            e @ (FindError::NotListed(_) | FindError::Stale) => Self::unavailable(e),
        }
    }
}

/// A NodeClaim read or write the report needed failed.
#[derive(Debug, Error)]
#[error("{action} NodeClaim {name}: {source}")]
struct ClaimCall {
    action: &'static str,
    name: String,
    #[source]
    source: kube::Error,
}

/// [`Replays`] is full: a signed report is turned away until entries expire.
#[derive(Debug, Error)]
#[error("replay set full")]
struct ReplaysFull;

/// Why a report is refused (final: the agent does not retry a 4xx).
#[derive(Debug, Error)]
pub enum ReportRefusal {
    #[error("identity document: {0}")]
    Identity(#[from] IdentityError),
    /// The instance's account or region is not allowed (the join's own
    /// origin check, [`Policy::check_origin`]).
    #[error(transparent)]
    NotAllowed(#[from] PolicyError),
    /// None or several NodeClaims have the instance's providerID.
    #[error(transparent)]
    NodeClaim(SelectError),
    #[error(transparent)]
    UnreadableBinding(#[from] Unreadable),
    #[error("instance is bound to a key but the report carries no proof")]
    NoProof,
    #[error("proof: {0}")]
    BadProof(#[from] ProofError),
    #[error("report signed by key {offered}, instance bound to {bound}")]
    WrongKey { offered: String, bound: String },
    #[error(
        "timestamp {timestamp} is {skew} s from the server's clock (allowed: {} s)",
        REPORT_WINDOW
    )]
    OutsideWindow { timestamp: i64, skew: u64 },
    #[error("this signed report was already accepted (a replay)")]
    Replayed,
}

impl ReportRefusal {
    /// The metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            ReportRefusal::Identity(_) => "identity",
            ReportRefusal::NotAllowed(_) => "not_allowed",
            ReportRefusal::NodeClaim(_) => "nodeclaims",
            ReportRefusal::UnreadableBinding(_) => "unreadable_binding",
            ReportRefusal::NoProof => "no_proof",
            ReportRefusal::BadProof(_) => "bad_proof",
            ReportRefusal::WrongKey { .. } => "wrong_key",
            ReportRefusal::OutsideWindow { .. } => "outside_window",
            ReportRefusal::Replayed => "replayed",
        }
    }
}

/// How much the server may believe a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trust {
    /// The instance is not bound yet: the report may come from anyone who
    /// read its identity document (a signature, if any, is by a key nothing
    /// vouches for). Good for an Event, never for replacing the machine.
    Unverified,
    /// Signed with the bound key, in the window, not seen before; by the
    /// digest [`Replays`] now remembers it by (see [`Admitted`]).
    Signed([u8; 32]),
}

/// The NodeClaim a report speaks for, and how far it is believed.
struct Sender {
    claim: Arc<NodeClaim>,
    trust: Trust,
}

/// Handles one report.
pub async fn handle(
    ctx: &ReportContext,
    request_id: &str,
    report: ReportRequest,
) -> Result<(), ReportError> {
    let sender = authenticate(ctx, &report).await.inspect_err(|e| {
        if let ReportError::Refused(refusal) = e {
            let reason = refusal.reason();
            ctx.metrics
                .agent_reports_refused
                .get_or_create(&ReportRefusalLabels { reason })
                .inc();
        }
        tracing::warn!(request_id, error = %e, "agent report refused");
    })?;
    let mut admitted = Admitted {
        replays: &ctx.replays,
        digest: match sender.trust {
            Trust::Signed(digest) => Some(digest),
            Trust::Unverified => None,
        },
    };
    let handled = act(ctx, request_id, &sender, &report).await;
    if handled.is_ok() {
        admitted.digest = None;
    }
    handled
}

/// Forgets an admitted report unless its handling completes: a failure, or
/// a request dropped halfway (the agent's try timed out and the connection
/// closed), must not make the agent's retry of the same bytes a "replay".
struct Admitted<'a> {
    replays: &'a Replays,
    digest: Option<[u8; 32]>,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let Some(digest) = self.digest.take() {
            self.replays.forget(&digest);
        }
    }
}

/// Records the report and does what it asks of the NodeClaim.
async fn act(
    ctx: &ReportContext,
    request_id: &str,
    sender: &Sender,
    report: &ReportRequest,
) -> Result<(), ReportError> {
    let claim = sender.claim.as_ref();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let (phase, outcome) = (report.phase.as_str(), report.outcome.as_str());
    ctx.metrics
        .agent_reports
        .get_or_create(&PhaseLabels { phase, outcome })
        .inc();
    let signed = sender.trust != Trust::Unverified;
    tracing::info!(request_id, nodeclaim = %name, phase, outcome, signed, agent_message = report.message.as_str(), "agent report");
    let message = crate::kube::marks::capped(&report.message, crate::kube::marks::MAX_MESSAGE);
    let note = format!("agent phase {phase} {outcome}: {message}");
    match (report.outcome, sender.trust) {
        (Outcome::Succeeded, _) => ctx.events.normal(claim, "AgentProgress", note),
        (Outcome::Retrying, _) => ctx.events.warning(claim, "AgentRetrying", note),
        (Outcome::Fatal, Trust::Unverified) => {
            tracing::warn!(request_id, nodeclaim = %name, "fatal agent report before the instance is bound to a key: unverified, so the NodeClaim is left alone");
            ctx.metrics.agent_reports_unverified_fatal.inc();
            let note = format!("unverified report (the instance is not bound to a key yet, so no signature can be checked), NodeClaim left alone: {note}");
            ctx.events.warning(claim, "BootstrapFailed", note);
        }
        (Outcome::Fatal, Trust::Signed(_)) => {
            ctx.events.warning(claim, "BootstrapFailed", note.clone());
            if claim.is_registered() {
                // Its Node exists: whatever failed, the machine is a node.
            } else if ctx.delete_on_fatal {
                delete(ctx, claim, request_id, &note).await?;
            } else {
                mark_failed(ctx, claim, &note).await?;
            }
        }
    }
    Ok(())
}

/// The NodeClaim this report may speak for, and how far to believe it.
async fn authenticate(ctx: &ReportContext, report: &ReportRequest) -> Result<Sender, ReportError> {
    let verified = identity::verify(report.identity.rsa2048.as_bytes(), &ctx.trust)
        .map_err(ReportRefusal::from)?;
    let doc = verified.document();
    // The time window is for joining; a failure may be reported later.
    ctx.policy.check_origin(doc).map_err(ReportRefusal::from)?;
    let provider_id = aws_provider_id(&doc.availability_zone, &doc.instance_id);
    // The join's own lookup, with its grace: an agent that fails before
    // its join (or a report that races Karpenter's status write) must not
    // lose the report to our cache's lag. A refused agent's final report
    // waits it out again; that costs the machine seconds it has no use for
    // anyway.
    let claim = ctx.claims.one_for(&provider_id).await?;
    let (claim, record) = bound(ctx, claim, report).await?;
    let trust = match record {
        None => Trust::Unverified,
        Some(record) => Trust::Signed(check_signed(ctx, report, &record.client_key)?),
    };
    Ok(Sender { claim, trust })
}

/// `claim` and its binding; read again from the API server when the cache
/// shows none but the report is signed. The agent signs as soon as its key
/// exists, and its first report after the join (a fatal one, say) can
/// arrive before the watch delivers the binding the join wrote: taken as
/// unverified, it would be ignored. Unsigned reports never cost the read.
async fn bound(
    ctx: &ReportContext,
    claim: Arc<NodeClaim>,
    report: &ReportRequest,
) -> Result<(Arc<NodeClaim>, Option<binding::Record>), ReportError> {
    if let Some(record) = binding::recorded(&claim).map_err(ReportRefusal::from)? {
        return Ok((claim, Some(record)));
    }
    if report.proof.is_none() {
        return Ok((claim, None));
    }
    let name = claim.metadata.name.clone().unwrap_or_default();
    let fresh = ctx.claims.get_fresh(&name).await.map_err(|source| {
        ReportError::unavailable(ClaimCall {
            action: "reading",
            name: name.clone(),
            source,
        })
    })?;
    match fresh {
        // The same object (a NodeClaim re-created under the name is not).
        Some(fresh) if fresh.metadata.uid == claim.metadata.uid => {
            let record = binding::recorded(&fresh).map_err(ReportRefusal::from)?;
            Ok((Arc::new(fresh), record))
        }
        _ => Ok((claim, None)),
    }
}

/// Checks a bound instance's report: signed with `bound`, timely, new.
/// Returns the digest it is now remembered by.
fn check_signed(
    ctx: &ReportContext,
    report: &ReportRequest,
    bound: &str,
) -> Result<[u8; 32], ReportError> {
    let proof = report.proof.as_ref().ok_or(ReportRefusal::NoProof)?;
    let signed = report.signed_bytes();
    let offered = proof::verify(proof, &signed).map_err(ReportRefusal::from)?;
    if offered != bound {
        return Err(ReportRefusal::WrongKey {
            offered,
            bound: bound.to_string(),
        }
        .into());
    }
    let now = (ctx.clock)().unix_timestamp();
    within_window(report.timestamp, now)?;
    let digest = proof::replay_digest(&signed);
    ctx.replays.admit(digest, report.timestamp, now)?;
    Ok(digest)
}

/// Whether a report written at `timestamp` may be accepted at `now`.
fn within_window(timestamp: i64, now: i64) -> Result<(), ReportRefusal> {
    let skew = now.abs_diff(timestamp);
    if skew > REPORT_WINDOW.unsigned_abs() {
        return Err(ReportRefusal::OutsideWindow { timestamp, skew });
    }
    Ok(())
}

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
#[derive(Debug)]
pub struct Replays {
    seen: Mutex<Seen>,
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
                capacity,
            }),
        }
    }

    /// Remembers the report with `digest`, written at `timestamp`, unless
    /// it is already remembered (a replay) or the set is full.
    fn admit(&self, digest: [u8; 32], timestamp: i64, now: i64) -> Result<(), ReportError> {
        // The lock guards plain data with no invariant a panic could break
        // halfway, so a poisoned lock is still good to use.
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.prune(now);
        if seen.expiry.contains_key(&digest) {
            return Err(ReportRefusal::Replayed.into());
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
        seen.expiry.insert(digest, expires);
        seen.by_expiry.insert((expires, digest));
        Ok(())
    }

    /// Forgets a report whose handling failed, so its retry is accepted.
    fn forget(&self, digest: &[u8; 32]) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(expires) = seen.expiry.remove(digest) {
            seen.by_expiry.remove(&(expires, *digest));
        }
    }

    /// How many reports are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.expiry.len()
    }
}

/// [`Replays`]' data: each digest with the second after which its report
/// is outside the window, and the same ordered by that second for pruning.
#[derive(Debug)]
struct Seen {
    expiry: HashMap<[u8; 32], i64>,
    by_expiry: BTreeSet<(i64, [u8; 32])>,
    capacity: usize,
}

impl Seen {
    /// Drops the reports the window alone now refuses.
    fn prune(&mut self, now: i64) {
        while let Some(&(expires, digest)) = self.by_expiry.first() {
            if expires >= now {
                break;
            }
            self.by_expiry.pop_first();
            self.expiry.remove(&digest);
        }
    }
}

/// Records the failure on the NodeClaim for the feedback controller's
/// condition, when deleting is turned off.
async fn mark_failed(
    ctx: &ReportContext,
    claim: &NodeClaim,
    note: &str,
) -> Result<(), ReportError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    ctx.claims.mark_failed(&name, note).await.map_err(|source| {
        ReportError::unavailable(ClaimCall {
            action: "marking failed",
            name,
            source,
        })
    })
}

/// Deletes the NodeClaim so Karpenter replaces the machine now.
async fn delete(
    ctx: &ReportContext,
    claim: &NodeClaim,
    request_id: &str,
    why: &str,
) -> Result<(), ReportError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    match ctx.claims.delete_failed(claim, why).await {
        Ok(deleted) => {
            if deleted {
                tracing::warn!(request_id, nodeclaim = %name, "agent failed for good (signed report); NodeClaim deleted so Karpenter replaces the machine now");
                ctx.metrics.nodeclaims_deleted.inc();
            }
            Ok(())
        }
        Err(source) => Err(ReportError::unavailable(ClaimCall {
            action: "deleting",
            name,
            source,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000;

    fn digest(n: u8) -> [u8; 32] {
        [n; 32]
    }

    #[test]
    fn the_window_is_inclusive_both_ways() {
        assert!(within_window(NOW, NOW).is_ok());
        assert!(within_window(NOW - REPORT_WINDOW, NOW).is_ok());
        assert!(within_window(NOW + REPORT_WINDOW, NOW).is_ok());
        let late = within_window(NOW - REPORT_WINDOW - 1, NOW).unwrap_err();
        assert_eq!(late.reason(), "outside_window");
        assert!(within_window(NOW + REPORT_WINDOW + 1, NOW).is_err());
        // Absurd timestamps are refused, not overflowed.
        assert!(within_window(i64::MIN, NOW).is_err());
        assert!(within_window(i64::MAX, NOW).is_err());
    }

    #[test]
    fn a_report_is_accepted_once() {
        let replays = Replays::default();
        replays.admit(digest(1), NOW, NOW).unwrap();
        let again = replays.admit(digest(1), NOW, NOW + 10).unwrap_err();
        assert!(matches!(
            again,
            ReportError::Refused(ReportRefusal::Replayed)
        ));
        replays.admit(digest(2), NOW, NOW + 10).unwrap();
    }

    #[test]
    fn a_report_is_remembered_until_the_window_refuses_it() {
        let replays = Replays::default();
        replays.admit(digest(1), NOW, NOW).unwrap();
        // While the timestamp is in the window, so is the digest.
        let last = NOW + REPORT_WINDOW;
        assert!(within_window(NOW, last).is_ok());
        assert!(replays.admit(digest(1), NOW, last).is_err());
        // One second later the window refuses it, and the set forgets it.
        assert!(within_window(NOW, last + 1).is_err());
        replays.admit(digest(2), last + 1, last + 1).unwrap();
        assert_eq!(replays.len(), 1);
    }

    #[test]
    fn a_full_set_turns_reports_away_until_entries_expire() {
        let replays = Replays::with_capacity(2);
        replays.admit(digest(1), NOW, NOW).unwrap();
        replays.admit(digest(2), NOW + 5, NOW).unwrap();
        let full = replays.admit(digest(3), NOW, NOW).unwrap_err();
        assert!(matches!(full, ReportError::Unavailable(_)), "{full}");
        // The first expires; the second is still there.
        replays
            .admit(digest(3), NOW, NOW + REPORT_WINDOW + 1)
            .unwrap();
        assert_eq!(replays.len(), 2);
        assert!(replays
            .admit(digest(2), NOW + 5, NOW + REPORT_WINDOW + 1)
            .is_err());
    }

    #[test]
    fn a_report_whose_handling_did_not_finish_may_be_sent_again() {
        let replays = Replays::default();
        replays.admit(digest(1), NOW, NOW).unwrap();
        // Failed or dropped: the guard is still armed.
        drop(Admitted {
            replays: &replays,
            digest: Some(digest(1)),
        });
        assert_eq!(replays.len(), 0);
        replays.admit(digest(1), NOW, NOW + 1).unwrap();
        // Done: disarmed, remembered.
        drop(Admitted {
            replays: &replays,
            digest: None,
        });
        assert!(replays.admit(digest(1), NOW, NOW + 2).is_err());
    }

    #[test]
    fn the_default_capacity_is_the_documented_bound() {
        let replays = Replays::default();
        let seen = replays.seen.lock().unwrap();
        assert_eq!(seen.capacity, REPLAY_CAPACITY);
    }
}
