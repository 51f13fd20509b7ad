//! Tells Karpenter's NodeClaims how their machine's bootstrap is going.
//!
//! For every NodeClaim whose instance autonode attested (it carries the key
//! binding annotation), keeps a condition of autonode's own type,
//! [`CONDITION`], on its status: Unknown while the machine is on its way,
//! True once its Node is Ready, False when bootstrap failed. Karpenter
//! rewrites the whole conditions list when it writes status, which can drop
//! ours, so the condition is re-asserted whenever it is missing or stale.
//!
//! It is written as the list Karpenter last wrote plus ours, with the
//! resourceVersion it was read at: if Karpenter writes in between, the API
//! server answers 409 and we look again, so Karpenter's conditions are never
//! changed or lost. (Server-side apply of one list entry would be neater,
//! but an API server that cannot build an OpenAPI model for the CRD, as
//! 1.20 cannot for Karpenter's, treats the list as atomic and would drop
//! Karpenter's conditions.)
//!
//! Milestones (Node registered, Node Ready) become Events and latency
//! observations once each; an annotation records which were reported so a
//! restarted or new leader does not report them again.

use crate::backoff::WatchBackoff;
use crate::binding;
use crate::cache;
use crate::events::Events;
use crate::karpenter::{Condition, NodeClaim};
use crate::marks;
use crate::metrics::Metrics;
use crate::nodeclaim::{self, NodeClaims};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Patch;
use kube::runtime::controller::{self, applier, trigger_self, trigger_with, Action};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// autonode's condition type on NodeClaims.
pub const CONDITION: &str = "AutonodeBootstrapped";
/// How long a NodeClaim's events must settle before it is reconciled.
const DEBOUNCE: Duration = Duration::from_secs(1);

/// What the feedback controller needs.
pub struct Context {
    pub nodeclaims: Api<NodeClaim>,
    pub nodes: Store<Node>,
    pub events: Events,
    pub metrics: Metrics,
}

#[derive(Debug, Error)]
pub enum Error {
    #[error("kube API: {0}")]
    Kube(#[from] kube::Error),
}

/// Where a machine's bootstrap stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Attested,
    Registered,
    Ready,
    Failed,
}

/// Runs the controller until its stream ends.
///
/// One NodeClaim watch and one Node watch, each into a store of what is
/// read ([`nodeclaim::strip`], [`cache::strip_node`]): a Node changing
/// (registered, Ready) wakes the NodeClaim with its providerID.
pub async fn run(client: Client, claims: NodeClaims, events: Events, metrics: Metrics) {
    let nodeclaims: Api<NodeClaim> = Api::all(client.clone());
    let page = watcher::Config::default().page_size(cache::LIST_PAGE);
    let (claim_store, claim_writer) = reflector::store();
    let claim_changes = watcher(nodeclaims.clone(), page.clone())
        .modify(nodeclaim::strip)
        .backoff(WatchBackoff::default())
        .reflect(claim_writer)
        .applied_objects();
    let (node_store, node_writer) = reflector::store();
    let node_changes = watcher(Api::<Node>::all(client), page)
        .modify(cache::strip_node)
        .backoff(WatchBackoff::default())
        .reflect(node_writer)
        .touched_objects();
    let woken = trigger_with(node_changes, move |node: Node| {
        let provider_id = node.spec.and_then(|s| s.provider_id).unwrap_or_default();
        claims
            .by_provider_id(&provider_id)
            .into_iter()
            .map(|c| ObjectRef::<NodeClaim>::new(&c.name_any()))
            .collect::<Vec<_>>()
    });
    let queue = futures::stream::select(trigger_self(claim_changes, ()), woken);
    let ctx = Arc::new(Context {
        nodeclaims,
        nodes: node_store,
        events,
        metrics,
    });
    // Debounced: a NodeClaim's events come in bursts while its machine
    // joins (the binding, Karpenter's status writes), and writing the
    // condition at the first of them put one more API write beside the
    // join's own approvals and signatures (README, Benchmarks: the
    // server's part of a join over its API writes alone, before and
    // after). A second later the join is done; Ready is reported a second
    // later too, which nobody waits on.
    let config = controller::Config::default().debounce(DEBOUNCE);
    applier(
        |claim, ctx| Box::pin(reconcile(claim, ctx)),
        error_policy,
        ctx,
        claim_store,
        queue,
        config,
    )
    .for_each(|_| futures::future::ready(()))
    .await;
}

async fn reconcile(claim: Arc<NodeClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    // The marks were judged, and foreign ones removed, before the claim
    // was kept (nodeclaim::strip), so a NodePool's copied annotations
    // neither start feedback nor mark a machine failed.
    let bound = matches!(binding::recorded(&claim), Ok(Some(_)));
    if !bound || claim.is_deleting() {
        return Ok(Action::await_change());
    }
    let stage = stage(&claim, &ctx.nodes);
    report_milestone(&claim, stage, &ctx).await?;
    let desired = condition(stage, &claim);
    if !same(claim.condition(CONDITION), &desired) {
        match assert_condition(&ctx.nodeclaims, &claim, desired).await {
            // Changed under us (Karpenter wrote status): the watch brings
            // the new version, and we judge again.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return Ok(Action::requeue(Duration::from_secs(1)))
            }
            other => other?,
        }
    }
    // The Node watch that woke us may run ahead of the Node cache we read:
    // until the machine is Ready (or failed), look again soon.
    let next = match stage {
        Stage::Ready | Stage::Failed => Duration::from_secs(300),
        Stage::Attested | Stage::Registered => Duration::from_secs(3),
    };
    Ok(Action::requeue(next))
}

/// Derives the stage from the NodeClaim and its Node.
pub fn stage(claim: &NodeClaim, nodes: &Store<Node>) -> Stage {
    if claim
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(marks::BOOTSTRAP_FAILED))
    {
        return Stage::Failed;
    }
    let node = claim.provider_id().and_then(|pid| {
        nodes.find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(pid))
    });
    match node {
        Some(node) if is_ready(&node) => Stage::Ready,
        Some(_) => Stage::Registered,
        None => Stage::Attested,
    }
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The condition autonode wants on the NodeClaim at this stage.
pub fn condition(stage: Stage, claim: &NodeClaim) -> Condition {
    let (status, reason, message) = match stage {
        Stage::Attested => (
            "Unknown",
            "Attested",
            "instance attested and certificates issued; waiting for kubelet to register"
                .to_string(),
        ),
        Stage::Registered => (
            "Unknown",
            "NodeRegistered",
            "Node registered; waiting for it to become Ready".to_string(),
        ),
        Stage::Ready => ("True", "NodeReady", "Node is Ready".to_string()),
        Stage::Failed => {
            let why = claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(marks::BOOTSTRAP_FAILED))
                .cloned()
                .unwrap_or_default();
            ("False", "BootstrapFailed", why)
        }
    };
    let previous = claim.condition(CONDITION);
    let transition = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => None,
    }
    .unwrap_or_else(now_rfc3339);
    Condition {
        type_: CONDITION.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_transition_time: Some(transition),
        observed_generation: claim.metadata.generation,
    }
}

fn same(current: Option<&Condition>, desired: &Condition) -> bool {
    current.is_some_and(|c| {
        c.status == desired.status && c.reason == desired.reason && c.message == desired.message
    })
}

/// Writes `claim`'s conditions with ours replaced, through the status
/// subresource, only if the NodeClaim is still at the version we read.
async fn assert_condition(
    api: &Api<NodeClaim>,
    claim: &NodeClaim,
    condition: Condition,
) -> Result<(), kube::Error> {
    let mut conditions: Vec<Condition> = claim
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    conditions.retain(|c| c.type_ != CONDITION);
    conditions.push(condition);
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": claim.metadata.resource_version },
        "status": { "conditions": conditions },
    });
    api.patch_status(
        &claim.name_any(),
        &marks::patch_params(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
}

/// An Event and a latency observation for each milestone, once.
async fn report_milestone(
    claim: &NodeClaim,
    stage: Stage,
    ctx: &Context,
) -> Result<(), kube::Error> {
    let milestone = match stage {
        Stage::Registered => "registered",
        Stage::Ready => "ready",
        Stage::Attested | Stage::Failed => return Ok(()),
    };
    let reported = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(marks::REPORTED))
        .cloned()
        .unwrap_or_default();
    if reported.split(',').any(|m| m == milestone) {
        return Ok(());
    }
    let mut all: Vec<&str> = reported.split(',').filter(|m| !m.is_empty()).collect();
    all.push(milestone);
    let patch = serde_json::json!({"metadata": {"annotations": {marks::REPORTED: all.join(",")}}});
    ctx.nodeclaims
        .patch(
            &claim.name_any(),
            &marks::patch_params(),
            &Patch::Merge(&patch),
        )
        .await?;
    if let Some(age) = age_seconds(claim) {
        ctx.metrics.observe_phase(milestone, age);
    }
    let (reason, note) = match stage {
        Stage::Ready => ("NodeReady", "the Node is Ready"),
        _ => ("NodeRegistered", "kubelet registered the Node"),
    };
    ctx.events.normal(claim, reason, note.to_string());
    Ok(())
}

/// Seconds since the NodeClaim was created.
pub fn age_seconds(claim: &NodeClaim) -> Option<f64> {
    let created = claim.metadata.creation_timestamp.as_ref()?;
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
    Some(age.as_secs_f64().max(0.0))
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn error_policy(_claim: Arc<NodeClaim>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "NodeClaim feedback failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transition_time_only_moves_when_the_status_does() {
        let mut claim = NodeClaim::default();
        let first = condition(Stage::Attested, &claim);
        claim.status = Some(crate::karpenter::NodeClaimStatus {
            conditions: vec![Condition {
                last_transition_time: Some("2026-01-01T00:00:00Z".into()),
                ..first.clone()
            }],
            ..Default::default()
        });
        let registered = condition(Stage::Registered, &claim);
        assert_eq!(
            registered.last_transition_time.as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
        let ready = condition(Stage::Ready, &claim);
        assert_ne!(
            ready.last_transition_time.as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
        assert_eq!(ready.status, "True");
    }

    #[test]
    fn a_dropped_or_stale_condition_is_rewritten() {
        let claim = NodeClaim::default();
        let desired = condition(Stage::Ready, &claim);
        assert!(!same(None, &desired));
        let stale = Condition {
            reason: Some("Attested".into()),
            ..desired.clone()
        };
        assert!(!same(Some(&stale), &desired));
        assert!(same(Some(&desired), &desired));
    }
}
