//! The one way autonode sets a status condition of its own, on a NodeClaim
//! (`AutonodeBootstrapped`) or an EC2NodeClass (`AutonodeRollout`).
//!
//! Karpenter writes these objects' conditions too, with merge patches of
//! its whole list; so the list is written back whole, every other writer's
//! condition as read and ours replaced, and only when ours changed (an
//! unchanged condition written again would be a write per resync, per
//! object). `lastTransitionTime` moves only when the status does, as the
//! API conventions ask.

use crate::kube::karpenter::Condition;
use crate::kube::reason::Reason;
use crate::primitives::clock::{Clock, KubeTime};

/// Condition type on NodeClaims: how far the machine's bootstrap got.
pub const BOOTSTRAPPED: &str = "AutonodeBootstrapped";

/// Condition type on EC2NodeClasses: the rollout guard's verdict.
pub const ROLLOUT: &str = "AutonodeRollout";

/// A condition of ours, as it should be.
#[derive(Debug, Clone)]
pub struct Desired {
    pub type_: &'static str,
    pub status: &'static str,
    pub reason: Reason,
    pub message: String,
    /// The object's `metadata.generation`, as read.
    pub generation: Option<i64>,
    pub clock: Clock,
}

/// `conditions` with `desired` set, or `None` when it is already there with
/// the same status, reason and message (nothing to write).
pub fn set_condition(conditions: &[Condition], desired: Desired) -> Option<Vec<Condition>> {
    let ours = conditions.iter().find(|c| c.type_ == desired.type_);
    if ours.is_some_and(|c| is(c, &desired)) {
        return None;
    }
    let since = ours
        .filter(|c| c.status == desired.status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| desired.clock.k8s().0.to_string());
    let mut next: Vec<Condition> = conditions
        .iter()
        .filter(|c| c.type_ != desired.type_)
        .cloned()
        .collect();
    next.push(Condition {
        type_: desired.type_.into(),
        status: desired.status.into(),
        reason: Some(desired.reason.as_str().into()),
        message: Some(desired.message),
        last_transition_time: Some(since),
        observed_generation: desired.generation,
    });
    Some(next)
}

/// Whether `current` already says what `desired` does.
pub fn is(current: &Condition, desired: &Desired) -> bool {
    current.status == desired.status
        && current.reason.as_deref() == Some(desired.reason.as_str())
        && current.message.as_deref() == Some(desired.message.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const LATER: Clock = Clock::reading(|| datetime!(2027-01-01 00:00:00 UTC));

    fn desired(status: &'static str, message: &str) -> Desired {
        Desired {
            type_: BOOTSTRAPPED,
            status,
            reason: Reason::NodeReady,
            message: message.into(),
            generation: Some(1),
            clock: LATER,
        }
    }

    fn karpenters() -> Condition {
        Condition {
            type_: "Launched".into(),
            status: "True".into(),
            reason: Some("Launched".into()),
            message: None,
            last_transition_time: Some("2026-01-01T00:00:00Z".into()),
            observed_generation: Some(1),
        }
    }

    #[test]
    fn an_unchanged_condition_is_not_written_again() {
        let once = set_condition(&[karpenters()], desired("True", "ready")).unwrap();
        assert_eq!(set_condition(&once, desired("True", "ready")), None);
    }

    #[test]
    fn others_conditions_are_kept_and_the_transition_time_moves_with_the_status_only() {
        let mut first = set_condition(&[karpenters()], desired("True", "ready")).unwrap();
        assert_eq!(first[0], karpenters());
        first[1].last_transition_time = Some("2026-06-01T00:00:00Z".into());
        let reworded = set_condition(&first, desired("True", "still ready")).unwrap();
        assert_eq!(
            reworded[1].last_transition_time.as_deref(),
            Some("2026-06-01T00:00:00Z")
        );
        let flipped = set_condition(&reworded, desired("False", "gone")).unwrap();
        assert_eq!(
            flipped[1].last_transition_time.as_deref(),
            Some("2027-01-01T00:00:00Z")
        );
        assert_eq!(flipped.len(), 2);
    }
}
