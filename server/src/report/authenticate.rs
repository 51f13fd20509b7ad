//! The authenticate step of a report: which NodeClaim it speaks for, and
//! how far it is believed.

use super::refusal::{ClaimCall, ReportError, ReportRefusal};
use super::replays::QUOTA_INSTANCES;
use super::{ReportContext, FUTURE_SKEW, REPORT_WINDOW};
use crate::kube::binding;
use crate::kube::karpenter::{aws_provider_id, NodeClaim};
use crate::primitives::limiter::Limiter;
use autonode_shared::identity;
use autonode_shared::proof;
use autonode_shared::protocol::ReportRequest;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// How much the server may believe a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trust {
    /// The instance is not bound yet: the report may come from anyone who
    /// read its identity document (a signature, if any, is by a key nothing
    /// vouches for). Good for an Event, never for replacing the machine.
    Unverified,
    /// Signed with the bound key, in the window, not seen before; by the
    /// digest [`Replays`](super::Replays) now remembers it by (see
    /// [`Admitted`](super::replays::Admitted)).
    Signed([u8; 32]),
}

impl Trust {
    /// The digest a signed report is remembered by; none for an unverified
    /// one.
    pub(super) fn digest(self) -> Option<[u8; 32]> {
        match self {
            Trust::Signed(digest) => Some(digest),
            Trust::Unverified => None,
        }
    }
}

/// The NodeClaim a report speaks for, and how far it is believed.
pub(super) struct Sender {
    pub claim: Arc<NodeClaim>,
    pub trust: Trust,
}

/// The NodeClaim this report may speak for, and how far to believe it.
pub(super) async fn authenticate(
    ctx: &ReportContext,
    report: &ReportRequest,
) -> Result<Sender, ReportError> {
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
    ctx.replays.take_quota(instance, Instant::now())?;
    let digest = proof::replay_digest(&signed);
    ctx.replays.admit(instance, digest, report.timestamp, now)?;
    Ok(digest)
}

/// Whether a report written at `timestamp` may be accepted at `now`.
pub(super) fn within_window(timestamp: i64, now: i64) -> Result<(), ReportRefusal> {
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

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000;

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
}
