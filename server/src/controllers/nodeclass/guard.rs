//! The class's side of the rollout guard: where a class's state is read
//! from and recorded (its store, or the class's annotation), its plan for
//! a class, what it tells about it, and its condition in the class's
//! status.

use super::{Context, Error};
use crate::controllers::nodeclass::rollout::cluster::Source;
use crate::controllers::nodeclass::rollout::store::{
    self, copy_digest, Entry, Lookup, Recorded, StoreError,
};
use crate::controllers::nodeclass::rollout::{self, Plan, State, Values};
use crate::controllers::nodeclass::userdata::Format;
use crate::kube::condition::{self, set_condition, Desired};
use crate::kube::karpenter::Ec2NodeClass;
use crate::kube::marks::{self, ROLLOUT_ANNOTATION};
use crate::kube::reason::Reason;
use kube::api::Patch;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

/// What [`crate::kube::events::Events::is_news`] tells once per class: that
/// the store may not be used.
const UNAVAILABLE_TOPIC: &str = "rollout-store-unavailable";
/// Likewise, once per class version: that its state does not fit.
const FULL_TOPIC: &str = "rollout-store-full";

impl Context {
    /// Where `class`'s rollout state is: the store's entry, the class's
    /// annotation to carry over (no entry yet, or a newer copy: see
    /// [`Context::newer_copy`]), or (store refused) the annotation alone.
    /// An error reading the store fails the reconcile: deciding on the
    /// annotation instead is what the store is there to prevent.
    pub(super) async fn source(&self, class: &Ec2NodeClass, name: &str) -> Result<Source, Error> {
        let uid = class.metadata.uid.as_deref().unwrap_or_default();
        let lookup = self.store.lookup(name, uid).await;
        Ok(match lookup.map_err(|e| store_error(name, e))? {
            Lookup::Found(entry) if self.newer_copy(class, name, &entry) => Source::Carried,
            Lookup::Found(entry) => Source::Stored(Box::new(entry.state)),
            Lookup::Absent => Source::Carried,
            Lookup::Unavailable => {
                self.tell_unavailable(class);
                Source::Annotation
            }
        })
    }

    /// Whether `class` carries a sealed copy of its state that its store
    /// `entry` has not seen and that is newer than the entry's state (see
    /// [`rollout::newer_copy`]): what a server before the store (0.2.0)
    /// recorded while it led, after a downgrade. Taken over (logged), so
    /// an upgrade back keeps what that leader reverted or promoted.
    fn newer_copy(&self, class: &Ec2NodeClass, name: &str, entry: &Entry) -> bool {
        let Some(text) = copy_text(class) else {
            return false;
        };
        if entry.seen.contains(&copy_digest(text)) {
            return false;
        }
        // A copy that does not open is told when it is read as a source.
        let Ok(Some(copy)) = rollout::read_state(class, &self.settings.rollout.key) else {
            return false;
        };
        let retry = rollout::retry(class);
        if !rollout::newer_copy(&entry.state, &copy, retry.as_deref()) {
            return false;
        }
        tracing::info!(
            nodeclass = %name,
            annotation = ROLLOUT_ANNOTATION,
            "the class carries a rollout state sealed since the store's (by a server before the \
             store, after a downgrade) that forgets nothing the store holds; taking it over"
        );
        true
    }

    /// Whether the class `name` with `uid` exists, as watched: when the
    /// watch is not current, every class is taken to (an entry is dropped
    /// only when its class is known gone).
    fn live(&self, name: &str, uid: &str) -> bool {
        if !self.classes.status.is_fresh() {
            return true;
        }
        let class = self.classes.store.get(&ObjectRef::new(name));
        class.is_some_and(|c| c.metadata.uid.as_deref() == Some(uid))
    }

    /// Whether `state` for `class` fits in the store, told when it does
    /// not (the class is then left as it is).
    pub(super) async fn fits(&self, class: &Ec2NodeClass, name: &str, state: &State) -> bool {
        let uid = class.metadata.uid.as_deref().unwrap_or_default();
        let live = |n: &str, u: &str| self.live(n, u);
        match self.store.fits(name, uid, state, &live).await {
            Ok(()) => true,
            Err(error) if error.is_full() => {
                self.tell_full(class, name, &error);
                false
            }
            Err(error) => {
                tracing::warn!(nodeclass = %name, %error, "rollout state not recorded; EC2NodeClass left as it is");
                false
            }
        }
    }

    /// Records `state` for `class` in the store; a trial with no start yet
    /// starts at the store write's own time (autonode's, by the API
    /// server's clock) when the class's apply gave none.
    pub(super) async fn record(
        &self,
        class: &Ec2NodeClass,
        name: &str,
        state: &State,
    ) -> Result<(), Error> {
        let uid = class.metadata.uid.as_deref().unwrap_or_default();
        let live = |n: &str, u: &str| self.live(n, u);
        let copy = copy_text(class);
        let recorded = self.store.record(name, uid, (state, copy), &live).await;
        let at = match self.unless_full(class, name, recorded)? {
            Some(Recorded::Refused) => {
                self.tell_unavailable(class);
                return Ok(());
            }
            Some(Recorded::Written { at }) => at,
            None => return Ok(()),
        };
        let mut started = state.clone();
        match started.trial.as_mut() {
            Some(trial) if trial.since.is_none() && at.is_some() => trial.since = at,
            _ => return Ok(()),
        }
        let again = self.store.record(name, uid, (&started, copy), &live).await;
        self.unless_full(class, name, again).map(|_| ())
    }

    /// What a record of `class`'s state came to: `None` when there was no
    /// room for it (told: the class goes on as decided by the caller, who
    /// acted only on what is safe without a record), an error otherwise.
    fn unless_full(
        &self,
        class: &Ec2NodeClass,
        name: &str,
        recorded: Result<Recorded, StoreError>,
    ) -> Result<Option<Recorded>, Error> {
        match recorded {
            Ok(recorded) => Ok(Some(recorded)),
            Err(error) if error.is_full() => {
                self.tell_full(class, name, &error);
                Ok(None)
            }
            Err(error) => Err(store_error(name, error)),
        }
    }

    /// Logs and records, once per class, that the store may not be used.
    fn tell_unavailable(&self, class: &Ec2NodeClass) {
        let events = &self.settings.events;
        if events.is_news(class, UNAVAILABLE_TOPIC, "forbidden") {
            events.warning(
                class,
                Reason::RolloutStoreUnavailable,
                store::UNAVAILABLE.into(),
            );
        }
    }

    /// Counts a state not recorded for want of room, and logs and records
    /// it once per class version.
    fn tell_full(&self, class: &Ec2NodeClass, name: &str, error: &StoreError) {
        self.settings.metrics.rollout_states_unrecorded.inc();
        let events = &self.settings.events;
        let version = class.metadata.resource_version.as_deref();
        if events.is_news(class, FULL_TOPIC, version.unwrap_or_default()) {
            tracing::warn!(nodeclass = %name, %error, "rollout state not recorded; only what is safe without a record is applied");
            events.warning(class, Reason::RolloutStoreFull, error.to_string());
        }
    }

    /// The rollout guard's plan for `class`, userData in `format`, on the
    /// state `source` holds.
    pub(super) fn guard(
        &self,
        class: &Ec2NodeClass,
        name: &str,
        format: Format,
        source: Source,
    ) -> Plan {
        let desired = &self.settings.desired;
        let current = Values {
            user_data: class.spec.user_data.clone().unwrap_or_default(),
            ami_selector_terms: desired
                .ami_terms
                .as_ref()
                .map(|_| class.spec.ami_selector_terms.clone()),
        };
        let cluster = rollout::cluster::Cluster {
            claims: &self.claims,
            settings: self.settings.rollout,
            events: &self.settings.events,
        };
        cluster.plan(class, name, source, current, desired.values(format))
    }

    /// Writes the [`condition::ROLLOUT`] `plan` calls for on
    /// `class`, when it differs from the one there: through the status
    /// subresource, every condition as read with ours replaced, with the
    /// resourceVersion read as a precondition (409 when the class changed
    /// since: its watch event decides again). Karpenter's own status writes
    /// are merge patches computed from the object it read, so a condition
    /// of ours survives them. Best effort: a failure is logged.
    pub(super) async fn mark_status(&self, class: &Ec2NodeClass, name: &str, plan: &Plan) {
        let (status, reason, message) = rollout::status_condition(plan);
        let conditions = class.status.as_ref().map(|s| s.conditions.as_slice());
        let desired = Desired {
            type_: condition::ROLLOUT,
            status,
            reason,
            message,
            generation: class.metadata.generation,
            clock: self.settings.rollout.clock,
        };
        let Some(next) = set_condition(conditions.unwrap_or_default(), desired) else {
            return;
        };
        let patch = json!({
            "metadata": {"resourceVersion": class.metadata.resource_version},
            "status": {"conditions": next},
        });
        match self
            .api
            .patch_status(name, &marks::patch_params(), &Patch::Merge(&patch))
            .await
        {
            // A status write: not one of autonode_nodeclass_writes_total,
            // which counts what changes a class's nodes.
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::debug!(nodeclass = %name, "EC2NodeClass changed before its rollout condition was written; deciding again")
            }
            Err(error) => {
                tracing::warn!(nodeclass = %name, %error, "could not write the EC2NodeClass's AutonodeRollout condition")
            }
        }
    }

    /// Logs, Events and counts what `plan` says happened to `class`.
    pub(super) fn announce(&self, class: &Ec2NodeClass, name: &str, plan: &Plan) {
        let teller = rollout::tell::Teller {
            events: &self.settings.events,
            metrics: &self.settings.metrics,
            settings: self.settings.rollout,
        };
        teller.announce(class, name, plan);
    }
}

/// The text of `class`'s copy of its rollout state, if it has one.
fn copy_text(class: &Ec2NodeClass) -> Option<&str> {
    class
        .metadata
        .annotations
        .as_ref()?
        .get(ROLLOUT_ANNOTATION)
        .map(String::as_str)
}

fn store_error(name: &str, source: StoreError) -> Error {
    Error::Store {
        name: name.to_string(),
        source,
    }
}
