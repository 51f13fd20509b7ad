//! The rollout guard: what the EC2NodeClass upkeep ([`crate::controllers::nodeclass`])
//! does before it changes a class's AMI or userData.
//!
//! Karpenter drifts every node of a class whose userData or AMI changes, so
//! a bad AMI or userData written by autonode would take the whole fleet.
//! The guard keeps, per class, a [`State`] holding the values autonode
//! stands by (`applied`), the last values that produced a Ready node
//! (`good`), the trial of new values and the NodeClaims launched under
//! them, and the values it reverted (`refused`). It keeps it in its
//! [`store`], a ConfigMap of the leader namespace that class editors
//! cannot write, so that deleting or editing anything on the class, or a
//! new seal key, cannot make it forget a refusal; every replica reads it
//! there: a new leader, or one restarted mid-rollout, carries on where the
//! last left off. Only the leader runs the upkeep, so no two replicas
//! write it. A copy goes on the class too, as the [`ROLLOUT_ANNOTATION`],
//! sealed: for a server before the store (a downgrade, a replica of the
//! previous release leading during a rolling upgrade), and read when the
//! store has no entry for the class yet (a state carried over) or may not
//! be used (RBAC without it).
//!
//! New values (a new `--ami-ids`, a new rendering of userData) start a
//! trial. The NodeClaims of the class created since the trial began (and,
//! once Karpenter records it, whose `status.imageID` is one of the AMIs the
//! change replaced, or any when userData changed: see
//! [`Values::watched_ami_ids`]) are watched: once one is Ready and each
//! changed AMI has a Ready one, the values are promoted to `good`; when
//! [`Settings::failures`] of them failed (a fatal agent report, a refusal
//! that dooms the instance, deleted before Ready after it was launched, or
//! launched and not Ready within [`Settings::ready_deadline`]) and none
//! became Ready, the last good
//! values are put back and the tried ones are refused until the operator
//! sets a new value of [`RETRY_ANNOTATION`] (or the flags change to other
//! values). [`HOLD_ANNOTATION`] freezes a class at the values autonode
//! applied last, e.g. during a control-plane upgrade.
//!
//! The annotation's state counts only when it opens under the replicas' key
//! ([`seal`]: an HMAC over the class's UID and the state's bytes) and
//! autonode's field manager is its only writer (see
//! [`crate::kube::marks::is_own`]); a state that does not is ignored (a
//! `RolloutStateRejected` Warning Event) and the guard starts afresh from
//! the class as it is, taking as good only values the flags render: this
//! can cost a revert's protection but never makes autonode keep or write
//! values it did not render. Everything that decides
//! is pure ([`plan`], [`observe`], [`verdict`], [`outcome`]) and tested in
//! `tests.rs`; [`crate::controllers::nodeclass`] reads the class and the NodeClaims and
//! writes the result together with the kept fields, in one apply.

use crate::kube::budget;
use crate::kube::class_meta::retry_token;
use crate::kube::condition::BOOTSTRAPPED as CONDITION;
use crate::kube::karpenter::{Ec2NodeClass, NodeClaim};
use crate::kube::marks;
use crate::kube::reason::Reason;
use crate::primitives::clock::Clock;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

pub mod cluster;
pub mod seal;
pub mod store;
pub mod tell;
#[cfg(test)]
mod tests;

pub use crate::kube::marks::{HOLD_ANNOTATION, RETRY_ANNOTATION, ROLLOUT_ANNOTATION};
pub use seal::StateKey;

/// The most NodeClaims a trial remembers (the annotation stays small).
pub const MAX_TRACKED: usize = 64;
/// The most failures a refusal keeps (its Event names the first ten and
/// counts them all): a reverted state stays within its store budget.
pub const MAX_FAILED: usize = 16;
/// How the guard judges a trial.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Failed NodeClaims, none Ready, after which new values are reverted.
    pub failures: usize,
    /// How long a NodeClaim has to become Ready before it counts as failed.
    pub ready_deadline: Duration,
    /// The key that seals the class's state (see [`seal`]).
    pub key: StateKey,
    /// What "now" is for trials and deadlines.
    pub clock: Clock,
}

/// The values the guard watches over: userData and, when autonode keeps
/// them, the AMI selector terms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Values {
    pub user_data: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ami_selector_terms: Option<Vec<Value>>,
}

impl Values {
    /// The AMI ids among the terms (empty when the AMI is not kept).
    pub fn ami_ids(&self) -> Vec<&str> {
        self.ami_selector_terms
            .iter()
            .flatten()
            .filter_map(|term| term.get("id")?.as_str())
            .collect()
    }

    /// The AMI ids among these values' that `from` (when known) does not
    /// have: what a change of `from` to these values puts on trial. An
    /// unchanged architecture's AMI is not on trial.
    pub fn changed_ami_ids(&self, from: Option<&Values>) -> Vec<&str> {
        let before = from.map(Values::ami_ids).unwrap_or_default();
        self.ami_ids()
            .into_iter()
            .filter(|id| !before.contains(id))
            .collect()
    }

    /// The AMI ids whose NodeClaims judge a change of `good` to these
    /// values: every one when userData changes (every node runs it), else
    /// the changed ones. Empty: any AMI.
    pub fn watched_ami_ids(&self, good: Option<&Values>) -> Vec<&str> {
        match good {
            Some(good) if good.user_data == self.user_data => self.changed_ami_ids(Some(good)),
            _ => self.ami_ids(),
        }
    }
}

/// A NodeClaim that failed under a trial, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub nodeclaim: String,
    pub reason: String,
}

/// A NodeClaim a trial has seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// Seen launched (an instance was made for it): gone without a node,
    /// it failed; gone before, it is forgotten (Karpenter gave up on the
    /// launch: no capacity, its NodePool deleted).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub launched: bool,
}

/// New values on trial: since when, and the NodeClaims seen under them by
/// name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trial {
    /// Unix seconds, by the API server's clock (the clock of the
    /// NodeClaims' creationTimestamp, not the leader's): the managedFields
    /// time of autonode's apply that started the trial, taken from the
    /// response to that apply and recorded in the store in the same
    /// reconcile. (Without the store, as before it: read back from the
    /// class's managedFields and recorded with the next write made for
    /// another reason.) Until known the trial judges nothing.
    #[serde(default)]
    pub since: Option<i64>,
    #[serde(default)]
    pub claims: BTreeMap<String, Seen>,
}

impl Trial {
    fn new() -> Self {
        Self {
            since: None,
            claims: BTreeMap::new(),
        }
    }

    /// The failures recorded so far, by NodeClaim name.
    pub fn failures(&self) -> Vec<Failure> {
        self.claims
            .iter()
            .filter_map(|(name, seen)| {
                Some(Failure {
                    nodeclaim: name.clone(),
                    reason: seen.failed.clone()?,
                })
            })
            .collect()
    }
}

/// Values that were reverted, and the failures that made it so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    pub values: Values,
    pub failed: Vec<Failure>,
}

/// The guard's state on a class (the [`ROLLOUT_ANNOTATION`]'s JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// What autonode applied last and stands by.
    pub applied: Values,
    /// The last values that produced a Ready node, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub good: Option<Values>,
    /// The trial of `applied`, while it is not `good`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trial: Option<Trial>,
    /// The values last reverted, not applied again until asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<Refused>,
    /// The last [`RETRY_ANNOTATION`] value acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried: Option<String>,
}

/// Where one NodeClaim's bootstrap stands, for the guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pending,
    Ready,
    Failed(String),
    /// Launched under other values after all: Karpenter recorded an AMI
    /// that is not the trial's (it may record it after the trial saw the
    /// NodeClaim); or deleted without ever being launched, which says
    /// nothing of the values; or failed by autonode because an impostor
    /// Node took it. Forgotten by the trial.
    Elsewhere,
}

/// A NodeClaim under trial as seen now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub name: String,
    pub uid: String,
    pub outcome: Outcome,
    /// The AMI Karpenter recorded for it, if yet.
    pub image: Option<String>,
    /// Whether an instance was launched for it.
    pub launched: bool,
}

/// What to do with a trial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Wait,
    Promote,
    Revert(Vec<Failure>),
}

/// What a reconcile asks the guard about one class.
#[derive(Debug, Clone)]
pub struct Input {
    /// The class's state, when autonode wrote it (its seal opens).
    pub state: Option<State>,
    /// The class's values now.
    pub current: Values,
    /// What the flags render for the class.
    pub desired: Values,
    pub hold: bool,
    pub retry: Option<String>,
    /// The NodeClaims under the trial, or `None` when they cannot be
    /// judged now (the NodeClaim cache is not fresh).
    pub observed: Option<Vec<Observed>>,
    /// When autonode last applied the class (Unix seconds), per its
    /// managedFields: the API server's clock.
    pub applied_at: Option<i64>,
    pub failures: usize,
    /// Unix seconds.
    pub now: i64,
}

/// What happened, for the log, Events and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    Started,
    Promoted,
    Reverted(Vec<Failure>),
    /// The wanted values are refused (they were reverted).
    Refusing(Vec<Failure>),
    Held,
    /// Asked to hold, but the class's values are not autonode's to hold.
    HoldIgnored,
    Retried(String),
}

/// The guard's answer: the values to keep on the class, the state to
/// write with them, and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub target: Values,
    pub state: State,
    pub notes: Vec<Note>,
}

/// The state of a class the guard has no (trusted) state for: what it runs
/// on now is what autonode stands by, and is taken as good only when it is
/// what the flags render. Not when managedFields say autonode applied it:
/// anyone who may patch the class can apply under autonode's manager name.
fn seed(input: &Input) -> State {
    let good = (input.current == input.desired).then(|| input.current.clone());
    State {
        applied: input.current.clone(),
        good,
        trial: None,
        refused: None,
        retried: None,
    }
}

/// Decides, for one class, which values to keep and the state to record.
pub fn plan(input: Input) -> Plan {
    let mut state = input.state.clone().unwrap_or_else(|| seed(&input));
    // A retry value a server before digests recorded whole compares as
    // what the class's value now reads as (see `retry_token`).
    if let Some(retried) = state.retried.as_mut() {
        *retried = retry_token(retried);
    }
    // A trial in a state read back began with the apply that wrote it.
    if let Some(trial) = state.trial.as_mut().filter(|t| t.since.is_none()) {
        trial.since = input.applied_at;
    }
    let mut notes = Vec::new();
    if let Some(value) = input
        .retry
        .as_ref()
        .filter(|v| state.retried.as_ref() != Some(v))
    {
        state.retried = Some(value.clone());
        if state.refused.take().is_some() {
            notes.push(Note::Retried(value.clone()));
        }
    }
    // Held at what autonode applied, never at someone else's values: with
    // no state of autonode's, only the rendered values hold.
    if input.hold && (input.state.is_some() || input.current == input.desired) {
        notes.push(Note::Held);
        return Plan {
            target: state.applied.clone(),
            state,
            notes,
        };
    }
    if input.hold {
        notes.push(Note::HoldIgnored);
    }
    judge(&mut state, &input, &mut notes);
    if state.applied != input.desired {
        match &state.refused {
            Some(refused) if refused.values == input.desired => {
                notes.push(Note::Refusing(refused.failed.clone()));
            }
            _ => {
                state.refused = None;
                state.applied = input.desired.clone();
                state.trial = None;
                notes.push(Note::Started);
            }
        }
    }
    // A trial runs exactly while the applied values are not known good.
    if state.good.as_ref() == Some(&state.applied) {
        state.trial = None;
    } else if state.trial.is_none() {
        state.trial = Some(Trial::new());
    }
    Plan {
        target: state.applied.clone(),
        state,
        notes,
    }
}

/// Whether `planned` is `read` with nothing new but a trial start filled
/// in: not worth a write of the class (with the store, the start is in the
/// store and the class's copy may lack it; without, it is read back from
/// the same managedFields time until the next write records it).
pub fn unchanged_but_start(read: &State, planned: &State) -> bool {
    let mut read = read.clone();
    if let (Some(r), Some(p)) = (read.trial.as_mut(), planned.trial.as_ref()) {
        if r.since.is_none() {
            r.since = p.since;
        }
    }
    &read == planned
}

/// Whether `copy`, a state sealed on the class that the store's entry has
/// not seen (neither autonode's own copy nor one taken over before: see
/// [`store::Entry::seen`]), is taken over from the `stored` one. It is
/// what a server before the store (0.2.0, leading after a downgrade)
/// sealed since the store was last written, unless an editor put back an
/// older sealed state (the seal cannot tell a replay), so it is taken only
/// when it forgets nothing the store holds: it differs from `stored`
/// (beyond a trial's start); it keeps the store's refusal, but for the
/// retry the class asks for now (`retry`), which the guard acts on anyway;
/// and it acted on no retry value but the store's or the class's own now
/// (a copy sealed before a retry the store saw is older).
pub fn newer_copy(stored: &State, copy: &State, retry: Option<&str>) -> bool {
    if unchanged_but_start(stored, copy) || unchanged_but_start(copy, stored) {
        return false;
    }
    let token = |v: Option<&String>| v.map(|v| retry_token(v));
    let (stored_retry, copy_retry) = (token(stored.retried.as_ref()), token(copy.retried.as_ref()));
    let asked = retry.map(retry_token);
    let retry_known = copy_retry == stored_retry || (copy_retry.is_some() && copy_retry == asked);
    let keeps_refusal = match (&stored.refused, &copy.refused) {
        (None, _) => true,
        (Some(s), Some(c)) if s.values == c.values => true,
        // Cleared by a retry the store has not acted on, that the class asks for now.
        _ => asked.is_some() && asked != stored_retry && copy_retry == asked,
    };
    retry_known && keeps_refusal
}

/// Moves the trial on with what is observed: promotes, reverts or waits.
fn judge(state: &mut State, input: &Input, notes: &mut Vec<Note>) {
    let (Some(trial), Some(observed)) = (state.trial.as_mut(), input.observed.as_ref()) else {
        return;
    };
    if trial.since.is_none() {
        return;
    }
    let ready = observe(trial, observed);
    let needed = match &state.good {
        Some(good) => state.applied.changed_ami_ids(Some(good)),
        None => Vec::new(),
    };
    match verdict(trial, &ready, &needed, input.failures, state.good.is_some()) {
        Verdict::Wait => {}
        Verdict::Promote => {
            state.good = Some(state.applied.clone());
            state.trial = None;
            notes.push(Note::Promoted);
        }
        Verdict::Revert(failed) => {
            let Some(good) = state.good.clone() else {
                return;
            };
            let tried = std::mem::replace(&mut state.applied, good);
            state.refused = Some(Refused {
                values: tried,
                failed: failed.iter().take(MAX_FAILED).cloned().collect(),
            });
            state.trial = None;
            notes.push(Note::Reverted(failed));
        }
    }
}

/// Records what is `observed` of a trial's NodeClaims in `trial`, and
/// returns the AMIs of those that are Ready (`None`: not recorded). A
/// NodeClaim the trial saw launched that is no longer observed (deleted,
/// its deletion missed) failed, unless it had; one never seen launched is
/// forgotten.
pub fn observe(trial: &mut Trial, observed: &[Observed]) -> Vec<Option<String>> {
    let mut ready = Vec::new();
    for claim in observed {
        let reason = match &claim.outcome {
            Outcome::Ready => {
                ready.push(claim.image.clone());
                continue;
            }
            Outcome::Failed(reason) => Some(marks::capped(reason, marks::MAX_NOTE)),
            Outcome::Pending => None,
            Outcome::Elsewhere => {
                trial.claims.remove(&claim.name);
                continue;
            }
        };
        let known = trial.claims.get(&claim.name).map(|s| s.uid == claim.uid);
        if known.is_none() && trial.claims.len() >= MAX_TRACKED {
            continue;
        }
        let seen = trial.claims.entry(claim.name.clone()).or_insert(Seen {
            uid: claim.uid.clone(),
            failed: None,
            launched: false,
        });
        if known == Some(false) {
            *seen = Seen {
                uid: claim.uid.clone(),
                failed: None,
                launched: false,
            };
        }
        seen.launched |= claim.launched;
        if seen.failed.is_none() {
            seen.failed = reason;
        }
    }
    trial.claims.retain(|name, seen| {
        let present = observed
            .iter()
            .any(|o| &o.name == name && o.uid == seen.uid);
        if !present && seen.failed.is_none() {
            if !seen.launched {
                return false;
            }
            seen.failed = Some(GONE.to_string());
        }
        true
    });
    ready
}

/// Why a launched NodeClaim that went away before its node was Ready
/// failed, when nothing says more (autonode marks why before it deletes).
pub const GONE: &str = "NodeClaim deleted after its instance was launched and before \
    its node was Ready, with no failure recorded (Karpenter deletes one that does not \
    register in time; or someone else deleted it)";

/// Promote once a NodeClaim is Ready and each of the `needed` AMIs (those
/// the change put on trial) has a Ready NodeClaim of its own; revert once
/// `failures` failed (and there are good values to go back to) with none
/// Ready; else wait. `ready` holds the AMIs of the Ready NodeClaims.
pub fn verdict(
    trial: &Trial,
    ready: &[Option<String>],
    needed: &[&str],
    failures: usize,
    has_good: bool,
) -> Verdict {
    let each = |id: &&str| ready.iter().any(|r| r.as_deref() == Some(*id));
    if !ready.is_empty() && needed.iter().all(each) {
        return Verdict::Promote;
    }
    if !ready.is_empty() {
        return Verdict::Wait;
    }
    let failed = trial.failures();
    if has_good && failed.len() >= failures.max(1) {
        return Verdict::Revert(failed);
    }
    Verdict::Wait
}

/// The [`crate::kube::condition::ROLLOUT`] condition for `plan`: `False` (`Reverted`) while
/// values are refused, `Unknown` (`OnTrial`) while new ones are on trial,
/// else `True` (`Settled`); `Held` as the reason while a hold stands.
/// Status, reason, message.
pub fn status_condition(plan: &Plan) -> (&'static str, Reason, String) {
    let held = plan.notes.contains(&Note::Held);
    let (status, reason, message) = if let Some(refused) = &plan.state.refused {
        let names: Vec<&str> = refused
            .failed
            .iter()
            .take(10)
            .map(|f| f.nodeclaim.as_str())
            .collect();
        (
            "False",
            Reason::Reverted,
            format!(
                "new AMI/userData failed on {} NodeClaims ({}) and were reverted; they are not \
                 applied again until annotation {RETRY_ANNOTATION} gets a new value",
                refused.failed.len(),
                names.join(", ")
            ),
        )
    } else if plan.state.trial.is_some() {
        (
            "Unknown",
            Reason::OnTrial,
            "new AMI/userData are on trial: no NodeClaim launched under them is Ready yet".into(),
        )
    } else {
        (
            "True",
            Reason::Settled,
            "the class runs AMI/userData that produced Ready nodes".into(),
        )
    };
    if held {
        let message = format!("held by annotation {HOLD_ANNOTATION}; {message}");
        return (status, Reason::Held, message);
    }
    (status, reason, message)
}

/// Whether `claim` was launched from class `class` under the trial begun
/// at `since`, with (when Karpenter has recorded it) one of `ami_ids`.
pub fn under_trial(claim: &NodeClaim, class: &str, since: i64, ami_ids: &[&str]) -> bool {
    let of_class = claim
        .spec
        .node_class_ref
        .as_ref()
        .is_some_and(|r| r.name == class && r.kind == "EC2NodeClass");
    let created = claim
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second());
    let image = claim.status.as_ref().and_then(|s| s.image_id.as_deref());
    let image_fits = match image {
        Some(image) if !ami_ids.is_empty() => ami_ids.contains(&image),
        _ => true,
    };
    of_class && created.is_some_and(|c| c >= since) && image_fits
}

/// Where `claim`'s bootstrap stands, at `now` (Unix seconds). A NodeClaim
/// autonode failed because an impostor Node took it counts for nothing
/// (elsewhere). Ready is
/// Karpenter's word (`Ready` or `Initialized`) or autonode's own
/// condition; failed is autonode's mark or condition, or, once launched,
/// being deleted or not Ready `deadline` after creation. A NodeClaim never
/// launched is pending, and forgotten when deleted.
pub fn outcome(claim: &NodeClaim, now: i64, deadline: Duration) -> Outcome {
    // Failed for a cause outside the machine: an impostor Node took it
    // (checked before Ready: a victim Registered to a Ready impostor reads
    // Ready), or autonode's own settings or clock refused it. Nothing of
    // the values on trial was tried.
    if budget::failed_elsewhere(claim) {
        return Outcome::Elsewhere;
    }
    let is_true = |kind: &str| claim.condition(kind).is_some_and(|c| c.status == "True");
    if is_true("Ready") || is_true("Initialized") || is_true(CONDITION) {
        return Outcome::Ready;
    }
    let mark = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(marks::BOOTSTRAP_FAILED));
    if let Some(note) = mark {
        return Outcome::Failed(note.clone());
    }
    if let Some(c) = claim.condition(CONDITION).filter(|c| c.status == "False") {
        return Outcome::Failed(
            c.message
                .clone()
                .unwrap_or_else(|| "bootstrap failed".into()),
        );
    }
    if !launched(claim) {
        // No instance, so nothing of the values tried: Karpenter's launch
        // failed (no capacity) or it deleted the claim (its NodePool gone).
        return if claim.is_deleting() {
            Outcome::Elsewhere
        } else {
            Outcome::Pending
        };
    }
    if claim.is_deleting() {
        return Outcome::Failed(GONE.to_string());
    }
    let created = claim
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second());
    let limit = i64::try_from(deadline.as_secs()).unwrap_or(i64::MAX);
    if created.is_some_and(|c| now.saturating_sub(c) > limit) {
        return Outcome::Failed(format!(
            "not Ready {limit}s after the NodeClaim was created"
        ));
    }
    Outcome::Pending
}

/// The outcome of a NodeClaim deleted while it was last as `claim`: Ready
/// if it was, forgotten if it never launched, else failed.
pub fn outcome_when_deleted(claim: &NodeClaim, now: i64, deadline: Duration) -> Outcome {
    match outcome(claim, now, deadline) {
        Outcome::Pending if !launched(claim) => Outcome::Elsewhere,
        Outcome::Pending => Outcome::Failed(GONE.to_string()),
        other => other,
    }
}

/// Whether an instance was launched for `claim`: it has a providerID, or
/// Karpenter's `Launched` condition is True.
pub fn launched(claim: &NodeClaim) -> bool {
    claim.provider_id().is_some()
        || claim
            .condition("Launched")
            .is_some_and(|c| c.status == "True")
}

/// The class's state, when it has one that opens under `key` and that
/// autonode's field manager alone wrote (`Ok(None)` when absent); an error
/// names what is wrong with it.
pub fn read_state(class: &Ec2NodeClass, key: &StateKey) -> Result<Option<State>, StateError> {
    let Some(text) = class
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ROLLOUT_ANNOTATION))
    else {
        return Ok(None);
    };
    if !marks::is_own(&class.metadata, ROLLOUT_ANNOTATION) {
        return Err(StateError::Foreign);
    }
    Ok(Some(key.open(class.metadata.uid.as_deref(), text)?))
}

/// Why a class's state is not used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("written by someone other than autonode-server (per managedFields)")]
    Foreign,
    #[error(transparent)]
    Sealed(#[from] seal::OpenError),
}

/// Whether `class` asks to be held: its [`HOLD_ANNOTATION`] is `true`
/// (nothing else, so a typo or `"no"` does not freeze a class unseen).
pub fn held(class: &Ec2NodeClass) -> bool {
    annotation(class, HOLD_ANNOTATION) == Some("true")
}

/// The class's [`RETRY_ANNOTATION`], if set: as its type reads it, the
/// value itself when short, else its digest (see [`retry_token`]), which
/// is what the state records.
pub fn retry(class: &Ec2NodeClass) -> Option<String> {
    annotation(class, RETRY_ANNOTATION).map(str::to_string)
}

fn annotation<'a>(class: &'a Ec2NodeClass, key: &str) -> Option<&'a str> {
    class
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}
