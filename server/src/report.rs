//! Progress reports from agents, turned into Events, metrics and, for a
//! definite failure, the NodeClaim's deletion.
//!
//! Deleting the NodeClaim of a machine whose agent gave up makes Karpenter
//! replace it now instead of after its 15-minute registration timeout. Only
//! a report the server can trust may do that: the identity document must
//! verify, and once the instance is bound to a client key the report must
//! be signed with that key.

use crate::events::Events;
use crate::karpenter::{aws_provider_id, NodeClaim};
use crate::metrics::{Metrics, PhaseLabels};
use crate::nodeclaim::NodeClaims;
use autonode_shared::identity::{self, Policy, TrustStore};
use autonode_shared::proof;
use autonode_shared::protocol::{Outcome, ReportRequest};
use std::sync::Arc;
use thiserror::Error;

/// What report handling needs.
pub struct ReportContext {
    pub trust: TrustStore,
    pub policy: Policy,
    pub claims: NodeClaims,
    pub events: Events,
    pub metrics: Metrics,
    /// Delete the NodeClaim when an agent reports a fatal failure.
    pub delete_on_fatal: bool,
}

#[derive(Debug, Error)]
pub enum ReportError {
    #[error("report refused: {0}")]
    Refused(String),
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
}

/// Handles one report.
pub async fn handle(
    ctx: &ReportContext,
    request_id: &str,
    report: ReportRequest,
) -> Result<(), ReportError> {
    let claim = authenticate(ctx, &report).await.inspect_err(|e| {
        tracing::warn!(request_id, error = %e, "agent report refused");
    })?;
    let name = claim.metadata.name.clone().unwrap_or_default();
    let (phase, outcome) = (report.phase.as_str(), report.outcome.as_str());
    ctx.metrics
        .agent_reports
        .get_or_create(&PhaseLabels { phase, outcome })
        .inc();
    tracing::info!(request_id, nodeclaim = %name, phase, outcome, message = %report.message, "agent report");
    let note = format!("agent phase {phase} {outcome}: {}", report.message);
    match report.outcome {
        Outcome::Succeeded => ctx.events.normal(claim.as_ref(), "AgentProgress", note),
        Outcome::Retrying => ctx.events.warning(claim.as_ref(), "AgentRetrying", note),
        Outcome::Fatal => {
            ctx.events
                .warning(claim.as_ref(), "BootstrapFailed", note.clone());
            if claim.is_registered() {
                // Its Node exists: whatever failed, the machine is a node.
            } else if ctx.delete_on_fatal {
                delete(ctx, &claim, request_id).await?;
            } else {
                mark_failed(ctx, &claim, &note).await?;
            }
        }
    }
    Ok(())
}

/// The NodeClaim this report may speak for.
async fn authenticate(
    ctx: &ReportContext,
    report: &ReportRequest,
) -> Result<Arc<NodeClaim>, ReportError> {
    let refused = |why: String| ReportError::Refused(why);
    let verified = identity::verify(report.identity.rsa2048.as_bytes(), &ctx.trust)
        .map_err(|e| refused(format!("identity: {e}")))?;
    let doc = verified.document();
    // The time window is for joining; a failure may be reported later.
    if !ctx.policy.accounts.contains(&doc.account_id) || !ctx.policy.regions.contains(&doc.region) {
        return Err(refused(format!(
            "account {} / region {} not allowed",
            doc.account_id, doc.region
        )));
    }
    ctx.claims
        .ready()
        .await
        .map_err(|e| ReportError::Unavailable(e.to_string()))?;
    let provider_id = aws_provider_id(&doc.availability_zone, &doc.instance_id);
    // The same grace as a join: an agent that fails before its join (or a
    // report that races Karpenter's status write) must not lose the report
    // to our cache's lag, since a fatal one is what replaces the machine.
    // A refused agent's final report waits it out again; that costs the
    // machine seconds it has no use for anyway.
    let claim = match ctx.claims.find(&provider_id).await.as_slice() {
        [only] => only.clone(),
        other => {
            return Err(refused(format!(
                "{} NodeClaims have providerID {provider_id}",
                other.len()
            )))
        }
    };
    if let Some(bound) = claim.bound_key() {
        let proof = report.proof.as_ref().ok_or_else(|| {
            refused("instance is bound to a key but the report carries no proof".into())
        })?;
        let offered =
            proof::verify(proof, &report.signed_bytes()).map_err(|e| refused(e.to_string()))?;
        if offered != bound {
            return Err(refused(format!(
                "report signed by key {offered}, instance bound to {bound}"
            )));
        }
    }
    Ok(claim)
}

/// Records the failure on the NodeClaim for the feedback controller's
/// condition, when deleting is turned off.
async fn mark_failed(
    ctx: &ReportContext,
    claim: &NodeClaim,
    note: &str,
) -> Result<(), ReportError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let patch = serde_json::json!({"metadata": {"annotations": {crate::feedback::FAILED_ANNOTATION: note}}});
    ctx.claims
        .api()
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
        .map_err(|e| ReportError::Unavailable(format!("marking NodeClaim {name} failed: {e}")))
}

/// Deletes the NodeClaim so Karpenter replaces the machine now.
async fn delete(
    ctx: &ReportContext,
    claim: &NodeClaim,
    request_id: &str,
) -> Result<(), ReportError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    match ctx.claims.delete_failed(claim).await {
        Ok(deleted) => {
            if deleted {
                tracing::warn!(request_id, nodeclaim = %name, "agent failed for good; NodeClaim deleted so Karpenter replaces the machine now");
                ctx.metrics.nodeclaims_deleted.inc();
            }
            Ok(())
        }
        Err(e) => Err(ReportError::Unavailable(format!(
            "deleting NodeClaim {name}: {e}"
        ))),
    }
}
