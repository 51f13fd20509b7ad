//! Approves the CSRs kubelet makes itself after joining: renewals of its
//! client certificate and its serving certificates.
//!
//! Kubernetes never approves kubelet serving CSRs by itself, and autonode's
//! own join path only approves what it created. This controller judges a
//! CSR only when it is one of ours to judge: a kubelet signer, requested by
//! `system:node:<name>` in `system:nodes`, not created by autonode's join
//! path, and not yet decided. It approves when the node is the instance
//! autonode bound it to (below), the subject is that node's, the usages are
//! a kubelet's, and serving SANs are within the instance's EC2 names and
//! addresses.
//! Anything else it leaves pending, logged, counted and visible; it never
//! denies, so it never overrides another approver's decision.

//!
//! "The node's" is decided by EC2 and autonode's own binding, never by what
//! the node wrote about itself: a node may delete and re-create its own Node
//! object (NodeRestriction allows it) with any `spec.providerID`. So the
//! Node's name must be the EC2 private DNS name of the instance behind that
//! providerID, that instance's one NodeClaim must carry the binding autonode
//! recorded when it joined (same instance, same node name), and Karpenter's
//! `status.nodeName`, once set, must agree. The binding also gives the
//! region to ask EC2 in: a zone cannot be trimmed to one (Local Zones such
//! as `us-west-2-lax-1a`).
//!
//! A node can make CSRs in a loop; two bounds keep that cheap. Each
//! requester may have at most `pending_cap` CSRs pending or approved within
//! [`RECENT_WINDOW`], and EC2 is asked through a [`LookupCache`] with at
//! most one real lookup per node per [`LOOKUP_PERIOD`] beyond a burst of
//! [`LOOKUP_BURST`] (the account's EC2 API budget is Karpenter's too).
mod cap;
mod decline;
mod index;
mod judge;
mod reconcile;
mod store;

pub use decline::Decline;
pub use reconcile::ours_to_judge;
pub use store::keep_for_judging;

use crate::ec2::{InstanceLookup, LookupCache};
use crate::kube::approval::ApprovalError;
use crate::kube::events::Events;
use crate::kube::metrics::Metrics;
use crate::kube::node::Node;
use crate::kube::nodeclaim::NodeClaims;
use crate::primitives::clock::Clock;
use crate::primitives::limiter::Limiter;
use crate::primitives::told::Told;
use autonode_shared::csr::{self, Purpose};
use futures::{Stream, StreamExt};
use index::ByNode;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::runtime::controller::{self, applier, trigger_self, Action};
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use store::{count_pending, kubelet_csrs};
use thiserror::Error;

/// CSRs of one signer judged at once. kube-runtime's default is no limit:
/// a new leader among 3,000 nodes judged every pending renewal at once,
/// each judgement holding its own connection to the API server (and to
/// EC2) open, so the leader's memory grew with the fleet (about 5 MiB of
/// connection buffers per 1,000 nodes, docs/benchmarks.md) and its
/// approvals met the API server's fairness limits all together. 32 at
/// once, at tens of milliseconds a judgement, is still hundreds of
/// approvals a second per signer.
pub const JUDGED_AT_ONCE: u16 = 32;

/// CSRs one requester may have pending or approved within
/// [`RECENT_WINDOW`] before more are left alone. A kubelet makes one client
/// renewal and one serving CSR per rotation (now and then a retry), so a
/// node well within this is not near it.
pub const DEFAULT_PENDING_CAP: usize = 5;
/// How long an approved CSR keeps counting toward its requester's cap.
/// Counting only undecided CSRs let a node that creates CSRs one after
/// another get each approved; long enough to cover such a loop, short next
/// to any certificate lifetime kubelet rotates at (kube-controller-manager's
/// cleaner removes issued CSRs after an hour anyway).
pub const RECENT_WINDOW: Duration = Duration::from_secs(15 * 60);
/// How long an EC2 answer about an instance is reused. Its private DNS name
/// and addresses do not change while it lives; a minute covers a node's
/// client and serving CSRs of one rotation and a pending CSR's next look
/// (`RETRY_DECLINED`) with one call, and a terminated instance stops
/// being believed within it.
pub const LOOKUP_TTL: Duration = Duration::from_secs(60);
/// Instances whose answers are kept at most: a few MB, and more than the
/// nodes of any cluster autonode serves (an eviction only costs a lookup).
pub const LOOKUP_CACHE_CAPACITY: usize = 10_000;
/// Real EC2 lookups one node may make at once before being paced.
pub const LOOKUP_BURST: u32 = 3;
/// After the burst, one real EC2 lookup per node per this long.
pub const LOOKUP_PERIOD: Duration = Duration::from_secs(30);
/// Nodes whose lookup budgets are tracked at most; idle ones (budget full
/// again) are forgotten first, as forgetting them changes nothing.
pub const LIMITER_CAPACITY: usize = 10_000;
/// The most usages a kubelet CSR is kept with: a kubelet asks for three.
pub const MAX_USAGES: usize = 16;
/// CSRs and nodes whose standing warning is remembered at most (see
/// [`Told`]).
const TOLD_CAPACITY: usize = 10_000;
/// When to look at a CSR left pending again: its node or NodeClaim may
/// appear, or an older CSR drop out of the cap's window.
const RETRY_DECLINED: Duration = Duration::from_secs(30);

/// What the approver is given.
#[derive(Clone)]
pub struct Settings {
    pub claims: NodeClaims,
    /// For the one Warning the approver writes: a reused name's CSR left
    /// pending (the other reasons are logs and metrics).
    pub events: Events,
    pub ec2: Arc<dyn InstanceLookup>,
    pub metrics: Metrics,
    pub pending_cap: usize,
    /// kube-controller-manager's `--cluster-signing-duration`: how long a
    /// reused node name's CSRs are left pending (see [`crate::kube::reuse`]).
    pub signing_duration: Duration,
    /// Where "now" comes from: the cap's window and a reused name's.
    pub clock: Clock,
}

/// What each reconcile sees.
struct Context {
    csrs: Api<CertificateSigningRequest>,
    nodes: Store<Node>,
    /// The controller's own view of the kubelet signers' CSRs, one store
    /// per signer (for the cap).
    csr_stores: [Store<CertificateSigningRequest>; 2],
    /// Those CSRs by requester, kept from the watches' changes.
    by_node: ByNode,
    /// Standing reasons already logged as warnings: per CSR its reason for
    /// being left pending, per node being over its cap.
    told: Told,
    /// EC2 answers, reused for [`LOOKUP_TTL`].
    lookups: LookupCache,
    /// Real EC2 lookups per node.
    limiter: Limiter,
    settings: Settings,
}

#[derive(Debug, Error)]
pub enum Error {
    #[error("kube API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Approval(#[from] ApprovalError),
}

/// Runs the controller until its streams end.
///
/// Nodes are read from the leader's one Node cache (`nodes`, shared with
/// the feedback controller). The CSRs are watched per signer (a field
/// selector on `spec.signerName`, one watch and one store for each of the
/// two kubelet signers): a CSR of any other signer, of any size, never
/// reaches this replica. What is kept of each is what judging reads
/// ([`keep_for_judging`]). These two watches are not the join path's CSR
/// watch ([`crate::kube::issuer`]): that one selects autonode's own CSRs by label
/// and keeps their outcome, these select kubelet's by signer, without that
/// label, and keep what judging reads; neither set contains the other.
///
/// Nothing is judged before the NodeClaim cache has listed (the leader
/// starts it once the Node cache has, [`crate::controllers::watches`]):
/// judged against a cache not yet listed, a kubelet's CSR would be left
/// pending for `RETRY_DECLINED` for an object that exists, with a warning
/// that is not true.
pub async fn run(client: Client, settings: Settings, nodes: Store<Node>) {
    if settings.claims.ready().await.is_err() {
        tracing::warn!(
            "kubelet CSR approver not started: the NodeClaim watch ended before its first list"
        );
        return;
    }
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let (client_store, client_csrs, client_watch) = kubelet_csrs(&csrs, csr::CLIENT_SIGNER);
    let (serving_store, serving_csrs, serving_watch) = kubelet_csrs(&csrs, csr::SERVING_SIGNER);
    let ctx = Arc::new(Context {
        csrs,
        nodes,
        csr_stores: [client_store.clone(), serving_store.clone()],
        by_node: ByNode::default(),
        told: Told::new(TOLD_CAPACITY),
        lookups: LookupCache::new(settings.ec2.clone(), LOOKUP_TTL, LOOKUP_CACHE_CAPACITY),
        limiter: Limiter::new(LOOKUP_BURST, LOOKUP_PERIOD, LIMITER_CAPACITY),
        settings,
    });
    let counting = count_pending(
        [
            (csr::CLIENT_SIGNER, client_store.clone()),
            (csr::SERVING_SIGNER, serving_store.clone()),
        ],
        ctx.settings.metrics.clone(),
    );
    let client_side = judging((0, client_store), client_csrs, ctx.clone());
    let serving_side = judging((1, serving_store), serving_csrs, ctx);
    let judge = futures::stream::select(client_side, serving_side).for_each(|result| {
        if let Err(error) = result {
            tracing::debug!(%error, "kubelet CSR approver");
        }
        futures::future::ready(())
    });
    // Polled here, not spawned: a replica that stops leading drops this
    // future, and the watches with it. The count never ends by itself.
    tokio::select! {
        _ = futures::future::join3(client_watch, serving_watch, judge) => {}
        () = counting => {}
    }
}

/// Reconciles every CSR `csrs` brings, reading it from `store` (the one
/// at `signer` in [`Context::csr_stores`]), and keeps the index by node.
fn judging(
    (signer, store): (usize, Store<CertificateSigningRequest>),
    csrs: impl Stream<Item = Result<Arc<CertificateSigningRequest>, Infallible>> + Send + 'static,
    ctx: Arc<Context>,
) -> impl Stream<Item = Result<(), String>> {
    let indexing = (ctx.clone(), store.clone());
    let csrs = csrs.inspect(move |csr| {
        let (ctx, store) = &indexing;
        if let Ok(csr) = csr {
            ctx.by_node.observe(signer, csr, store);
        }
    });
    applier(
        |csr, ctx| Box::pin(reconcile::reconcile(csr, ctx)),
        error_policy,
        ctx,
        store,
        trigger_self(csrs, ()),
        controller::Config::default().concurrency(JUDGED_AT_ONCE),
    )
    .map(|result| result.map(|_| ()).map_err(|e| e.to_string()))
}

fn error_policy(_csr: Arc<CertificateSigningRequest>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "approver reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// The key under which a node's being over its cap is told.
pub(super) fn over_cap_key(node: &str) -> String {
    format!("node/{node}")
}

pub(super) fn kind_label(purpose: Purpose) -> &'static str {
    match purpose {
        Purpose::Client => "client_renewal",
        Purpose::Serving => "serving",
    }
}

#[cfg(test)]
mod tests;
