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
//!   and logged, and a fatal one changes nothing (see `Trust::Unverified`).
//! - Once bound, a report must be signed with the bound key, carry a
//!   timestamp at most [`REPORT_WINDOW`] behind the server's clock and
//!   [`FUTURE_SKEW`] ahead, fit its instance's quota ([`QUOTA_BURST`], then
//!   one per [`QUOTA_PERIOD`]), and not be one this replica has already
//!   accepted ([`Replays`]). Only such a report may delete the NodeClaim
//!   (or, with deletion off, mark it failed).
//!
//! The quota and the replay memory are per instance, and counted only for
//! reports signed with the instance's bound key: one node flooding signed
//! reports is told 429 and fills only its own slots, never another
//! machine's, so every other node's fatal report still acts.

use crate::kube::binding::{self, Unreadable};
use crate::primitives::clock::Clock;
use crate::kube::events::Events;
use crate::kube::karpenter::{aws_provider_id, NodeClaim};
use crate::primitives::limiter::Limiter;
use crate::kube::metrics::{Metrics, PhaseLabels, ReportRefusalLabels};
use crate::kube::nodeclaim::{Failed, FindError, NodeClaims, OnFailure, SelectError};
use crate::kube::reason::Reason;
use autonode_shared::identity::{self, IdentityError, Policy, PolicyError, TrustStore};
use autonode_shared::proof::{self, ProofError};
use autonode_shared::protocol::{Outcome, ReportRequest};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use thiserror::Error;

/// How far a signed report's `timestamp` may be behind the server's clock,
/// in seconds (ahead: [`FUTURE_SKEW`]).
///
/// The window is what lets the server forget: a report older than this is
/// refused on its timestamp, so [`Replays`] need only remember the reports
/// it accepted within the last two windows. Five minutes (Kerberos's
/// default skew too) is wide enough for an agent whose clock has not synced
/// yet on a freshly booted machine plus a report's own retries (10 s), and
/// narrow enough that a captured report is useless soon after and the set
/// stays small.
pub const REPORT_WINDOW: i64 = 300;

/// How far a signed report's `timestamp` may be ahead of the server's
/// clock, in seconds.
///
/// A report is remembered until its timestamp plus [`REPORT_WINDOW`], so a
/// timestamp in the future is memory held longer: with the full window
/// ahead, one report held a slot for ten minutes. A clock runs ahead of the
/// server's only by drift, which on EC2 (the hypervisor's clock at boot,
/// Amazon Time Sync after) is well under a second; a minute covers that and
/// a server whose own clock lags, and keeps a report's memory under
/// [`REPORT_WINDOW`] + a minute. Behind stays wide: a report may be retried,
/// or written before the network (and so the time sync) came up.
pub const FUTURE_SKEW: i64 = 60;

/// Signed reports one instance may send at once before the quota holds it
/// to one per [`QUOTA_PERIOD`]. An agent sends a few per boot (each phase,
/// retrying ones from the third failure then once a minute, a final one).
pub const QUOTA_BURST: u32 = 10;

/// One more signed report per instance per this long, past [`QUOTA_BURST`].
pub const QUOTA_PERIOD: Duration = Duration::from_secs(30);

/// Instances whose quota is tracked at once (idle ones are forgotten: a
/// full bucket is no bucket). Only instances with a bound key get one.
const QUOTA_INSTANCES: usize = 20_000;

/// Most reports [`Replays`] remembers for one instance. Within the time a
/// report is remembered ([`REPORT_WINDOW`] + [`FUTURE_SKEW`], 360 s) the
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

/// API reads of an unbound NodeClaim one instance's signed reports may
/// cause at once, past which they wait [`UNBOUND_READ_PERIOD`]: anyone
/// holding a machine's identity document can attach a proof to a report
/// before that machine is bound, and each such report made a GET of the
/// NodeClaim, outside the join's caps. One read settles the honest race (a
/// report sent before the watch delivered the join's binding); a report
/// past the budget is judged on the cache alone.
pub const UNBOUND_READ_BURST: u32 = 2;

/// One more read per instance per this long, past [`UNBOUND_READ_BURST`].
pub const UNBOUND_READ_PERIOD: Duration = Duration::from_secs(30);

/// The reads' limiter, as [`ReportContext::unbound_reads`] holds it.
pub fn unbound_read_limiter() -> Limiter {
    Limiter::new(UNBOUND_READ_BURST, UNBOUND_READ_PERIOD, QUOTA_INSTANCES)
}

/// Warn lines about refused reports one reason may take at once, past
/// which they are one per [`REFUSAL_LINE_PERIOD`]: any network client can
/// send a report that is refused, and each refusal was a warn line of up to
/// ~1 KiB. Every refusal is still counted
/// (`autonode_agent_reports_refused_total{reason}`) and logged at debug.
pub const REFUSAL_LINE_BURST: u32 = 5;

/// One more warn line per refusal reason per this long.
pub const REFUSAL_LINE_PERIOD: Duration = Duration::from_secs(60);

/// Keys [`refusal_line_limiter`] tracks: the refusal reasons, and
/// "unavailable", with room to spare.
const REFUSAL_LINE_KEYS: usize = 32;

/// The warn lines' limiter, as [`ReportContext::refusal_lines`] holds it.
pub fn refusal_line_limiter() -> Limiter {
    Limiter::new(REFUSAL_LINE_BURST, REFUSAL_LINE_PERIOD, REFUSAL_LINE_KEYS)
}

/// What report handling needs.
pub struct ReportContext {
    pub trust: TrustStore,
    pub policy: Policy,
    pub claims: NodeClaims,
    pub events: Events,
    pub metrics: Metrics,
    /// What becomes of the NodeClaim when its agent reports, signed, that
    /// it failed for good.
    pub on_failure: OnFailure,
    /// Injected so tests can set the time.
    pub clock: Clock,
    /// Signed reports this replica accepted within the window.
    pub replays: Replays,
    /// API reads of unbound NodeClaims, per instance (see
    /// [`unbound_read_limiter`]).
    pub unbound_reads: Limiter,
    /// Warn lines about refused reports, per reason (see
    /// [`refusal_line_limiter`]).
    pub refusal_lines: Limiter,
}

#[derive(Debug, Error)]
pub enum ReportError {
    #[error("report refused: {0}")]
    Refused(#[from] ReportRefusal),
    /// Something on our side is unavailable; the agent retries (503).
    #[error("temporarily unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The instance sent more signed reports than its quota (429).
    #[error("instance {instance_id} sent too many signed reports; the next is accepted in {} s", retry_after.as_secs().max(1))]
    TooMany {
        instance_id: String,
        retry_after: Duration,
    },
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
        "timestamp {timestamp} is {skew} s from the server's clock (allowed: {} s behind, {} s ahead)",
        REPORT_WINDOW, FUTURE_SKEW
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
    let sender = authenticate(ctx, &report)
        .await
        .inspect_err(|e| refused(ctx, request_id, e))?;
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

/// Counts a report refused (or not handled, for `Unavailable`) and logs it:
/// at warn within its reason's line budget, else at debug.
fn refused(ctx: &ReportContext, request_id: &str, e: &ReportError) {
    let reason = match e {
        ReportError::Refused(refusal) => refusal.reason(),
        ReportError::TooMany { .. } => "over_quota",
        ReportError::Unavailable(_) => "unavailable",
    };
    if !matches!(e, ReportError::Unavailable(_)) {
        ctx.metrics
            .agent_reports_refused
            .get_or_create(&ReportRefusalLabels { reason })
            .inc();
    }
    // Over its quota, an instance is told so at every report: a line each
    // would let the flooder fill the logs as well.
    let budget = !matches!(e, ReportError::TooMany { .. })
        && ctx.refusal_lines.try_take(reason, Instant::now()).is_ok();
    if budget {
        tracing::warn!(request_id, reason, error = %e, "agent report refused (warn lines limited per reason; all counted in autonode_agent_reports_refused_total)");
    } else {
        tracing::debug!(request_id, reason, error = %e, "agent report refused");
    }
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
        (Outcome::Succeeded, _) => ctx.events.normal(claim, Reason::AgentProgress, note),
        (Outcome::Retrying, _) => ctx.events.warning(claim, Reason::AgentRetrying, note),
        (Outcome::Fatal, Trust::Unverified) => {
            tracing::warn!(request_id, nodeclaim = %name, "fatal agent report before the instance is bound to a key: unverified, so the NodeClaim is left alone");
            ctx.metrics.agent_reports_unverified_fatal.inc();
            let note = format!("unverified report (the instance is not bound to a key yet, so no signature can be checked), NodeClaim left alone: {note}");
            ctx.events.warning(claim, Reason::BootstrapFailed, note);
        }
        (Outcome::Fatal, Trust::Signed(_)) => {
            ctx.events
                .warning(claim, Reason::BootstrapFailed, note.clone());
            failed(ctx, claim, request_id, &note).await?;
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
        Some(record) => Trust::Signed(check_signed(ctx, report, &record)?),
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
    if let Err(retry_in) = ctx.unbound_reads.try_take(&name, Instant::now()) {
        tracing::debug!(nodeclaim = %name, ?retry_in, "signed report for an unbound NodeClaim past its read budget: judged on the cache");
        return Ok((claim, None));
    }
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

/// Checks a bound instance's report: signed with its bound key, timely,
/// within the instance's quota, new. Returns the digest it is now
/// remembered by.
///
/// The quota is taken only after the signature checks: anyone holding the
/// identity document could otherwise spend a machine's quota for it.
fn check_signed(
    ctx: &ReportContext,
    report: &ReportRequest,
    record: &binding::Record,
) -> Result<[u8; 32], ReportError> {
    let bound = record.client_key.as_str();
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
    let now = ctx.clock.unix();
    within_window(report.timestamp, now)?;
    let instance = record.instance_id.as_str();
    ctx.replays
        .quota
        .try_take(instance, Instant::now())
        .map_err(|retry_after| ReportError::TooMany {
            instance_id: instance.to_string(),
            retry_after,
        })?;
    let digest = proof::replay_digest(&signed);
    ctx.replays.admit(instance, digest, report.timestamp, now)?;
    Ok(digest)
}

/// Whether a report written at `timestamp` may be accepted at `now`.
fn within_window(timestamp: i64, now: i64) -> Result<(), ReportRefusal> {
    let skew = now.abs_diff(timestamp);
    let allowed = if timestamp > now {
        FUTURE_SKEW
    } else {
        REPORT_WINDOW
    };
    if skew > allowed.unsigned_abs() {
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
    fn admit(
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

/// Does with the NodeClaim what the failure policy says.
async fn failed(
    ctx: &ReportContext,
    claim: &NodeClaim,
    request_id: &str,
    why: &str,
) -> Result<(), ReportError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    match ctx.claims.failed(claim, why, ctx.on_failure).await {
        Ok(Failed::Deleted) => {
            tracing::warn!(request_id, nodeclaim = %name, "agent failed for good (signed report); NodeClaim deleted so Karpenter replaces the machine now");
            ctx.metrics.nodeclaims_deleted.inc();
            Ok(())
        }
        Ok(Failed::Marked | Failed::Left) => Ok(()),
        Err(source) => Err(ReportError::unavailable(ClaimCall {
            action: "marking failed",
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
        assert!(within_window(NOW + FUTURE_SKEW, NOW).is_ok());
        assert!(within_window(NOW + FUTURE_SKEW + 1, NOW).is_err());
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
        drop(Admitted {
            replays: &replays,
            digest: Some(digest(1)),
        });
        assert_eq!(replays.len(), 0);
        replays.admit("i-1", digest(1), NOW, NOW + 1).unwrap();
        // Done: disarmed, remembered.
        drop(Admitted {
            replays: &replays,
            digest: None,
        });
        assert!(replays.admit("i-1", digest(1), NOW, NOW + 2).is_err());
    }

    #[test]
    fn an_instance_past_its_slots_is_refused_and_others_are_not() {
        let replays = Replays::default();
        for n in 0..REPLAY_SLOTS_PER_INSTANCE {
            let digest = [
                u8::try_from(n).unwrap(),
                0xf1,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
            ];
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
    fn each_refusal_reason_has_its_own_budget_of_warn_lines() {
        let lines = refusal_line_limiter();
        let t0 = Instant::now();
        for _ in 0..REFUSAL_LINE_BURST {
            assert!(lines.try_take("identity", t0).is_ok());
        }
        assert!(lines.try_take("identity", t0).is_err(), "past its burst");
        assert!(lines.try_take("wrong_key", t0).is_ok(), "another reason");
        let later = t0 + REFUSAL_LINE_PERIOD;
        assert!(lines.try_take("identity", later).is_ok());
        assert!(lines.try_take("identity", later).is_err());
    }

    #[test]
    fn the_default_capacity_is_the_documented_bound() {
        let replays = Replays::default();
        let seen = replays.seen.lock().unwrap();
        assert_eq!(seen.capacity, REPLAY_CAPACITY);
    }
}
