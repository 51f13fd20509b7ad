//! Tells Karpenter's NodeClaims how their machine's bootstrap is going.
//!
//! For every NodeClaim whose instance autonode attested (it carries the key
//! binding annotation), keeps a condition of autonode's own type,
//! [`condition::BOOTSTRAPPED`], on its status: Unknown while the machine is on its way,
//! True once its Node is Ready, False when bootstrap failed. True stays
//! True: a Node that is NotReady later (a kubelet restart, a network
//! blip) has finished bootstrapping all the same, and its health is what
//! the Node's own Ready says; a condition that fell back to "waiting for it
//! to become Ready" would tell an operator the machine never joined.
//! Karpenter
//! rewrites the whole conditions list from the copy it read when it writes
//! status (a merge patch, no resourceVersion), which can drop ours or put
//! back an earlier value of it, so the condition is re-asserted whenever it
//! is missing or stale.
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
//! restarted or new leader does not report them again. The join records
//! its own two (attested, certificates) in the same annotation, and
//! [`pending`] decides for both which are still to report. Each is timed when
//! it happened, not when it was seen: registered at the Node's creation,
//! Ready at its Ready condition's last transition. A kubelet can report
//! Ready within a second of registering, inside the debounce, so the
//! controller may see a Node that is already Ready: registered is then
//! reported first, in the same reconcile ([`due`]).
//!
//! A NodeClaim's Node is the one its binding names ([`binding::node_of`]),
//! never any Node that carries its providerID: a node may register its own
//! Node with another instance's, and must not make that machine Ready.
//!
//! A bound NodeClaim that Karpenter Registered to another Node than the one
//! its binding names is an impostor's (a Node registered with this
//! instance's providerID by another node, before this machine's kubelet):
//! it is reported, counted and failed like a doomed machine, so Karpenter
//! replaces it (`fail_impostor`).
//!
//! Once the Node is Ready, its allocatable is compared with what Karpenter
//! planned with, once per NodeClaim ([`crate::controllers::capacity`]): recorded in the
//! same mark, with the same write as the Ready milestone.

use crate::controllers::capacity;
use crate::kube::binding;
use crate::kube::budget::{Cause, Failure};
use crate::kube::cache::Cache;
use crate::kube::condition::{self, set_condition, Desired};
use crate::kube::events::Events;
use crate::kube::karpenter::NodeClaim;
use crate::kube::marks;
use crate::kube::metrics::Metrics;
use crate::kube::node::Node;
use crate::kube::nodeclaim::{pending, Milestone, NodeClaims};
use crate::kube::reason::Reason;
use crate::primitives::bounded::Bounded;
use crate::primitives::clock::{Clock, KubeTime};
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::{self, applier, trigger_self, trigger_with, Action};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// How long a NodeClaim's events must settle before it is reconciled.
const DEBOUNCE: Duration = Duration::from_secs(1);

/// NodeClaims reconciled at once. Without a limit a new leader among
/// thousands of nodes wrote every NodeClaim's condition at once, a
/// connection to the API server apiece (see the approver's
/// `JUDGED_AT_ONCE`). Reporting is never urgent to the second.
const REPORTED_AT_ONCE: u16 = 16;

/// How often a claim whose machine is on its way (attested, registered)
/// is looked at again with nothing having woken it.
const RECHECK_ON_THE_WAY: Duration = Duration::from_secs(60);

/// How long the attested condition waits for the machine's join to
/// record its certificates (the join's own write of the
/// [`marks::REPORTED`] mark) before it is written anyway: longer than a
/// join takes between its binding and its certificates, even in a burst.
const HOLD_FOR_JOIN: Duration = Duration::from_secs(60);

/// NodeClaims the condition is held back for while their join is in
/// flight, by UID, with when the hold began. Held back because the join's
/// last write (the certificates mark) and the condition's (on status) are
/// each made only on the version their writer read: written while the
/// join is in flight, the condition moved the NodeClaim on under the join,
/// whose mark write then conflicted and was read and written again, and
/// the condition's own write met the mark's in turn (docs/benchmarks.md:
/// a burst's NodeClaim requests). Bounded: a hold is forgotten after
/// `HOLD_FOR_JOIN` (60 s), and at most `HOLDS` (16,384) are kept.
pub struct JoinHolds {
    since: std::sync::Mutex<Bounded<String, Instant>>,
}

impl Default for JoinHolds {
    fn default() -> Self {
        Self {
            since: std::sync::Mutex::new(Bounded::new(HOLD_FOR_JOIN * 2, HOLDS)),
        }
    }
}

/// How many NodeClaims' holds are remembered at once.
const HOLDS: usize = 16_384;

impl JoinHolds {
    /// Whether `claim`'s condition waits for its join, counting the hold
    /// from the first time it is asked.
    fn holds(&self, claim: &NodeClaim, now: Instant) -> bool {
        let certified =
            pending(marks::reported(&claim.metadata), &[Milestone::Certificates]).is_empty();
        if certified {
            return false;
        }
        let mut since = self
            .since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let began = *since.get_or_insert_with(claim.uid().unwrap_or_default(), now, || now);
        now.duration_since(began) < HOLD_FOR_JOIN
    }
}

/// What the feedback controller needs.
pub struct Context {
    /// The only writer of NodeClaims (and the cache the join reads).
    pub claims: NodeClaims,
    pub nodes: Store<Node>,
    pub events: Events,
    pub metrics: Metrics,
    /// The capacity check made when a Node is Ready.
    pub capacity: capacity::Check,
    /// When milestones are due and conditions change.
    pub clock: Clock,
    /// Conditions held back while their join is in flight.
    pub holds: JoinHolds,
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
/// It watches nothing itself: it reads the NodeClaim cache the join path
/// reads and the leader's Node cache (both [`Cache`]s, with the
/// relist after a failed watch), and is woken by their changes: a Node
/// changing (registered, Ready) wakes the NodeClaim with its providerID.
pub async fn run(
    claims: NodeClaims,
    nodes: Cache<Node>,
    events: Events,
    metrics: Metrics,
    capacity: capacity::Check,
    clock: Clock,
) {
    let claim_changes = claims.changes().map(Ok::<_, Infallible>);
    let node_changes = nodes.changes().map(Ok::<_, Infallible>);
    let lookup = claims.clone();
    let woken = trigger_with(node_changes, move |node: Arc<Node>| {
        let provider_id = node.provider_id().unwrap_or_default();
        lookup
            .by_provider_id(provider_id)
            .into_iter()
            .map(|c| ObjectRef::<NodeClaim>::new(&c.name_any()))
            .collect::<Vec<_>>()
    });
    let queue = futures::stream::select(trigger_self(claim_changes, ()), woken);
    let claim_store = claims.store();
    let ctx = Arc::new(Context {
        claims,
        nodes: nodes.store,
        events,
        metrics,
        capacity,
        clock,
        holds: JoinHolds::default(),
    });
    // Debounced: a NodeClaim's events come in bursts while its machine
    // joins (the binding, Karpenter's status writes), and writing the
    // condition at the first of them put one more API write beside the
    // join's own approvals and signatures (docs/benchmarks.md: the
    // server's part of a join over its API writes alone, before and
    // after). A second later the join is done; Ready is reported a second
    // later too, which nobody waits on.
    let config = controller::Config::default()
        .debounce(DEBOUNCE)
        .concurrency(REPORTED_AT_ONCE);
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
    // was kept (NodeClaims::strip), so a NodePool's copied annotations
    // neither start feedback nor mark a machine failed.
    // Machines autonode joined, and those it marked failed before any
    // binding (a join refused for good, kept by the failure policy): the
    // condition says why they will never join.
    let bound = matches!(binding::recorded(&claim), Ok(Some(_)));
    if !(bound || marked_failed(&claim)) || claim.is_deleting() {
        return Ok(Action::await_change());
    }
    if let Some(impostor) = impostor(&claim) {
        return fail_impostor(&claim, impostor, &ctx).await;
    }
    let node = binding::node_of(&claim, &ctx.nodes);
    let stage = stage(&claim, node.as_deref());
    if stage == Stage::Attested && ctx.holds.holds(&claim, Instant::now()) {
        // The join's certificates mark wakes it (or the hold runs out).
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    // Writing the mark moved the NodeClaim on: the condition is written
    // against what that write returned, not (certain to conflict) the
    // version read.
    let written = report_milestones(&claim, stage, node.as_deref(), &ctx).await?;
    let claim = match written {
        Some(mut written) => {
            // Judged like every claim read, so its marks are our own.
            ctx.claims.strip(&mut written);
            Arc::new(written)
        }
        None => claim,
    };
    let conditions = claim.status.as_ref().map(|s| s.conditions.as_slice());
    if let Some(next) = set_condition(
        conditions.unwrap_or_default(),
        desired(stage, &claim, ctx.clock),
    ) {
        // Through the status subresource, only if the NodeClaim is still
        // at the version read.
        match ctx.claims.write_conditions(&claim, &next).await {
            // Changed under us (Karpenter wrote status): the watch brings
            // the new version, and we judge again.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return Ok(Action::requeue(Duration::from_secs(1)))
            }
            other => other?,
        }
    }
    // What moves a claim on wakes it: its own changes, and its Node's
    // (both announced by the caches after their stores hold them, so the
    // Node read here is the one that woke us). The requeue is a safety
    // net, not the path: at 3 s it was 333 reconciles a second for a
    // burst of 1,000 machines on their way (docs/benchmarks.md, "The
    // third pass").
    let next = match stage {
        Stage::Ready | Stage::Failed => Duration::from_secs(300),
        Stage::Attested | Stage::Registered => RECHECK_ON_THE_WAY,
    };
    Ok(Action::requeue(next))
}

/// The Node Karpenter Registered `claim` to, when that is not the
/// machine its binding names (EC2's name for the bound instance): a Node
/// another node registered with this instance's providerID before the
/// machine's own kubelet did. Not for a claim already marked failed (this
/// is how it got marked). An unbound NodeClaim's impostor is found when
/// the machine's agent joins (`join::attest`).
fn impostor(claim: &NodeClaim) -> Option<Impostor> {
    let machine = binding::recorded(claim).ok()??.node_name;
    let registered = claim.status.as_ref()?.node_name.clone()?;
    (claim.is_registered() && !marked_failed(claim) && registered != machine).then_some(Impostor {
        registered,
        machine,
    })
}

/// How often a NodeClaim whose impostor has cost its allowance of victims
/// is looked at again.
const WITHHELD_LOOK: Duration = Duration::from_secs(300);

/// A Node Karpenter Registered a NodeClaim to that is not its machine.
struct Impostor {
    /// The Node Karpenter took.
    registered: String,
    /// The machine's own name, as its binding recorded it (EC2's).
    machine: String,
}

/// Reports, meters and fails (`--delete-failed-nodeclaims`: deletes, so
/// Karpenter terminates the machine, deletes the impostor Node and
/// launches another) a NodeClaim Registered to an impostor Node.
async fn fail_impostor(
    claim: &NodeClaim,
    impostor: Impostor,
    ctx: &Context,
) -> Result<Action, Error> {
    let name = claim.name_any();
    let Impostor {
        registered,
        machine,
    } = impostor;
    let told = (&ctx.metrics, &ctx.events);
    if !ctx
        .claims
        .impostors()
        .may_fail_victim(told, claim, &registered)
    {
        // Past the impostor's allowance: left alone (and said once); looked
        // at again when the allowance may have grown.
        return Ok(Action::requeue(WITHHELD_LOOK));
    }
    let why = format!(
        "NodeClaim {name} is Registered to Node {registered}, but its machine is {machine}: a \
         Node carrying this instance's providerID was registered by another node"
    );
    tracing::warn!(nodeclaim = %name, node = %registered, "{why}");
    ctx.metrics.spoofed_nodes.inc();
    ctx.events.warning(claim, Reason::NodeSpoofed, why.clone());
    let spoofed = Failure {
        reason: "node_spoofed",
        cause: Cause::Impostor,
    };
    ctx.claims.failed_impostor(claim, &why, spoofed).await?;
    Ok(Action::requeue(Duration::from_secs(3)))
}

/// Whether autonode marked `claim` failed (a foreign mark was dropped when
/// the claim was kept).
fn marked_failed(claim: &NodeClaim) -> bool {
    claim
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(marks::BOOTSTRAP_FAILED))
}

/// Derives the stage from the NodeClaim and its Node (if registered).
/// Ready once the Ready milestone is in the claim's own
/// [`marks::REPORTED`] mark (judged ours, see [`NodeClaims::strip`]),
/// whatever the Node says since.
pub fn stage(claim: &NodeClaim, node: Option<&Node>) -> Stage {
    if marked_failed(claim) {
        return Stage::Failed;
    }
    if pending(marks::reported(&claim.metadata), &[Milestone::Ready]).is_empty() {
        return Stage::Ready;
    }
    match node {
        Some(node) if node.is_ready() => Stage::Ready,
        Some(_) => Stage::Registered,
        None => Stage::Attested,
    }
}

/// The condition autonode wants on the NodeClaim at this stage.
pub fn desired(stage: Stage, claim: &NodeClaim, clock: Clock) -> Desired {
    let (status, reason, message) = match stage {
        Stage::Attested => (
            "Unknown",
            Reason::Attested,
            "instance attested and certificates issued; waiting for kubelet to register"
                .to_string(),
        ),
        Stage::Registered => (
            "Unknown",
            Reason::NodeRegistered,
            "Node registered; waiting for it to become Ready".to_string(),
        ),
        Stage::Ready => ("True", Reason::NodeReady, "Node became Ready".to_string()),
        Stage::Failed => {
            let why = claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(marks::BOOTSTRAP_FAILED))
                .cloned()
                .unwrap_or_default();
            ("False", Reason::BootstrapFailed, why)
        }
    };
    Desired {
        type_: condition::BOOTSTRAPPED,
        status,
        reason,
        message,
        generation: claim.metadata.generation,
        clock,
    }
}

/// A milestone's Event, reason and note, for those this controller reports (the
/// join's own Event covers the others).
fn event(milestone: Milestone) -> Option<(Reason, &'static str)> {
    match milestone {
        Milestone::Attested | Milestone::Certificates => None,
        Milestone::Registered => Some((Reason::NodeRegistered, "kubelet registered the Node")),
        Milestone::Ready => Some((Reason::NodeReady, "the Node is Ready")),
    }
}

/// Whether this controller sees a machine at `stage` past `milestone`. Never
/// for the join's milestones: only the join knows when they happened.
fn reached(milestone: Milestone, stage: Stage) -> bool {
    match milestone {
        Milestone::Attested | Milestone::Certificates => false,
        Milestone::Registered => matches!(stage, Stage::Registered | Stage::Ready),
        Milestone::Ready => stage == Stage::Ready,
    }
}

/// When a Node's milestones happened, as it records them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeTimes {
    /// The Node's creation: kubelet registered it.
    pub registered: Option<Timestamp>,
    /// Its Ready condition's last transition.
    pub ready: Option<Timestamp>,
}

impl NodeTimes {
    fn of(node: &Node) -> Self {
        NodeTimes {
            registered: node.metadata.creation_timestamp.as_ref().map(|t| t.0),
            ready: node
                .status
                .ready
                .as_ref()
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0),
        }
    }
}

/// The milestones to report now, in order, each with its seconds since the
/// NodeClaim's creation (`None` when that is unknown).
///
/// Due: reached at `stage`, not in `reported` (the [`marks::REPORTED`]
/// mark), and not before one already reported, which would come out of
/// order and late (a NodeClaim whose registration a former leader missed).
/// Each is timed when it happened, `now` standing in for a time the Node
/// does not give; Ready is never before registered, though it is stamped by
/// kubelet's clock and registration by the API server's.
pub fn due(
    stage: Stage,
    reported: &str,
    created: Option<Timestamp>,
    times: NodeTimes,
    now: Timestamp,
) -> Vec<(Milestone, Option<f64>)> {
    let registered = times.registered.unwrap_or(now);
    let ready = times.ready.unwrap_or(now).max(registered);
    let since =
        |at: Timestamp| created.map(|created| at.duration_since(created).as_secs_f64().max(0.0));
    let reached: Vec<Milestone> = Milestone::ALL
        .into_iter()
        .filter(|m| reached(*m, stage))
        .collect();
    pending(reported, &reached)
        .into_iter()
        .map(|m| {
            let at = match m {
                Milestone::Ready => ready,
                // Registered; the join's milestones are never reached here.
                _ => registered,
            };
            (m, since(at))
        })
        .collect()
}

/// An Event and a latency observation for each milestone, once and in
/// order (see [`due`]), then, once the Node is Ready, the capacity check
/// (once too). Returns the NodeClaim as the mark's write left it, when
/// there was one.
async fn report_milestones(
    claim: &NodeClaim,
    stage: Stage,
    node: Option<&Node>,
    ctx: &Context,
) -> Result<Option<NodeClaim>, kube::Error> {
    let reported = marks::reported(&claim.metadata);
    let created = claim.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let times = node.map(NodeTimes::of).unwrap_or_default();
    let due = due(stage, reported, created, times, ctx.clock.stamp());
    let compare = node.filter(|_| stage == Stage::Ready && !capacity::checked(reported));
    if due.is_empty() && compare.is_none() {
        return Ok(None);
    }
    // Marked before reported: a failed write reports nothing, and the
    // retry reports it all; a report is never made twice.
    let mut more: Vec<&str> = due.iter().map(|(m, _)| m.name()).collect();
    if compare.is_some() {
        more.push(capacity::CHECKED);
    }
    let written = ctx
        .claims
        .mark_reported(claim, &marks::with_reported(reported, &more))
        .await?;
    for (milestone, seconds) in due {
        if let Some(seconds) = seconds {
            ctx.metrics.observe_phase(milestone.name(), seconds);
        }
        if let Some((reason, note)) = event(milestone) {
            ctx.events.normal(claim, reason, note.to_string());
        }
    }
    if let Some(node) = compare {
        ctx.capacity
            .run(claim, node, &ctx.events, &ctx.metrics)
            .await;
    }
    Ok(Some(written))
}

fn error_policy(_claim: Arc<NodeClaim>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "NodeClaim feedback failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ready: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "status": {"conditions": [{"type": "Ready", "status": ready}]},
        }))
        .unwrap()
    }

    fn reported(mark: &str) -> NodeClaim {
        let mut claim = NodeClaim::default();
        claim.metadata.annotations = Some([(marks::REPORTED.to_string(), mark.to_string())].into());
        claim
    }

    #[test]
    fn the_condition_waits_for_the_joins_certificates_but_not_for_ever() {
        let holds = JoinHolds::default();
        let mut joining = reported("attested");
        joining.metadata.uid = Some("u1".into());
        let mut certified = reported("attested,certificates");
        certified.metadata.uid = Some("u2".into());
        let start = Instant::now();
        assert!(holds.holds(&joining, start), "the join is in flight");
        assert!(holds.holds(&joining, start + HOLD_FOR_JOIN / 2));
        assert!(
            !holds.holds(&joining, start + HOLD_FOR_JOIN),
            "a join that never records its certificates holds it no longer"
        );
        assert!(!holds.holds(&certified, start), "the join recorded them");
        // A later milestone reported implies the certificates (an older
        // server's join may not have marked them).
        let registered = reported("attested,registered");
        assert!(!holds.holds(&registered, start));
    }

    #[test]
    fn the_stage_follows_the_node_until_ready_was_reported_and_then_stays() {
        let (ready, not_ready) = (node("True"), node("False"));
        let fresh = NodeClaim::default();
        assert_eq!(stage(&fresh, None), Stage::Attested);
        assert_eq!(stage(&fresh, Some(&not_ready)), Stage::Registered);
        assert_eq!(stage(&fresh, Some(&ready)), Stage::Ready);
        let registered = reported("attested,certificates,registered");
        assert_eq!(stage(&registered, Some(&not_ready)), Stage::Registered);
        let bootstrapped = reported("attested,certificates,registered,ready");
        assert_eq!(stage(&bootstrapped, Some(&not_ready)), Stage::Ready);
        assert_eq!(stage(&bootstrapped, None), Stage::Ready);
    }

    #[test]
    fn each_stage_sets_its_reason_and_status() {
        let claim = NodeClaim::default();
        let reasons = [
            Stage::Attested,
            Stage::Registered,
            Stage::Ready,
            Stage::Failed,
        ]
        .map(|stage| {
            let d = desired(stage, &claim, Clock::SYSTEM);
            (d.status, d.reason)
        });
        assert_eq!(
            reasons,
            [
                ("Unknown", Reason::Attested),
                ("Unknown", Reason::NodeRegistered),
                ("True", Reason::NodeReady),
                ("False", Reason::BootstrapFailed),
            ]
        );
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    /// A Node registered and Ready at these seconds.
    fn times(registered: Option<i64>, ready: Option<i64>) -> NodeTimes {
        NodeTimes {
            registered: registered.map(at),
            ready: ready.map(at),
        }
    }

    /// Both milestones due, at these seconds after the claim.
    fn both(registered: f64, ready: f64) -> [(Milestone, Option<f64>); 2] {
        [
            (Milestone::Registered, Some(registered)),
            (Milestone::Ready, Some(ready)),
        ]
    }

    fn names(due: &[(Milestone, Option<f64>)]) -> Vec<&'static str> {
        due.iter().map(|(m, _)| m.name()).collect()
    }

    #[test]
    fn a_node_seen_ready_at_once_is_registered_first_each_at_its_own_time() {
        let times = times(Some(40), Some(41));
        let due = due(Stage::Ready, "", Some(at(0)), times, at(43));
        assert_eq!(due, both(40.0, 41.0));
    }

    #[test]
    fn each_milestone_is_due_once() {
        let times = times(Some(40), Some(45));
        let now = at(50);
        let registered = due(Stage::Registered, "", Some(at(0)), times, now);
        assert_eq!(registered, [(Milestone::Registered, Some(40.0))]);
        assert!(due(Stage::Registered, "registered", Some(at(0)), times, now).is_empty());
        let ready = due(Stage::Ready, "registered", Some(at(0)), times, now);
        assert_eq!(ready, [(Milestone::Ready, Some(45.0))]);
        assert!(due(Stage::Ready, "registered,ready", Some(at(0)), times, now).is_empty());
        for stage in [Stage::Attested, Stage::Failed] {
            assert!(due(stage, "", Some(at(0)), times, now).is_empty());
        }
    }

    #[test]
    fn the_joins_milestones_are_pending_once_and_never_after_a_later_one() {
        let both = [Milestone::Attested, Milestone::Certificates];
        assert_eq!(pending("", &both), both);
        assert_eq!(pending("attested", &both), [Milestone::Certificates]);
        assert!(pending("attested,certificates", &both).is_empty());
        // An older server bound it and kubelet registered: too late now.
        assert!(pending("registered", &both).is_empty());
        // Never reported by this controller, whatever the stage.
        let due = due(Stage::Ready, "", None, NodeTimes::default(), at(0));
        assert_eq!(names(&due), ["registered", "ready"]);
    }

    #[test]
    fn registered_is_not_reported_after_ready() {
        // A former leader reported Ready, not registered: too late now.
        let due = due(Stage::Ready, "ready", None, NodeTimes::default(), at(0));
        assert!(due.is_empty(), "{:?}", names(&due));
    }

    #[test]
    fn ready_is_never_before_registered_nor_before_the_claim() {
        // kubelet's clock behind the API server's.
        let skewed = times(Some(40), Some(38));
        let due_now = due(Stage::Ready, "", Some(at(0)), skewed, at(50));
        assert_eq!(due_now, both(40.0, 40.0));
        let early = times(Some(-5), None);
        let due_now = due(Stage::Ready, "", Some(at(0)), early, at(7));
        assert_eq!(due_now, both(0.0, 7.0));
        // No creation time: reported, not timed.
        let untimed = due(Stage::Ready, "", None, skewed, at(50));
        assert_eq!(names(&untimed), ["registered", "ready"]);
        assert!(untimed.iter().all(|(_, s)| s.is_none()));
    }

    #[test]
    fn the_ready_transition_survives_the_parsing_of_a_node() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "creationTimestamp": "2027-01-15T08:00:00Z"},
            "spec": {"providerID": "aws:///us-west-2a/i-1"},
            "status": {"conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "lastTransitionTime": "2027-01-15T08:00:01Z"}]},
        }))
        .unwrap();
        let times = NodeTimes::of(&node);
        assert_eq!(
            times.registered,
            Some("2027-01-15T08:00:00Z".parse().unwrap())
        );
        assert_eq!(times.ready, Some("2027-01-15T08:00:01Z".parse().unwrap()));
        assert!(node.is_ready());
    }

    #[test]
    fn a_dropped_or_stale_condition_is_rewritten() {
        let claim = NodeClaim::default();
        let ready = || desired(Stage::Ready, &claim, Clock::SYSTEM);
        let written = set_condition(&[], ready()).expect("a dropped one is written");
        assert_eq!(set_condition(&written, ready()), None);
        let stale =
            set_condition(&written, desired(Stage::Attested, &claim, Clock::SYSTEM)).unwrap();
        assert!(set_condition(&stale, ready()).is_some());
    }
}
