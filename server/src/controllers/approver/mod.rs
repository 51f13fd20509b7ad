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

use crate::ec2::{InstanceLookup, LookupCache, LookupError};
use crate::kube::approval::{self, ApprovalError};
use crate::kube::binding::{self, Unreadable};
use crate::kube::cache::{self, Cache};
use crate::kube::karpenter::{parse_aws_provider_id, NodeClaim};
use crate::kube::limiter::Limiter;
use crate::kube::metrics::{KindLabels, LeftPendingLabels, Metrics, SignerLabels};
use crate::kube::nodeclaim::NodeClaims;
use autonode_shared::csr::{self, Purpose};
use futures::{Stream, StreamExt};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::ByteString;
use kube::runtime::controller::{self, applier, trigger_self, Action};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use thiserror::Error;

/// The approval condition's reason for renewals.
pub const RENEWAL_REASON: &str = "AutonodeRenewal";
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
/// ([`RETRY_DECLINED`]) with one call, and a terminated instance stops
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
/// When to look at a CSR left pending again: its node or NodeClaim may
/// appear, or an older CSR drop out of the cap's window.
const RETRY_DECLINED: Duration = Duration::from_secs(30);

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
    /// The controller's own view of the kubelet signers' CSRs, one store
    /// per signer (for the cap).
    csr_stores: [Store<CertificateSigningRequest>; 2],
    /// EC2 answers, reused for [`LOOKUP_TTL`].
    lookups: LookupCache,
    /// Real EC2 lookups per node.
    limiter: Limiter,
    settings: Settings,
}

/// Why a kubelet CSR was not approved (now).
#[derive(Debug, Error)]
pub enum Decline {
    #[error("node {0} does not exist")]
    NoNode(String),
    #[error("node {0} has no AWS providerID")]
    NoProviderId(String),
    #[error("no NodeClaim has providerID {0}")]
    NoNodeClaim(String),
    #[error("{count} NodeClaims have providerID {provider_id}")]
    ManyNodeClaims { provider_id: String, count: usize },
    #[error("NodeClaim {nodeclaim} is for node {claimed}, not {node}")]
    OtherNode {
        nodeclaim: String,
        claimed: String,
        node: String,
    },
    #[error("NodeClaim {0} is not bound by autonode")]
    NotBound(String),
    #[error("NodeClaim {nodeclaim}: {source}")]
    UnreadableBinding {
        nodeclaim: String,
        source: Unreadable,
    },
    #[error("NodeClaim {nodeclaim} is bound to instance {bound}, node {node} names {named}")]
    OtherInstance {
        nodeclaim: String,
        bound: String,
        named: String,
        node: String,
    },
    #[error("node {node} is not instance {instance_id}'s name ({according_to} says {name:?})")]
    NotItsName {
        node: String,
        instance_id: String,
        according_to: &'static str,
        name: String,
    },
    #[error("instance {instance_id} is {state:?} in EC2, not pending or running")]
    NotLive { instance_id: String, state: String },
    #[error("{0}")]
    Csr(#[from] csr::CsrError),
    /// Its body was not kept ([`keep_for_judging`]): never judged.
    #[error(
        "its request is over {max} bytes or it has over {MAX_USAGES} usages; not kept, not judged",
        max = csr::MAX_CSR_PEM_BYTES
    )]
    Oversized,
    #[error(
        "node {node} already has {count} CSRs pending or approved in the last {window_minutes} \
         minutes (cap {cap})"
    )]
    TooMany {
        node: String,
        count: usize,
        cap: usize,
        window_minutes: u64,
    },
    #[error("EC2 lookup: {0}")]
    Lookup(#[from] LookupError),
    /// Not a verdict: this node's EC2 lookups are paced; look again then.
    #[error("node {node} is out of EC2 lookups for now; next in {retry_in:?}")]
    RateLimited { node: String, retry_in: Duration },
}

impl Decline {
    /// A short, fixed label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoNode(_) => "no_node",
            Self::NoProviderId(_) => "no_provider_id",
            Self::NoNodeClaim(_) => "no_nodeclaim",
            Self::ManyNodeClaims { .. } => "many_nodeclaims",
            Self::OtherNode { .. } => "nodeclaim_other_node",
            Self::NotBound(_) => "not_bound",
            Self::UnreadableBinding { .. } => "unreadable_binding",
            Self::OtherInstance { .. } => "bound_other_instance",
            Self::NotItsName { .. } => "not_instance_name",
            Self::NotLive { .. } => "instance_not_live",
            Self::Csr(e) => e.reason(),
            Self::Oversized => "csr_too_large",
            Self::TooMany { .. } => "too_many_csrs",
            Self::Lookup(_) => "ec2_lookup",
            Self::RateLimited { .. } => "rate_limited",
        }
    }

    /// When to look at the CSR again: never for one not kept (a CSR's
    /// spec cannot change).
    fn retry_in(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_in, .. } => Some(*retry_in),
            Self::Oversized => None,
            _ => Some(RETRY_DECLINED),
        }
    }
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
/// and keeps their outcome, these select kubelet's by signer and keep what
/// judging reads; neither set contains the other.
pub async fn run(client: Client, settings: Settings, nodes: Store<Node>) {
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let (client_store, client_csrs, client_watch) = kubelet_csrs(&csrs, csr::CLIENT_SIGNER);
    let (serving_store, serving_csrs, serving_watch) = kubelet_csrs(&csrs, csr::SERVING_SIGNER);
    let ctx = Arc::new(Context {
        csrs,
        nodes,
        csr_stores: [client_store.clone(), serving_store.clone()],
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
    let client_side = judging(client_store, client_csrs, ctx.clone());
    let serving_side = judging(serving_store, serving_csrs, ctx);
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

/// How often `autonode_csrs_pending` is counted again.
const PENDING_COUNT_PERIOD: Duration = Duration::from_secs(5);

/// Keeps `autonode_csrs_pending` at the undecided CSRs in each signer's
/// store: counted from the stores rather than from judgements, so a CSR
/// judged once and never again (one too large to keep) counts for as long
/// as it is pending, and a deleted one stops counting. Back to 0 when
/// dropped (this replica stops leading), so only the leader's is not 0.
async fn count_pending(
    stores: [(&'static str, Store<CertificateSigningRequest>); 2],
    metrics: Metrics,
) {
    struct Zero(Metrics, [&'static str; 2]);
    impl Drop for Zero {
        fn drop(&mut self) {
            for signer in self.1 {
                self.0
                    .csrs_pending
                    .get_or_create(&SignerLabels { signer })
                    .set(0);
            }
        }
    }
    let _zero = Zero(metrics.clone(), stores.clone().map(|(signer, _)| signer));
    loop {
        for (signer, store) in &stores {
            let pending = store.state().iter().filter(|c| !decided(c)).count();
            metrics
                .csrs_pending
                .get_or_create(&SignerLabels { signer })
                .set(i64::try_from(pending).unwrap_or(i64::MAX));
        }
        tokio::time::sleep(PENDING_COUNT_PERIOD).await;
    }
}

/// The CSRs of `signer`, as a store, the queue of their changes and the
/// watch that fills both (each object stripped to [`keep_for_judging`]
/// before it is kept), to be polled beside the controller.
fn kubelet_csrs(
    api: &Api<CertificateSigningRequest>,
    signer: &'static str,
) -> (
    Store<CertificateSigningRequest>,
    impl Stream<Item = Result<Arc<CertificateSigningRequest>, Infallible>> + Send + 'static,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let config = watcher::Config::default()
        .fields(&format!("spec.signerName={signer}"))
        .page_size(cache::SMALL_PAGE);
    let (csrs, watching) = Cache::with_config(api.clone(), config, signer, keep_for_judging);
    let changes = csrs.changes().map(Ok);
    (csrs.store, changes, watching)
}

/// Reconciles every CSR `csrs` brings, reading it from `store`.
fn judging(
    store: Store<CertificateSigningRequest>,
    csrs: impl Stream<Item = Result<Arc<CertificateSigningRequest>, Infallible>> + Send + 'static,
    ctx: Arc<Context>,
) -> impl Stream<Item = Result<(), String>> {
    applier(
        |csr, ctx| Box::pin(reconcile(csr, ctx)),
        error_policy,
        ctx,
        store,
        trigger_self(csrs, ()),
        controller::Config::default(),
    )
    .map(|result| result.map(|_| ()).map_err(|e| e.to_string()))
}

/// What the approver keeps of a kubelet CSR: what [`ours_to_judge`],
/// [`judge`] and the cap read. A request larger than
/// [`csr::MAX_CSR_PEM_BYTES`] (or with more usages than [`MAX_USAGES`]) is
/// not kept: its request is emptied, which the API server never stores, so
/// [`judge`] knows it for one it will not judge.
pub fn keep_for_judging(csr: &mut CertificateSigningRequest) {
    cache::identity_only(&mut csr.metadata);
    let spec = &mut csr.spec;
    spec.extra = None;
    spec.uid = None;
    let usages = spec.usages.as_ref().map_or(0, Vec::len);
    if spec.request.0.len() > csr::MAX_CSR_PEM_BYTES || usages > MAX_USAGES {
        spec.request = ByteString(Vec::new());
        spec.usages = None;
    }
    let Some(status) = csr.status.as_mut() else {
        return;
    };
    // Only whether there is one is read.
    if let Some(certificate) = status.certificate.as_mut() {
        certificate.0 = Vec::new();
    }
    for condition in status.conditions.iter_mut().flatten() {
        *condition = CertificateSigningRequestCondition {
            type_: std::mem::take(&mut condition.type_),
            status: std::mem::take(&mut condition.status),
            ..Default::default()
        };
    }
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
            if !approve(&ctx.csrs, &csr, &node).await? {
                return Ok(Action::await_change());
            }
            ctx.settings
                .metrics
                .approvals
                .get_or_create(&KindLabels { kind })
                .inc();
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
            tracing::warn!(csr = %csr.name_any(), %node, kind, reason, detail = %decline, "kubelet CSR left pending");
            Ok(decline
                .retry_in()
                .map_or_else(Action::await_change, Action::requeue))
        }
    }
}

/// `Some((node, purpose))` for an undecided kubelet CSR a node made itself.
///
/// CSRs autonode's join path creates are requested by autonode-server's own
/// identity, not a node's, so they never get here; their labels are not
/// consulted, as anyone who may create a CSR may set them.
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

fn decided(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.as_ref();
    status.and_then(|s| s.certificate.as_ref()).is_some()
        || status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
            c.iter()
                .any(|c| matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed"))
        })
}

/// Approved (by anyone), whether or not signed yet.
fn approved(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.as_ref();
    status.and_then(|s| s.certificate.as_ref()).is_some()
        || status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Approved"))
}

/// Checks cheapest first, so that what is refused on the objects alone
/// never costs an EC2 call.
async fn judge(
    csr: &CertificateSigningRequest,
    node: &str,
    purpose: Purpose,
    ctx: &Context,
) -> Result<(), Decline> {
    if csr.spec.request.0.is_empty() {
        return Err(Decline::Oversized);
    }
    let count = counted_toward_cap(ctx, csr);
    if count >= ctx.settings.pending_cap {
        return Err(Decline::TooMany {
            node: node.to_string(),
            count,
            cap: ctx.settings.pending_cap,
            window_minutes: RECENT_WINDOW.as_secs() / 60,
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
    let (_zone, instance_id) = parse_aws_provider_id(&provider_id)
        .ok_or_else(|| Decline::NoProviderId(node.to_string()))?;
    let claims = ctx.settings.claims.by_provider_id(&provider_id);
    let region = bound_region(claims, &provider_id, instance_id, node)?;
    let parsed = csr::parse_csr(&csr.spec.request.0)?;
    csr::check_usages(
        csr.spec.usages.as_deref().unwrap_or_default(),
        purpose,
        &parsed.key,
    )?;
    let instance = lookup(ctx, node, &region, instance_id).await?;
    if !instance.state.is_live() {
        return Err(Decline::NotLive {
            instance_id: instance_id.to_string(),
            state: format!("{:?}", instance.state),
        });
    }
    its_name(node, instance_id, "EC2", &instance.private_dns_name)?;
    match purpose {
        Purpose::Client => csr::check_client_csr(&parsed, node)?,
        Purpose::Serving => {
            let dns = [instance.private_dns_name.clone()];
            csr::check_serving_csr(&parsed, node, &dns, &instance.private_ips)?;
        }
    }
    Ok(())
}

/// The region of the instance behind `provider_id`, from the binding on its
/// one NodeClaim (`claims` are those with that providerID), once that
/// NodeClaim is shown to be `node`'s.
fn bound_region(
    mut claims: Vec<Arc<NodeClaim>>,
    provider_id: &str,
    instance_id: &str,
    node: &str,
) -> Result<String, Decline> {
    let claim = match claims.len() {
        1 => claims.pop(),
        0 => None,
        count => {
            return Err(Decline::ManyNodeClaims {
                provider_id: provider_id.to_string(),
                count,
            })
        }
    }
    .ok_or_else(|| Decline::NoNodeClaim(provider_id.to_string()))?;
    let nodeclaim = claim.name_any();
    if let Some(claimed) = claim.status.as_ref().and_then(|s| s.node_name.as_deref()) {
        if claimed != node {
            return Err(Decline::OtherNode {
                nodeclaim,
                claimed: claimed.to_string(),
                node: node.to_string(),
            });
        }
    }
    let record = match binding::recorded(&claim) {
        Ok(Some(record)) => record,
        Ok(None) => return Err(Decline::NotBound(nodeclaim)),
        Err(source) => return Err(Decline::UnreadableBinding { nodeclaim, source }),
    };
    if record.instance_id != instance_id {
        return Err(Decline::OtherInstance {
            nodeclaim,
            bound: record.instance_id,
            named: instance_id.to_string(),
            node: node.to_string(),
        });
    }
    // What EC2 said at join time; EC2 is asked again below, but a node that
    // fails here need not cost a call.
    its_name(node, instance_id, "the binding", &record.node_name)?;
    Ok(record.region)
}

/// Whether `node` is `name`, the name `according_to` gives `instance_id`.
fn its_name(
    node: &str,
    instance_id: &str,
    according_to: &'static str,
    name: &str,
) -> Result<(), Decline> {
    if name == node {
        return Ok(());
    }
    Err(Decline::NotItsName {
        node: node.to_string(),
        instance_id: instance_id.to_string(),
        according_to,
        name: name.to_string(),
    })
}

/// The instance as EC2 describes it: from the cache, or (within `node`'s
/// budget) from EC2.
async fn lookup(
    ctx: &Context,
    node: &str,
    region: &str,
    instance_id: &str,
) -> Result<crate::ec2::Ec2Instance, Decline> {
    if let Some(instance) = ctx.lookups.cached(region, instance_id) {
        return Ok(instance);
    }
    ctx.limiter
        .try_take(node, Instant::now())
        .map_err(|retry_in| Decline::RateLimited {
            node: node.to_string(),
            retry_in,
        })?;
    Ok(ctx.lookups.refresh(region, instance_id).await?)
}

/// CSRs from the same requester that count toward its cap, this one
/// excluded.
fn counted_toward_cap(ctx: &Context, csr: &CertificateSigningRequest) -> usize {
    let now = unix_now();
    ctx.csr_stores
        .iter()
        .map(|store| {
            store
                .state_filter(|other| counts_toward_cap(other, csr, now))
                .len()
        })
        .sum()
}

/// Whether `other` counts toward `csr`'s requester's cap at `now` (Unix
/// seconds): same requester, another CSR, and pending, or approved and
/// created within [`RECENT_WINDOW`]. Denied and failed-unapproved ones do
/// not count: they gave the node nothing.
fn counts_toward_cap(
    other: &CertificateSigningRequest,
    csr: &CertificateSigningRequest,
    now: i64,
) -> bool {
    if other.spec.username != csr.spec.username || other.name_any() == csr.name_any() {
        return false;
    }
    if !decided(other) {
        return true;
    }
    if !approved(other) {
        return false;
    }
    let window = i64::try_from(RECENT_WINDOW.as_secs()).unwrap_or(i64::MAX);
    match other.metadata.creation_timestamp.as_ref() {
        Some(created) => now.saturating_sub(created.0.as_second()) < window,
        // The API server always sets it; without one, count it.
        None => true,
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Approves the CSR judged, by UID: a CSR deleted and re-created under the
/// same name while it was judged is another object and is not approved
/// (it gets its own reconcile, and its own judgement).
async fn approve(
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
        reason: RENEWAL_REASON,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::marks;
    use serde_json::json;

    const NODE: &str = "ip-10-0-1-23.us-west-2.compute.internal";
    const PID: &str = "aws:///us-west-2-lax-1a/i-0123456789abcdef0";
    const ID: &str = "i-0123456789abcdef0";

    fn csr(
        name: &str,
        user: &str,
        status: serde_json::Value,
        age_secs: i64,
    ) -> CertificateSigningRequest {
        let created = k8s_openapi::jiff::Timestamp::from_second(NOW - age_secs).unwrap();
        serde_json::from_value(json!({
            "metadata": {"name": name, "creationTimestamp": created.to_string()},
            "spec": {"request": "", "signerName": csr::SERVING_SIGNER, "username": user},
            "status": status,
        }))
        .unwrap()
    }

    const NOW: i64 = 1_800_000_000;
    const ME: &str = "system:node:me";

    fn approved_status() -> serde_json::Value {
        json!({"conditions": [{"type": "Approved", "status": "True"}]})
    }

    #[test]
    fn pending_and_recently_approved_csrs_count_toward_the_cap() {
        let this = csr("this", ME, json!({}), 0);
        let counted = |other: &CertificateSigningRequest| counts_toward_cap(other, &this, NOW);
        assert!(counted(&csr("pending-old", ME, json!({}), 20 * 3600)));
        assert!(counted(&csr("approved-now", ME, approved_status(), 60)));
        assert!(counted(&csr(
            "issued",
            ME,
            json!({"certificate": "Zm9v"}),
            14 * 60
        )));
        assert!(!counted(&csr(
            "approved-old",
            ME,
            approved_status(),
            15 * 60
        )));
        let denied = json!({"conditions": [{"type": "Denied", "status": "True"}]});
        assert!(!counted(&csr("denied", ME, denied, 60)));
        assert!(!counted(&csr(
            "someone-else",
            "system:node:other",
            json!({}),
            0
        )));
        assert!(!counted(&this), "a CSR does not count against itself");
    }

    #[test]
    fn a_kubelet_rotation_stays_well_under_the_default_cap() {
        // A rotation: one client renewal and one serving CSR approved, and
        // a retried serving CSR pending; the next CSR sees three.
        let this = csr("next", ME, json!({}), 0);
        let others = [
            csr("client", ME, approved_status(), 120),
            csr("serving", ME, approved_status(), 110),
            csr("serving-retry", ME, json!({}), 10),
        ];
        let count = others
            .iter()
            .filter(|o| counts_toward_cap(o, &this, NOW))
            .count();
        assert!(count < DEFAULT_PENDING_CAP, "{count}");
    }

    fn kubelet_csr(request: &str, usages: usize) -> CertificateSigningRequest {
        serde_json::from_value(json!({
            "metadata": {
                "name": "c1", "uid": "u1", "creationTimestamp": "2026-01-01T10:00:00Z",
                "labels": {crate::kube::marks::CSR_MANAGED_LABEL: "true"},
                "annotations": {"big": "x".repeat(200_000)},
                "managedFields": [{"manager": "kubelet"}],
            },
            "spec": {
                "request": request, "signerName": csr::SERVING_SIGNER,
                "usages": vec!["server auth"; usages], "username": ME,
                "groups": [csr::NODES_GROUP], "extra": {"k": ["x".repeat(100_000)]},
            },
            "status": {
                "conditions": [{"type": "Approved", "status": "True", "message": "x".repeat(100_000)}],
                "certificate": "Y2VydA==",
            },
        }))
        .unwrap()
    }

    #[test]
    fn what_judging_reads_is_kept_and_nothing_else() {
        let mut kept = kubelet_csr("eHh4", 3);
        keep_for_judging(&mut kept);
        assert_eq!(
            serde_json::to_value(&kept).unwrap(),
            json!({
                "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": {"name": "c1", "uid": "u1", "creationTimestamp": "2026-01-01T10:00:00Z"},
                "spec": {
                    "request": "eHh4", "signerName": csr::SERVING_SIGNER,
                    "usages": ["server auth", "server auth", "server auth"],
                    "username": ME, "groups": [csr::NODES_GROUP],
                },
                "status": {
                    "conditions": [{"type": "Approved", "status": "True"}],
                    "certificate": "",
                },
            })
        );
        // Still decided and approved, as it was.
        assert!(decided(&kept) && approved(&kept));
    }

    #[test]
    fn an_oversized_request_or_usage_list_is_not_kept() {
        use k8s_openapi::ByteString;
        let mut big = kubelet_csr("", 3);
        big.spec.request = ByteString(vec![b'A'; csr::MAX_CSR_PEM_BYTES + 1]);
        let mut at_limit = big.clone();
        at_limit.spec.request.0.truncate(csr::MAX_CSR_PEM_BYTES);
        let mut many = kubelet_csr("eHh4", MAX_USAGES + 1);
        for csr in [&mut big, &mut at_limit, &mut many] {
            keep_for_judging(csr);
        }
        assert!(big.spec.request.0.is_empty());
        assert_eq!(at_limit.spec.request.0.len(), csr::MAX_CSR_PEM_BYTES);
        assert!(many.spec.request.0.is_empty() && many.spec.usages.is_none());
        assert_eq!(Decline::Oversized.reason(), "csr_too_large");
        assert_eq!(Decline::Oversized.retry_in(), None);
    }

    fn claim(node_name: Option<&str>, binding: Option<serde_json::Value>) -> Arc<NodeClaim> {
        let mut annotations = serde_json::Map::new();
        if let Some(b) = binding {
            annotations.insert(marks::BINDING.into(), json!(b.to_string()));
        }
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "c1", "annotations": annotations},
                "spec": {},
                "status": {"providerID": PID, "nodeName": node_name},
            }))
            .unwrap(),
        )
    }

    fn record(instance_id: &str, node_name: &str) -> serde_json::Value {
        json!({
            "instanceId": instance_id, "region": "us-west-2", "nodeName": node_name,
            "clientKey": "aa", "servingKey": "bb", "csrs": [],
        })
    }

    fn region_for(claims: Vec<Arc<NodeClaim>>) -> Result<String, Decline> {
        bound_region(claims, PID, ID, NODE)
    }

    #[test]
    fn the_region_comes_from_the_binding_not_the_zone() {
        let bound = claim(None, Some(record(ID, NODE)));
        assert_eq!(region_for(vec![bound.clone()]).unwrap(), "us-west-2");
        let registered = claim(Some(NODE), Some(record(ID, NODE)));
        assert_eq!(region_for(vec![registered]).unwrap(), "us-west-2");
    }

    #[test]
    fn the_nodeclaim_must_be_one_bound_and_this_nodes() {
        let reason = |claims| region_for(claims).unwrap_err().reason();
        let good = claim(None, Some(record(ID, NODE)));
        assert_eq!(reason(vec![]), "no_nodeclaim");
        assert_eq!(reason(vec![good.clone(), good]), "many_nodeclaims");
        assert_eq!(reason(vec![claim(None, None)]), "not_bound");
        assert_eq!(
            reason(vec![claim(Some("ip-10-9-9-9"), Some(record(ID, NODE)))]),
            "nodeclaim_other_node"
        );
        assert_eq!(
            reason(vec![claim(None, Some(record("i-1234abcd", NODE)))]),
            "bound_other_instance"
        );
        assert_eq!(
            reason(vec![claim(None, Some(record(ID, "ip-10-9-9-9")))]),
            "not_instance_name"
        );
        assert_eq!(
            reason(vec![claim(None, Some(json!("not a record")))]),
            "unreadable_binding"
        );
    }
}
