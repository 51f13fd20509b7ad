//! The failure budget: what becomes of the NodeClaim of a machine that
//! failed for good, decided in one place for every way a failure is known
//! (a join refused for good, an agent's signed fatal report, a NodeClaim
//! Registered to an impostor).
//!
//! Deleting such a NodeClaim makes Karpenter replace the machine in
//! seconds instead of after its 15-minute registration timeout: right for
//! one bad machine, a launch storm when every machine fails the same way
//! (a broken userData, a wrong allow-list). So failures are counted per
//! group, a [`Group`]: the NodeClaim's NodePool (its `karpenter.sh/nodepool`
//! label), its EC2NodeClass (`spec.nodeClassRef.name`) and the failure's
//! reason. A group's first [`Settings::limit`] failures with no machine of
//! its NodePool and class Ready since are deleted, as before; past that the
//! NodeClaim is marked failed and kept, and Karpenter's own timeout (and
//! its NodePool condition `NodeRegistrationHealthy`) take over. A Ready
//! machine of the NodePool and class starts its groups over. docs/design.md
//! says why this and not a backoff.
//!
//! Causes on the server's side ([`Cause::Server`]: its allow-lists, its
//! clock) never delete and never count against a group's budget: the
//! machine is not at fault, and a replacement fails the same way.
//!
//! Every replica counts from what it already watches, the NodeClaim cache
//! ([`Budget::observe`] on each change and each NodeClaim gone): a
//! NodeClaim carrying autonode's own sealed failure mark counts once per
//! UID, its reason read from the [`marks::FAILURE_REASON`] mark written in
//! the same patch. The replica that acts (any replica serves joins and
//! reports) asks [`Budget::decide`], which counts the failure at once, so
//! two failures judged together on one replica are two. Two replicas
//! judging at the same instant may each delete one more than the limit:
//! the overshoot is bounded by the replicas, not by time.
//!
//! A group going over its budget, and the first NodeClaim of a group
//! failed for a cause on the server's side, are said once (per replica,
//! [`Told`]) as a Warning Event on the NodePool and the EC2NodeClass, and
//! in `autonode_failure_groups_over_budget` /
//! `autonode_nodeclaims_failed_server_side_total`.

use crate::kube::condition;
use crate::kube::events::Events;
use crate::kube::karpenter::{Ec2NodeClass, NodeClaim};
use crate::kube::marks;
use crate::kube::metrics::{FailureLabels, Metrics};
use crate::kube::reason::Reason;
use crate::primitives::bounded::Bounded;
use crate::primitives::clock::{Clock, KubeTime};
use crate::primitives::told::Told;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Api, Client};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The default budget: a group's first two failures with no machine of it
/// Ready since are replaced at once. One is a bad machine; a third in a
/// row is a pattern, and a pattern replaced at once is a launch storm.
pub const DEFAULT_LIMIT: u32 = 2;

/// NodePool and class pairs remembered (the cluster's own objects; a
/// cluster has a handful). Past it the least recently used are forgotten,
/// and start over from nothing.
const POOLS: usize = 1024;
/// Failure reasons remembered per NodePool and class: reasons are a closed
/// set far smaller than this; a mark of an unknown one counts as its own.
const REASONS: usize = 64;
/// Failures remembered per group: far past any budget that makes sense.
const PER_GROUP: usize = 64;
/// NodeClaims whose failure was counted, by UID, so each counts once: a
/// NodeClaim kept marked lives at most Karpenter's 15 minutes unregistered.
const COUNTED: usize = 16_384;
/// How long a NodePool and class's tally is kept unused.
const TALLY_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a counted UID is remembered unused.
const COUNTED_TTL: Duration = Duration::from_secs(3600);

/// What a failure is a fault of, and so whether replacing the machine can
/// help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// The machine's own (its agent, its AMI, its userData): a replacement
    /// may join; counted against its group's budget.
    Machine,
    /// autonode's settings or clock (an allow-list, the server's clock):
    /// a replacement fails the same way. Marked and said, never deleted.
    Server,
    /// Another node registered a Node with this machine's providerID: the
    /// NodeClaim's "node" is not its machine, so only a replacement gets
    /// the capacity back. Replaced whatever the budget (an attacker's
    /// doing, not a pattern of the fleet's), and counted.
    Impostor,
}

impl Cause {
    fn name(self) -> &'static str {
        match self {
            Cause::Machine => "machine",
            Cause::Server => "server",
            Cause::Impostor => "impostor",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        [Cause::Machine, Cause::Server, Cause::Impostor]
            .into_iter()
            .find(|c| c.name() == name)
    }
}

/// A machine's failure, as the part of the server that saw it names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// A fixed label: a refusal's reason, `agent_fatal`, `node_spoofed`.
    pub reason: &'static str,
    pub cause: Cause,
}

impl Failure {
    /// The [`marks::FAILURE_REASON`] mark's value: `<cause>:<reason>`.
    pub fn mark(self) -> String {
        format!("{}:{}", self.cause.name(), self.reason)
    }
}

/// The cause and reason a [`marks::FAILURE_REASON`] mark records; a failure
/// mark without one (an older server's) is the machine's, `unknown`.
fn recorded(claim: &NodeClaim) -> Option<(Cause, String)> {
    let annotations = claim.metadata.annotations.as_ref()?;
    annotations.get(marks::BOOTSTRAP_FAILED)?;
    let parsed = annotations
        .get(marks::FAILURE_REASON)
        .and_then(|v| v.split_once(':'))
        .and_then(|(cause, reason)| Some((Cause::parse(cause)?, reason.to_string())));
    Some(parsed.unwrap_or((Cause::Machine, "unknown".to_string())))
}

/// Whether `claim`'s failure mark records a cause outside the machine:
/// autonode's settings or clock ([`Cause::Server`]), or an impostor Node
/// that took it ([`Cause::Impostor`], see [`crate::kube::impostor`]). The
/// rollout guard counts neither against the values on trial: nothing of
/// them was tried.
pub fn failed_elsewhere(claim: &NodeClaim) -> bool {
    matches!(recorded(claim), Some((Cause::Server | Cause::Impostor, _)))
}

/// What to do with a failed machine's NodeClaim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Mark it failed, then delete it: Karpenter replaces it now.
    Delete,
    /// Mark it failed and keep it.
    Mark,
}

/// The budget's settings.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// `--delete-failed-nodeclaims`: deleting at all.
    pub delete: bool,
    /// `--failure-budget`: failures per group replaced at once while no
    /// machine of it is Ready since (0: none).
    pub limit: u32,
}

/// The NodePool, class and reason a failure is counted under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Group {
    pub nodepool: String,
    pub nodeclass: String,
    pub reason: String,
}

impl Group {
    /// `claim`'s group for `reason`.
    pub fn of(claim: &NodeClaim, reason: &str) -> Self {
        let label = claim
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(NODEPOOL_LABEL));
        let class = claim.spec.node_class_ref.as_ref().map(|r| r.name.clone());
        Self {
            nodepool: label.cloned().unwrap_or_default(),
            nodeclass: class.unwrap_or_default(),
            reason: reason.to_string(),
        }
    }

    fn pool(&self) -> Pool {
        (self.nodepool.clone(), self.nodeclass.clone())
    }

    /// The metric labels of this group.
    pub fn labels(&self) -> FailureLabels {
        FailureLabels {
            reason: self.reason.clone(),
            nodepool: self.nodepool.clone(),
            nodeclass: self.nodeclass.clone(),
        }
    }
}

/// The label Karpenter gives a NodeClaim naming its NodePool.
pub const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";

/// A NodePool and EC2NodeClass pair: a Ready machine of it starts its
/// groups over.
type Pool = (String, String);

/// One NodePool and class: when a machine of it was last seen Ready, and
/// its failures since, per reason.
#[derive(Default)]
struct Tally {
    /// Unix seconds of the latest Ready seen; failures of NodeClaims
    /// created before it no longer count.
    ready_at: i64,
    reasons: Vec<Reasoned>,
}

/// A group's failures: the creation times (Unix seconds) of its failed
/// NodeClaims since the pool's last Ready, newest last.
struct Reasoned {
    reason: String,
    failures: VecDeque<i64>,
    /// Over budget (said once, gauged).
    over: bool,
}

impl Tally {
    fn reasoned(&mut self, reason: &str) -> &mut Reasoned {
        let at = self.reasons.iter().position(|r| r.reason == reason);
        let at = at.unwrap_or_else(|| {
            if self.reasons.len() >= REASONS {
                self.reasons.remove(0);
            }
            self.reasons.push(Reasoned {
                reason: reason.to_string(),
                failures: VecDeque::new(),
                over: false,
            });
            self.reasons.len() - 1
        });
        &mut self.reasons[at]
    }

    /// Records a failure of a NodeClaim created at `created`; returns how
    /// many the group has now (this one included). One created before the
    /// pool's last Ready is recorded as of then.
    fn fail(&mut self, reason: &str, created: i64) -> usize {
        let at = created.max(self.ready_at.saturating_add(1));
        let group = self.reasoned(reason);
        if group.failures.len() >= PER_GROUP {
            group.failures.pop_front();
        }
        group.failures.push_back(at);
        group.failures.len()
    }

    /// How many failures `reason`'s group has.
    fn count(&self, reason: &str) -> usize {
        let group = self.reasons.iter().find(|r| r.reason == reason);
        group.map_or(0, |g| g.failures.len())
    }

    /// A machine of the pool was Ready at `at`: every group starts over.
    /// Returns whether a group that was over its budget is no longer.
    fn ready(&mut self, at: i64) -> bool {
        if at <= self.ready_at {
            return false;
        }
        self.ready_at = at;
        let mut settled = false;
        for group in &mut self.reasons {
            group.failures.retain(|created| *created > at);
            settled |= std::mem::take(&mut group.over);
        }
        settled
    }
}

/// The counting: pure, so its arithmetic is tested alone.
struct State {
    pools: Bounded<Pool, Tally>,
    /// Each counted NodeClaim's decision, by UID.
    counted: Bounded<String, Decision>,
}

/// What [`State::judge`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Verdict {
    decision: Decision,
    /// This failure took its group over the budget (told once).
    over_now: bool,
    /// The group's failures, this one included.
    count: usize,
}

impl State {
    fn new() -> Self {
        Self {
            pools: Bounded::new(TALLY_TTL, POOLS),
            counted: Bounded::new(COUNTED_TTL, COUNTED),
        }
    }

    /// Counts the failure of NodeClaim `uid` (created at `created`) in
    /// `group`, once, and decides what becomes of it; a NodeClaim counted
    /// before gets the decision it got then.
    fn judge(
        &mut self,
        uid: &str,
        (group, created): (&Group, i64),
        failure: Failure,
        settings: Settings,
        now: Instant,
    ) -> Verdict {
        let tally = self
            .pools
            .get_or_insert_with(group.pool(), now, Tally::default);
        if let Some(decision) = self.counted.get_mut(&uid.to_string(), now) {
            let count = tally.count(&group.reason);
            return Verdict {
                decision: *decision,
                over_now: false,
                count,
            };
        }
        let count = tally.fail(&group.reason, created);
        let within = u32::try_from(count).is_ok_and(|c| c <= settings.limit);
        let delete = settings.delete
            && match failure.cause {
                Cause::Machine => within,
                Cause::Impostor => true,
                Cause::Server => false,
            };
        let decision = if delete {
            Decision::Delete
        } else {
            Decision::Mark
        };
        let over_now = failure.cause == Cause::Machine && !within && {
            let reasoned = tally.reasoned(&group.reason);
            !std::mem::replace(&mut reasoned.over, true)
        };
        self.counted.insert(uid.to_string(), now, decision);
        Verdict {
            decision,
            over_now,
            count,
        }
    }

    /// A NodeClaim seen marked failed by any replica: counted once.
    fn seen_failed(
        &mut self,
        uid: &str,
        (group, created): (&Group, i64),
        cause: Cause,
        limit: u32,
        now: Instant,
    ) {
        if self.counted.get_mut(&uid.to_string(), now).is_some() {
            return;
        }
        let tally = self
            .pools
            .get_or_insert_with(group.pool(), now, Tally::default);
        let count = tally.fail(&group.reason, created);
        if cause == Cause::Machine && u32::try_from(count).map_or(true, |c| c > limit) {
            tally.reasoned(&group.reason).over = true;
        }
        self.counted.insert(uid.to_string(), now, Decision::Mark);
    }

    /// A machine of `pool` seen Ready at `at`. Whether a group over its
    /// budget starts over.
    fn seen_ready(&mut self, pool: Pool, at: i64, now: Instant) -> bool {
        let tally = self.pools.get_or_insert_with(pool, now, Tally::default);
        tally.ready(at)
    }

    /// Groups over their budget now.
    fn over(&self) -> i64 {
        let over = self
            .pools
            .values()
            .flat_map(|t| &t.reasons)
            .filter(|r| r.over);
        i64::try_from(over.count()).unwrap_or(i64::MAX)
    }
}

/// The failure budget of this replica (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    state: Mutex<State>,
    metrics: Metrics,
    events: Events,
    classes: Api<Ec2NodeClass>,
    clock: Clock,
    /// What was said per group (the systemic Warning), once per transition.
    told: Told,
}

impl Budget {
    /// A budget with these settings, saying what it does through `events`
    /// and `metrics`; `client` reads an EC2NodeClass's UID for its Event.
    pub fn new(
        client: Client,
        settings: Settings,
        (events, metrics): (Events, Metrics),
        clock: Clock,
    ) -> Self {
        let inner = Inner {
            settings,
            state: Mutex::new(State::new()),
            metrics,
            events,
            classes: Api::all(client),
            clock,
            told: Told::new(POOLS),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts `failure` of `claim` (once per UID) and decides what becomes
    /// of it; says so when its group has just gone over the budget, or a
    /// cause on the server's side marks one.
    pub fn decide(&self, claim: &NodeClaim, failure: Failure) -> Decision {
        let group = Group::of(claim, failure.reason);
        let uid = claim.metadata.uid.as_deref().unwrap_or_default();
        let created = created(claim);
        let settings = self.inner.settings;
        let verdict = {
            let mut state = self.state();
            let verdict = state.judge(uid, (&group, created), failure, settings, Instant::now());
            self.inner
                .metrics
                .failure_groups_over_budget
                .set(state.over());
            verdict
        };
        if verdict.over_now {
            self.tell(claim, &group, verdict.count, failure.cause);
        }
        if failure.cause == Cause::Server {
            self.tell(claim, &group, verdict.count, failure.cause);
        }
        verdict.decision
    }

    /// Records what was done: the deletion metric, by group.
    pub fn done(&self, claim: &NodeClaim, failure: Failure, deleted: bool) {
        let labels = Group::of(claim, failure.reason).labels();
        let metrics = &self.inner.metrics;
        if deleted {
            metrics.nodeclaims_deleted.get_or_create(&labels).inc();
        }
        if failure.cause == Cause::Server {
            metrics
                .nodeclaims_failed_server_side
                .get_or_create(&labels)
                .inc();
        }
    }

    /// Counts what the NodeClaim cache shows: a NodeClaim marked failed by
    /// autonode (any replica), once; one Ready, which starts its pool's
    /// groups over.
    pub fn observe(&self, claim: &NodeClaim) {
        let now = Instant::now();
        let ready = ready_at(claim, self.inner.clock);
        let failed = recorded(claim);
        if ready.is_none() && failed.is_none() {
            return;
        }
        let mut state = self.state();
        if let Some((cause, reason)) = failed {
            let uid = claim.metadata.uid.as_deref().unwrap_or_default();
            let group = Group::of(claim, &reason);
            state.seen_failed(
                uid,
                (&group, created(claim)),
                cause,
                self.inner.settings.limit,
                now,
            );
        }
        if let Some(at) = ready {
            let pool = Group::of(claim, "").pool();
            if state.seen_ready(pool.clone(), at, now) {
                self.inner.told.clear(&told_key(&pool));
            }
        }
        self.inner
            .metrics
            .failure_groups_over_budget
            .set(state.over());
    }

    /// Says once per transition, on the NodePool and the EC2NodeClass,
    /// what `group` is doing and what autonode does about it.
    fn tell(&self, claim: &NodeClaim, group: &Group, count: usize, cause: Cause) {
        let key = format!("{}/{}", told_key(&group.pool()), group.reason);
        if !self.inner.told.first(&key, cause.name()) {
            return;
        }
        let note = systemic_note(group, count, cause, self.inner.settings.limit);
        tracing::warn!(nodepool = %group.nodepool, nodeclass = %group.nodeclass, reason = %group.reason, count, "{note}");
        let reason = match cause {
            Cause::Server => Reason::FailingOnServerSide,
            Cause::Machine | Cause::Impostor => Reason::FailureBudgetSpent,
        };
        if let Some(pool) = nodepool_of(claim) {
            self.inner.events.warning_about(pool, reason, note.clone());
        }
        let (classes, events, name) = (
            self.inner.classes.clone(),
            self.inner.events.clone(),
            group.nodeclass.clone(),
        );
        tokio::spawn(async move {
            // The Event names the class by UID (`kubectl describe` finds
            // it by that): one GET per transition.
            match classes.get_opt(&name).await {
                Ok(Some(class)) => events.warning(&class, reason, note),
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(nodeclass = %name, %error, "could not read the EC2NodeClass to tell it of its failures")
                }
            }
        });
    }
}

fn told_key((nodepool, nodeclass): &Pool) -> String {
    format!("{nodepool}/{nodeclass}")
}

/// What the systemic Warning says.
fn systemic_note(group: &Group, count: usize, cause: Cause, limit: u32) -> String {
    let Group {
        nodepool,
        nodeclass,
        reason,
    } = group;
    match cause {
        Cause::Server => format!(
            "a NodeClaim of NodePool {nodepool} and EC2NodeClass {nodeclass} was refused for \
             {reason}, a cause on autonode's side (its allow-lists or its clock), {count} so far: \
             autonode marks them failed and keeps them, never deleting them, since a replacement \
             would fail the same way; fix the server's settings (docs/operations.md)"
        ),
        Cause::Machine | Cause::Impostor => format!(
            "{count} NodeClaims of NodePool {nodepool} and EC2NodeClass {nodeclass} failed with \
             {reason} and no machine of them became Ready since: past the failure budget \
             (--failure-budget={limit}), autonode marks them failed and keeps them instead of \
             deleting them, so Karpenter's registration timeout replaces them; a machine of \
             them becoming Ready starts the count over (docs/operations.md)"
        ),
    }
}

/// Unix seconds of `claim`'s creation (0 when unknown).
fn created(claim: &NodeClaim) -> i64 {
    claim
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second())
}

/// When `claim`'s machine became Ready (Unix seconds), if it is: Karpenter's
/// `Ready` or `Initialized`, or autonode's own condition, True; at the
/// condition's last transition, else now.
fn ready_at(claim: &NodeClaim, clock: Clock) -> Option<i64> {
    let ready = ["Ready", "Initialized", condition::BOOTSTRAPPED]
        .into_iter()
        .filter_map(|kind| claim.condition(kind))
        .find(|c| c.status == "True")?;
    let at = ready
        .last_transition_time
        .as_deref()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
    Some(at.map_or_else(|| clock.stamp().as_second(), |t| t.as_second()))
}

/// The NodeClaim's NodePool, as an Event names it: from its owner
/// reference (Karpenter sets it), which has the NodePool's UID, by which
/// `kubectl describe nodepool` finds its Events.
fn nodepool_of(claim: &NodeClaim) -> Option<ObjectReference> {
    let owners = claim.metadata.owner_references.as_ref()?;
    let owner = owners.iter().find(|o| o.kind == "NodePool")?;
    Some(ObjectReference {
        api_version: Some(owner.api_version.clone()),
        kind: Some(owner.kind.clone()),
        name: Some(owner.name.clone()),
        uid: Some(owner.uid.clone()),
        ..ObjectReference::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MACHINE: Failure = Failure {
        reason: "agent_fatal",
        cause: Cause::Machine,
    };
    const ON: Settings = Settings {
        delete: true,
        limit: DEFAULT_LIMIT,
    };

    fn group(pool: &str, reason: &str) -> Group {
        Group {
            nodepool: pool.into(),
            nodeclass: "c".into(),
            reason: reason.into(),
        }
    }

    fn judge(
        state: &mut State,
        uid: &str,
        g: &Group,
        created: i64,
        failure: Failure,
        settings: Settings,
    ) -> Verdict {
        state.judge(uid, (g, created), failure, settings, Instant::now())
    }

    fn decisions(
        state: &mut State,
        g: &Group,
        uids: &[(&str, i64)],
        failure: Failure,
        settings: Settings,
    ) -> Vec<Decision> {
        uids.iter()
            .map(|(uid, at)| judge(state, uid, g, *at, failure, settings).decision)
            .collect()
    }

    #[test]
    fn a_groups_first_failures_are_replaced_and_the_rest_kept() {
        let mut state = State::new();
        let g = group("p", "agent_fatal");
        let got = decisions(
            &mut state,
            &g,
            &[("a", 10), ("b", 20), ("c", 30), ("d", 40)],
            MACHINE,
            ON,
        );
        use Decision::*;
        assert_eq!(got, [Delete, Delete, Mark, Mark]);
        assert_eq!(state.over(), 1);
    }

    #[test]
    fn the_budget_is_told_once_when_it_is_spent() {
        let mut state = State::new();
        let g = group("p", "agent_fatal");
        let told: Vec<bool> = [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
            .iter()
            .map(|(u, at)| judge(&mut state, u, &g, *at, MACHINE, ON).over_now)
            .collect();
        assert_eq!(told, [false, false, true, false]);
    }

    #[test]
    fn a_nodeclaim_counts_once_and_keeps_its_decision() {
        let mut state = State::new();
        let g = group("p", "agent_fatal");
        let first = decisions(
            &mut state,
            &g,
            &[("a", 1), ("a", 1), ("b", 2), ("b", 2)],
            MACHINE,
            ON,
        );
        assert_eq!(first, [Decision::Delete; 4]);
        // What the cache shows of them afterwards does not count again.
        state.seen_failed("a", (&g, 1), Cause::Machine, 2, Instant::now());
        assert_eq!(judge(&mut state, "c", &g, 3, MACHINE, ON).count, 3);
    }

    #[test]
    fn a_ready_machine_of_the_pool_starts_its_groups_over() {
        let mut state = State::new();
        let g = group("p", "agent_fatal");
        decisions(
            &mut state,
            &g,
            &[("a", 10), ("b", 20), ("c", 30)],
            MACHINE,
            ON,
        );
        assert_eq!(state.over(), 1);
        assert!(
            state.seen_ready(g.pool(), 100, Instant::now()),
            "an over group settles"
        );
        assert_eq!(state.over(), 0);
        let after = decisions(
            &mut state,
            &g,
            &[("d", 110), ("e", 120), ("f", 130)],
            MACHINE,
            ON,
        );
        assert_eq!(after, [Decision::Delete, Decision::Delete, Decision::Mark]);
        // An older Ready seen later (a relist) changes nothing.
        assert!(!state.seen_ready(g.pool(), 50, Instant::now()));
    }

    #[test]
    fn a_failure_of_a_nodeclaim_older_than_the_last_ready_still_counts_once() {
        let mut state = State::new();
        let g = group("p", "agent_fatal");
        state.seen_ready(g.pool(), 100, Instant::now());
        let got = decisions(
            &mut state,
            &g,
            &[("a", 90), ("b", 95), ("c", 99)],
            MACHINE,
            ON,
        );
        assert_eq!(got, [Decision::Delete, Decision::Delete, Decision::Mark]);
    }

    #[test]
    fn groups_are_apart_by_pool_class_and_reason() {
        let mut state = State::new();
        let (a, b) = (group("p", "agent_fatal"), group("q", "agent_fatal"));
        let c = group("p", "image_mismatch");
        decisions(
            &mut state,
            &a,
            &[("a1", 1), ("a2", 2), ("a3", 3)],
            MACHINE,
            ON,
        );
        assert_eq!(
            judge(&mut state, "b1", &b, 4, MACHINE, ON).decision,
            Decision::Delete
        );
        let other = Failure {
            reason: "image_mismatch",
            cause: Cause::Machine,
        };
        assert_eq!(
            judge(&mut state, "c1", &c, 5, other, ON).decision,
            Decision::Delete
        );
        // A Ready machine of the pool settles its every reason, not another pool's.
        state.seen_ready(b.pool(), 10, Instant::now());
        assert_eq!(state.over(), 1);
    }

    #[test]
    fn causes_on_the_servers_side_never_delete_nor_spend_the_budget() {
        let mut state = State::new();
        let server = Failure {
            reason: "account_not_allowed",
            cause: Cause::Server,
        };
        let g = group("p", "account_not_allowed");
        let got = decisions(&mut state, &g, &[("a", 1), ("b", 2), ("c", 3)], server, ON);
        assert_eq!(got, [Decision::Mark; 3]);
        assert_eq!(state.over(), 0);
        let machine = group("p", "agent_fatal");
        assert_eq!(
            judge(&mut state, "d", &machine, 4, MACHINE, ON).decision,
            Decision::Delete
        );
    }

    #[test]
    fn impostors_are_replaced_whatever_the_budget_and_nothing_is_deleted_when_deleting_is_off() {
        let mut state = State::new();
        let spoofed = Failure {
            reason: "node_spoofed",
            cause: Cause::Impostor,
        };
        let g = group("p", "node_spoofed");
        let got = decisions(&mut state, &g, &[("a", 1), ("b", 2), ("c", 3)], spoofed, ON);
        assert_eq!(got, [Decision::Delete; 3]);
        let off = Settings {
            delete: false,
            limit: 2,
        };
        let g = group("p", "agent_fatal");
        assert_eq!(
            judge(&mut state, "d", &g, 4, MACHINE, off).decision,
            Decision::Mark
        );
        let zero = Settings {
            delete: true,
            limit: 0,
        };
        let g = group("q", "agent_fatal");
        let v = judge(&mut state, "e", &g, 5, MACHINE, zero);
        assert_eq!((v.decision, v.over_now), (Decision::Mark, true));
    }

    #[test]
    fn failures_seen_in_the_cache_count_and_say_over() {
        let mut state = State::new();
        let g = group("p", "agent_fatal");
        for (uid, at) in [("a", 1), ("b", 2), ("c", 3)] {
            state.seen_failed(uid, (&g, at), Cause::Machine, 2, Instant::now());
        }
        assert_eq!(state.over(), 1);
        assert_eq!(
            judge(&mut state, "d", &g, 4, MACHINE, ON).decision,
            Decision::Mark
        );
    }

    #[test]
    fn a_groups_memory_is_bounded() {
        let mut tally = Tally::default();
        for at in 0..1000 {
            tally.fail("r", at);
        }
        assert_eq!(tally.count("r"), PER_GROUP);
        for reason in 0..1000 {
            tally.fail(&reason.to_string(), 1);
        }
        assert_eq!(tally.reasons.len(), REASONS);
    }

    #[test]
    fn the_mark_records_cause_and_reason_and_an_older_servers_mark_is_the_machines() {
        let mut claim = NodeClaim::default();
        let server = Failure {
            reason: "too_old",
            cause: Cause::Server,
        };
        claim.metadata.annotations = Some(
            [
                (marks::BOOTSTRAP_FAILED.to_string(), "x".to_string()),
                (marks::FAILURE_REASON.to_string(), server.mark()),
            ]
            .into(),
        );
        assert_eq!(
            recorded(&claim),
            Some((Cause::Server, "too_old".to_string()))
        );
        assert!(failed_elsewhere(&claim));
        claim
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(marks::FAILURE_REASON);
        assert_eq!(
            recorded(&claim),
            Some((Cause::Machine, "unknown".to_string()))
        );
        assert!(!failed_elsewhere(&claim));
    }
}
