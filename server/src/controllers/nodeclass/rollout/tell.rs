//! What the rollout guard tells: a log line and an Event on the class for
//! each step of a rollout, and `autonode_rollouts_reverted_total`. Steps
//! that stand (held, refusing) are told once per class and change, not
//! every resync.

use super::{Failure, Note, Plan, Settings, Values, HOLD_ANNOTATION, RETRY_ANNOTATION};
use crate::kube::events::Events;
use crate::kube::karpenter::Ec2NodeClass;
use crate::kube::metrics::{Metrics, NodeClassLabels};
use crate::kube::reason::Reason;

/// The most failures named in one Event.
const NAMED: usize = 10;

/// What [`Events::is_news`] tells once: the standing note (held, refusing).
const STANDING_TOPIC: &str = "rollout-standing";

/// Where the guard tells what happened.
pub struct Teller<'a> {
    pub events: &'a Events,
    pub metrics: &'a Metrics,
    pub settings: Settings,
}

impl Teller<'_> {
    /// Tells each of `plan`'s notes about `class` (named `name`).
    pub fn announce(&self, class: &Ec2NodeClass, name: &str, plan: &Plan) {
        let mut stands = None;
        for note in &plan.notes {
            match note {
                Note::Started => self.started(class, name, plan),
                Note::Promoted => {
                    tracing::info!(nodeclass = %name, "rollout promoted: a node launched under the new AMI/userData is Ready");
                    self.events.normal(class, Reason::RolloutPromoted, "a node launched under the new AMI/userData is Ready: they are this class's last good values now".into());
                }
                Note::Reverted(failed) => self.reverted(class, name, plan, failed),
                Note::Retried(value) => {
                    tracing::info!(nodeclass = %name, retry = %value, "rollout retry asked: the reverted values may be applied again");
                }
                Note::Refusing(_) | Note::Held | Note::HoldIgnored => stands = Some(note),
            }
        }
        // A revert's Event already says the values are refused from now on.
        let reverted = plan.notes.iter().any(|n| matches!(n, Note::Reverted(_)));
        if self.stands_new(class, name, stands) && !reverted {
            if let Some(note) = stands {
                self.standing(class, name, note);
            }
        }
    }

    /// Whether `note` (or none) is not what was last told for the class.
    fn stands_new(&self, class: &Ec2NodeClass, _name: &str, note: Option<&Note>) -> bool {
        let Some(note) = note else {
            self.events.settled(class, STANDING_TOPIC);
            return false;
        };
        self.events
            .is_news(class, STANDING_TOPIC, &format!("{note:?}"))
    }

    fn started(&self, class: &Ec2NodeClass, name: &str, plan: &Plan) {
        let good = plan.state.good.as_ref();
        let what = change(good, &plan.state.applied);
        let guard = match good {
            Some(_) => format!(
                "if {} NodeClaims launched under them fail with none Ready, the last good values are put back",
                self.settings.failures
            ),
            None => "there are no last good values yet, so nothing would be put back".to_string(),
        };
        tracing::info!(nodeclass = %name, change = %what, "rollout started");
        self.events.normal(
            class,
            Reason::RolloutStarted,
            format!("autonode-server applied new values ({what}); the first NodeClaim launched under them that is Ready makes them the last good values; {guard}"),
        );
    }

    fn reverted(&self, class: &Ec2NodeClass, name: &str, plan: &Plan, failed: &[Failure]) {
        let tried = plan.state.refused.as_ref().map(|r| &r.values);
        let what = tried.map_or_else(String::new, |t| change(Some(&plan.state.applied), t));
        let failures = named(failed);
        tracing::warn!(nodeclass = %name, change = %what, %failures, "rollout reverted: the NodeClaims launched under the new AMI/userData failed and none became Ready");
        // Names first: the Event's note is cut at 1000 bytes, and the
        // reasons are long; each NodeClaim's own Events say why in full.
        self.events.warning(
            class,
            Reason::RolloutReverted,
            format!(
                "{} NodeClaims failed under the new values ({what}), none Ready: {}. The last \
                 good values are back; the new ones are not applied again until annotation \
                 {RETRY_ANNOTATION} is set to a new value or the flags render other values. \
                 Why: {failures}",
                failed.len(),
                names(failed),
            ),
        );
        self.metrics
            .rollouts_reverted
            .get_or_create(&NodeClassLabels {
                nodeclass: name.to_string(),
            })
            .inc();
    }

    fn standing(&self, class: &Ec2NodeClass, name: &str, note: &Note) {
        match note {
            Note::Refusing(failed) => {
                let failures = named(failed);
                tracing::warn!(nodeclass = %name, %failures, "rollout refused: the wanted AMI/userData were reverted before; keeping the last good values");
                self.events.warning(class, Reason::RolloutRefused, format!(
                    "the AMI/userData autonode-server renders were reverted before (failed: {failures}); \
                     the class keeps the last good values until annotation {RETRY_ANNOTATION} is set to a new value"
                ));
            }
            Note::Held => {
                tracing::info!(nodeclass = %name, "EC2NodeClass held: its AMI and userData stay at the values autonode applied last");
                self.events.normal(class, Reason::RolloutHeld, format!(
                    "annotation {HOLD_ANNOTATION} is set: autonode-server keeps this class's AMI and userData \
                     at the values it applied last and applies no new ones until the annotation is removed"
                ));
            }
            Note::HoldIgnored => {
                tracing::warn!(nodeclass = %name, "EC2NodeClass hold ignored: its AMI/userData were not applied by autonode, and there is no rollout state of autonode's");
                self.events.warning(class, Reason::RolloutHoldIgnored, format!(
                    "annotation {HOLD_ANNOTATION} is set, but this class's AMI/userData were not applied by \
                     autonode-server (and it has no rollout state of autonode's): a hold keeps only autonode's \
                     own values, so the rendered values are applied"
                ));
            }
            _ => {}
        }
    }
}

/// What changes from `from` to `to`, for people: the AMI ids, userData.
pub fn change(from: Option<&Values>, to: &Values) -> String {
    let mut parts = Vec::new();
    let from_ids = from.map(Values::ami_ids).unwrap_or_default();
    if from.map(|f| &f.ami_selector_terms) != Some(&to.ami_selector_terms) {
        parts.push(format!(
            "AMI [{}] -> [{}]",
            from_ids.join(", "),
            to.ami_ids().join(", ")
        ));
    }
    if from.map(|f| &f.user_data) != Some(&to.user_data) {
        parts.push("userData".to_string());
    }
    if parts.is_empty() {
        parts.push("no change".to_string());
    }
    parts.join(", ")
}

/// The failed NodeClaims' names, the first [`NAMED`] of them.
fn names(failed: &[Failure]) -> String {
    let mut text: Vec<&str> = failed
        .iter()
        .take(NAMED)
        .map(|f| f.nodeclaim.as_str())
        .collect();
    let more = format!("and {} more", failed.len().saturating_sub(NAMED));
    if failed.len() > NAMED {
        text.push(&more);
    }
    text.join(", ")
}

/// The failures, `name: reason`, the first [`NAMED`] of them.
fn named(failed: &[Failure]) -> String {
    let mut text: Vec<String> = failed
        .iter()
        .take(NAMED)
        .map(|f| format!("{}: {}", f.nodeclaim, f.reason))
        .collect();
    if failed.len() > NAMED {
        text.push(format!("and {} more", failed.len() - NAMED));
    }
    text.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_come_before_the_reasons_and_are_bounded() {
        let failed: Vec<Failure> = (0..12)
            .map(|i| Failure {
                nodeclaim: format!("c{i}"),
                reason: "x".repeat(300),
            })
            .collect();
        assert_eq!(names(&failed[..2]), "c0, c1");
        let all = names(&failed);
        assert!(
            all.starts_with("c0, c1,") && all.ends_with("c9, and 2 more"),
            "{all}"
        );
    }
}
