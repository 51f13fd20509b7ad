//! The act step of a report: counted, logged and shown as an Event on its
//! NodeClaim; a signed fatal one deletes the NodeClaim (or marks it
//! failed), so Karpenter replaces the machine now.

use super::authenticate::{Sender, Trust};
use super::refusal::{ClaimCall, ReportError};
use super::ReportContext;
use crate::kube::budget::{Cause, Failure};
use crate::kube::karpenter::NodeClaim;
use crate::kube::marks::{capped, MAX_MESSAGE};
use crate::kube::metrics::PhaseLabels;
use crate::kube::nodeclaim::Failed;
use crate::kube::reason::Reason;
use autonode_shared::protocol::{Outcome, ReportRequest};

/// Records the report and does what it asks of the NodeClaim.
pub(super) async fn act(
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
    let message = capped(&report.message, MAX_MESSAGE);
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

/// An agent's signed fatal report: the machine's own failure.
const AGENT_FATAL: Failure = Failure {
    reason: "agent_fatal",
    cause: Cause::Machine,
};

/// Does with the NodeClaim what the failure budget decides.
async fn failed(
    ctx: &ReportContext,
    claim: &NodeClaim,
    request_id: &str,
    why: &str,
) -> Result<(), ReportError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    match ctx.claims.failed(claim, why, AGENT_FATAL).await {
        Ok(Failed::Deleted) => {
            tracing::warn!(request_id, nodeclaim = %name, "agent failed for good (signed report); NodeClaim deleted so Karpenter replaces the machine now");
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
