//! Kubernetes Events on NodeClaims: what operators see in
//! `kubectl describe nodeclaim`.
//!
//! Published in the background: an Event is worth a log line if it fails,
//! never a slower or failed join.

use crate::karpenter::NodeClaim;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};

/// Publishes Events as `autonode-server`.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    /// A publisher identifying this replica as `instance`.
    pub fn new(client: Client, instance: String) -> Self {
        let reporter = Reporter {
            controller: "autonode-server".into(),
            instance: Some(instance),
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// A Normal event on the NodeClaim.
    pub fn normal(&self, claim: &NodeClaim, reason: &str, note: String) {
        self.publish(claim, EventType::Normal, reason, note);
    }

    /// A Warning event on the NodeClaim.
    pub fn warning(&self, claim: &NodeClaim, reason: &str, note: String) {
        self.publish(claim, EventType::Warning, reason, note);
    }

    fn publish(&self, claim: &NodeClaim, type_: EventType, reason: &str, note: String) {
        let reference: ObjectReference = claim.object_ref(&());
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(note)),
            action: "Bootstrap".into(),
            secondary: None,
        };
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::warn!(error = %e, reason = %event.reason, "could not publish Event");
            }
        });
    }
}

// The API server refuses notes over 1 KiB.
fn truncate(mut note: String) -> String {
    if note.len() > 1000 {
        let mut end = 1000;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    note
}
