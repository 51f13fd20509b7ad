//! The rollout guard's view of the cluster: a class's state and the
//! NodeClaims launched under its trial, read from the caches, turned into
//! the pure [`Input`] that [`super::plan`] decides on.

use super::{
    held, launched, outcome, outcome_when_deleted, plan, read_state, retry, under_trial, Input,
    Observed, Outcome, Plan, Settings, State, Trial, Values,
};
use crate::kube::events::Events;
use crate::kube::karpenter::{Ec2NodeClass, NodeClaim};
use crate::kube::nodeclaim::NodeClaims;
use crate::kube::reason::Reason;
use kube::ResourceExt;

/// Where a class's state comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The store's entry for the class (see [`super::store`]).
    Stored(Box<State>),
    /// No entry in the store yet: the class's sealed annotation, as a
    /// server before the store wrote it, carried over into the store.
    Carried,
    /// The store may not be used (RBAC): the annotation alone, as before.
    Annotation,
}

impl Source {
    /// Whether the state goes to the store.
    pub fn is_store(&self) -> bool {
        !matches!(self, Source::Annotation)
    }
}

/// Where the guard reads NodeClaims from.
pub struct Cluster<'a> {
    pub claims: &'a NodeClaims,
    pub settings: Settings,
    pub events: &'a Events,
}

/// What [`Events::is_news`] tells once per version of the class, not every
/// resync: that its rollout state was ignored.
const IGNORED_TOPIC: &str = "rollout-state-rejected";

impl Cluster<'_> {
    /// The plan for `class` (named `name`), whose kept values are
    /// `current` and for which the flags render `desired`, on the state
    /// `source` holds.
    pub fn plan(
        &self,
        class: &Ec2NodeClass,
        name: &str,
        source: Source,
        current: Values,
        desired: Values,
    ) -> Plan {
        let (state, applied_at) = match source {
            // A trial's start in the store is autonode's own write's time:
            // never read back from managedFields, where anyone applying as
            // autonode-server can move it.
            Source::Stored(state) => (Some(*state), None),
            Source::Carried | Source::Annotation => {
                (self.annotation_state(class, name), applied_at(class))
            }
        };
        let observed = state
            .as_ref()
            .and_then(|s| Some((s.trial.as_ref()?, s)))
            .and_then(|(trial, state)| {
                let since = trial.since.or(applied_at)?;
                self.observed(name, trial, since, state)
            });
        plan(Input {
            state,
            current,
            desired,
            hold: held(class),
            retry: retry(class),
            observed,
            applied_at,
            failures: self.settings.failures,
            now: self.settings.clock.unix(),
        })
    }

    /// The state in the class's annotation, when autonode wrote it.
    fn annotation_state(&self, class: &Ec2NodeClass, name: &str) -> Option<State> {
        match read_state(class, &self.settings.key) {
            Ok(state) => state,
            Err(error) => {
                self.warn_ignored(class, name, &error);
                None
            }
        }
    }

    /// The NodeClaims of class `class` under `trial` of `state`'s applied
    /// values (those launched from an AMI the change put on trial, or any
    /// when userData changed), live and deleted, or `None` while the
    /// NodeClaim cache is not current (a NodeClaim missing from it may
    /// just not have arrived yet).
    fn observed(
        &self,
        class: &str,
        trial: &Trial,
        since: i64,
        state: &State,
    ) -> Option<Vec<Observed>> {
        if !self.claims.is_fresh() {
            return None;
        }
        let ids = Values::watched_ami_ids(&state.applied, state.good.as_ref());
        let pick = |claim: &NodeClaim| under_trial(claim, class, since, &ids);
        let (now, deadline) = (self.settings.clock.unix(), self.settings.ready_deadline);
        let mut seen = Vec::new();
        for claim in self.claims.store().state() {
            let outcome = if pick(&claim) {
                rollout_outcome(&claim, now, deadline, false)
            } else if remembered(trial, &claim) {
                Outcome::Elsewhere
            } else {
                continue;
            };
            seen.push(observed(&claim, outcome));
        }
        // After the store: a NodeClaim it no longer held is gone by now.
        for claim in self.claims.gone(pick) {
            let uid = claim.metadata.uid.clone().unwrap_or_default();
            if !seen.iter().any(|o| o.uid == uid) {
                seen.push(observed(
                    &claim,
                    rollout_outcome(&claim, now, deadline, true),
                ));
            }
        }
        tracing::debug!(nodeclass = %class, ?seen, "NodeClaims under the rollout trial");
        Some(seen)
    }
}

/// Whether `trial` saw `claim` (by name and uid).
fn remembered(trial: &Trial, claim: &NodeClaim) -> bool {
    trial
        .claims
        .get(&claim.name_any())
        .is_some_and(|seen| Some(&seen.uid) == claim.metadata.uid.as_ref())
}

fn rollout_outcome(
    claim: &NodeClaim,
    now: i64,
    deadline: std::time::Duration,
    deleted: bool,
) -> Outcome {
    if deleted {
        outcome_when_deleted(claim, now, deadline)
    } else {
        outcome(claim, now, deadline)
    }
}

fn observed(claim: &NodeClaim, outcome: Outcome) -> Observed {
    Observed {
        name: claim.name_any(),
        uid: claim.metadata.uid.clone().unwrap_or_default(),
        outcome,
        image: claim.status.as_ref().and_then(|s| s.image_id.clone()),
        launched: launched(claim),
    }
}

/// When autonode-server last applied `class`, by the API server's clock:
/// its managedFields entry's time (Unix seconds). Anyone who applies as
/// autonode-server moves it: read from a class as read, it only starts a
/// trial of a state kept on the class (no store); from the response to
/// autonode's own write it is autonode's.
pub fn applied_at(class: &Ec2NodeClass) -> Option<i64> {
    class
        .metadata
        .managed_fields
        .as_deref()?
        .iter()
        .find(|e| {
            e.manager.as_deref() == Some(crate::kube::marks::FIELD_MANAGER)
                && e.operation.as_deref() == Some("Apply")
        })?
        .time
        .as_ref()
        .map(|t| t.0.as_second())
}

impl Cluster<'_> {
    /// Logs and records a Warning Event, once per class version, that its
    /// state is not used.
    fn warn_ignored(&self, class: &Ec2NodeClass, name: &str, error: &super::StateError) {
        let version = class.metadata.resource_version.as_deref();
        if !self
            .events
            .is_news(class, IGNORED_TOPIC, version.unwrap_or_default())
        {
            return;
        }
        tracing::warn!(
            nodeclass = %name,
            annotation = super::ROLLOUT_ANNOTATION,
            %error,
            "EC2NodeClass rollout state rejected; the rollout guard starts afresh from the class's current values"
        );
        self.events.warning(
            class,
            Reason::RolloutStateRejected,
            format!(
                "annotation {}: {error}. autonode-server does not use it: the rollout guard starts \
                 afresh from this class's current values (taken as good only when they are what \
                 the flags render) and writes a state of its own",
                super::ROLLOUT_ANNOTATION
            ),
        );
    }
}
