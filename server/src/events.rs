//! Kubernetes Events on NodeClaims and EC2NodeClasses: what operators see
//! in `kubectl describe nodeclaim` (or `ec2nodeclass`).
//!
//! Both are cluster-scoped. Core/v1 Events in the `default` namespace
//! are how every API server version accepts Events about cluster-scoped
//! objects (1.20's events.k8s.io/v1 refuses them), so autonode writes those.
//! Published in the background: an Event is worth a log line if it fails,
//! never a slower or failed join.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, Resource};

/// The component name on every Event.
pub const COMPONENT: &str = "autonode-server";

/// Publishes Events as `autonode-server`.
#[derive(Clone)]
pub struct Events {
    api: Api<Event>,
    instance: String,
}

impl Events {
    /// A publisher identifying this replica as `instance`.
    pub fn new(client: Client, instance: String) -> Self {
        Self {
            api: Api::namespaced(client, "default"),
            instance,
        }
    }

    /// A Normal event on `object` (a NodeClaim, an EC2NodeClass).
    pub fn normal<K: Resource<DynamicType = ()>>(&self, object: &K, reason: &str, note: String) {
        self.publish(object, "Normal", reason, note);
    }

    /// A Warning event on `object`.
    pub fn warning<K: Resource<DynamicType = ()>>(&self, object: &K, reason: &str, note: String) {
        self.publish(object, "Warning", reason, note);
    }

    fn publish<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        type_: &str,
        reason: &str,
        note: String,
    ) {
        let event = self.event(object.object_ref(&()), type_, reason, truncate(note));
        let api = self.api.clone();
        tokio::spawn(async move {
            if let Err(e) = api.create(&PostParams::default(), &event).await {
                tracing::warn!(error = %e, reason = ?event.reason, "could not publish Event");
            }
        });
    }

    fn event(
        &self,
        regarding: ObjectReference,
        type_: &str,
        reason: &str,
        message: String,
    ) -> Event {
        let now = k8s_openapi::jiff::Timestamp::now();
        let object = regarding.name.clone().unwrap_or_default();
        Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{object}.")),
                namespace: Some("default".into()),
                ..Default::default()
            },
            involved_object: regarding,
            type_: Some(type_.into()),
            reason: Some(reason.into()),
            message: Some(message),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            // The legacy form (no eventTime/reporting*): the new form's
            // validation demands involvedObject.namespace == namespace,
            // which a cluster-scoped object cannot meet before 1.22.
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: Some(self.instance.clone()),
            }),
            ..Default::default()
        }
    }
}

// Keep messages short enough for any API server's limits.
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
