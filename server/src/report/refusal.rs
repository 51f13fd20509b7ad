//! Why a report was not handled, and what a refusal leaves behind: the
//! agent is answered (by the front) 403 for a refusal, 503 for unavailable,
//! 429 over its quota; every refusal is counted, and logged at warn only
//! within its reason's budget of lines.

use super::{ReportContext, FUTURE_SKEW, REPORT_WINDOW};
use crate::kube::binding::Unreadable;
use crate::kube::metrics::ReportRefusalLabels;
use crate::kube::nodeclaim::{FindError, SelectError};
use autonode_shared::identity::{IdentityError, PolicyError};
use autonode_shared::proof::ProofError;
use std::time::{Duration, Instant};
use thiserror::Error;

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
    pub(super) fn unavailable(why: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
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
pub(super) struct ClaimCall {
    pub action: &'static str,
    pub name: String,
    #[source]
    pub source: kube::Error,
}

/// Why a report is refused (final: the agent does not retry a 4xx).
#[derive(Debug, Error)]
pub enum ReportRefusal {
    #[error("identity document: {0}")]
    Identity(#[from] IdentityError),
    /// The instance's account or region is not allowed (the join's own
    /// origin check, [`Policy::check_origin`](autonode_shared::identity::Policy::check_origin)).
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

/// Counts a report refused (or not handled, for `Unavailable`) and logs it:
/// at warn within its reason's line budget, else at debug.
pub(super) fn refused(ctx: &ReportContext, request_id: &str, e: &ReportError) {
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
