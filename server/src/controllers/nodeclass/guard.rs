//! The class's side of the rollout guard: its plan for a class, what it
//! tells about it, and its condition in the class's status.

use super::Context;
use crate::controllers::nodeclass::rollout::{self, Plan, Values};
use crate::controllers::nodeclass::userdata::Format;
use crate::kube::condition::{self, set_condition, Desired};
use crate::kube::karpenter::Ec2NodeClass;
use crate::kube::marks;
use kube::api::Patch;
use serde_json::json;

impl Context {
    /// The rollout guard's plan for `class`, userData in `format`.
    pub(super) fn guard(&self, class: &Ec2NodeClass, name: &str, format: Format) -> Plan {
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
        cluster.plan(class, name, current, desired.values(format))
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
