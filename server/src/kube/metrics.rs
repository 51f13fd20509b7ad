//! Prometheus metrics.
//!
//! Labels are low-cardinality by construction: results and refusal reasons
//! come from fixed `&'static str` labels, never from request data.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JoinLabels {
    /// `joined`, `resumed`, `refused` or `unavailable`.
    pub result: &'static str,
    /// The refusal reason, or `none`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentLabels {
    /// A released agent version this server knows, or `newer`, `older` or
    /// `unknown` (see `join::agents`).
    pub version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `client` or `serving`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MilestoneLabels {
    /// `attested`, `certificates`, `registered` or `ready`.
    pub milestone: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    /// The join's step, named as its file in `join/` (the list is
    /// `join::Step`): `admit` (the CSRs parsed, the document's signature
    /// and policy), `attest` (the NodeClaim, EC2, the CSRs against both),
    /// `bind` (creating the CSRs and rendering, together, then the
    /// binding) or `approve` (approving, kube-controller-manager signing).
    pub step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: &'static str,
    pub outcome: &'static str,
}

/// Every metric the server exports.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub joins: Family<JoinLabels, Counter>,
    pub join_agents: Family<AgentLabels, Counter>,
    pub join_seconds: Histogram,
    pub join_step_seconds: Family<StepLabels, Histogram>,
    pub possible_replays: Counter,
    pub spoofed_nodes: Counter,
    pub impostor_repeats: Counter,
    pub approvals: Family<KindLabels, Counter>,
    pub renewals_refused: Family<KindLabels, Counter>,
    pub agent_reports: Family<PhaseLabels, Counter>,
    pub joins_in_flight: Gauge,
    pub nodeclaims_deleted: Family<FailureLabels, Counter>,
    pub nodeclaims_failed_server_side: Family<FailureLabels, Counter>,
    pub failure_groups_over_budget: Gauge,
    pub nodeclass_checks: Counter,
    pub nodeclass_writes: Counter,
    pub rollouts_reverted: Family<NodeClassLabels, Counter>,
    pub rollout_states_unrecorded: Counter,
    pub milestone_seconds: Family<MilestoneLabels, Histogram>,
    pub leader: Gauge,
    pub caches_ready: Gauge,
    pub csr_left_pending: Family<LeftPendingLabels, Counter>,
    pub csrs_pending: Family<SignerLabels, Gauge>,
    pub agent_reports_refused: Family<ReportRefusalLabels, Counter>,
    pub agent_reports_unverified_fatal: Counter,
    pub join_admission_refused: Family<AdmissionLabels, Counter>,
    pub events_dropped: Family<EventDropLabels, Counter>,
    pub capacity_shortfalls: Family<CapacityLabels, Counter>,
}

/// A stopwatch over a join's steps: each [`Steps::done`] records the time
/// since the previous one under that step's name.
pub struct Steps<'a> {
    metrics: &'a Metrics,
    since: std::time::Instant,
}

impl Steps<'_> {
    pub fn done(&mut self, step: &'static str) {
        let now = std::time::Instant::now();
        self.metrics
            .join_step_seconds
            .get_or_create(&StepLabels { step })
            .observe(now.duration_since(self.since).as_secs_f64());
        self.since = now;
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("autonode");
        let joins = Family::<JoinLabels, Counter>::default();
        registry.register(
            "joins",
            "Join requests by result and refusal reason",
            joins.clone(),
        );
        let join_agents = Family::<AgentLabels, Counter>::default();
        registry.register(
            "join_agent_versions",
            "Admitted join requests by the agent version they carried: when an old \
             version's count stops growing, no AMI with that agent is booting any more",
            join_agents.clone(),
        );
        let join_seconds = Histogram::new(exponential_buckets(0.01, 2.0, 14));
        registry.register(
            "join_duration_seconds",
            "Time to answer a join request",
            join_seconds.clone(),
        );
        let join_step_seconds = Family::<StepLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        registry.register(
            "join_step_duration_seconds",
            "Time each step of a join took, for those it reached (where a slow join \
             spends it: EC2, the API server's writes, kube-controller-manager's signing)",
            join_step_seconds.clone(),
        );
        let possible_replays = Counter::default();
        registry.register(
            "possible_replays",
            "Joins refused because the instance is bound to another client key",
            possible_replays.clone(),
        );
        let spoofed_nodes = Counter::default();
        registry.register(
            "spoofed_nodes",
            "NodeClaims found Registered to a Node that is not their machine (another node \
             registered a Node with their instance's providerID), each then failed",
            spoofed_nodes.clone(),
        );
        let impostor_repeats = Counter::default();
        registry.register(
            "impostor_repeats",
            "NodeClaims found Registered to an impostor Node that had already cost its \
             allowance of victims (see kube/impostor.rs): left as they are; that node is \
             likely compromised (its name is in the log and the Warning Event)",
            impostor_repeats.clone(),
        );
        let approvals = Family::<KindLabels, Counter>::default();
        registry.register(
            "csr_approvals",
            "CSRs approved by autonode",
            approvals.clone(),
        );
        let renewals_refused = Family::<KindLabels, Counter>::default();
        registry.register(
            "csr_renewals_refused",
            "Kubelet renewal CSRs autonode declined to approve",
            renewals_refused.clone(),
        );
        let agent_reports = Family::<PhaseLabels, Counter>::default();
        registry.register(
            "agent_reports",
            "Progress reports from agents",
            agent_reports.clone(),
        );
        let joins_in_flight = Gauge::default();
        registry.register(
            "joins_in_flight",
            "Join requests being processed",
            joins_in_flight.clone(),
        );
        let nodeclaims_deleted = Family::<FailureLabels, Counter>::default();
        registry.register(
            "nodeclaims_deleted",
            "NodeClaims deleted because their machine failed to bootstrap, by reason, \
             NodePool and EC2NodeClass",
            nodeclaims_deleted.clone(),
        );
        let nodeclaims_failed_server_side = Family::<FailureLabels, Counter>::default();
        registry.register(
            "nodeclaims_failed_server_side",
            "NodeClaims marked failed (never deleted) for a cause on autonode's side: an \
             allow-list that leaves out the fleet's account or region, the server's clock",
            nodeclaims_failed_server_side.clone(),
        );
        let failure_groups_over_budget = Gauge::default();
        registry.register(
            "failure_groups_over_budget",
            "NodePool, EC2NodeClass and reason groups past their failure budget \
             (--failure-budget) with no machine of them Ready since: their failed NodeClaims \
             are kept, not replaced at once (each replica counts from its NodeClaim cache)",
            failure_groups_over_budget.clone(),
        );
        let nodeclass_checks = Counter::default();
        registry.register(
            "nodeclass_checks",
            "EC2NodeClasses compared with the rendered userData and AMIs",
            nodeclass_checks.clone(),
        );
        let nodeclass_writes = Counter::default();
        registry.register(
            "nodeclass_writes",
            "EC2NodeClasses written because a kept field differed",
            nodeclass_writes.clone(),
        );
        let rollouts_reverted = Family::<NodeClassLabels, Counter>::default();
        registry.register(
            "rollouts_reverted",
            "AMI or userData changes the rollout guard put back to the last good values \
             because the NodeClaims launched under them failed, by EC2NodeClass",
            rollouts_reverted.clone(),
        );
        let rollout_states_unrecorded = Counter::default();
        registry.register(
            "rollout_states_unrecorded",
            "EC2NodeClass rollout states the guard could not record for want of room in its \
             store (the class's budget, or every class's slot taken: Events RolloutStoreFull); \
             new AMI/userData wait meanwhile",
            rollout_states_unrecorded.clone(),
        );
        let milestone_seconds = Family::<MilestoneLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(1.0, 2.0, 12))
        });
        registry.register(
            "milestone_seconds",
            "Seconds from NodeClaim creation to each bootstrap milestone",
            milestone_seconds.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica runs the controllers",
            leader.clone(),
        );
        let caches_ready = Gauge::default();
        registry.register(
            "caches_ready",
            "1 while this replica can judge joins (what /readyz answers), set when scraped",
            caches_ready.clone(),
        );
        let csr_left_pending = Family::<LeftPendingLabels, Counter>::default();
        registry.register(
            "csr_left_pending",
            "Kubelet CSRs the approver left pending, by kind and reason",
            csr_left_pending.clone(),
        );
        let csrs_pending = Family::<SignerLabels, Gauge>::default();
        registry.register(
            "csrs_pending",
            "Kubelet signers' CSRs nobody has decided yet (no Approved, Denied or Failed \
             condition, no certificate), counted by the leader from the approver's watch, \
             which leaves out autonode's own join CSRs (0 on other replicas)",
            csrs_pending.clone(),
        );
        let agent_reports_refused = Family::<ReportRefusalLabels, Counter>::default();
        registry.register(
            "agent_reports_refused",
            "Agent reports refused, by reason (replayed, outside_window, wrong_key, ...)",
            agent_reports_refused.clone(),
        );
        let agent_reports_unverified_fatal = Counter::default();
        registry.register(
            "agent_reports_unverified_fatal",
            "Fatal agent reports from instances not bound to a key yet: shown, not acted on",
            agent_reports_unverified_fatal.clone(),
        );
        let join_admission_refused = Family::<AdmissionLabels, Counter>::default();
        registry.register(
            "join_admission_refused",
            "Callers the join API turned away before any join work (connection and join \
             caps, global and per source; handshake, header and body timeouts; oversized \
             bodies), by reason",
            join_admission_refused.clone(),
        );
        let events_dropped = Family::<EventDropLabels, Counter>::default();
        registry.register(
            "events_dropped",
            "Event writes not made when asked, by reason (rate_limited: written later \
             with the count so far; queue_full: lost)",
            events_dropped.clone(),
        );
        let capacity_shortfalls = Family::<CapacityLabels, Counter>::default();
        registry.register(
            "capacity_shortfalls",
            "Ready nodes with less allocatable than their NodeClaim's (what Karpenter planned \
             with), beyond --capacity-tolerance, by EC2NodeClass and resource",
            capacity_shortfalls.clone(),
        );
        Self {
            registry: Arc::new(registry),
            joins,
            join_agents,
            join_seconds,
            join_step_seconds,
            possible_replays,
            spoofed_nodes,
            impostor_repeats,
            approvals,
            renewals_refused,
            agent_reports,
            joins_in_flight,
            nodeclaims_deleted,
            nodeclaims_failed_server_side,
            failure_groups_over_budget,
            nodeclass_checks,
            nodeclass_writes,
            rollouts_reverted,
            rollout_states_unrecorded,
            milestone_seconds,
            leader,
            caches_ready,
            csr_left_pending,
            csrs_pending,
            agent_reports_refused,
            agent_reports_unverified_fatal,
            join_admission_refused,
            events_dropped,
            capacity_shortfalls,
        }
    }

    /// Times the steps of one join; see [`Steps`].
    pub fn steps(&self) -> Steps<'_> {
        Steps {
            metrics: self,
            since: std::time::Instant::now(),
        }
    }

    /// Records that a NodeClaim reached `milestone` `seconds` after it was
    /// created.
    pub fn observe_phase(&self, milestone: &'static str, seconds: f64) {
        self.milestone_seconds
            .get_or_create(&MilestoneLabels { milestone })
            .observe(seconds);
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeftPendingLabels {
    /// `client_renewal` or `serving`.
    pub kind: &'static str,
    /// Why the approver did not approve (a fixed label, see
    /// `approver::Decline::reason`).
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignerLabels {
    /// `kubernetes.io/kube-apiserver-client-kubelet` or
    /// `kubernetes.io/kubelet-serving`.
    pub signer: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReportRefusalLabels {
    /// Why a report was refused (see `report::ReportRefusal::reason`).
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// Why the join API turned a caller away (see `api::gate::Turned::reason`).
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventDropLabels {
    /// `rate_limited` (the object's bucket was empty: the Event's count is
    /// written with its next token) or `queue_full` (lost).
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapacityLabels {
    /// The NodeClaim's EC2NodeClass: the one label not fixed in the code,
    /// but an operator's object (a cluster has a handful), never request
    /// data.
    pub nodeclass: String,
    /// `cpu`, `memory`, `pods` or `ephemeral-storage`.
    pub resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// The failure's reason: a refusal's label, `agent_fatal`,
    /// `node_spoofed` (a closed set), or `unknown`.
    pub reason: String,
    /// The NodeClaim's NodePool and EC2NodeClass: the operator's objects
    /// (a cluster has a handful), never request data.
    pub nodepool: String,
    pub nodeclass: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeClassLabels {
    /// The EC2NodeClass: an operator's object (a cluster has a handful),
    /// never request data.
    pub nodeclass: String,
}
