//! Approves the CSRs kubelet makes itself after joining: renewals of its
//! client certificate and its serving certificates.
//!
//! Kubernetes never approves kubelet serving CSRs by itself, and autonode's
//! own join path only approves what it created. This controller judges a
//! CSR only when it is one of ours to judge: a kubelet signer, requested by
//! `system:node:<name>` in `system:nodes`, not created by autonode's join
//! path, and not yet decided. It approves when the node exists and belongs
//! to a NodeClaim, the subject is that node's, the usages are a kubelet's,
//! and serving SANs are within the instance's EC2 names and addresses.
//! Anything else it leaves pending, logged, counted and visible; it never
//! denies, so it never overrides another approver's decision.

use crate::ec2::InstanceLookup;
use crate::issuer::MANAGED_LABEL;
use crate::karpenter::parse_aws_provider_id;
use crate::metrics::{KindLabels, Metrics};
use crate::nodeclaim::NodeClaims;
use autonode_shared::csr::{self, Purpose};
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestStatus,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// The approval condition's reason for renewals.
pub const RENEWAL_REASON: &str = "AutonodeRenewal";
/// Pending kubelet CSRs one node may have before more are left alone.
pub const DEFAULT_PENDING_CAP: usize = 5;

/// What the approver is given.
#[derive(Clone)]
pub struct Settings {
    pub claims: NodeClaims,
    pub ec2: Arc<dyn InstanceLookup>,
    pub metrics: Metrics,
    pub pending_cap: usize,
}

/// What each reconcile sees.
struct Context {
    csrs: Api<CertificateSigningRequest>,
    nodes: Store<Node>,
    /// The controller's own view of every CSR (for the pending cap).
    csr_store: Store<CertificateSigningRequest>,
    settings: Settings,
}

/// Why a renewal was not approved.
#[derive(Debug, Error)]
pub enum Decline {
    #[error("node {0} does not exist")]
    NoNode(String),
    #[error("node {0} has no AWS providerID")]
    NoProviderId(String),
    #[error("no NodeClaim has providerID {0}")]
    NoNodeClaim(String),
    #[error("{0}")]
    Csr(#[from] csr::CsrError),
    #[error("node {node} already has {pending} pending CSRs (cap {cap})")]
    TooManyPending {
        node: String,
        pending: usize,
        cap: usize,
    },
    #[error("EC2 lookup: {0}")]
    Lookup(String),
}

#[derive(Debug, Error)]
pub enum Error {
    #[error("kube API: {0}")]
    Kube(#[from] kube::Error),
}

/// Runs the controller until the stream ends.
pub async fn run(client: Client, settings: Settings) {
    let nodes: Api<Node> = Api::all(client.clone());
    let (node_store, node_writer) = kube::runtime::reflector::store();
    let node_stream =
        kube::runtime::reflector(node_writer, watcher(nodes, watcher::Config::default()))
            .backoff(crate::backoff::WatchBackoff::default());
    tokio::spawn(async move {
        let mut s = std::pin::pin!(node_stream);
        while s.next().await.is_some() {}
    });
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let controller = Controller::new(csrs.clone(), watcher::Config::default());
    let ctx = Context {
        csrs,
        nodes: node_store,
        csr_store: controller.store(),
        settings,
    };
    controller
        .run(reconcile, error_policy, Arc::new(ctx))
        .for_each(|_| futures::future::ready(()))
        .await;
}

async fn reconcile(
    csr: Arc<CertificateSigningRequest>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let Some((node, purpose)) = ours_to_judge(&csr) else {
        return Ok(Action::await_change());
    };
    let kind = kind_label(purpose);
    match judge(&csr, &node, purpose, &ctx).await {
        Ok(()) => {
            approve(&ctx.csrs, &csr.name_any(), &node).await?;
            ctx.settings
                .metrics
                .approvals
                .get_or_create(&KindLabels { kind })
                .inc();
            tracing::info!(csr = %csr.name_any(), %node, kind, "kubelet CSR approved");
            Ok(Action::await_change())
        }
        Err(decline) => {
            ctx.settings
                .metrics
                .renewals_refused
                .get_or_create(&KindLabels { kind })
                .inc();
            tracing::warn!(csr = %csr.name_any(), %node, kind, reason = %decline, "kubelet CSR left pending");
            // A node or NodeClaim may appear moments later: look again.
            Ok(Action::requeue(Duration::from_secs(30)))
        }
    }
}

/// `Some((node, purpose))` for an undecided kubelet CSR a node made itself.
pub fn ours_to_judge(csr: &CertificateSigningRequest) -> Option<(String, Purpose)> {
    let purpose = match csr.spec.signer_name.as_str() {
        csr::CLIENT_SIGNER => Purpose::Client,
        csr::SERVING_SIGNER => Purpose::Serving,
        _ => return None,
    };
    if csr.labels().contains_key(MANAGED_LABEL) || decided(csr) {
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

fn decided(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.as_ref();
    status.and_then(|s| s.certificate.as_ref()).is_some()
        || status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
            c.iter()
                .any(|c| matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed"))
        })
}

async fn judge(
    csr: &CertificateSigningRequest,
    node: &str,
    purpose: Purpose,
    ctx: &Context,
) -> Result<(), Decline> {
    let pending = pending_for(ctx, csr);
    if pending >= ctx.settings.pending_cap {
        return Err(Decline::TooManyPending {
            node: node.to_string(),
            pending,
            cap: ctx.settings.pending_cap,
        });
    }
    let node_obj = ctx
        .nodes
        .get(&ObjectRef::new(node))
        .ok_or_else(|| Decline::NoNode(node.to_string()))?;
    let provider_id = node_obj
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .ok_or_else(|| Decline::NoProviderId(node.to_string()))?;
    if ctx.settings.claims.by_provider_id(&provider_id).is_empty() {
        return Err(Decline::NoNodeClaim(provider_id));
    }
    let parsed = csr::parse_csr(&csr.spec.request.0)?;
    csr::check_usages(
        csr.spec.usages.as_deref().unwrap_or_default(),
        purpose,
        &parsed.key,
    )?;
    match purpose {
        Purpose::Client => csr::check_client_csr(&parsed, node)?,
        Purpose::Serving => {
            let (zone, instance_id) = parse_aws_provider_id(&provider_id)
                .ok_or_else(|| Decline::NoProviderId(node.to_string()))?;
            let region = zone.trim_end_matches(|c: char| c.is_ascii_alphabetic());
            let instance = ctx
                .settings
                .ec2
                .describe_instance(region, instance_id)
                .await
                .map_err(|e| Decline::Lookup(e.to_string()))?;
            let dns = [instance.private_dns_name.clone()];
            csr::check_serving_csr(&parsed, node, &dns, &instance.private_ips)?;
        }
    }
    Ok(())
}

/// Pending kubelet CSRs from the same requester, this one excluded.
fn pending_for(ctx: &Context, csr: &CertificateSigningRequest) -> usize {
    ctx.csr_store
        .state_filter(|other| {
            other.spec.username == csr.spec.username
                && other.name_any() != csr.name_any()
                && !decided(other)
        })
        .len()
}

async fn approve(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    node: &str,
) -> Result<(), kube::Error> {
    let status = CertificateSigningRequestStatus {
        conditions: Some(vec![
            k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: "True".into(),
                reason: Some(RENEWAL_REASON.into()),
                message: Some(format!(
                "autonode-server: requested by node {node} for itself; node belongs to a NodeClaim"
            )),
                ..Default::default()
            },
        ]),
        certificate: None,
    };
    let patch = serde_json::json!({ "status": status });
    api.patch_approval(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

fn error_policy(_csr: Arc<CertificateSigningRequest>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "approver reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

fn kind_label(purpose: Purpose) -> &'static str {
    match purpose {
        Purpose::Client => "client_renewal",
        Purpose::Serving => "serving",
    }
}
