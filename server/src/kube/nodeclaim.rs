//! Finding an instance's NodeClaim, the rules it must pass, and every
//! write autonode makes to NodeClaims.
//!
//! [`NodeClaims`] is the only writer of NodeClaims: the binding, the
//! bootstrap-failed and reported marks, the feedback condition and the
//! deletion of a failed machine's NodeClaim all go through its methods, each
//! under [`marks::FIELD_MANAGER`], every mark with its seal in the same
//! write ([`marks::with_seals`]), so what [`marks::keep_own`] trusts is
//! exactly what these methods write.
//!
//! Lookups come from a watch-backed cache (a kube-runtime reflector), never
//! a LIST per join: a scale-out of a thousand machines must not become a
//! thousand LISTs of every NodeClaim.

use crate::kube::binding;
use crate::kube::budget::{Budget, Decision, Failure};
use crate::kube::cache::{self, Cache, OnGone};
use crate::kube::impostor::Impostors;
use crate::kube::index::Index;
use crate::kube::karpenter::{Condition, NodeClaim};
use crate::kube::marks::{self, StateKey};
use crate::kube::reuse::History;
use crate::primitives::bounded::Bounded;
use crate::primitives::clock::{self, Clock, KubeTime};
use futures::StreamExt;
use kube::api::{DeleteParams, Patch, Preconditions};
use kube::{Api, Client};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use time::OffsetDateTime;

/// The keys a NodeClaim is found by (see [`NodeClaims::by_provider_id`],
/// [`NodeClaims::bound_to`]).
fn index_keys(claim: &NodeClaim) -> Vec<String> {
    let provider = claim.provider_id().map(provider_key);
    let bound = binding::recorded(claim).ok().flatten();
    let node = bound.map(|record| node_key(&record.node_name));
    provider.into_iter().chain(node).collect()
}

fn provider_key(provider_id: &str) -> String {
    format!("provider:{provider_id}")
}

fn node_key(node: &str) -> String {
    format!("node:{node}")
}

/// How long a join waits for the cache to show a NodeClaim it lacks.
pub const CACHE_GRACE: Duration = Duration::from_secs(3);

/// The most deleted NodeClaims remembered (see [`NodeClaims::gone`]):
/// stripped NodeClaims are small, and a rollout trial watches fewer. The
/// node names they held are remembered apart, by time ([`History`]).
pub const MAX_GONE: usize = 1024;

/// How long a failure found at admission waits for the cache to show the
/// instance's NodeClaim ([`NodeClaims::failed_when_known`]): Karpenter
/// writes the providerID seconds after the launch, long before an agent
/// boots and joins, so this is only the cache's lag, generously.
pub const AWAIT_CLAIM: Duration = Duration::from_secs(120);

/// Failures found at admission waiting for their NodeClaim, at most: each
/// is an AWS-signed document of a distinct instance, which costs whoever
/// sends them an instance apiece.
pub const AWAITING: usize = 1024;

/// Failures waiting for their instance's NodeClaim to show, by providerID.
type Awaiting = Arc<Mutex<Bounded<String, (Failure, String)>>>;

/// The NodeClaim cache.
#[derive(Clone)]
pub struct NodeClaims {
    cache: Cache<NodeClaim>,
    api: Api<NodeClaim>,
    /// Seals every mark written, and opens those read.
    key: StateKey,
    history: History,
    /// The cache's NodeClaims by providerID and by bound node name.
    index: Index<NodeClaim>,
    /// What becomes of a failed machine's NodeClaim.
    budget: Budget,
    awaiting: Awaiting,
    impostors: Arc<Impostors>,
}

impl NodeClaims {
    /// Starts watching NodeClaims in the background. `key` seals and opens
    /// marks; the names of bound NodeClaims seen gone (`clock`'s time)
    /// are remembered for `signing` (`--signing-duration`). Every
    /// NodeClaim the watch brings or sees go is shown to `budget`.
    pub fn start(
        client: Client,
        key: StateKey,
        (clock, signing): (Clock, Duration),
        budget: Budget,
    ) -> Self {
        let api: Api<NodeClaim> = Api::all(client);
        let history = History::new(signing);
        let remember = history.clone();
        let counter = budget.clone();
        let on_gone: OnGone<NodeClaim> = Arc::new(move |claim: &NodeClaim| {
            remember.record(claim, clock.stamp(), Instant::now());
            counter.observe(claim);
        });
        let filter = move |claim: &mut NodeClaim| strip(claim, &key);
        let index = Index::new(index_keys);
        let gone = (MAX_GONE, on_gone);
        let cache = Cache::start_remembering(api.clone(), "NodeClaim", filter, gone, index.clone());
        let awaiting = Arc::new(Mutex::new(Bounded::new(AWAIT_CLAIM, AWAITING)));
        let claims = Self {
            cache,
            api,
            key,
            history,
            index,
            budget,
            awaiting,
            impostors: Arc::default(),
        };
        tokio::spawn(claims.clone().watch_failures());
        claims
    }

    /// Shows the budget every NodeClaim the watch brings, and acts on the
    /// failures that were waiting for one to show.
    async fn watch_failures(self) {
        let mut changes = std::pin::pin!(self.changes());
        while let Some(claim) = changes.next().await {
            self.budget.observe(&claim);
            let waiting = claim.provider_id().and_then(|pid| {
                let mut awaiting = self.awaiting.lock().unwrap_or_else(PoisonError::into_inner);
                awaiting.remove(&pid.to_string())
            });
            if let Some((failure, why)) = waiting {
                let claims = self.clone();
                tokio::spawn(async move { claims.failed_logged(&claim, &why, failure).await });
            }
        }
    }

    /// Records `failure` on the NodeClaim of `provider_id`: now if the
    /// cache holds it, else once the watch shows it (within
    /// [`AWAIT_CLAIM`]): a join refused at admission comes before the
    /// NodeClaim lookup, and may come before the cache has the
    /// providerID Karpenter just wrote.
    pub fn failed_when_known(&self, provider_id: &str, why: String, failure: Failure) {
        if let [claim] = self.by_provider_id(provider_id).as_slice() {
            let (claims, claim) = (self.clone(), claim.clone());
            tokio::spawn(async move { claims.failed_logged(&claim, &why, failure).await });
            return;
        }
        let mut awaiting = self.awaiting.lock().unwrap_or_else(PoisonError::into_inner);
        awaiting.insert(provider_id.to_string(), Instant::now(), (failure, why));
    }

    /// [`NodeClaims::failed`], with what it did logged; not for a bound
    /// NodeClaim (a join got through once: whoever was refused now may be
    /// someone else holding its document).
    async fn failed_logged(&self, claim: &NodeClaim, why: &str, failure: Failure) {
        if matches!(binding::recorded(claim), Ok(Some(_))) {
            return;
        }
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        match self.failed(claim, why, failure).await {
            Ok(Failed::Left) => {}
            Ok(done) => tracing::warn!(nodeclaim = name, reason = failure.reason, ?done, "{why}"),
            Err(error) => {
                tracing::warn!(nodeclaim = name, %error, "could not mark the NodeClaim of a refused instance")
            }
        }
    }

    /// How many victims each impostor Node may cost (see
    /// [`crate::kube::impostor`]): one allowance per replica, whichever of
    /// the join and the feedback controller finds the victim.
    pub fn impostors(&self) -> &Impostors {
        &self.impostors
    }

    /// The node names gone NodeClaims held (see [`crate::kube::reuse`]).
    pub fn history(&self) -> &History {
        &self.history
    }

    /// `claim`, as the API server sent it, stripped as the cache's are
    /// (see [`strip`]): only autonode's own marks are left.
    pub fn strip(&self, claim: &mut NodeClaim) {
        strip(claim, &self.key);
    }

    /// `annotations` (marks to write) with their seals, for `claim`.
    fn sealed(&self, claim: &NodeClaim, annotations: serde_json::Value) -> serde_json::Value {
        let uid = claim.metadata.uid.as_deref().unwrap_or_default();
        let serde_json::Value::Object(annotations) = annotations else {
            return annotations;
        };
        marks::with_seals(&self.key, uid, annotations).into()
    }

    /// Waits until the first full list has arrived.
    pub async fn ready(&self) -> Result<(), NotListed> {
        self.cache.status.wait_listed().await.map_err(NotListed)
    }

    /// Whether the cache has listed since its watch last failed (which
    /// implies it has listed): what `/readyz` asks. While it has not (the
    /// API server was away, the watch is backing off), a NodeClaim missing
    /// from the cache may just be one it has not seen: not a reason to
    /// refuse a machine.
    pub fn is_fresh(&self) -> bool {
        self.cache.status.is_fresh()
    }

    /// Like [`NodeClaims::by_provider_id`], but when nothing matches, gives
    /// the watch up to [`CACHE_GRACE`] to deliver a providerID Karpenter
    /// has just written, rather than refuse a machine for our cache's lag.
    pub async fn find(&self, provider_id: &str) -> Vec<Arc<NodeClaim>> {
        let deadline = tokio::time::Instant::now() + CACHE_GRACE;
        loop {
            let found = self.by_provider_id(provider_id);
            if !found.is_empty() || tokio::time::Instant::now() >= deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The one NodeClaim whose `status.providerID` is `provider_id`: the
    /// lookup the join and an agent's report share. After the first list,
    /// through [`NodeClaims::find`]'s grace; none found while the watch is
    /// reconnecting is [`FindError::Stale`] (the NodeClaim may be one it
    /// missed), not a verdict on the machine.
    pub async fn one_for(&self, provider_id: &str) -> Result<Arc<NodeClaim>, FindError> {
        self.ready().await?;
        let matches = self.find(provider_id).await;
        if matches.is_empty() && !self.is_fresh() {
            return Err(FindError::Stale);
        }
        Ok(only(provider_id, matches)?)
    }

    /// The NodeClaims whose `status.providerID` is exactly `provider_id`,
    /// as the store holds them (the index only names candidates).
    pub fn by_provider_id(&self, provider_id: &str) -> Vec<Arc<NodeClaim>> {
        self.indexed(&provider_key(provider_id), |c| {
            c.provider_id() == Some(provider_id)
        })
    }

    /// The NodeClaims whose binding records the node name `node`, as the
    /// store holds them.
    pub fn bound_to(&self, node: &str) -> Vec<Arc<NodeClaim>> {
        self.indexed(&node_key(node), |c| {
            binding::recorded(c)
                .ok()
                .flatten()
                .is_some_and(|r| r.node_name == node)
        })
    }

    /// The store's NodeClaims among the index's candidates for `key` that
    /// `matches` judges, on each as the store holds it now.
    fn indexed(&self, key: &str, matches: impl Fn(&NodeClaim) -> bool) -> Vec<Arc<NodeClaim>> {
        let store = &self.cache.store;
        let found = self.index.candidates(key).into_iter();
        found
            .filter_map(|object| store.get(&object))
            .filter(|claim| matches(claim))
            .collect()
    }

    /// Each NodeClaim this cache's watch brings (see [`Cache::changes`]):
    /// the feedback controller's queue, from the one NodeClaim watch.
    pub fn changes(&self) -> impl futures::Stream<Item = Arc<NodeClaim>> + Send + 'static {
        self.cache.changes()
    }

    /// The deleted NodeClaims (the last [`MAX_GONE`] this replica's watch
    /// saw go) that `keep` picks, each as it last was: the rollout guard
    /// judges a NodeClaim under trial by its last state, failure mark
    /// included. Read after [`NodeClaims::store`]: a NodeClaim the store no
    /// longer held is here by then.
    pub fn gone(&self, keep: impl Fn(&NodeClaim) -> bool) -> Vec<Arc<NodeClaim>> {
        self.cache.gone(keep)
    }

    /// The cache's store, for a controller reconciling from it.
    pub fn store(&self) -> kube::runtime::reflector::Store<NodeClaim> {
        self.cache.store.clone()
    }

    /// The NodeClaim as the API server has it now (for conflict handling),
    /// with only autonode's own marks.
    pub async fn get_fresh(&self, name: &str) -> Result<Option<NodeClaim>, kube::Error> {
        let mut claim = self.api.get_opt(name).await?;
        if let Some(claim) = claim.as_mut() {
            self.strip(claim);
        }
        Ok(claim)
    }

    /// Writes `value` (a serialized [`crate::kube::binding::Record`]; the binding
    /// owns its format) as the binding of `over`, and `reported` as its
    /// [`marks::REPORTED`] mark when given, only if the NodeClaim is still
    /// at `over`'s resourceVersion (the API server answers 409 otherwise),
    /// and `held` as its [`marks::NAME_LAST_HELD`] mark when given.
    /// Returns the NodeClaim as written, with only autonode's own marks.
    pub async fn write_binding(
        &self,
        over: &NodeClaim,
        value: &str,
        (reported, held): (Option<&str>, Option<&str>),
    ) -> Result<NodeClaim, kube::Error> {
        let name = over.metadata.name.as_deref().unwrap_or_default();
        let resource_version = over.metadata.resource_version.as_deref();
        let mut annotations = serde_json::json!({ marks::BINDING: value });
        if let Some(reported) = reported {
            annotations[marks::REPORTED] = reported.into();
        }
        if let Some(held) = held {
            annotations[marks::NAME_LAST_HELD] = held.into();
        }
        // A merge patch with metadata.resourceVersion is a precondition.
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": resource_version,
                "annotations": self.sealed(over, annotations),
            }
        });
        let mut written = self.merge(name, &patch).await?;
        self.strip(&mut written);
        Ok(written)
    }

    /// Deletes a NodeClaim whose machine failed to bootstrap, so Karpenter
    /// replaces it now; only if it is still the object we judged (same
    /// uid). `Ok(false)` when it was already gone or replaced. First marks
    /// it failed with `why` (capped), so that the last state the watches
    /// see says why it went (the rollout guard names it): one more write,
    /// on the failure path only.
    async fn delete_failed(
        &self,
        claim: &NodeClaim,
        why: &str,
        failure: Failure,
    ) -> Result<bool, kube::Error> {
        let name = claim.metadata.name.clone().unwrap_or_default();
        if !self.mark_failed(claim, why, failure).await? {
            return Ok(false);
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: claim.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.api.delete(&name, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Does with `claim`, whose machine failed for good, what the failure
    /// budget decides ([`Budget::decide`]); the one place for every way a
    /// failure is known (a join refused for good, an agent's signed fatal
    /// report, an impostor Node). A registered
    /// NodeClaim is left alone: its Node exists, so whatever failed, the
    /// machine is a node, and its Node's conditions speak for it now.
    pub async fn failed(
        &self,
        claim: &NodeClaim,
        why: &str,
        failure: Failure,
    ) -> Result<Failed, kube::Error> {
        if claim.is_registered() {
            return Ok(Failed::Left);
        }
        self.act_on_failure(claim, why, failure).await
    }

    /// [`NodeClaims::failed`] for a NodeClaim Karpenter Registered to an
    /// impostor: a Node that is not the machine EC2 names for its instance
    /// (another node registered it with this instance's providerID). Its
    /// "node" is not its machine, so the registration protects nothing:
    /// deleting the NodeClaim makes Karpenter terminate the machine,
    /// delete the impostor Node and launch another. The failure's reason
    /// mark says an impostor failed it ([`crate::kube::budget::Cause::Impostor`]):
    /// it says nothing of the machine's AMI or userData.
    pub async fn failed_impostor(
        &self,
        claim: &NodeClaim,
        why: &str,
        failure: Failure,
    ) -> Result<Failed, kube::Error> {
        self.act_on_failure(claim, why, failure).await
    }

    /// Asks the budget, then deletes (marked first) or marks; a NodeClaim
    /// to be kept that already carries autonode's failure mark is left as
    /// it is (a refused machine's every retry would be a write).
    async fn act_on_failure(
        &self,
        claim: &NodeClaim,
        why: &str,
        failure: Failure,
    ) -> Result<Failed, kube::Error> {
        let done = match self.budget.decide(claim, failure) {
            Decision::Delete => self
                .delete_failed(claim, why, failure)
                .await?
                .then_some(Failed::Deleted),
            Decision::Mark if marked_failed(claim) => None,
            Decision::Mark => self
                .mark_failed(claim, why, failure)
                .await?
                .then_some(Failed::Marked),
        };
        if let Some(done) = done {
            self.budget.done(claim, failure, done == Failed::Deleted);
        }
        Ok(done.unwrap_or(Failed::Left))
    }

    /// Marks `claim` failed with `note` (the [`marks::BOOTSTRAP_FAILED`]
    /// annotation), for the feedback controller's condition, with the
    /// failure's cause and reason ([`marks::FAILURE_REASON`]) in the same
    /// write; only if it is still the object judged (same uid: a NodeClaim
    /// of the same name made since is not marked, 409). `Ok(false)` when
    /// it was gone or replaced.
    async fn mark_failed(
        &self,
        claim: &NodeClaim,
        note: &str,
        failure: Failure,
    ) -> Result<bool, kube::Error> {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let note = serde_json::json!({
            marks::BOOTSTRAP_FAILED: marks::capped(note, marks::MAX_NOTE),
            marks::FAILURE_REASON: failure.mark(),
        });
        let patch = serde_json::json!({"metadata": {
            "uid": claim.metadata.uid,
            "annotations": self.sealed(claim, note),
        }});
        match self.merge(&name, &patch).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Records `reported` (comma-separated milestones) as `claim`'s
    /// [`marks::REPORTED`] mark, if it is still the object read (same
    /// uid: the seal is for it); returns the NodeClaim as the write left it.
    pub async fn mark_reported(
        &self,
        claim: &NodeClaim,
        reported: &str,
    ) -> Result<NodeClaim, kube::Error> {
        let mark = serde_json::json!({marks::REPORTED: reported});
        let patch = serde_json::json!({"metadata": {
            "uid": claim.metadata.uid,
            "annotations": self.sealed(claim, mark),
        }});
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        self.merge(name, &patch).await
    }

    /// [`NodeClaims::mark_reported`], only if `claim` is still at the
    /// version it was read at (the API server answers 409 otherwise), for
    /// a writer that read the mark from it. Returns the NodeClaim as
    /// written, with only autonode's own marks.
    pub async fn mark_reported_over(
        &self,
        claim: &NodeClaim,
        reported: &str,
    ) -> Result<NodeClaim, kube::Error> {
        let mark = serde_json::json!({marks::REPORTED: reported});
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": claim.metadata.resource_version,
            "annotations": self.sealed(claim, mark),
        }});
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let mut written = self.merge(name, &patch).await?;
        self.strip(&mut written);
        Ok(written)
    }

    /// Writes `claim`'s status conditions as `conditions`, through the
    /// status subresource, only if the NodeClaim is still at the version
    /// `claim` was read at (the API server answers 409 otherwise).
    pub async fn write_conditions(
        &self,
        claim: &NodeClaim,
        conditions: &[Condition],
    ) -> Result<(), kube::Error> {
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": claim.metadata.resource_version },
            "status": { "conditions": conditions },
        });
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        self.api
            .patch_status(name, &marks::patch_params(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }

    /// A merge patch of `name`'s metadata, under autonode's field manager.
    async fn merge(&self, name: &str, patch: &serde_json::Value) -> Result<NodeClaim, kube::Error> {
        self.api
            .patch(name, &marks::patch_params(), &Patch::Merge(patch))
            .await
    }
}

/// What [`NodeClaims::failed`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    Deleted,
    Marked,
    /// Nothing: registered, gone, or replaced by another of its name.
    Left,
}

/// Whether autonode marked `claim` failed (a foreign mark was dropped when
/// the claim was kept).
pub fn marked_failed(claim: &NodeClaim) -> bool {
    claim
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(marks::BOOTSTRAP_FAILED))
}

/// Seconds since the NodeClaim was created.
pub fn age_seconds(claim: &NodeClaim, clock: Clock) -> Option<f64> {
    let created = claim.metadata.creation_timestamp.as_ref()?;
    let age = clock.stamp().duration_since(created.0);
    Some(age.as_secs_f64().max(0.0))
}

/// What is kept of a NodeClaim (in this cache and the feedback controller's):
/// its identity, the typed spec and status (unknown fields are never
/// parsed), its labels (the renderer gives them to the node) and, of its
/// annotations, only autonode's own marks (judged with `key`). Everything
/// else a NodePool's template copies on (annotations of any size) is
/// dropped, seals included once they have been checked, as are
/// managedFields once `keep_own_marks` has judged the marks by them.
pub fn strip(claim: &mut NodeClaim, key: &StateKey) {
    keep_own_marks(claim, key);
    let marks = claim.metadata.annotations.take().and_then(|mut all| {
        all.retain(|key, _| marks::NODECLAIM_MARKS.contains(&key.as_str()));
        (!all.is_empty()).then_some(all)
    });
    let labels = claim.metadata.labels.take();
    // The NodePool's, for the failure budget's Event on it (its UID).
    let owners = claim.metadata.owner_references.take().and_then(|mut all| {
        all.retain(|o| o.kind == "NodePool" && o.api_version.starts_with("karpenter.sh/"));
        (!all.is_empty()).then_some(all)
    });
    cache::identity_only(&mut claim.metadata);
    claim.metadata.annotations = marks;
    claim.metadata.labels = labels;
    claim.metadata.owner_references = owners;
}

/// Drops the `autonode.dev/*` marks on `claim` that autonode did not write
/// (see [`marks`]): from here on, nothing reads a foreign one.
fn keep_own_marks(claim: &mut NodeClaim, key: &StateKey) {
    let removed = marks::keep_own(&mut claim.metadata, key);
    if !removed.is_empty() {
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        tracing::warn!(nodeclaim = name, annotations = ?removed, "ignoring autonode annotations that autonode did not write (copied from a NodePool template, or set by hand)");
    }
}

/// The NodeClaim cache never listed: its watch ended first.
#[derive(Debug, thiserror::Error)]
#[error("NodeClaim cache: {0}")]
pub struct NotListed(#[source] cache::WatchEnded);

/// Why [`NodeClaims::one_for`] found no one NodeClaim.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    #[error(transparent)]
    NotListed(#[from] NotListed),
    /// Nothing matched while the watch was reconnecting.
    #[error("NodeClaim cache out of date (watch reconnecting)")]
    Stale,
    /// None or several NodeClaims have the providerID
    /// ([`SelectError::None`] or [`SelectError::Many`]).
    #[error(transparent)]
    Select(#[from] SelectError),
}

/// Why an attested instance has no NodeClaim it may join as.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    #[error("no NodeClaim has providerID {0}")]
    None(String),
    #[error("{count} NodeClaims have providerID {provider_id}")]
    Many { provider_id: String, count: usize },
    #[error("NodeClaim {0} is already Registered")]
    Registered(String),
    #[error("NodeClaim {0} is being deleted")]
    Deleting(String),
    #[error(
        "instance pendingTime {pending} is before NodeClaim {nodeclaim} was created ({created})"
    )]
    PendingBeforeNodeClaim {
        nodeclaim: String,
        pending: String,
        created: String,
    },
}

/// The one NodeClaim of `matches` (those with `provider_id`), or none
/// or many.
pub fn only(
    provider_id: &str,
    matches: Vec<Arc<NodeClaim>>,
) -> Result<Arc<NodeClaim>, SelectError> {
    match <[Arc<NodeClaim>; 1]>::try_from(matches) {
        Ok([claim]) => Ok(claim),
        Err(matches) if matches.is_empty() => Err(SelectError::None(provider_id.to_string())),
        Err(matches) => Err(SelectError::Many {
            provider_id: provider_id.to_string(),
            count: matches.len(),
        }),
    }
}

/// How many seconds the API server's clock (which stamps a NodeClaim's
/// creation) may be ahead of EC2's (which stamps an instance's
/// pendingTime) before an instance counts as older than its NodeClaim.
/// Both are NTP-disciplined, but a second or two apart is ordinary, and
/// with none a join was refused (and, before the failure budget, its
/// NodeClaim deleted) for it; five seconds is far shorter than any
/// launch, so an instance launched for another NodeClaim is still told.
pub const CLOCK_TOLERANCE: i64 = 5;

/// The rules the one NodeClaim an attested instance joins as must pass:
/// not Registered, not deleting, and the instance's `pendingTime` no
/// earlier than the NodeClaim's creation (an instance older than its claim
/// is not the machine Karpenter launched for it).
pub fn check(claim: &NodeClaim, pending_time: OffsetDateTime) -> Result<(), SelectError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    if claim.is_deleting() {
        return Err(SelectError::Deleting(name));
    }
    if claim.is_registered() {
        return Err(SelectError::Registered(name));
    }
    let created = claim
        .metadata
        .creation_timestamp
        .as_ref()
        .map(clock::from_k8s);
    match created {
        // The API server stores whole seconds: compare at that resolution,
        // with the tolerance for its clock being ahead of EC2's.
        Some(created)
            if pending_time.unix_timestamp() + CLOCK_TOLERANCE >= created.unix_timestamp() =>
        {
            Ok(())
        }
        created => Err(SelectError::PendingBeforeNodeClaim {
            nodeclaim: name,
            pending: pending_time.to_string(),
            created: created
                .map(|c| c.to_string())
                .unwrap_or_else(|| "unknown".into()),
        }),
    }
}

/// A bootstrap milestone, in the order they happen. The join reports the
/// first two (it alone sees them happen), the leader's feedback controller
/// the others; all
/// are recorded in the one [`marks::REPORTED`] mark, and [`pending`]
/// decides for both which are still to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Milestone {
    /// The instance attested and bound to its NodeClaim.
    Attested,
    /// Its certificates issued.
    Certificates,
    Registered,
    Ready,
}

impl Milestone {
    /// Every milestone, in order.
    pub const ALL: [Milestone; 4] = [
        Milestone::Attested,
        Milestone::Certificates,
        Milestone::Registered,
        Milestone::Ready,
    ];

    /// Its name in the [`marks::REPORTED`] mark and the metric's label.
    pub fn name(self) -> &'static str {
        match self {
            Milestone::Attested => "attested",
            Milestone::Certificates => "certificates",
            Milestone::Registered => "registered",
            Milestone::Ready => "ready",
        }
    }
}

/// Of `candidates`, those still to report given the [`marks::REPORTED`]
/// mark `reported`: not in it, and not before one already in it, which
/// would come out of order and late (a milestone a former leader, or an
/// older server, did not report).
pub fn pending(reported: &str, candidates: &[Milestone]) -> Vec<Milestone> {
    let done: Vec<Milestone> = Milestone::ALL
        .into_iter()
        .filter(|m| reported.split(',').any(|r| r == m.name()))
        .collect();
    candidates
        .iter()
        .copied()
        .filter(|m| done.iter().all(|d| d < m))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use time::macros::datetime;

    fn claim(extra: serde_json::Value) -> Arc<NodeClaim> {
        let mut base = json!({
            "metadata": {"name": "c1", "creationTimestamp": "2026-01-01T10:00:00Z"},
            "spec": {},
            "status": {"providerID": "aws:///us-west-2a/i-1"},
        });
        merge(&mut base, extra);
        Arc::new(serde_json::from_value(base).unwrap())
    }

    fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
        if let (Some(b), serde_json::Value::Object(e)) = (base.as_object_mut(), extra) {
            for (k, v) in e {
                match b.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
    }

    #[test]
    fn only_labels_and_own_marks_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let tls_key = dir.path().join("tls.key");
        std::fs::write(&tls_key, b"key").unwrap();
        let own = json!({
            "manager": marks::FIELD_MANAGER, "operation": "Update",
            "apiVersion": "karpenter.sh/v1", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {format!("f:{}", marks::REPORTED): {}}}},
        });
        let claim = claim(json!({"metadata": {
            "uid": "u1",
            "labels": {"team": "a"},
            "annotations": {
                marks::REPORTED: "registered",
                marks::BINDING: "copied from a NodePool",
                "big": "x".repeat(100_000),
            },
            "managedFields": [own],
            "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "o"}],
            "finalizers": ["karpenter.sh/termination"],
        }}));
        let mut claim = (*claim).clone();
        strip(&mut claim, &StateKey::from_tls_key(&tls_key).unwrap());
        let meta = serde_json::to_value(&claim.metadata).unwrap();
        assert_eq!(
            meta,
            json!({
                "name": "c1", "uid": "u1", "creationTimestamp": "2026-01-01T10:00:00Z",
                "labels": {"team": "a"},
                "annotations": {marks::REPORTED: "registered"},
            })
        );
        assert_eq!(claim.provider_id(), Some(PID));
    }

    const PID: &str = "aws:///us-west-2a/i-1";
    const AFTER: OffsetDateTime = datetime!(2026-01-01 10:00:30 UTC);

    #[test]
    fn one_fresh_claim_is_selected() {
        let one = only(PID, vec![claim(json!({}))]).unwrap();
        assert!(check(&one, AFTER).is_ok());
    }

    #[test]
    fn none_or_many_are_refused() {
        assert!(matches!(only(PID, vec![]), Err(SelectError::None(_))));
        let two = vec![claim(json!({})), claim(json!({}))];
        assert!(matches!(
            only(PID, two),
            Err(SelectError::Many { count: 2, .. })
        ));
    }

    #[test]
    fn registered_deleting_and_older_instances_are_refused() {
        let registered =
            claim(json!({"status": {"conditions": [{"type": "Registered", "status": "True"}]}}));
        assert!(matches!(
            check(&registered, AFTER),
            Err(SelectError::Registered(_))
        ));
        let deleting = claim(json!({"metadata": {"deletionTimestamp": "2026-01-01T10:01:00Z"}}));
        assert!(matches!(
            check(&deleting, AFTER),
            Err(SelectError::Deleting(_))
        ));
        let skewed = datetime!(2026-01-01 09:59:58 UTC);
        assert!(
            check(&claim(json!({})), skewed).is_ok(),
            "the API server's clock 2 s ahead of EC2's refuses nothing"
        );
        let before = datetime!(2026-01-01 09:59:54 UTC);
        assert!(matches!(
            check(&claim(json!({})), before),
            Err(SelectError::PendingBeforeNodeClaim { .. })
        ));
    }
}
