//! A Node, as far as the leader reads it.
//!
//! The approver and the feedback controller read the leader's one Node
//! cache for a Node's name, UID and creation time (the `registered`
//! milestone), `spec.providerID`, whether it is Ready and since when (the
//! `ready` milestone), and of `status.allocatable` the resources the
//! capacity check compares ([`Resource`]). A node writes its own Node,
//! status included: its images, annotations, labels, conditions and
//! extended resources are as large as it likes.
//!
//! The watch parses each Node straight into this shape: serde steps over
//! everything else without building it. The server before parsed every
//! Node whole (an EKS node's is about 9 KB of JSON: 40 images, 19 labels,
//! four conditions) and then stripped it; at 3,000 nodes the Nodes it kept
//! took 2.3 KB each, and each event's parse allocated the whole tree first.

use crate::kube::cache::Identity;
use crate::primitives::quantity::{self, Resource};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::fmt;

/// The longest `spec.providerID` kept. An AWS one
/// (`aws:///<zone>/<instance>`) is under 64 bytes; a node writes its own.
pub const MAX_PROVIDER_ID: usize = 256;

/// `v1` Node: what autonode reads of it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Node {
    #[serde(default, deserialize_with = "Identity::read_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: NodeSpec,
    #[serde(default)]
    pub status: NodeStatus,
}

/// `spec.providerID`, when it is of a sane length.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeSpec {
    #[serde(rename = "providerID", default, deserialize_with = "provider_id")]
    pub provider_id: Option<String>,
}

/// The Ready condition and the compared allocatable resources.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeStatus {
    /// Of `status.conditions`, the one of type Ready.
    #[serde(rename = "conditions", default, deserialize_with = "ready_only")]
    pub ready: Option<Ready>,
    /// Of `status.allocatable`, the resources in [`Resource::ALL`], each of
    /// a sane length ([`quantity::MAX_LEN`]).
    #[serde(default, deserialize_with = "compared_only")]
    pub allocatable: BTreeMap<String, String>,
}

/// A Node's Ready condition.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ready {
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub last_transition_time: Option<Time>,
}

impl Node {
    /// Whether its Ready condition is True.
    pub fn is_ready(&self) -> bool {
        self.status
            .ready
            .as_ref()
            .is_some_and(|r| r.status == "True")
    }

    /// `spec.providerID`, if it has one (of a sane length).
    pub fn provider_id(&self) -> Option<&str> {
        self.spec.provider_id.as_deref()
    }
}

fn provider_id<'de, D: Deserializer<'de>>(from: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(from)?.filter(|id| id.len() <= MAX_PROVIDER_ID))
}

/// One condition of `status.conditions`, its type and what [`Ready`] keeps.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Condition {
    #[serde(rename = "type", default)]
    type_: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    last_transition_time: Option<Time>,
}

fn ready_only<'de, D: Deserializer<'de>>(from: D) -> Result<Option<Ready>, D::Error> {
    struct Conditions;
    impl<'de> Visitor<'de> for Conditions {
        type Value = Option<Ready>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of conditions")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut ready = None;
            while let Some(c) = seq.next_element::<Condition>()? {
                if c.type_ == "Ready" {
                    ready = Some(Ready {
                        status: c.status,
                        last_transition_time: c.last_transition_time,
                    });
                }
            }
            Ok(ready)
        }
    }
    from.deserialize_any(Conditions)
}

fn compared_only<'de, D: Deserializer<'de>>(from: D) -> Result<BTreeMap<String, String>, D::Error> {
    struct Allocatable;
    impl<'de> Visitor<'de> for Allocatable {
        type Value = BTreeMap<String, String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map of resources to quantities")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(BTreeMap::new())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut kept = BTreeMap::new();
            while let Some(name) = map.next_key::<String>()? {
                if !Resource::ALL.iter().any(|r| r.name() == name) {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                let value = map.next_value::<String>()?;
                if value.len() <= quantity::MAX_LEN {
                    kept.insert(name, value);
                }
            }
            Ok(kept)
        }
    }
    from.deserialize_any(Allocatable)
}

cluster_resource!(Node, "Node", "", "v1", "nodes");

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_node_keeps_its_name_provider_id_readiness_and_allocatable_only() {
        let big = "x".repeat(100_000);
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": "n1", "uid": "u1",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"big": big}, "annotations": {"big": big},
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:x": big}}],
            },
            "spec": {"providerID": "aws:///us-west-2a/i-0123456789abcdef0", "podCIDR": "10.0.0.0/24"},
            "status": {
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "message": big},
                    {"type": "Ready", "status": "True", "message": big, "reason": "KubeletReady",
                     "lastTransitionTime": "2026-01-01T00:00:05Z"},
                ],
                "allocatable": {"cpu": "2", "memory": "3Gi", "pods": "110",
                                "example.com/big": big, "ephemeral-storage": big},
                "images": [{"names": [big], "sizeBytes": 1}],
            },
        }))
        .unwrap();
        assert_eq!(node.metadata.name.as_deref(), Some("n1"));
        assert_eq!(node.metadata.uid.as_deref(), Some("u1"));
        assert!(node.metadata.creation_timestamp.is_some());
        assert!(node.metadata.labels.is_none() && node.metadata.annotations.is_none());
        assert!(node.metadata.managed_fields.is_none());
        assert_eq!(
            node.provider_id(),
            Some("aws:///us-west-2a/i-0123456789abcdef0")
        );
        assert!(node.is_ready());
        let ready = node.status.ready.as_ref().unwrap();
        assert!(ready.last_transition_time.is_some());
        // Only the compared resources, each of a sane length.
        let kept: Vec<_> = node.status.allocatable.keys().map(String::as_str).collect();
        assert_eq!(kept, ["cpu", "memory", "pods"]);
    }

    #[test]
    fn an_overlong_provider_id_is_not_kept() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "spec": {"providerID": "x".repeat(MAX_PROVIDER_ID + 1)},
        }))
        .unwrap();
        assert_eq!(node.provider_id(), None);
    }

    #[test]
    fn a_node_without_status_or_with_nulls_is_not_ready() {
        let bare: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
        assert!(!bare.is_ready() && bare.status.allocatable.is_empty());
        let nulls: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"}, "spec": {"providerID": null},
            "status": {"conditions": null, "allocatable": null},
        }))
        .unwrap();
        assert!(!nulls.is_ready() && nulls.provider_id().is_none());
        let not_ready: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
        }))
        .unwrap();
        assert!(!not_ready.is_ready());
    }
}
