//! One reconcile of a kubelet CSR: whether it is one to judge, the
//! judgement, and the approval or the CSR left pending, counted and logged.

use super::decline::Decline;
use super::judge::judge;
use super::store::decided;
use super::{kind_label, over_cap_key, Context, Error};
use crate::kube::approval::{self, ApprovalError};
use crate::kube::metrics::{KindLabels, LeftPendingLabels};
use crate::kube::reason::Reason;
use autonode_shared::csr::{self, Purpose};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use std::sync::Arc;

pub(super) async fn reconcile(
    csr: Arc<CertificateSigningRequest>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let Some((node, purpose)) = ours_to_judge(&csr) else {
        return Ok(Action::await_change());
    };
    let kind = kind_label(purpose);
    match judge(&csr, &node, purpose, &ctx).await {
        Ok(()) => {
            if !approve(&ctx.csrs, &csr, &node).await? {
                return Ok(Action::await_change());
            }
            ctx.settings
                .metrics
                .approvals
                .get_or_create(&KindLabels { kind })
                .inc();
            ctx.told.clear(&csr.name_any());
            ctx.told.clear(&over_cap_key(&node));
            tracing::info!(csr = %csr.name_any(), %node, kind, "kubelet CSR approved");
            Ok(Action::await_change())
        }
        Err(decline) => {
            let reason = decline.reason();
            ctx.settings
                .metrics
                .renewals_refused
                .get_or_create(&KindLabels { kind })
                .inc();
            ctx.settings
                .metrics
                .csr_left_pending
                .get_or_create(&LeftPendingLabels { kind, reason })
                .inc();
            tell(&ctx, &csr, &node, (kind, &decline));
            Ok(decline
                .retry_in()
                .map_or_else(Action::await_change, Action::requeue))
        }
    }
}

/// Logs why `csr` was left pending: as a warning when the reason is new
/// for it, and a node's being over its cap once for the node, not per CSR
/// and look; at debug otherwise (the metric counts every time). A reused
/// name is also a Warning Event on the CSR, where `kubectl describe csr`
/// shows whoever wonders why their node's CSR waits.
fn tell(
    ctx: &Context,
    object: &CertificateSigningRequest,
    node: &str,
    (kind, decline): (&str, &Decline),
) {
    let reason = decline.reason();
    let csr = object.name_any();
    let first = match decline {
        Decline::TooMany { .. } => ctx.told.first(&over_cap_key(node), reason),
        _ => ctx.told.first(&csr, reason),
    };
    if first && matches!(decline, Decline::NameReused { .. }) {
        let note = format!("left pending: {decline}");
        ctx.settings
            .events
            .warning(object, Reason::NodeNameReused, note);
    }
    if first {
        tracing::warn!(%csr, %node, kind, reason, detail = %decline, "kubelet CSR left pending");
    } else {
        tracing::debug!(%csr, %node, kind, reason, detail = %decline, "kubelet CSR left pending");
    }
}

/// `Some((node, purpose))` for an undecided kubelet CSR a node made itself.
///
/// CSRs autonode's join path creates are requested by autonode-server's own
/// identity, not a node's, so they are never judged here (and the watches
/// leave out CSRs with autonode's label: a node that sets it on its own
/// only keeps that CSR from being approved). The labels decide nothing
/// else, as anyone who may create a CSR may set them.
pub fn ours_to_judge(csr: &CertificateSigningRequest) -> Option<(String, Purpose)> {
    let purpose = match csr.spec.signer_name.as_str() {
        csr::CLIENT_SIGNER => Purpose::Client,
        csr::SERVING_SIGNER => Purpose::Serving,
        _ => return None,
    };
    if decided(csr) {
        return None;
    }
    let node = csr::node_name_from_username(csr.spec.username.as_deref()?)?;
    let in_nodes_group = csr
        .spec
        .groups
        .as_ref()
        .is_some_and(|g| g.iter().any(|g| g == csr::NODES_GROUP));
    in_nodes_group.then(|| (node.to_string(), purpose))
}

/// Approves the CSR judged, by UID: a CSR deleted and re-created under the
/// same name while it was judged is another object and is not approved
/// (it gets its own reconcile, and its own judgement).
pub(super) async fn approve(
    api: &Api<CertificateSigningRequest>,
    csr: &CertificateSigningRequest,
    node: &str,
) -> Result<bool, Error> {
    let name = csr.name_any();
    let Some(uid) = csr.metadata.uid.as_deref() else {
        return Ok(false);
    };
    let message = format!(
        "autonode-server: requested by node {node} for itself; \
         its instance's EC2 name and autonode's binding agree"
    );
    let verdict = approval::Verdict {
        reason: Reason::AutonodeRenewal,
        message: &message,
    };
    match approval::approve(api, &name, uid, verdict).await {
        Ok(()) => Ok(true),
        Err(ApprovalError::Substituted { detail, .. }) => {
            tracing::warn!(csr = %name, %node, uid, %detail, "kubelet CSR replaced under its name while it was judged; nothing approved");
            Ok(false)
        }
        Err(error) => Err(error.into()),
    }
}
